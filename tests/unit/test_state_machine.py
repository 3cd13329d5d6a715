# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The storage state machine at validate: every (current, requested) pair of the manual's
table, on EBS (archivable) and on EFS/S3 (not), without and with attachments (declared,
and recorded as launched in meta-state/launch-params.yaml but undeclared), and the
records of storages that left the YAML. Messages are the reference manual's."""
from __future__ import annotations

import itertools
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bad_inputs"))
import corpus  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import LEGAL_TRANSITIONS, load_and_validate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.launch import compute_launch_params  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState  # noqa: E402

CURRENT = [None, "active", "archived", "destroyed"]
REQUESTED = ["active", "archived", "destroyed"]
PAIRS = list(itertools.product(CURRENT, REQUESTED))
STORAGES_FILE = "storages/storage0.yaml"
INSTANCES_FILE = "instances/instances.yaml"
#: storage -> (index in storages/storage0.yaml, builder type)
STORAGES = {"mnt_data": (0, "tf-aws-ebs"), "default-bucket": (1, "tf-aws-s3"), "efs-storage": (2, "tf-aws-efs")}

#: the manual's table (digest section 6): None->active, active->archived, archived->active,
#: active->destroyed, archived->destroyed, destroyed->active, and staying put
LEGAL = {(None, "active"), ("active", "archived"), ("archived", "active"), ("active", "destroyed"),
         ("archived", "destroyed"), ("destroyed", "active"),
         ("active", "active"), ("archived", "archived"), ("destroyed", "destroyed")}


def skey(name: str, key: str = "state") -> str:
    return "storages[%d] (%s).%s" % (STORAGES[name][0], name, key)


def never_applied(name: str, req: str) -> Tuple[str, str, str]:
    return (STORAGES_FILE, skey(name), "storage '%s' has never been applied; a new storage must start 'active', not '%s'"
            % (name, req))


def illegal(name: str, cur: str, req: str) -> Tuple[str, str, str]:
    return (STORAGES_FILE, skey(name), "storage '%s': transition %s -> %s is not legal" % (name, cur, req))


def no_archive(name: str) -> Tuple[str, str, str]:
    return (STORAGES_FILE, skey(name),
            "storage '%s' (%s) requests archived, which its builder does not realize (snapshot + restore); "
            "only builders that support archiving may" % (name, STORAGES[name][1]))


def while_attached(name: str, cur: str, req: str, users: List[str]) -> Tuple[str, str, str]:
    return (STORAGES_FILE, skey(name), "storage '%s' cannot move %s -> %s while attached by %s "
            "(detach in one run, transition in the next; N21)" % (name, cur, req, users))


def is_but_attached(name: str, req: str, users: List[str]) -> Tuple[str, str, str]:
    return (STORAGES_FILE, skey(name), "storage '%s' is %s but instances attach it: %s" % (name, req, users))


def attach_non_active(inst_key: str, name: str, req: str, users: List[str]) -> Tuple[str, str, str]:
    return (INSTANCES_FILE, inst_key, "instances %s attach storage '%s' which is %s" % (users, name, req))


def run(root: str, undeclare=()) -> List[Tuple[str, str, str]]:
    try:
        load_and_validate(root, undeclare=undeclare, run_version=corpus.version_stub({}))
    except ConfigError as exc:
        return sorted((p.file, p.key, p.message) for p in exc.problems)
    return []


def make_tree(tmp_path, name: str, req: str, cur: Optional[str], attach: Optional[str] = None,
              extra_records: Optional[Dict[str, Any]] = None, launched: Optional[Dict[str, Any]] = None) -> str:
    """examples/ with ``name`` requested ``req`` and recorded ``cur``. ``attach``: None = no
    instance declares ``name``; 'declared' = test2 declares it (mnt_data as in the example)."""
    root = corpus.copy_examples(str(tmp_path / "tree"))
    muts = [{"file": STORAGES_FILE, "set": {"storages.%d.state" % STORAGES[name][0]: req}}]
    if attach == "declared" and name != "mnt_data":
        muts.append({"file": INSTANCES_FILE, "set": {"instances.0.storages": [
            {"name": name, "mount_point": "/mnt/x"}]}})
    elif attach is None:
        muts.append({"file": INSTANCES_FILE, "delete": ["instances.0.storages"]})
    for mut in muts:
        corpus.apply_mutation(root, mut)
    records = dict(extra_records or {})
    if cur is not None:
        records[name] = {"state": cur, "generation": 1, "facts": {"builder": "x", "type": "y"}}
    if launched:
        launched = launch_records(root, launched)
    with MetaState(root).transaction("test") as txn:
        txn.save("storage-state.yaml", {"storages": records})
        if launched:
            txn.save("launch-params.yaml", {"instances": launched})
    return root


def launch_records(root: str, launched: Dict[str, Any]) -> Dict[str, Any]:
    """Launch records as a launch writes them: the declared instance's launch parameters,
    with the recorded facts of ``launched`` (its mounts...) over them, so that only what the
    test changes differs from the record (launch parameters are immutable, N26)."""
    tree = load_tree(root)
    out = {}
    for name, rec in launched.items():
        inst = tree.instances.get(name)
        base = compute_launch_params(tree, {}, inst) if inst is not None else {}
        out[name] = dict(base, **rec)
    return out


def test_the_table_is_the_manuals():
    assert LEGAL_TRANSITIONS == LEGAL


@pytest.mark.parametrize("cur,req", PAIRS, ids=["%s->%s" % p for p in PAIRS])
def test_ebs_unattached(tmp_path, cur, req):
    root = make_tree(tmp_path, "mnt_data", req, cur)
    before = corpus.tree_hash(root)
    if cur is None and req != "active":
        want = [never_applied("mnt_data", req)]
    elif (cur, req) not in LEGAL:
        want = [illegal("mnt_data", cur, req)]
    else:
        want = []
    assert run(root) == sorted(want)
    assert corpus.tree_hash(root) == before


@pytest.mark.parametrize("name", ["efs-storage", "default-bucket"])
@pytest.mark.parametrize("cur,req", PAIRS, ids=["%s->%s" % p for p in PAIRS])
def test_efs_and_s3_unattached(tmp_path, name, cur, req):
    root = make_tree(tmp_path, name, req, cur)
    if req == "archived":
        want = [no_archive(name)]  # refused whatever the record says
    elif cur is None and req != "active":
        want = [never_applied(name, req)]
    elif (cur, req) not in LEGAL:
        want = [illegal(name, cur, req)]
    else:
        want = []
    assert run(root) == sorted(want)


EBS_DECLARED = {
    # (cur, req) -> problems while instance test2 declares mnt_data
    (None, "active"): [],
    (None, "archived"): [never_applied("mnt_data", "archived")],
    (None, "destroyed"): [never_applied("mnt_data", "destroyed")],
    ("active", "active"): [],
    ("active", "archived"): [while_attached("mnt_data", "active", "archived", ["test2"]),
                             attach_non_active("instances[0] (test2).storages", "mnt_data", "archived", ["test2"])],
    ("active", "destroyed"): [while_attached("mnt_data", "active", "destroyed", ["test2"]),
                              attach_non_active("instances[0] (test2).storages", "mnt_data", "destroyed", ["test2"])],
    ("archived", "active"): [],  # a restore: attaching an active storage is fine
    ("archived", "archived"): [is_but_attached("mnt_data", "archived", ["test2"])],
    ("archived", "destroyed"): [while_attached("mnt_data", "archived", "destroyed", ["test2"]),
                                attach_non_active("instances[0] (test2).storages", "mnt_data", "destroyed", ["test2"])],
    ("destroyed", "active"): [],
    ("destroyed", "archived"): [illegal("mnt_data", "destroyed", "archived"),
                                attach_non_active("instances[0] (test2).storages", "mnt_data", "archived", ["test2"])],
    ("destroyed", "destroyed"): [is_but_attached("mnt_data", "destroyed", ["test2"])],
}


def test_the_declared_table_covers_every_pair():
    assert sorted(EBS_DECLARED, key=str) == sorted(PAIRS, key=str)


@pytest.mark.parametrize("cur,req", PAIRS, ids=["%s->%s" % p for p in PAIRS])
def test_ebs_attached_by_a_declared_instance(tmp_path, cur, req):
    root = make_tree(tmp_path, "mnt_data", req, cur, attach="declared")
    assert run(root) == sorted(EBS_DECLARED[(cur, req)])


@pytest.mark.parametrize("cur,req", PAIRS, ids=["%s->%s" % p for p in PAIRS])
def test_efs_attached_by_a_declared_instance(tmp_path, cur, req):
    root = make_tree(tmp_path, "efs-storage", req, cur, attach="declared")
    users = ["test2"]
    ikey = "instances[0] (test2).storages"
    if req == "archived":
        want = [no_archive("efs-storage")]
        if cur not in (None, "archived"):
            want.append(attach_non_active(ikey, "efs-storage", "archived", users))
    elif cur is None and req != "active":
        want = [never_applied("efs-storage", req)]
    elif (cur, req) not in LEGAL:
        want = [illegal("efs-storage", cur, req)]
    elif req == "active":
        want = []
    elif cur == req:
        want = [is_but_attached("efs-storage", req, users)]
    else:
        want = [while_attached("efs-storage", cur, req, users), attach_non_active(ikey, "efs-storage", req, users)]
    assert run(root) == sorted(want)


LAUNCHED_TEST2 = {"test2": {"launched": True, "image": "imgfile-basic-dask", "group": "coops",
                            "mounts": [{"storage": "mnt_data", "mount_point": "/mnt/data", "type": "ebs"}]}}


@pytest.mark.parametrize("undeclare", [False, True], ids=["mapping-removed", "instance-undeclared"])
@pytest.mark.parametrize("cur,req", PAIRS, ids=["%s->%s" % p for p in PAIRS])
def test_ebs_attached_in_reality_only(tmp_path, cur, req, undeclare):
    """test2 no longer declares the mount (or is undeclared for the run) but launch-params
    records it launched with the mount: reality, so leaving active is refused (N21)."""
    root = make_tree(tmp_path, "mnt_data", req, cur, attach=None, launched=LAUNCHED_TEST2)
    if cur is None and req != "active":
        want = [never_applied("mnt_data", req)]
    elif (cur, req) not in LEGAL:
        want = [illegal("mnt_data", cur, req)]
    elif cur != req and req != "active":
        want = [while_attached("mnt_data", cur, req, ["test2"])]
    else:
        want = []
    assert run(root, undeclare=["test2"] if undeclare else ()) == sorted(want)


def test_a_launch_record_that_is_not_launched_does_not_attach(tmp_path):
    rec = {"test2": dict(LAUNCHED_TEST2["test2"], launched=False)}
    root = make_tree(tmp_path, "mnt_data", "archived", "active", attach=None, launched=rec)
    assert run(root) == []


# ---------------------------------------------------------------- undeclared records
RECORDS_FILE = "meta-state/storage-state.yaml"


@pytest.mark.parametrize("state", ["active", "archived"])
def test_an_undeclared_record_without_a_builder_is_refused(tmp_path, state):
    root = make_tree(tmp_path, "mnt_data", "active", "active",
                     extra_records={"old-data": {"state": state, "generation": 1}})
    assert run(root) == [(RECORDS_FILE, "storages.old-data",
                          "storage 'old-data' is recorded %s but no longer declared, and its record names no storage "
                          "builder: re-declare it (or record it with `state import`) so the destroy can be planned" % state)]


@pytest.mark.parametrize("state", ["active", "archived"])
def test_an_undeclared_record_with_its_builder_is_planned_as_destroyed(tmp_path, state):
    root = make_tree(tmp_path, "mnt_data", "active", "active",
                     extra_records={"old-data": {"state": state, "facts": {"builder": "aws-ebs", "type": "ebs"}}})
    assert run(root) == []


def test_an_undeclared_record_naming_an_undeclared_builder_is_refused(tmp_path):
    root = make_tree(tmp_path, "mnt_data", "active", "active",
                     extra_records={"old-data": {"state": "active", "facts": {"builder": "aws-gone"}}})
    assert run(root) == [(RECORDS_FILE, "storages.old-data",
                          "storage 'old-data' is recorded active and no longer declared; its record names storage "
                          "builder 'aws-gone', which is not declared")]


def test_an_undeclared_destroyed_record_needs_nothing(tmp_path):
    root = make_tree(tmp_path, "mnt_data", "active", "active",
                     extra_records={"old-data": {"state": "destroyed"}})
    assert run(root) == []


@pytest.mark.parametrize("undeclare", [False, True], ids=["instance-declared", "instance-undeclared"])
def test_an_undeclared_record_still_mounted_by_a_launched_instance_is_refused(tmp_path, undeclare):
    launched = {"test2": dict(LAUNCHED_TEST2["test2"], mounts=[{"storage": "old-data", "mount_point": "/mnt/old"}])}
    root = make_tree(tmp_path, "mnt_data", "active", "active", attach=None, launched=launched,
                     extra_records={"old-data": {"state": "active", "facts": {"builder": "aws-ebs"}}})
    assert run(root, undeclare=["test2"] if undeclare else ()) == [
        (RECORDS_FILE, "storages.old-data",
         "storage 'old-data' cannot move active -> destroyed while attached by ['test2'] "
         "(detach in one run, transition in the next; N21)")]


def test_a_recorded_storage_keeps_its_label(tmp_path):
    root = make_tree(tmp_path, "mnt_data", "active", "active",
                     extra_records={"mnt-data": {"state": "active", "facts": {"builder": "aws-ebs"}}})
    assert run(root) == [(STORAGES_FILE, skey("mnt_data", "name"),
                          "storage 'mnt_data' and the recorded storage 'mnt-data' both become the terraform label "
                          "'storage_mnt_data'")]


def test_a_launched_instance_keeps_its_label(tmp_path):
    """A launched instance renamed to a name of the same terraform label (test-2 -> test.2) would be
    the same module call: planned as an in-place update of the old machine, never decommissioned."""
    launched = {"test-2": dict(LAUNCHED_TEST2["test2"])}
    root = make_tree(tmp_path, "mnt_data", "active", "active", launched=launched)
    corpus.apply_mutation(root, {"file": INSTANCES_FILE, "set": {"instances.0.name": "test.2"}})
    assert run(root) == [(INSTANCES_FILE, "instances[0] (test.2).name",
                          "instance 'test.2' and the launched instance 'test-2' (meta-state/launch-params.yaml) both "
                          "become the terraform label 'instance_test_2': a launched instance keeps its name; name it "
                          "'test-2' again, or decommission 'test-2' first (undeclare it, run playbooks/instance_image.yml)")]


def test_a_broken_storage_state_file_is_reported_not_guessed(tmp_path):
    """An unreadable record is reported at its key; the state machine does not run on a guess."""
    root = make_tree(tmp_path, "mnt_data", "archived", None)
    os.makedirs(os.path.join(root, "meta-state"), exist_ok=True)
    with open(os.path.join(root, "meta-state", "storage-state.yaml"), "w") as fh:
        fh.write("storages:\n  mnt_data: {state: gone}\n")
    assert run(root) == [(RECORDS_FILE, "storages.mnt_data.state",
                          "must be one of active|archived|destroyed, got 'gone'")]
