# -*- coding: utf-8 -*-
"""The recorders go record by record (issue 10): recording an applied root reads and writes
only the records of its own instances and storages, the pins' rest and the read-model records
of the storages they mount, and what they leave is what a rebuild from every record gives.
Pure library, temporary directories; the terraform state is given as data."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

from ansible_collections.csis.infra.plugins.module_utils.csis.state import record, store
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState, MetaStateError, audit_trail

LP, IS, PINS, ST, MODEL = "launch-params.yaml", "instance-state.yaml", "pins.yaml", "storage-state.yaml", "storage.yaml"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CSIS_META_STATE_CACHE", str(tmp_path / "reader-cache"))


def _ms(tmp_path: Path) -> MetaState:
    return MetaState(str(tmp_path / "cfg"), lock_timeout=5)


def _params(storage: str = "data") -> Dict[str, Any]:
    return {"image": "base", "group": "team", "machine_type": "t3.small",
            "mounts": [{"storage": storage, "mount_point": "/data", "type": "efs"}]}


def _instance_root(*names: str, **info: Any) -> Dict[str, Any]:
    return {"lifecycle": "instance-image", "builder": "ec2",
            "instances": {n: dict({"address": "module.inst_%s" % n, "launch_params": _params()}, **info) for n in names}}


def _state(**machines: str) -> Dict[str, Any]:
    """A terraform state holding ``aws_instance.this`` of each instance (name -> instance id)."""
    return {"resources": [
        {"mode": "managed", "module": "module.inst_%s" % name, "type": "aws_instance", "name": "this",
         "instances": [{"attributes": {"id": iid, "ami": "ami-%s" % iid[2:], "private_ip": "10.0.0.1",
                                       "availability_zone": "us-east-1a", "instance_type": "t3.small"}}]}
        for name, iid in machines.items()]}


def _fleet(ms: MetaState, count: int) -> None:
    """``count`` launched instances mounting the EFS ``data``, recorded one transaction at a time
    as applies would, then the storage ``data`` itself."""
    with ms.transaction("storage") as txn:
        txn.save(ST, {"storages": {"data": {"state": "active", "generation": 1, "history": [],
                                            "facts": {"builder": "efs", "type": "efs", "file_system_id": "fs-1"}}}})
        txn.save(MODEL, {"storages": {"data": record.storage_model(txn.load(ST)["storages"]["data"], [])}})
    record.record_instance_root(ms, _instance_root(*("n%d" % i for i in range(count))),
                                _state(**{"n%d" % i: "i-%d" % i for i in range(count)}), "r1")


def _rebuilt_model(ms: MetaState) -> Dict[str, Any]:
    """storage.yaml as a rebuild from every storage and launch record gives it."""
    launches = ms.load(LP)["instances"]
    return {name: record.storage_model(rec, [n for n, lp in launches.items() if record.attaches(name, lp)])
            for name, rec in ms.load(ST)["storages"].items()}


def _damage(ms: MetaState, name: str, key: str) -> None:
    Path(ms.record_path(name, key)).write_text("")


def test_recording_one_instance_reads_no_other_record(tmp_path):
    """Every record of the rest of the fleet is emptied (a whole read would refuse it): recording,
    replacing and decommissioning one instance still works, and writes only its own records."""
    ms = _ms(tmp_path)
    _fleet(ms, 5)
    for other in ("n1", "n2", "n3", "n4"):
        for name in (LP, IS, PINS):
            _damage(ms, name, other)
    got = record.record_instance_root(ms, _instance_root("n0"), _state(n0="i-0"), "r2")
    assert got == {"n0": "standing", "_written": [], "_bound": [], "_unconfirmed": []}
    got = record.record_instance_root(ms, _instance_root("n0"), _state(n0="i-new"), "r3")
    assert got["n0"] == "launched" and set(got["_written"]) == {LP, IS, PINS}  # replaced on another image
    assert got["_bound"] == []  # the pin moved: no first pin bound (the render named the new AMI already)
    with pytest.raises(MetaStateError, match=r"meta-state/launch-params/n[1-4].yaml: is empty"):
        ms.load(LP)  # the damage is still refused by every whole read
    got = record.record_instance_root(ms, _instance_root("n0", decommission=True), _state(), "r4")
    assert got["n0"] == "decommission" and set(got["_written"]) == {LP, IS, PINS, MODEL}
    changed = [(c["file"], c.get("key") or "") for c in audit_trail(ms)[-1]["changes"]]
    assert sorted(changed) == sorted([(LP, "n0"), (IS, "n0"), (PINS, "n0"), (PINS, ""), (MODEL, "data")])


def test_the_read_model_follows_launches_replacements_and_decommissions(tmp_path):
    ms = _ms(tmp_path)
    _fleet(ms, 3)
    assert ms.load(MODEL)["storages"]["data"]["attachments"] == ["n0", "n1", "n2"]
    assert ms.load(MODEL)["storages"] == _rebuilt_model(ms)
    record.record_instance_root(ms, _instance_root("n1", decommission=True), _state(), "r2")
    assert ms.load(MODEL)["storages"]["data"]["attachments"] == ["n0", "n2"]
    root = _instance_root("n3")
    root["instances"]["n3"]["launch_params"]["mounts"][0]["storage"] = "other"  # not recorded: no model
    record.record_instance_root(ms, root, _state(n3="i-3"), "r3")
    assert ms.load(MODEL)["storages"] == _rebuilt_model(ms) and "other" not in ms.load(MODEL)["storages"]
    # n2 moves to another storage: it leaves data's attachments
    root = _instance_root("n2")
    root["instances"]["n2"]["launch_params"]["mounts"][0]["storage"] = "other"
    record.record_instance_root(ms, root, _state(n2="i-2"), "r4")
    assert ms.load(MODEL)["storages"]["data"]["attachments"] == ["n0"]
    assert ms.load(MODEL)["storages"] == _rebuilt_model(ms)


def test_a_storage_recorded_again_gets_its_attachments_from_every_launch_record(tmp_path):
    """A storage forgotten while instances still mount it, then recorded again, has no read-model
    record: its attachments come from every launch record (the one whole read)."""
    ms = _ms(tmp_path)
    _fleet(ms, 2)
    with ms.transaction("forget") as txn:
        txn.save_record(ST, "data", None)
        record.refresh_storage_model(txn, ["data"])
    assert ms.load(MODEL)["storages"] == {}
    root = {"lifecycle": "storage", "builder": "efs",
            "storages": {"data": {"address": "module.data", "builder": "efs", "type": "efs"}}}
    state = {"resources": [{"mode": "managed", "module": "module.data", "type": "aws_efs_file_system",
                            "name": "this", "instances": [{"attributes": {"id": "fs-2"}}]}]}
    got = record.record_storage_root(ms, root, state, "r2")
    assert got["data"] == [None, "active"]
    assert ms.load(MODEL)["storages"]["data"]["attachments"] == ["n0", "n1"]
    assert ms.load(MODEL)["storages"] == _rebuilt_model(ms)


def test_pins_are_records_and_the_rest_is_beside_them(tmp_path):
    ms = _ms(tmp_path)
    _fleet(ms, 2)
    assert os.path.exists(ms.record_path(PINS, "n0")) and os.path.exists(ms.record_path(PINS, "n1"))
    pins = ms.load(PINS)
    assert pins["instances"] == {"n0": "ami-0", "n1": "ami-1"} and pins["pending_replacements"] == {}
    assert [u["op"] for u in pins["upgrades"]] == ["bind", "bind"]
    # a first launch binds the machine's first pin (csis_record's `bound`: the role renders the root again)
    assert record.record_instance_root(ms, _instance_root("n5"), _state(n5="i-5"), "r1b")["_bound"] == ["n5"]
    # an ephemeral machine is never pinned: nothing bound
    assert record.record_instance_root(ms, _instance_root("n6", ephemeral=True), _state(n6="i-6"), "r1c")["_bound"] == []
    out = record.mark_upgrade(ms.config_root, "n0", "r2", to="ami-9")
    assert out["changed"] and out["pending"]["from"] == "ami-0"
    assert ms.load(PINS)["pending_replacements"]["n0"]["to"] == "ami-9"
    assert os.path.exists(os.path.join(ms.dir, "pins", "_rest.yaml"))
    # the replacement onto the new image moves the pin and clears the marker
    state = _state(n0="i-9")
    state["resources"][0]["instances"][0]["attributes"]["ami"] = "ami-9"
    record.record_instance_root(ms, _instance_root("n0"), state, "r3")
    pins = ms.load(PINS)
    assert pins["instances"]["n0"] == "ami-9" and pins["pending_replacements"] == {}
    assert pins["upgrades"][-1] == {"kind": "instance", "name": "n0", "from": "ami-0", "to": "ami-9", "op": "upgrade",
                                    "run": "r3"}
    # a pending replacement of an instance that is not launched is refused at commit
    with pytest.raises(MetaStateError, match=r"'pending_replacements.n7' asks to replace an instance"):
        with ms.transaction("bad") as txn:
            rest = txn.load_rest(PINS)
            rest["pending_replacements"]["n7"] = {"to": None}
            txn.save_rest(PINS, rest)
    with pytest.raises(MetaStateError, match=r"'pending_replacements.n7' asks to replace an instance"):
        with ms.transaction("bad, whole") as txn:
            whole = txn.load(PINS)
            whole["pending_replacements"]["n7"] = {"to": None}
            txn.save(PINS, whole)
    with pytest.raises(MetaStateError, match=r"'instances' holds the records"):
        with ms.transaction("bad") as txn:
            txn.save_rest(PINS, {"instances": {}})


def test_a_whole_pins_file_is_read_then_migrated_by_the_recorder(tmp_path):
    ms = _ms(tmp_path)
    _fleet(ms, 2)
    whole = ms.load(PINS)
    for name in os.listdir(os.path.join(ms.dir, "pins")):
        os.unlink(os.path.join(ms.dir, "pins", name))
    os.rmdir(os.path.join(ms.dir, "pins"))
    Path(ms.path(PINS)).write_text(store.LEGACY_HEADER + yaml.safe_dump(whole))
    assert ms.load(PINS) == whole
    record.record_instance_root(ms, _instance_root("n2"), _state(n2="i-2"), "r2")
    assert not os.path.exists(ms.path(PINS))
    assert sorted(os.listdir(os.path.join(ms.dir, "pins"))) == ["_rest.yaml", "n0.yaml", "n1.yaml", "n2.yaml"]
    assert ms.load(PINS)["instances"] == dict(whole["instances"], n2="ami-2")
    assert "migrated" in [c["action"] for c in audit_trail(ms)[-1]["changes"] if c["file"] == PINS]


def test_a_whole_file_change_is_audited_with_its_diff(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction("first") as txn:
        data = txn.load("runs.yaml")
        data["runs"].append({"run": "r1"})
        txn.save("runs.yaml", data)
    with ms.transaction("second") as txn:
        data = txn.load("runs.yaml")
        data["runs"].append({"run": "r2"})
        txn.save("runs.yaml", data)
    change = audit_trail(ms)[-1]["changes"][0]
    assert change["file"] == "runs.yaml" and change["action"] == "changed" and change["diff"]


def test_the_tree_tag_the_machine_carries_is_recorded_from_the_state(tmp_path):
    """meta-state keeps the csis_config tag the applied resource carries (validate compares it with the
    tree's name: test_validate.py), taken from the state, never from the configuration."""
    ms = _ms(tmp_path)
    state = _state(n0="i-0")
    state["resources"][0]["instances"][0]["attributes"]["tags_all"] = {"csis_config": "team-a", "Name": "n0"}
    record.record_instance_root(ms, _instance_root("n0"), state, "r1")
    assert ms.load(IS)["instances"]["n0"]["current"]["csis_config"] == "team-a"
    assert "csis_config" not in record.record_instance_root(ms, _instance_root("n1"), _state(n1="i-1"), "r2") and \
        "csis_config" not in ms.load(IS)["instances"]["n1"]["current"]  # an untagged machine: nothing claimed
    assert record.tree_tag({"tags": {"csis_config": "x"}}) == "x"
    assert record.tree_tag({"tags": None}) is None and record.tree_tag(None) is None


def test_a_standing_machine_keeps_the_hash_of_the_launch_script_it_booted_with(tmp_path):
    """The instance module ignores changes to user_data: a launch script rendered differently later
    (another collection version, a changed mount) never reaches a standing machine, so its record
    keeps the hash of the script it ran; a replacement (a new instance id) records the new one."""
    ms = _ms(tmp_path)
    root = _instance_root("n0")
    root["instances"]["n0"]["launch_params"]["user_data_sha256"] = "a" * 64
    record.record_instance_root(ms, root, _state(n0="i-0"), "r1")
    root["instances"]["n0"]["launch_params"]["user_data_sha256"] = "b" * 64
    assert record.record_instance_root(ms, root, _state(n0="i-0"), "r2")["n0"] == "standing"
    assert ms.load(LP)["instances"]["n0"]["user_data_sha256"] == "a" * 64
    assert record.record_instance_root(ms, root, _state(n0="i-1"), "r3")["n0"] == "launched"
    assert ms.load(LP)["instances"]["n0"]["user_data_sha256"] == "b" * 64


@pytest.mark.parametrize("state,problem", [
    ([], "the document is not a mapping"),
    ({"resources": {}}, "'resources' is not a list"),
    ({"resources": ["x"]}, "resources[0] is not a mapping"),
    ({"resources": [{"mode": "managed", "name": "this", "instances": []}]}, "resources[0] has no type or no name"),
    ({"resources": [{"mode": "managed", "type": "aws_instance", "name": "this", "module": "module.inst_n0",
                     "instances": {"a": 1}}]}, "resources[0] (aws_instance.this): 'instances' is not a list"),
    ({"resources": [{"mode": "managed", "type": "aws_instance", "name": "this", "module": "module.inst_n0",
                     "instances": [{"attributes": ["id"]}]}]},
     "resources[0] (aws_instance.this): instances[0] has no attributes mapping"),
    # an instance without an id was recorded launched, with instance_id null
    ({"resources": [{"mode": "managed", "type": "aws_instance", "name": "this", "module": "module.inst_n0",
                     "instances": [{"attributes": {"ami": "ami-1"}}]}]}, "resources[0] (aws_instance.this): instances[0] has no id"),
], ids=["a-list", "resources-a-mapping", "a-string-resource", "no-type", "instances-a-mapping", "attributes-a-list",
        "an-instance-without-id"])
def test_a_state_not_as_terraform_writes_it_is_refused_naming_what_and_records_nothing(tmp_path, state, problem):
    ms = _ms(tmp_path)
    before = sorted(p.name for p in Path(ms.dir).rglob("*")) if os.path.isdir(ms.dir) else []
    root = dict(_instance_root("n0"), key="instance-image-ec2", directory="/trees/x/generated/instance-image/ec2")
    with pytest.raises(record.RecordError) as err:
        record.record_root(ms.config_root, root, "r1", state=state)
    assert str(err.value) == ("instance-image-ec2: the terraform state does not read as terraform writes it: %s; nothing "
                              "was recorded (terraform state pull in /trees/x/generated/instance-image/ec2 shows it)" % problem)
    assert (sorted(p.name for p in Path(ms.dir).rglob("*")) if os.path.isdir(ms.dir) else []) == before


def test_a_subject_the_state_lost_is_recorded_gone_only_when_this_apply_destroyed_it(tmp_path):
    """Meta-state never claims what no apply did: a storage recorded active, declared destroyed,
    that the root's state does not hold (imported with terraform state untouched, a state edited or
    lost) stays active with a warning line unless this run's apply destroyed something of its
    module; the same for a launched machine to decommission or an ephemeral one. A machine whose
    launch record says it never launched is closed without an apply (nothing claimed of reality)."""
    ms = _ms(tmp_path)
    _fleet(ms, 3)
    root = {"lifecycle": "storage", "builder": "efs",
            "storages": {"data": {"address": "module.data", "builder": "efs", "type": "efs", "requested_state": "destroyed"}}}
    got = record.record_storage_root(ms, root, {"resources": []}, "r2", deleted=[])
    assert "data" not in got and got["_written"] == [], got
    [line] = got["_unconfirmed"]
    assert line.startswith("storage data is recorded active and is declared destroyed, and the root's terraform state "
                           "does not hold it, but this run's apply destroyed nothing of it: not recorded as gone."), line
    assert "playbooks/forget.yml -e forget_storage=data -e force=true" in line
    assert ms.load(ST)["storages"]["data"]["state"] == "active"
    # another module's destroy is no proof; its own is
    assert record.record_storage_root(ms, root, {"resources": []}, "r3", deleted=["module.database.aws_efs_file_system.this"])[
        "_unconfirmed"]
    got = record.record_storage_root(ms, root, {"resources": []}, "r4", deleted=["module.data.aws_efs_file_system.this"])
    assert got["data"] == ["active", "destroyed"] and got["_unconfirmed"] == []

    for info in ({"decommission": True}, {"ephemeral": True}):
        got = record.record_instance_root(ms, _instance_root("n1", **info), _state(), "r5", deleted=[])
        assert "n1" not in got and got["_written"] == [] and len(got["_unconfirmed"]) == 1, got
        assert got["_unconfirmed"][0].startswith("instance n1 is recorded launched and is "), got
        assert "n1" in ms.load(LP)["instances"] and ms.load(IS)["instances"]["n1"]["current"]["instance_id"] == "i-1"
    got = record.record_instance_root(ms, _instance_root("n1", decommission=True), _state(), "r6",
                                      deleted=["module.inst_n1.aws_instance.this"])
    assert got["n1"] == "decommission" and got["_unconfirmed"] == []
    # an ephemeral machine's module has a count: the teardown destroys module.<name>[0]...
    got = record.record_instance_root(ms, _instance_root("n2", ephemeral=True), _state(), "r6b",
                                      deleted=["module.inst_n2[0].aws_volume_attachment.this[\"data\"]",
                                               "module.inst_n2[0].aws_instance.this"])
    assert got["n2"] == "ephemeral" and got["_unconfirmed"] == []
    # a launch record of a machine that never launched: closed without an apply
    with ms.transaction("seed") as txn:
        txn.save_record(LP, "n9", dict(_params(), launched=False))
    got = record.record_instance_root(ms, _instance_root("n9", decommission=True), _state(), "r7", deleted=[])
    assert got["n9"] == "decommission" and got["_unconfirmed"] == []


def test_a_standing_machine_keeps_how_its_launch_script_mounted(tmp_path):
    """A read-only mount (an EFS reached through its public access point) is recorded for a
    machine whose launch script made it so: a standing machine launched before keeps its record
    (its user data never changes), a new generation gets it."""
    ms = _ms(tmp_path)
    record.record_instance_root(ms, _instance_root("n0"), _state(n0="i-0"), "r1")
    root = _instance_root("n0")
    root["instances"]["n0"]["launch_params"]["mounts"][0]["read_only"] = True
    record.record_instance_root(ms, root, _state(n0="i-0"), "r2")
    assert "read_only" not in ms.load(LP)["instances"]["n0"]["mounts"][0]
    record.record_instance_root(ms, root, _state(n0="i-1"), "r3")  # replaced: launched with the new script
    assert ms.load(LP)["instances"]["n0"]["mounts"][0]["read_only"] is True
    record.record_instance_root(ms, root, _state(n0="i-1"), "r4")
    assert ms.load(LP)["instances"]["n0"]["mounts"][0]["read_only"] is True
    # its group joined the storage's since: the render says read-write, the machine still mounts it ro
    root["instances"]["n0"]["launch_params"]["mounts"][0].pop("read_only")
    record.record_instance_root(ms, root, _state(n0="i-1"), "r5")
    assert ms.load(LP)["instances"]["n0"]["mounts"][0]["read_only"] is True
