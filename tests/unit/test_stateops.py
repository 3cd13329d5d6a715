# -*- coding: utf-8 -*-
"""forget / state import (plugins/module_utils/csis/state/ops.py) against a fake endpoint:
the refusals (still exists, cannot check, undeclared, wrong shape, absent) and what is written."""
from __future__ import annotations

import json
import os
import re

import pytest
from trees import copy_as_shipped

from ansible_collections.csis.infra.plugins.module_utils.csis.state import ops as so
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState, audit_trail

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


class Err(Exception):
    def __init__(self, code):
        super().__init__("An error occurred (%s)" % code)
        self.response = {"Error": {"Code": code}}


def fake(**handlers):
    class Client:
        def __getattr__(self, op):
            def call(**kw):
                h = handlers[op]
                if isinstance(h, Exception):
                    raise h
                return h(**kw) if callable(h) else h
            return call
    return lambda service, access: Client()


RECORDED = "vol-0aaaaaaaaaaaaaaaa"   # the volume the fixture records for mnt_data


def volumes_but_the_recorded(VolumeIds):  # noqa: N803 - boto3's argument name
    """describe_volumes: any id is an available volume, but the recorded one, gone (the import's
    case: it replaces a volume deleted out of band)."""
    if VolumeIds[0] == RECORDED:
        raise Err("InvalidVolume.NotFound")
    return {"Volumes": [{"VolumeId": VolumeIds[0], "State": "available", "Size": 100, "AvailabilityZone": "us-east-2a"}]}


@pytest.fixture()
def root(tmp_path):
    dest = str(tmp_path / "tree")
    copy_as_shipped(EXAMPLES, dest)
    with MetaState(dest).transaction("test") as txn:
        txn.save("storage-state.yaml", {"storages": {"mnt_data": {
            "state": "active", "generation": 1, "history": [],
            "facts": {"builder": "aws-ebs", "type": "ebs", "volume_id": "vol-0aaaaaaaaaaaaaaaa"}}}})
        txn.save("launch-params.yaml", {"instances": {"test2": {
            "launched": True, "runtime": "aws-east2-runtime", "build": "ami-1",
            "mounts": [{"storage": "mnt_data"}]}}})
        txn.save("instance-state.yaml", {"instances": {"test2": {
            "generation": {"durable": 1, "ephemeral": 0}, "history": [],
            "current": {"number": 1, "instance_id": "i-0aaa", "ami_id": "ami-1"}}}})
        txn.save("pins.yaml", {"instances": {"test2": "ami-1"}, "pending_replacements": {}, "upgrades": []})
    return dest


def ms(root, name):
    return MetaState(root).load(name)


def test_forget_storage_whose_volume_is_gone(root):
    gone = fake(describe_volumes=Err("InvalidVolume.NotFound"))
    # destroy before delete: a record that is not destroyed needs the operator's force
    with pytest.raises(so.StateOpError, match=r"storage 'mnt_data' is recorded active, not destroyed \(at the endpoint: "
                                              r"volume vol-0aaaaaaaaaaaaaaaa is gone\).*pass force=true"):
        so.forget_storage(root, "mnt_data", run="r1", factory=gone)
    assert "mnt_data" in ms(root, "storage-state.yaml")["storages"]
    res = so.forget_storage(root, "mnt_data", run="r1", factory=gone, force=True)
    assert res["checked"] == "volume vol-0aaaaaaaaaaaaaaaa is gone" and res["mounted_by"] == ["test2"]
    assert "storage-state.yaml" in res["written"]
    assert ms(root, "storage-state.yaml")["storages"] == {}


def test_forget_storage_refuses_while_it_exists_or_cannot_be_checked(root):
    present = fake(describe_volumes={"Volumes": [{"VolumeId": "vol-0aaaaaaaaaaaaaaaa", "State": "in-use"}]})
    with pytest.raises(so.StateOpError, match="still exists.*confirm=true"):
        so.forget_storage(root, "mnt_data", factory=present)
    with pytest.raises(so.StateOpError, match="cannot tell whether.*REFUSED \\(UnauthorizedOperation\\)"):
        so.forget_storage(root, "mnt_data", factory=fake(describe_volumes=Err("UnauthorizedOperation")))
    assert "mnt_data" in ms(root, "storage-state.yaml")["storages"]
    with pytest.raises(so.StateOpError, match="still exists.*confirm=true"):
        so.forget_storage(root, "mnt_data", factory=present, force=True)  # force is for things that are gone
    so.forget_storage(root, "mnt_data", confirm=True, factory=present)
    assert ms(root, "storage-state.yaml")["storages"] == {}
    # forgetting it again changes nothing and says so (idempotent); a name never recorded is refused
    revision = MetaState(root).revision()
    again = so.forget_storage(root, "mnt_data", factory=present)
    assert again["already_forgotten"] is True and again["written"] == [], again
    assert again["checked"].startswith("already forgotten (revision "), again
    assert so.forget_storage(root, "mnt_data", factory=present, check=True)["already_forgotten"] is True
    assert MetaState(root).revision() == revision  # no transaction committed
    with pytest.raises(so.StateOpError, match="storage 'mnt_dat': nothing is recorded for it"):
        so.forget_storage(root, "mnt_dat", factory=present)


def test_forget_refuses_a_storage_still_declared_destroyed_or_archived(root):
    """Forgotten, a storage is one never applied, which must start active: one still declared
    destroyed (or archived) would make the tree fail validation, and every run with it."""
    import yaml
    path = os.path.join(root, "storages", "storage0.yaml")
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    [entry] = [s for s in doc["storages"] if s["name"] == "mnt_data"]
    entry["state"] = "destroyed"
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh)
    with MetaState(root).transaction("test") as txn:
        data = txn.load("storage-state.yaml")
        data["storages"]["mnt_data"]["state"] = "destroyed"
        txn.save("storage-state.yaml", data)
    with pytest.raises(so.StateOpError) as err:
        so.forget_storage(root, "mnt_data", factory=fake())
    assert str(err.value) == ("storage 'mnt_data' is still declared with state: destroyed; once forgotten it would be "
                              "a new storage, which must start active, and the tree would no longer validate. Remove "
                              "its declaration from storages/ first (or declare it active to have it created anew), "
                              "then forget it")
    assert ms(root, "storage-state.yaml")["storages"]["mnt_data"]["state"] == "destroyed"
    doc["storages"] = [s for s in doc["storages"] if s["name"] != "mnt_data"]
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh)
    assert so.forget_storage(root, "mnt_data", factory=fake())["was"] == "destroyed"
    assert ms(root, "storage-state.yaml")["storages"] == {}


def test_forget_storage_again_after_the_state_query_that_follows_it(root):
    """forget.yml forgets, then queries the state, which drops the storage's HARD line from
    drift.yaml: an audit record about the storage, but no change of its record. The same forget.yml
    again (an AWX retry) changes nothing and says so, as it does without the query between."""
    hard = {"kind": "storage", "name": "mnt_data", "drift": "missing", "detail": "volume vol-0aaaaaaaaaaaaaaaa is gone"}
    with MetaState(root).transaction("csis_state_query r0") as txn:
        txn.save("drift.yaml", {"hard": [hard], "run": "r0", "time": "2026-12-06T14:00:00Z"})
    gone = fake(describe_volumes={"Volumes": []})
    so.forget_storage(root, "mnt_data", run="r1", factory=gone, force=True)
    with MetaState(root).transaction("csis_state_query r1") as txn:
        txn.save("drift.yaml", {"hard": [], "run": "r1", "time": "2026-12-06T14:01:00Z"})
    revision = MetaState(root).revision()
    again = so.forget_storage(root, "mnt_data", run="r2", factory=gone)
    assert again["already_forgotten"] is True and again["written"] == [], again
    assert so.forget_storage(root, "mnt_data", factory=gone, check=True)["already_forgotten"] is True
    assert MetaState(root).revision() == revision
    # the history still shows the query's record among the storage's (drift lines count there)
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import audit_trail
    assert [d["what"] for d in audit_trail(MetaState(root), storage="mnt_data")][-2:] == [
        "csis_forget storage mnt_data", "csis_state_query r1"]


def test_forget_a_destroyed_storage_needs_no_word_and_no_lookup(root):
    with MetaState(root).transaction("test") as txn:
        data = txn.load("storage-state.yaml")
        data["storages"]["mnt_data"]["state"] = "destroyed"
        txn.save("storage-state.yaml", data)
    res = so.forget_storage(root, "mnt_data", run="r1", factory=fake())  # any AWS call would fail (no handler)
    assert res["was"] == "destroyed" and res["checked"] == "not looked up (recorded destroyed)"
    assert ms(root, "storage-state.yaml")["storages"] == {}


def test_force_does_not_forget_what_nothing_looked_up(root):
    """force is for what the endpoint shows gone: a record that is not destroyed and whose resource nothing looked up
    (no id recorded) needs confirm, as one whose existence cannot be checked does; check mode refuses alike."""
    with MetaState(root).transaction("test") as txn:
        data = txn.load("storage-state.yaml")
        data["storages"]["mnt_data"]["facts"].pop("volume_id")
        txn.save("storage-state.yaml", data)
        inst = txn.load("instance-state.yaml")
        inst["instances"]["test2"]["current"].pop("instance_id")
        txn.save("instance-state.yaml", inst)
    for forget, name, state, why in ((so.forget_storage, "storage 'mnt_data'", "active", "no id of it is recorded"),
                                     (so.forget_instance, "instance 'test2'", "launched", "no instance id of it is recorded")):
        target = name.split("'")[1]
        for check in (False, True):
            with pytest.raises(so.StateOpError, match=r"%s is recorded %s, not destroyed, and its resource was not looked "
                                                      r"up \(%s\): whether it is gone cannot be told, so force does not "
                                                      r"apply.*confirm=true" % (name, state, why)):
                forget(root, target, run="r1", factory=fake(), force=True, check=check)  # any AWS call would fail
        res = forget(root, target, run="r1", factory=fake(), confirm=True)
        assert res["checked"] == "not looked up (%s)" % why and res["written"], res
    assert ms(root, "storage-state.yaml")["storages"] == {} and ms(root, "launch-params.yaml")["instances"] == {}


def test_forget_instance(root):
    running = fake(describe_instances={"Reservations": [{"Instances": [
        {"InstanceId": "i-0aaa", "State": {"Name": "running"}, "ImageId": "ami-1"}]}]})
    with pytest.raises(so.StateOpError, match="the machine i-0aaa still exists"):
        so.forget_instance(root, "test2", factory=running)
    assert so.forget_instance(root, "test2", check=True, confirm=True, factory=running)["written"] == []
    assert "test2" in ms(root, "launch-params.yaml")["instances"]
    terminated = fake(describe_instances={"Reservations": [{"Instances": [
        {"InstanceId": "i-0aaa", "State": {"Name": "terminated"}}]}]})
    with pytest.raises(so.StateOpError, match=r"instance 'test2' is recorded launched, not destroyed \(at the endpoint: "
                                              r"i-0aaa is gone \(terminated\)\).*force=true"):
        so.forget_instance(root, "test2", run="r2", factory=terminated)
    res = so.forget_instance(root, "test2", run="r2", factory=terminated, force=True)
    assert res["checked"] == "i-0aaa is gone (terminated)"
    assert ms(root, "launch-params.yaml")["instances"] == {}
    pins = ms(root, "pins.yaml")
    assert pins["instances"] == {} and pins["upgrades"][-1] == {"kind": "instance", "name": "test2", "from": "ami-1",
                                                                "op": "forget", "run": "r2"}
    st = ms(root, "instance-state.yaml")["instances"]["test2"]
    assert st["current"] is None and st["history"][-1]["why"] == "forgotten" and st["generation"]["durable"] == 1
    again = so.forget_instance(root, "test2", run="r3", factory=fake())  # no lookup: nothing is recorded
    assert again["already_forgotten"] is True and again["written"] == [] and again["instance_id"] == "i-0aaa", again
    assert again["checked"].startswith("already forgotten (run r2, "), again
    assert ms(root, "instance-state.yaml")["instances"]["test2"] == st
    with pytest.raises(so.StateOpError, match="instance 'tset2': nothing is recorded for it"):
        so.forget_instance(root, "tset2", factory=fake())


def test_forget_a_decommissioned_instance_finds_nothing_to_do(root):
    """An instance whose machine went through its lifecycle (decommissioned) has no record saying it
    stands: its forget changes nothing and says why, where it said "nothing is recorded for it"
    (false: instance-state.yaml keeps its generation history, which a forget never deletes)."""
    with MetaState(root).transaction("test: decommissioned") as txn:
        txn.save("launch-params.yaml", {"instances": {}})
        txn.save("pins.yaml", {"instances": {}, "pending_replacements": {}, "upgrades": []})
        txn.save("instance-state.yaml", {"instances": {"test2": {
            "generation": {"durable": 1, "ephemeral": 0}, "current": None,
            "history": [{"number": 1, "instance_id": "i-0aaa", "ami_id": "ami-1", "why": "decommission",
                         "closed_run": "r7", "closed_at": "2026-12-01T00:00:00Z"}]}}})
    before = ms(root, "instance-state.yaml")
    for check in (True, False):
        res = so.forget_instance(root, "test2", run="r8", factory=fake(), check=check)
        assert res["closed_as"] == "decommission" and "already_forgotten" not in res, res
        assert res["written"] == [] and res["instance_id"] == "i-0aaa", res
        assert res["checked"] == ("its last machine (i-0aaa) was closed as decommission in run r7, 2026-12-01T00:00:00Z: "
                                  "nothing records it as standing, so there is nothing to forget (its generation "
                                  "history stays in instance-state.yaml)"), res
    assert ms(root, "instance-state.yaml") == before


def test_import_storage_refusals(root):
    vol = fake(describe_volumes=Err("InvalidVolume.NotFound"))
    with pytest.raises(so.StateOpError, match="not declared"):
        so.import_storage(root, "nope", "vol-0bbbbbbbbbbbbbbbb", factory=vol)
    with pytest.raises(so.StateOpError, match="is not a volume id"):
        so.import_storage(root, "mnt_data", "fs-0bbbbbbbbbbbbbbbb", factory=vol)
    with pytest.raises(so.StateOpError, match="does not exist at http://127.0.0.1:5055"):
        so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", factory=vol)
    with pytest.raises(so.StateOpError, match="cannot check"):
        so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", factory=fake(describe_volumes=Err("InternalError")))
    with MetaState(root).transaction("test") as txn:
        data = txn.load("storage-state.yaml")
        data["storages"]["old"] = {"state": "active", "facts": {"builder": "aws-ebs", "type": "ebs",
                                                                "volume_id": "vol-0cccccccccccccccc"}}
        txn.save("storage-state.yaml", data)
    with pytest.raises(so.StateOpError, match="already recorded for storage 'old'"):
        so.import_storage(root, "mnt_data", "vol-0cccccccccccccccc", factory=vol)
    assert ms(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"] == "vol-0aaaaaaaaaaaaaaaa"
    # an archived storage: its snapshot (here of a pre-0.1.0 name) would be left unreferenced
    with MetaState(root).transaction("test") as txn:
        data = txn.load("storage-state.yaml")
        data["storages"]["mnt_data"] = {"state": "archived", "generation": 1, "facts": {
            "builder": "aws-ebs", "type": "ebs", "archive": "csis-mnt-data-archive"}}
        txn.save("storage-state.yaml", data)
    found = fake(describe_volumes=volumes_but_the_recorded)
    with pytest.raises(so.StateOpError, match=r"storage 'mnt_data' is recorded archived \(its archive snapshot "
                                              r"csis-mnt-data-archive\): an import would record it active"):
        so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", factory=found)
    assert ms(root, "storage-state.yaml")["storages"]["mnt_data"]["state"] == "archived"


def test_import_storage_records_active_with_facts(root):
    vols = fake(describe_volumes=volumes_but_the_recorded)
    res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", run="r3", factory=vols)
    assert res["changed"] and "storage-state.yaml" in res["written"]
    rec = ms(root, "storage-state.yaml")["storages"]["mnt_data"]
    assert rec["state"] == "active" and rec["facts"] == {
        "builder": "aws-ebs", "type": "ebs", "volume_id": "vol-0bbbbbbbbbbbbbbbb", "availability_zone": "us-east-2a",
        "size": 100, "archive": "csis-mnt_data-archive"}
    assert rec["history"][-1]["action"] == "import" and rec["history"][-1]["from"] == "active"
    again = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", factory=vols)
    assert again["changed"] is False and again["written"] == []
    buckets = fake(get_bucket_tagging={"TagSet": []})
    res = so.import_storage(root, "default-bucket", "csis-example-default-bucket", run="r4", factory=buckets)
    rec = ms(root, "storage-state.yaml")["storages"]["default-bucket"]
    assert rec["state"] == "active" and rec["facts"]["bucket_name"] == "csis-example-default-bucket"
    assert rec["history"] == [{"from": None, "to": "active", "run": "r4", "at": rec["history"][0]["at"],
                               "generation": 1, "action": "import", "id": "csis-example-default-bucket"}]


def _initialised_root(root, module_line=True, installed=()):
    """The storage root as a real run leaves it (a local backend here, whose state file is absent:
    an empty state), with or without the storage's module call in its files and installed."""
    directory = os.path.join(root, "generated", "storage", "aws-ebs", "storage-generation")
    os.makedirs(os.path.join(directory, ".terraform", "modules"))
    with open(os.path.join(directory, ".terraform", "terraform.tfstate"), "w", encoding="utf-8") as fh:
        json.dump({"version": 3, "backend": {"type": "local", "config": {"path": "terraform.tfstate"}}}, fh)
    with open(os.path.join(directory, ".terraform", "modules", "modules.json"), "w", encoding="utf-8") as fh:
        json.dump({"Modules": [{"Key": "", "Source": "", "Dir": "."}]
                   + [{"Key": k, "Source": "../m", "Dir": "../m"} for k in installed]}, fh)
    with open(os.path.join(directory, "aws-ebs-storage-generation-storage-mnt_data.tf"), "w", encoding="utf-8") as fh:
        fh.write('module "storage_mnt_data" {\n  source = "../m"\n}\n' if module_line else "# nothing\n")
    return directory


def test_import_into_a_root_rendered_before_the_storage_was_declared_leaves_its_state(root):
    """The root is initialised but its files do not declare the storage yet: terraform would
    refuse the import (no configuration for the address); the record is made and the state left
    to the storage run that renders the storage, as for a root never rendered."""
    directory = _initialised_root(root, module_line=False)
    vols = fake(describe_volumes=volumes_but_the_recorded)
    res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", run="r3", factory=vols)
    assert res["terraform"] == ("terraform state not touched: %s was rendered before storage 'mnt_data' was declared "
                                "(a storage run renders it and stops at the gate; then state import again)" % directory)
    assert ms(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"] == "vol-0bbbbbbbbbbbbbbbb"


def test_import_into_a_root_rendered_before_the_storage_was_declared_renders_it_first(root):
    """The root is initialised but its files do not declare the storage yet: terraform would
    refuse the import (no configuration for the address); the import renders the root first, as a
    storage run would, when asked (csis_state_import asks; check mode says so; the real render is
    tests/integration's)."""
    directory = _initialised_root(root, module_line=False)
    vols = fake(describe_volumes=volumes_but_the_recorded)
    res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", check=True, factory=vols, render_root=True)
    assert res["terraform"] == ("would render and initialise %s (rendered before storage 'mnt_data' was declared), then "
                                "import vol-0bbbbbbbbbbbbbbbb into its terraform state as "
                                "module.storage_mnt_data.aws_ebs_volume.this" % directory)
    assert res["changed"] is True and res["written"] == []
    assert ms(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"] == RECORDED


@pytest.mark.parametrize("installed", [(), ("storage_mnt_data",)])
def test_import_into_a_root_rendered_again_since_its_init_installs_the_module_first(root, installed):
    """A dry run rendered the storage's module call into an initialised root and installed
    nothing (terraform would say "Module not installed"): the import installs it first (check
    mode says so); an installed module needs nothing."""
    directory = _initialised_root(root, installed=installed)
    vols = fake(describe_volumes=volumes_but_the_recorded)
    res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", check=True, factory=vols)
    after = "" if installed else " (after installing its module storage_mnt_data)"
    assert res["terraform"] == "would import vol-0bbbbbbbbbbbbbbbb into the terraform state of %s as " \
        "module.storage_mnt_data.aws_ebs_volume.this%s" % (directory, after)


@pytest.mark.parametrize("releasable", [True, False])
def test_check_mode_of_an_import_checks_the_state_lock_as_a_real_run(root, monkeypatch, releasable):
    """Check mode looks at the root's state lock without releasing it: a lock a real run would
    release (a dead local run's, or one whose ID is in force_unlock) is named in the line; one a real
    run would refuse on is refused. The operator's IDs reach the check."""
    directory = _initialised_root(root, installed=("storage_mnt_data",))
    seen = []

    def locked(root_dir, binary="terraform", release=True, env=None, confirmed_gone=(), confirm_with=None):
        seen.append((root_dir, release, list(confirmed_gone), confirm_with))
        raise so.StateLockError("STATE LOCKED: the lock (lock ID abc); its holder ...: if that run is really gone, ...",
                                releasable=releasable,
                                lock="the lock (lock ID abc); its holder on this machine is gone" if releasable else None)

    monkeypatch.setattr(so, "check_and_release", locked)
    vols = fake(describe_volumes=volumes_but_the_recorded)
    revision = MetaState(root).revision()
    if releasable:
        res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", check=True, factory=vols, force_unlock=["abc"])
        assert res["terraform"].endswith(" as module.storage_mnt_data.aws_ebs_volume.this (after releasing the state lock: "
                                         "the lock (lock ID abc); its holder on this machine is gone)"), res
    else:
        with pytest.raises(so.StateLockError, match="STATE LOCKED: the lock"):
            so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", check=True, factory=vols, force_unlock=["abc"])
    assert seen == [(directory, False, ["abc"], so.CONFIRM_BY_STATE_IMPORT)]
    assert MetaState(root).revision() == revision


def test_a_lock_the_import_released_is_audited_and_named_when_the_import_then_fails(root, monkeypatch):
    """A real run that released the root's state lock puts the release in the audit trail as the
    lifecycles' plan step does (csis_audit's event of the root), and a step that then fails (here
    the real terraform's `get` of a module source that is not there) still says what was released."""
    _initialised_root(root)  # the module call rendered, not installed: `terraform get` runs, and fails
    said = "released the state lock: s is locked by runner@awx-ee-7f9c ...; its ID was given in csis_force_unlock"
    asked = []
    monkeypatch.setattr(so, "check_and_release", lambda *a, **k: asked.append(k) or {"released": True, "msg": said, "locked": True})
    before = ms(root, "storage-state.yaml")
    vols = fake(describe_volumes=volumes_but_the_recorded)
    with pytest.raises(so.StateOpError, match=r"(?s)get -no-color failed in .* \(before it, %s\)$" % re.escape(said)):
        so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", run="r9", factory=vols, force_unlock=["x"])
    events = [e for d in audit_trail(MetaState(root)) for e in d.get("events") or []]
    assert events == [{"kind": "state lock released", "root": "storage-aws-ebs", "lifecycle": "storage", "detail": said}]
    assert audit_trail(MetaState(root))[-1]["what"] == "csis state lock released: storage-aws-ebs"
    assert audit_trail(MetaState(root))[-1]["context"]["run"] == "r9"
    assert [(k["release"], k["confirmed_gone"]) for k in asked] == [(True, ["x"])]  # a real run, the operator's IDs
    assert ms(root, "storage-state.yaml") == before  # the failed import recorded nothing


def test_check_mode_of_an_import_into_terraform_alone_reports_the_change(root):
    """The record already holds the storage (an earlier state import, before its root was
    initialised): a real run only imports into terraform and reports changed, so check mode
    reports changed too ("would import"), and writes nothing."""
    vols = fake(describe_volumes=volumes_but_the_recorded)
    so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", run="r3", factory=vols)
    _initialised_root(root, installed=("storage_mnt_data",))
    revision = MetaState(root).revision()
    res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", check=True, factory=vols)
    assert res["terraform"].startswith("would import vol-0bbbbbbbbbbbbbbbb ") and res["changed"] is True, res
    assert res["written"] == [] and MetaState(root).revision() == revision


@pytest.mark.parametrize("check", [False, True])
def test_an_import_both_records_and_state_already_hold_changes_nothing(root, check):
    """The record holds the storage and the root's state holds its id at the storage's address:
    nothing to do, in a real run and in check mode (the change is a flag beside the message)."""
    vols = fake(describe_volumes=volumes_but_the_recorded)
    so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", run="r3", factory=vols)
    directory = _initialised_root(root, installed=("storage_mnt_data",))
    with open(os.path.join(directory, "terraform.tfstate"), "w", encoding="utf-8") as fh:
        json.dump({"version": 4, "serial": 1, "lineage": "l", "outputs": {}, "resources": [
            {"module": "module.storage_mnt_data", "mode": "managed", "type": "aws_ebs_volume", "name": "this",
             "provider": "provider[\"registry.terraform.io/hashicorp/aws\"]",
             "instances": [{"attributes": {"id": "vol-0bbbbbbbbbbbbbbbb"}}]}]}, fh)
    revision = MetaState(root).revision()
    res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", check=check, factory=vols)
    assert res["terraform"] == "terraform state already holds vol-0bbbbbbbbbbbbbbbb as " \
        "module.storage_mnt_data.aws_ebs_volume.this", res
    assert res["changed"] is False and res["written"] == [] and MetaState(root).revision() == revision


def test_import_leaves_a_root_only_a_dry_run_rendered_to_its_first_run(root):
    """A dry run renders the storage root and stamps it (.terraform/csis-prepared.json) but
    initialises no backend: terraform there would fail ("Module not installed"), so the import
    records and says the state was not touched, as for a root never rendered."""
    directory = os.path.join(root, "generated", "storage", "aws-ebs", "storage-generation")
    os.makedirs(os.path.join(directory, ".terraform"))
    with open(os.path.join(directory, ".terraform", "csis-prepared.json"), "w", encoding="utf-8") as fh:
        fh.write("{}")
    vols = fake(describe_volumes=volumes_but_the_recorded)
    res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", run="r3", factory=vols)
    assert res["terraform"] == "terraform state not touched: %s is not rendered and initialised yet" % directory
    assert ms(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"] == "vol-0bbbbbbbbbbbbbbbb"


def test_import_into_a_root_only_a_dry_run_rendered_renders_and_initialises_it(root):
    """A dry run renders the storage root and stamps it (.terraform/csis-prepared.json) but
    initialises no backend, and an AWX job's checkout has no generated/ at all: terraform there
    would fail ("Module not installed"), and a record without the state's import would leave the
    storage's create planned (refused by the gate for a recorded storage). The import renders and
    initialises the root first (check mode says it would)."""
    directory = os.path.join(root, "generated", "storage", "aws-ebs", "storage-generation")
    vols = fake(describe_volumes=volumes_but_the_recorded)
    res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", check=True, factory=vols, render_root=True)
    assert res["terraform"].startswith("would render and initialise %s (not initialised for a real run), "
                                       "then import vol-0bbbbbbbbbbbbbbbb" % directory), res["terraform"]
    os.makedirs(os.path.join(directory, ".terraform"))
    with open(os.path.join(directory, ".terraform", "csis-prepared.json"), "w", encoding="utf-8") as fh:
        fh.write("{}")
    res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", check=True, factory=vols, render_root=True)
    assert res["terraform"].startswith("would render and initialise %s (not initialised" % directory), res["terraform"]
    assert ms(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"] == RECORDED


def test_a_root_with_local_state_a_real_run_prepared_is_initialised(root, monkeypatch):
    """A tree without state backends (the default: local state in the root) has no backend in its
    .terraform/; a real run's render prepared it (its stamp's real key): the import goes to its state
    as it is, not through another render (which would say, untrue, that it was not initialised)."""
    directory = os.path.join(root, "generated", "storage", "aws-ebs", "storage-generation")
    os.makedirs(os.path.join(directory, ".terraform", "modules"))
    with open(os.path.join(directory, ".terraform", "csis-prepared.json"), "w", encoding="utf-8") as fh:
        json.dump({"real": "k1", "dry": "k0"}, fh)
    with open(os.path.join(directory, ".terraform", "modules", "modules.json"), "w", encoding="utf-8") as fh:
        json.dump({"Modules": [{"Key": "storage_mnt_data", "Source": "../m", "Dir": "../m"}]}, fh)
    with open(os.path.join(directory, "aws-ebs-storage-generation-storage-mnt_data.tf"), "w", encoding="utf-8") as fh:
        fh.write('module "storage_mnt_data" {\n  source = "../m"\n}\n')
    # (its state, as `state pull` reads it there: tests/integration/test_tfstate_direct.py reads real ones)
    monkeypatch.setattr(so.tfstate, "read", lambda directory, binary="terraform": {"resources": [], "outputs": {}})
    vols = fake(describe_volumes=volumes_but_the_recorded)
    res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", check=True, factory=vols, render_root=True)
    assert res["terraform"] == ("would import vol-0bbbbbbbbbbbbbbbb into the terraform state of %s as "
                                "module.storage_mnt_data.aws_ebs_volume.this" % directory), res["terraform"]


def _volume(state="available", tags=None, attached=None):
    def describe(VolumeIds):  # noqa: N803 - boto3's argument name
        if VolumeIds[0] == RECORDED and state != "recorded-too":
            raise Err("InvalidVolume.NotFound")
        v = {"VolumeId": VolumeIds[0], "State": "in-use" if attached else "available", "Size": 100,
             "AvailabilityZone": "us-east-2a", "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()]}
        if attached:
            v["Attachments"] = [{"InstanceId": attached, "State": "attached"}]
        return {"Volumes": [v]}
    return describe


def test_an_import_over_a_recorded_volume_that_still_exists_is_refused(root):
    """mnt_data's recorded volume still exists: importing another would leave the data the tree runs
    on unmanaged (and called foreign by the state query). Forget the storage first to mean it."""
    before = ms(root, "storage-state.yaml")
    live = fake(describe_volumes=_volume(state="recorded-too"))
    with pytest.raises(so.StateOpError) as err:
        so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", factory=live)
    assert str(err.value) == (
        "storage 'mnt_data' is recorded with volume vol-0aaaaaaaaaaaaaaaa, which still exists (available): importing "
        "vol-0bbbbbbbbbbbbbbbb would leave it unmanaged (the state query would call it foreign). If vol-0bbbbbbbbbbbbbbbb "
        "is to take its place, forget the storage first (playbooks/forget.yml -e forget_storage=mnt_data -e "
        "confirm=true) and remove vol-0aaaaaaaaaaaaaaaa from the storage root's terraform state (terraform -chdir=%s "
        "state rm module.storage_mnt_data.aws_ebs_volume.this), then import it; not imported"
        % os.path.join(root, "generated", "storage", "aws-ebs", "storage-generation"))

    def unknown(VolumeIds):  # noqa: N803
        if VolumeIds[0] == RECORDED:
            raise Err("InternalError")
        return _volume()(VolumeIds)
    with pytest.raises(so.StateOpError, match=r"^storage 'mnt_data': cannot tell whether its recorded volume "
                                              r"vol-0aaaaaaaaaaaaaaaa still exists \(.*InternalError.*\): not imported over it$"):
        so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", factory=fake(describe_volumes=unknown))
    assert ms(root, "storage-state.yaml") == before
    # the recorded volume itself (a record made again, the state already holding it) is no replacement
    res = so.import_storage(root, "mnt_data", RECORDED, check=True, factory=live)
    assert res["id"] == RECORDED


def test_an_import_of_what_cannot_be_the_storage_is_refused(root):
    before = ms(root, "storage-state.yaml")
    theirs = fake(describe_volumes=_volume(tags={"csis_config": "csis-payroll"}))
    with pytest.raises(so.StateOpError) as err:
        so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", factory=theirs)
    assert str(err.value) == ("storage 'mnt_data': volume vol-0bbbbbbbbbbbbbbbb carries csis_config=csis-payroll, another "
                              "tree's tag (this tree is csis-example): it is that tree's, not imported")
    # an instance's root volume (in-use at the instance's root device)
    root_disk = fake(describe_volumes=_volume(attached="i-0web"), describe_instances={"Reservations": [{"Instances": [{
        "InstanceId": "i-0web", "RootDeviceName": "/dev/sda1",
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeId": "vol-0bbbbbbbbbbbbbbbb"}}]}]}]})
    with pytest.raises(so.StateOpError) as err:
        so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", factory=root_disk)
    assert str(err.value) == ("storage 'mnt_data': volume vol-0bbbbbbbbbbbbbbbb is the root volume of instance i-0web "
                              "(/dev/sda1), not a storage volume: not imported")
    # a bucket of another name than the storage's
    with pytest.raises(so.StateOpError) as err:
        so.import_storage(root, "default-bucket", "csis-other-bucket", factory=fake(get_bucket_tagging={"TagSet": []}))
    assert str(err.value).startswith("storage 'default-bucket': its bucket is csis-example-default-bucket (the storage's "
                                     "bucket_name, else its builder's, else its name); bucket csis-other-bucket is "
                                     "another"), str(err.value)
    assert ms(root, "storage-state.yaml") == before
    # a data volume attached to a machine at another device (mounted by it: a record forgotten, imported again)
    data_disk = fake(describe_volumes=_volume(attached="i-0web"), describe_instances={"Reservations": [{"Instances": [{
        "InstanceId": "i-0web", "RootDeviceName": "/dev/sda1",
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeId": "vol-0root"}},
                                {"DeviceName": "/dev/sdf", "Ebs": {"VolumeId": "vol-0bbbbbbbbbbbbbbbb"}}]}]}]})
    res = so.import_storage(root, "mnt_data", "vol-0bbbbbbbbbbbbbbbb", run="r5", factory=data_disk)
    assert res["changed"] and ms(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"] == \
        "vol-0bbbbbbbbbbbbbbbb"
