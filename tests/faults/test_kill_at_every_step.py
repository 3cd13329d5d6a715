# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Issue 14, item 1: a storage run SIGKILLed (the whole run: ansible-playbook, its modules, the
daemonised async apply, csis-tf-supervise and terraform, all stopped first so none can react)
at every step, each time followed by a plain re-run that must converge with nothing lost.

ONE one-EBS tree for the file (its own tree id, so the drift report's foreign scan sees only
its own resources, and its own state key); the cases run in file order and each re-run is
the next case's starting point: each case declares one more storage, kills the run that
would create it, checks what the kill left, then runs again.

=====================  ====================================================================
kill                   the moment
=====================  ====================================================================
during render          ``terraform init`` of the root runs (under csis_render), first run
during plan            ``terraform plan`` runs in the root and holds the S3 state lock
between gate and apply the "Re-read the apply flags" task has started (the gate passed)
during the apply       the new volume exists at the endpoint (boto3, polled): terraform has
                       sent the create call; its state write follows the provider's wait
during record          the "Record what the state now holds" task has started
=====================  ====================================================================

Before the re-run after the kill between gate and apply, a lock of another machine is put in the
bucket (as a killed AWX job's would be, its container gone): the next run refuses it, naming its
ID and ``csis_force_unlock``; the run with that ID releases it and converges. Each lock a run
releases is in the audit trail.

After every kill, meta-state never claims what is not there: each record's volume is in the
terraform state and at the endpoint. The apply kill leaves a volume the state may not hold
(the test says which case it hit): the drift report names it ``foreign`` (it carries the tree's
tag), ``state_import.yml`` adopts it (meta-state and the root's terraform state), and the
re-run then plans no create.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

pytestmark = e2e.needs_terraform()

EBS_ROOT = e2e.EBS_ROOT
STEP_TIMEOUT = 900  # a bound on a hung run, never a threshold the test asserts


def overlays(ep):
    return [ep.overlay_path, e2e.APPLY_ALL]


@pytest.fixture(scope="module")
def tree(moto_endpoint, tmp_path_factory):
    parent = str(tmp_path_factory.mktemp("faults"))
    key = "faults-%s" % uuid.uuid4().hex[:8]
    root = e2e.make_ebs_tree(parent, key, tree_id=key)
    return SimpleNamespace(root=root, key=key, tag=key, root_dir=os.path.realpath(os.path.join(root, EBS_ROOT)),
                           log=lambda n: os.path.join(parent, n))


# ------------------------------------------------------------------ helpers
def records(tree):
    return e2e.meta(tree.root, "storage-state.yaml").get("storages") or {}


def declare(tree, name):
    path = os.path.join(tree.root, "storages", "storage0.yaml")
    doc = e2e.read_yaml(path)
    doc["storages"].append({"name": name, "mount_point": "/mnt/%s" % name, "groups": ["coops"], "state": "active"})
    e2e.write_yaml(path, doc)


def tagged_volumes(ep, tree, name):
    """{id: state} of the volumes carrying this tree's tag and the Name of storage ``name``."""
    vols = ep.client("ec2").describe_volumes(Filters=[{"Name": "tag:Name", "Values": [name]},
                                                      {"Name": "tag:csis_config", "Values": [tree.tag]}])["Volumes"]
    return {v["VolumeId"]: v["State"] for v in vols}


def state_lock_objects(ep, tree):
    """The S3 backend's lock objects of the tree's state (terraform holds one while it applies)."""
    return [o["Key"] for o in ep.client("s3").list_objects_v2(Bucket=ep.state_bucket, Prefix="statefiles/%s/" % tree.key)
            .get("Contents", []) if o["Key"].endswith(".tflock")]


def state_volume_ids(tree, ep):
    if not os.path.isdir(os.path.join(tree.root_dir, ".terraform")):
        return set()
    return set(e2e.state_ids(e2e.tf_state_pull(tree.root_dir, ep.env), "aws_ebs_volume"))


def assert_meta_state_true(tree, ep):
    """Meta-state never lies: every active record's volume is in the root's terraform state and
    exists at the endpoint (the store reading every file whole is part of it)."""
    recs = records(tree)
    in_state = state_volume_ids(tree, ep)
    for name, rec in recs.items():
        if rec.get("state") != "active":
            continue
        vid = rec["facts"]["volume_id"]
        assert vid in in_state, "meta-state records %s as %s, which the terraform state does not hold" % (name, vid)
        assert vid in tagged_volumes(ep, tree, name), "meta-state records %s as %s, which does not exist" % (name, vid)
    return recs


def assert_all_gone(tree, proc):
    """No process of the killed run is left (a killed process may show for a moment while the
    kernel tears it down: :func:`e2e.processes_left` waits for that, bounded)."""
    left = e2e.processes_left(proc.pid, [tree.root_dir])
    assert not left, "processes of the killed run live on: %r" % left


def kill_when(tree, proc, log, predicate, poll=0.05):
    """SIGKILL the whole run as soon as ``predicate(log text)`` holds; returns True if it did
    (False: the run ended first)."""
    deadline = time.monotonic() + STEP_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        with open(log, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if predicate(text):
            e2e.kill_tree(proc.pid, [tree.root_dir])
            proc.wait()
            return True
        time.sleep(poll)
    if proc.poll() is None:
        e2e.kill_tree(proc.pid, [tree.root_dir])
        proc.wait()
    return False


def kill_at_process(tree, ep, log, predicate):
    proc = e2e.start_playbook("storage.yml", tree.root, ep.env, tree.log(log), overlays=overlays(ep))
    hit = e2e.kill_tree_when(proc, predicate, timeout=STEP_TIMEOUT, poll=0.1, dirs=[tree.root_dir])
    assert hit is not None, open(tree.log(log), encoding="utf-8").read()[-4000:]
    assert_all_gone(tree, proc)
    return hit


def kill_at_task(tree, ep, log, task):
    header = "TASK [%s]" % task
    proc = e2e.start_playbook("storage.yml", tree.root, ep.env, tree.log(log), overlays=overlays(ep))
    assert kill_when(tree, proc, tree.log(log), lambda text: header in text), \
        open(tree.log(log), encoding="utf-8").read()[-4000:]
    assert_all_gone(tree, proc)


def rerun(tree, ep, log, name, extra_vars=None):
    """The plain re-run after a kill: it converges, ``name`` is recorded active with the one
    volume of that name, and every record is true."""
    run = e2e.run_playbook("storage.yml", tree.root, ep.env, overlays=overlays(ep), log=tree.log(log),
                           extra_vars=extra_vars)
    assert run.rc == 0, run.tail()
    recs = assert_meta_state_true(tree, ep)
    assert recs[name]["state"] == "active"
    assert set(tagged_volumes(ep, tree, name)) == {recs[name]["facts"]["volume_id"]}, "a duplicate or orphan volume"
    return run, recs


def in_root(tree, verb):
    def pred(p):
        argv = p["argv"]
        return (bool(argv) and os.path.basename(argv[0]) in ("terraform", "tofu") and verb in argv[1:3]
                and os.path.realpath(p["cwd"]) == tree.root_dir)
    return pred


# ------------------------------------------------------------------ the cases, in order
def test_killed_during_render(tree, moto_endpoint):
    ep = moto_endpoint
    kill_at_process(tree, ep, "render-killed.log", in_root(tree, "init"))
    assert not tagged_volumes(ep, tree, "mnt_data")
    assert not records(tree)                                     # render writes no meta-state
    _run, recs = rerun(tree, ep, "render-rerun.log", "mnt_data")
    tree.first = recs["mnt_data"]["facts"]["volume_id"]


def test_killed_during_plan(tree, moto_endpoint):
    ep = moto_endpoint
    declare(tree, "p1")
    before = e2e.meta_state_digest(tree.root)
    planning = in_root(tree, "plan")
    # while terraform plans it holds the S3 state lock: killed then, it leaves the lock behind
    kill_at_process(tree, ep, "plan-killed.log", lambda p: planning(p) and bool(state_lock_objects(ep, tree)))
    assert e2e.meta_state_digest(tree.root) == before
    assert not tagged_volumes(ep, tree, "p1")
    assert_meta_state_true(tree, ep)
    locks = state_lock_objects(ep, tree)
    assert locks, "the killed plan left no state lock (the case this test is about)"
    tree.lock_key = locks[0]
    run, recs = rerun(tree, ep, "plan-rerun.log", "p1")
    assert recs["mnt_data"]["facts"]["volume_id"] == tree.first
    # the plan step released the dead run's lock (its holder, a terraform of this machine, is gone),
    # saying how old it was by the store's clock, and the audit trail keeps it
    assert re.search(r"released a stale state lock: .* lock ID [\w-]+, written \d+ (s|min) ago by the store's clock\)",
                     " ".join(run.out.split())), run.tail()
    assert not state_lock_objects(ep, tree)
    released = released_locks(tree)
    assert len(released) == 1 and released[0]["root"] == "storage-aws-ebs", released
    assert "its holder on this machine is gone" in released[0]["detail"], released


def released_locks(tree):
    """The audit trail's ``state lock released`` events, oldest first."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState, audit_trail

    return [e for d in audit_trail(MetaState(tree.root)) for e in d.get("events") or []
            if e.get("kind") == "state lock released"]


def test_killed_between_gate_and_apply(tree, moto_endpoint):
    ep = moto_endpoint
    declare(tree, "p2")
    before = e2e.meta_state_digest(tree.root)
    kill_at_task(tree, ep, "gate-killed.log", "csis.infra.tofu_root : Re-read the apply flags as they are now")
    text = open(tree.log("gate-killed.log"), encoding="utf-8").read()
    assert "Gate the plan" in text and "Start the apply of exactly that plan file" not in text
    assert e2e.meta_state_digest(tree.root) == before
    assert not tagged_volumes(ep, tree, "p2")
    # and a killed AWX job's lock is there too (its container gone: a lock of another machine, which
    # csis cannot prove dead): the next run refuses, naming the lock's ID and how to release it
    lock_id = str(uuid.uuid4())
    body = {"ID": lock_id, "Operation": "OperationTypeApply", "Info": "", "Who": "runner@awx-ee-7f9c",
            "Version": "1.11.0", "Created": "2026-12-07T01:00:00.000000000Z",
            "Path": "%s/%s" % (ep.state_bucket, tree.lock_key[:-len(".tflock")])}
    ep.client("s3").put_object(Bucket=ep.state_bucket, Key=tree.lock_key, Body=json.dumps(body).encode())
    # (as an AWX workflow launched with its survey question left blank passes it: null, awx issue 16205)
    refused = e2e.run_playbook("storage.yml", tree.root, ep.env, overlays=overlays(ep), log=tree.log("gate-refused.log"),
                               extra_vars={"csis_force_unlock": None})
    flat = " ".join(refused.out.split())
    assert refused.rc != 0 and "STATE LOCKED:" in flat and "a run on another machine" in flat, refused.tail()
    assert "run again with -e csis_force_unlock=%s" % lock_id in flat, refused.tail()
    assert e2e.meta_state_digest(tree.root) == before and state_lock_objects(ep, tree) == [tree.lock_key]
    # the operator found that job gone and names its lock: the plan step releases it and the run converges
    run, recs = rerun(tree, ep, "gate-rerun.log", "p2", extra_vars={"csis_force_unlock": lock_id})
    assert recs["mnt_data"]["facts"]["volume_id"] == tree.first
    assert re.search(r"released the state lock: .* is locked by runner@awx-ee-7f9c .* lock ID %s, written \d+ (s|min) ago "
                     r"by the store's clock\); its ID was given in csis_force_unlock" % lock_id,
                     " ".join(run.out.split())), run.tail()
    assert not state_lock_objects(ep, tree)
    released = released_locks(tree)  # the audit trail: whose lock went, on whose word
    assert len(released) == 2 and lock_id in released[-1]["detail"] and "csis_force_unlock" in released[-1]["detail"]


def test_killed_during_apply_leaves_an_orphan_that_drift_reports_and_import_adopts(tree, moto_endpoint):
    ep = moto_endpoint
    declare(tree, "p3")
    before = e2e.meta_state_digest(tree.root)
    proc = e2e.start_playbook("storage.yml", tree.root, ep.env, tree.log("apply-killed.log"), overlays=overlays(ep))
    deadline, vid = time.monotonic() + STEP_TIMEOUT, None
    while time.monotonic() < deadline and proc.poll() is None and vid is None:
        vid = next(iter(tagged_volumes(ep, tree, "p3")), None)
        if vid is None:
            time.sleep(0.1)
    e2e.kill_tree(proc.pid, [tree.root_dir])        # as soon as the volume exists
    proc.wait()
    assert vid is not None, open(tree.log("apply-killed.log"), encoding="utf-8").read()[-4000:]
    assert_all_gone(tree, proc)
    assert e2e.meta_state_digest(tree.root) == before and "p3" not in records(tree)
    in_state = vid in state_volume_ids(tree, ep)
    # which case the kill hit (both are handled the same way below)
    print("apply kill: volume %s %s" % (vid, "reached the terraform state (the state write came first)" if in_state
                                        else "is NOT in the terraform state: an orphan"))
    assert_meta_state_true(tree, ep)
    # terraform held the S3 state lock when it was killed: the lock stays until a run releases it
    assert state_lock_objects(ep, tree), "the killed apply left no state lock (the case this test is about)"

    query = e2e.run_playbook("state_query.yml", tree.root, ep.env, overlays=[ep.overlay_path],
                             log=tree.log("apply-query.log"))
    assert query.rc == 0, query.tail()
    line = "foreign  storage  p3: volume %s (tagged csis_config=%s) exists but meta-state has no record of it" \
        % (vid, tree.tag)
    assert " ".join(line.split()) in " ".join(query.out.split()), query.tail()   # (the output wraps long lines)

    imp = e2e.run_playbook("state_import.yml", tree.root, ep.env, overlays=[ep.overlay_path],
                           extra_vars={"import_storage": "p3", "storage_id": vid}, log=tree.log("apply-import.log"))
    assert imp.rc == 0, imp.tail()
    adopted = ("terraform state already holds %s" % vid) if in_state else ("imported %s into the terraform state" % vid)
    flat = " ".join(imp.out.split())
    assert adopted in flat, imp.tail()
    if not in_state:
        # the import takes the state lock: the dead run's, whose holder (a terraform of this
        # machine) is gone, is released first, and the import says so
        assert "released a stale state lock" in flat, imp.tail()
        assert not state_lock_objects(ep, tree)
    assert "no drift: meta-state agrees with reality" in flat, imp.tail()   # its state query, at the end
    assert records(tree)["p3"]["facts"]["volume_id"] == vid
    assert_meta_state_true(tree, ep)

    run, recs = rerun(tree, ep, "apply-rerun.log", "p3")
    assert recs["p3"]["facts"]["volume_id"] == vid                # adopted, not created again
    if in_state:  # the import left the state alone, lock and all: the re-run's plan step released it
        assert "released a stale state lock" in " ".join(run.out.split()), run.tail()
    assert not state_lock_objects(ep, tree)
    assert e2e.plan_summaries(run.out)["storage-aws-ebs"].startswith("Plan: 0 to add"), run.tail()


def test_killed_during_record(tree, moto_endpoint):
    ep = moto_endpoint
    declare(tree, "p4")
    kill_at_task(tree, ep, "record-killed.log", "csis.infra.tofu_root : Record what the state now holds")
    made = tagged_volumes(ep, tree, "p4")
    assert len(made) == 1 and set(made) <= state_volume_ids(tree, ep)   # the apply happened, state written
    recs = assert_meta_state_true(tree, ep)                             # whole files, true records
    print("record kill: the record %s" % ("had landed" if "p4" in recs else "had not landed (nothing recorded)"))
    run, recs = rerun(tree, ep, "record-rerun.log", "p4")
    assert set(made) == {recs["p4"]["facts"]["volume_id"]}
    assert e2e.plan_summaries(run.out)["storage-aws-ebs"].startswith("Plan: 0 to add, 0 to change, 0 to destroy")
    assert {n for n, r in recs.items() if r["state"] == "active"} == {"mnt_data", "p1", "p2", "p3", "p4"}
