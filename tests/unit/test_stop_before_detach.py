# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Which machines are stopped before an apply detaches their EBS volumes and destroys them
(plugins/module_utils/csis/apply/stopbeforedetach.py): the pure selection from the gate's
addresses and the root's state, and the stop-and-wait against a stand-in EC2 client (its
failure and timeout paths; tests/integration/test_stop_before_detach.py runs it against moto)."""
from __future__ import annotations

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.apply import stopbeforedetach as sbd
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.stopbeforedetach import (
    StopError, machines_to_stop, stop_before_detach, stop_machines)


def _res(module, rtype, name, attrs, index=None):
    inst = {"attributes": attrs}
    if index is not None:
        inst["index_key"] = index
    return {"mode": "managed", "module": module, "type": rtype, "name": name, "instances": [inst]}


def _state(*machines):
    """A state holding, for each (module, instance id, [storages]), the instance and its attachments."""
    res = []
    for module, iid, storages in machines:
        res.append(_res(module, "aws_instance", "this", {"id": iid}))
        for s in storages:
            res.append(_res(module, "aws_volume_attachment", "this", {"id": "vai-%s" % s, "instance_id": iid}, index=s))
    return {"version": 4, "resources": res}


def _att(module, storage):
    return '%s.aws_volume_attachment.this["%s"]' % (module, storage)


INSTANCES = {"web": {"label": "web", "address": "module.instance_web"},
             "db": {"label": "db", "address": "module.instance_db"},
             "eph": {"label": "eph", "address": "module.instance_eph", "ephemeral": True}}


def test_a_decommission_stops_the_machine_whose_attachments_go_with_it():
    state = _state(("module.instance_web", "i-web", ["mnt_data", "mnt_logs"]), ("module.instance_db", "i-db", []))
    addresses = {"create": [], "update": [], "replace": [], "forget": [],
                 "delete": [_att("module.instance_web", "mnt_data"), _att("module.instance_web", "mnt_logs"),
                            "module.instance_web.aws_instance.this"]}
    (m,) = machines_to_stop(addresses, state, INSTANCES)
    assert m == {"address": "module.instance_web", "name": "web", "instance_id": "i-web",
                 "attachments": [_att("module.instance_web", "mnt_data"), _att("module.instance_web", "mnt_logs")]}


def test_a_replacement_stops_the_machine_its_attachments_replaced_too():
    state = _state(("module.instance_web", "i-web", ["mnt_data"]))
    addresses = {"delete": [], "replace": ["module.instance_web.aws_instance.this", _att("module.instance_web", "mnt_data")]}
    assert [(m["name"], m["instance_id"]) for m in machines_to_stop(addresses, state, INSTANCES)] == [("web", "i-web")]


def test_an_ephemeral_teardown_stops_the_counted_module_and_names_it():
    state = _state(("module.instance_eph[0]", "i-eph", ["scratch"]))
    addresses = {"delete": ["module.instance_eph[0].aws_instance.this", _att("module.instance_eph[0]", "scratch")],
                 "replace": []}
    (m,) = machines_to_stop(addresses, state, INSTANCES)
    assert (m["address"], m["name"], m["instance_id"]) == ("module.instance_eph[0]", "eph", "i-eph")


def test_a_machine_without_ebs_or_whose_attachments_stay_is_not_stopped():
    state = _state(("module.instance_web", "i-web", []), ("module.instance_db", "i-db", ["mnt_data"]))
    # web has no volume; db's instance is only updated (a tag), one of its volumes detached
    # (the unmount machinery's case, tasks/unmount.yml)
    addresses = {"delete": ["module.instance_web.aws_instance.this", _att("module.instance_db", "mnt_data")],
                 "replace": [], "update": ["module.instance_db.aws_instance.this"]}
    assert machines_to_stop(addresses, state, INSTANCES) == []
    # another module's attachment never pairs with web (instance_web is a prefix of instance_web2)
    state2 = _state(("module.instance_web", "i-web", []), ("module.instance_web2", "i-web2", ["x"]))
    addresses2 = {"delete": ["module.instance_web.aws_instance.this", _att("module.instance_web2", "x")], "replace": []}
    assert machines_to_stop(addresses2, state2, INSTANCES) == []


def test_nothing_destroyed_selects_nothing_and_reads_no_state(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("the state is not read when the plan destroys no instance")
    monkeypatch.setattr(sbd.tfstate, "read", boom)
    root = {"key": "r", "directory": "/nowhere", "instances": INSTANCES, "aws": {"region": "us-east-2"}}
    for addresses in ({}, {"delete": [], "replace": []}, {"delete": [_att("module.instance_web", "mnt_data")]}):
        assert stop_before_detach(root, addresses)["machines"] == []
    assert machines_to_stop({"delete": [], "replace": []}, {"resources": []}) == []


def test_a_machine_the_state_does_not_hold_is_named_by_its_address_without_an_id():
    addresses = {"delete": ["module.instance_gone.aws_instance.this", _att("module.instance_gone", "d")], "replace": []}
    (m,) = machines_to_stop(addresses, {"version": 4, "resources": []}, INSTANCES)
    assert (m["name"], m["instance_id"]) == ("module.instance_gone", None)


def test_deposed_objects_and_duplicates_do_not_add_machines():
    state = _state(("module.instance_web", "i-web", ["d"]))
    addresses = {"delete": ["module.instance_web.aws_instance.this (deposed object abc123)", _att("module.instance_web", "d")],
                 "replace": ["module.instance_web.aws_instance.this"]}
    assert [m["instance_id"] for m in machines_to_stop(addresses, state, INSTANCES)] == ["i-web"]


# --------------------------------------------------------------------------- the stop, a stand-in EC2
class FakeEC2:
    """EC2 as the stop sees it: describe_instances answers from ``states`` (a list per id: one
    state per describe, the last repeated); stop_instances records the call or raises ``fail``, and
    refuses a machine last seen ``pending`` as EC2 does (IncorrectInstanceState)."""

    class NotFound(Exception):
        response = {"Error": {"Code": "InvalidInstanceID.NotFound", "Message": "not found"}}

    def __init__(self, states, fail=None):
        self.states = {k: list(v) for k, v in states.items()}
        self.fail = fail
        self.stopped = []
        self.seen = {}

    def describe_instances(self, InstanceIds):
        (iid,) = InstanceIds
        if iid not in self.states:
            raise FakeEC2.NotFound("InvalidInstanceID.NotFound")
        seq = self.states[iid]
        st = seq.pop(0) if len(seq) > 1 else seq[0]
        self.seen[iid] = st
        return {"Reservations": [{"Instances": [{"InstanceId": iid, "State": {"Name": st}}]}]}

    def stop_instances(self, InstanceIds):
        if self.fail:
            raise self.fail
        if any(self.seen.get(i) == "pending" for i in InstanceIds):
            raise Exception("An error occurred (IncorrectInstanceState) when calling the StopInstances operation: "
                            "The instance '%s' is not in a state from which it can be stopped." % InstanceIds[0])
        self.stopped += InstanceIds
        return {}


def _machines(*ids):
    return [{"address": "module.instance_%s" % i, "name": i, "instance_id": "i-%s" % i, "attachments": []} for i in ids]


@pytest.fixture
def fake(monkeypatch):
    holder = {}

    def client(service, access):
        assert service == "ec2" and access == {"region": "us-east-2"}
        return holder["ec2"]
    monkeypatch.setattr(sbd.aws, "client", client)
    return holder


def test_running_machines_are_stopped_and_waited_for_others_skipped(fake):
    fake["ec2"] = FakeEC2({"i-a": ["running", "stopping", "stopping", "stopped"], "i-b": ["stopped"],
                           "i-c": ["terminated"], "i-d": ["stopping", "stopped"], "i-e": ["shutting-down"]})
    slept = []
    res = stop_machines(_machines("a", "b", "c", "d", "e", "zz"), {"region": "us-east-2"}, timeout=60,
                        interval=1, sleep=slept.append)
    assert fake["ec2"].stopped == ["i-a"]  # i-d, stopping already, is waited for, not asked again
    assert sorted((m["instance_id"], m["state"]) for m in res["stopped"]) == [("i-a", "stopped"), ("i-d", "stopped")]
    assert {m["instance_id"]: m["reason"] for m in res["skipped"]} == {
        "i-b": "already stopped", "i-c": "already terminated",
        "i-e": "already shutting-down", "i-zz": "EC2 does not know it (not found)"}
    assert slept == [1, 1] and res["would_stop"] == []


def test_check_mode_stops_nothing_and_says_what_it_would(fake):
    fake["ec2"] = FakeEC2({"i-a": ["running"], "i-b": ["stopped"]})
    res = stop_machines(_machines("a", "b"), {"region": "us-east-2"}, check=True)
    assert fake["ec2"].stopped == [] and res["stopped"] == []
    assert [m["instance_id"] for m in res["would_stop"]] == ["i-a"]
    assert [m["instance_id"] for m in res["skipped"]] == ["i-b"]


def test_a_stop_that_fails_names_the_instance_and_nothing_is_applied(fake):
    err = Exception("An error occurred (UnauthorizedOperation) when calling the StopInstances operation: denied")
    fake["ec2"] = FakeEC2({"i-a": ["running"]}, fail=err)
    with pytest.raises(StopError) as exc:
        stop_machines(_machines("a"), {"region": "us-east-2"})
    assert "instance a (i-a): StopInstances failed before the apply" in str(exc.value)
    assert "UnauthorizedOperation" in str(exc.value) and "nothing applied" in str(exc.value)


def test_a_machine_not_stopped_in_time_fails_naming_it(fake):
    fake["ec2"] = FakeEC2({"i-a": ["running", "stopping"]})
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
    with pytest.raises(StopError) as exc:
        stop_machines(_machines("a"), {"region": "us-east-2"}, timeout=12, interval=5, sleep=sleep, clock=lambda: now[0])
    assert str(exc.value).startswith("instance a (i-a) (EC2 says stopping) did not reach 'stopped' within 12s")
    assert "nothing applied" in str(exc.value) and fake["ec2"].stopped == ["i-a"]
    assert now[0] == 12


def test_a_machine_still_launching_is_stopped_once_it_runs(fake):
    # StopInstances refuses a pending machine: the step waits until it runs, then stops it
    fake["ec2"] = FakeEC2({"i-a": ["pending", "pending", "running", "stopping", "stopped"], "i-b": ["running", "stopped"],
                           "i-c": ["pending", "terminated"]})
    slept = []
    res = stop_machines(_machines("a", "b", "c"), {"region": "us-east-2"}, timeout=60, interval=1, sleep=slept.append)
    assert fake["ec2"].stopped == ["i-b", "i-a"]  # the running one at once, the launching one once it runs
    assert sorted(m["instance_id"] for m in res["stopped"]) == ["i-a", "i-b"]
    assert [(m["instance_id"], m["reason"]) for m in res["skipped"]] == [("i-c", "already terminated")]


def test_a_machine_launching_past_the_timeout_fails_naming_it_and_what_was_asked(fake):
    fake["ec2"] = FakeEC2({"i-a": ["pending"], "i-b": ["running", "stopped"]})
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
    with pytest.raises(StopError) as exc:
        stop_machines(_machines("a", "b"), {"region": "us-east-2"}, timeout=10, interval=5, sleep=sleep, clock=lambda: now[0])
    assert str(exc.value).startswith("instance a (i-a) still launching ('pending') 10s after the stop began")
    assert "nothing applied (stop already asked of i-b)" in str(exc.value) and fake["ec2"].stopped == ["i-b"]


def test_the_whole_step_reads_the_state_only_when_the_plan_destroys_an_instance_with_attachments(fake, monkeypatch):
    fake["ec2"] = FakeEC2({"i-web": ["running", "stopped"]})
    read = []
    state = _state(("module.instance_web", "i-web", ["d"]))
    monkeypatch.setattr(sbd.tfstate, "read", lambda d, b: read.append((d, b)) or state)
    root = {"key": "r", "directory": "/root-dir", "binary_path": "tofu", "instances": INSTANCES,
            "aws": {"region": "us-east-2"}, "secrets": {}}
    addresses = {"delete": ["module.instance_web.aws_instance.this", _att("module.instance_web", "d")], "replace": []}
    res = stop_before_detach(root, addresses, interval=0)
    assert read == [("/root-dir", "tofu")]
    assert [m["name"] for m in res["machines"]] == ["web"] and [m["name"] for m in res["stopped"]] == ["web"]
