# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Issue 16, defects 1 and 2, reproduced as the issue describes them against real terraform,
real ansible-playbook and the session's moto server. One EBS tree (no S3 bucket), whose first
run is the killed one; the tests run in file order and each leaves the tree as the next expects.

1. A killed run keeps applying: ``kill -9 -- -<pgid>`` of ansible-playbook 2 s after
   ``terraform apply`` appears. terraform runs under the role's ``csis-tf-supervise``, which
   stops it gracefully (one SIGINT) once the controller is gone: no ``terraform apply`` is
   left running, the state lock is released, and the next run converges and records (when
   the stop cut the volume's create short, the volume is tainted: the gate refuses its
   replacement until the operator untaints it, as docs/operations.md says).
2. A vanished volume is silently re-created empty: the volume of a recorded active storage
   is deleted out of band; the next storage run (no state query in between) stops before
   the plan with the drift report's ``missing ... [HARD]`` line, creates nothing and writes
   no meta-state.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

pytestmark = e2e.needs_terraform()

EBS_ROOT = e2e.EBS_ROOT


def overlays(ep):
    return [ep.overlay_path, e2e.APPLY_ALL]


def records(root):
    return e2e.meta(root, "storage-state.yaml").get("storages") or {}


def volumes_of(ep, vid):
    try:
        return ep.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"]
    except Exception as exc:  # noqa: BLE001  (moto: InvalidVolume.NotFound)
        if "NotFound" in str(exc):
            return []
        raise


def tainted(state):
    """The addresses of the tainted resource instances in a pulled state."""
    out = []
    for r in state.get("resources") or []:
        base = ".".join(x for x in (r.get("module"), r.get("type"), r.get("name")) if x)
        out += [base for i in r.get("instances") or [] if i.get("status") == "tainted"]
    return out


def lock_objects(ep, key):
    return [o["Key"] for o in ep.client("s3").list_objects_v2(Bucket=ep.state_bucket, Prefix="statefiles/%s/" % key)
            .get("Contents", []) if o["Key"].endswith(".tflock")]


@pytest.fixture(scope="module")
def tree(moto_endpoint, tmp_path_factory):
    parent = str(tmp_path_factory.mktemp("interrupted"))
    key = "int-%s" % uuid.uuid4().hex[:8]
    # its own tree id, so its resources carry their own csis_config tag: the other files on the
    # shared endpoint declare storages named p1 and p2 too (tests/faults/test_kill_at_every_step.py)
    # not applied here: the killed run below is the tree's first (the supervisor's stop is the same
    # for a first apply as for a later one), and its re-run applies the tree
    root = e2e.make_ebs_tree(parent, key, tree_id=key)
    return SimpleNamespace(root=root, key=key, root_dir=os.path.realpath(os.path.join(root, EBS_ROOT)),
                           log=lambda n: os.path.join(parent, n))


def test_killed_run_does_not_leave_terraform_applying(tree, moto_endpoint):
    ep = moto_endpoint
    storages = os.path.join(tree.root, "storages", "storage0.yaml")
    doc = e2e.read_yaml(storages)
    doc["storages"].append({"name": "p1", "mount_point": "/mnt/p1", "groups": ["coops"], "state": "active"})
    e2e.write_yaml(storages, doc)

    def applying(p):
        return e2e.is_terraform_apply(p) and os.path.realpath(p["cwd"]) == tree.root_dir

    proc = e2e.start_playbook("storage.yml", tree.root, ep.env, tree.log("killed.log"), overlays=overlays(ep))
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None and not e2e.processes(applying):
        time.sleep(0.2)
    assert e2e.processes(applying), open(tree.log("killed.log"), encoding="utf-8").read()[-4000:]
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)          # kill -9 -- -<pgid>, as the issue does
    proc.wait()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120 and e2e.processes(applying):
        time.sleep(0.5)
    left = e2e.processes(applying)
    assert not left, "terraform apply still running %.0f s after the kill: %r" % (time.monotonic() - t0, left)
    assert not lock_objects(ep, tree.key), "the stopped apply left its state lock"
    assert not records(tree.root)

    # Where the SIGINT lands is the machine's timing: before the create (nothing in the state),
    # after it (the volume in the state), or inside the provider's wait for the new volume, which
    # the stop cuts short: the volume then comes back TAINTED. Its plan is a replacement, which
    # the gate refuses; the operator checks the volume and untaints it (docs/operations.md,
    # "Killed runs"). Either way the next runs converge and nothing is orphaned.
    # (the run is the tree's first: both volumes, mnt_data's and p1's, were being created)
    cut = tainted(e2e.tf_state_pull(tree.root_dir, ep.env))
    if cut:
        refused = e2e.run_playbook("storage.yml", tree.root, ep.env, overlays=overlays(ep),
                                   log=tree.log("after-kill-tainted.log"))
        assert refused.rc != 0
        for address in cut:
            assert "DESTROY NOT WHITELISTED: %s" % address in refused.out, refused.tail()
        assert not records(tree.root)
        for address in cut:
            e2e.terraform_in(tree.root_dir, ep.env, "untaint", address)

    rerun = e2e.run_playbook("storage.yml", tree.root, ep.env, overlays=overlays(ep), log=tree.log("after-kill.log"))
    assert rerun.rc == 0, rerun.tail()
    recs = records(tree.root)
    assert recs["p1"]["state"] == "active"
    state_ids = e2e.state_ids(e2e.tf_state_pull(tree.root_dir, ep.env), "aws_ebs_volume")
    assert {recs["p1"]["facts"]["volume_id"], recs["mnt_data"]["facts"]["volume_id"]} == set(state_ids)
    for vid in state_ids:
        assert volumes_of(ep, vid)


def test_an_apply_past_its_timeout_stops_gracefully_and_the_rerun_converges(tree, moto_endpoint):
    """Issue 16, defect 5: an apply is bounded (csis_apply_timeout) and shows progress while it
    runs. Past the timeout (1 s here: terraform is stopped before or while it creates) it gets
    one SIGINT and stops gracefully, saving the state and releasing its lock; the root fails
    naming the timeout, meta-state claims nothing, and the next run converges with exactly one
    new volume (nothing the stopped apply may have created is orphaned)."""
    ep = moto_endpoint
    storages = os.path.join(tree.root, "storages", "storage0.yaml")
    doc = e2e.read_yaml(storages)
    doc["storages"].append({"name": "p2", "mount_point": "/mnt/p2", "groups": ["coops"], "state": "active"})
    e2e.write_yaml(storages, doc)
    before = e2e.meta_state_digest(tree.root)
    named_p2 = _volumes_named(ep, tree, "p2")
    run = e2e.run_playbook("storage.yml", tree.root, ep.env, overlays=overlays(ep), log=tree.log("timeout.log"),
                           extra_vars={"csis_apply_timeout": 1, "csis_progress_interval": 1})
    assert run.rc != 0
    text = " ".join(run.out.split())
    assert "it ran longer than 1 s (csis_apply_timeout): stopping terraform gracefully (SIGINT" in text, run.tail()
    assert "storage-aws-ebs: apply still running after 1 s (follow it: tail -f %s/.apply.log)" % tree.root_dir in text
    with open(os.path.join(tree.root_dir, ".apply.log"), encoding="utf-8") as fh:
        assert "Interrupt received" in fh.read()                       # terraform's own output, as it came
    assert not e2e.processes(lambda p: e2e.is_terraform_apply(p) and os.path.realpath(p["cwd"]) == tree.root_dir)
    assert not lock_objects(ep, tree.key), "the stopped apply left its state lock"
    assert e2e.meta_state_digest(tree.root) == before and "p2" not in records(tree.root)

    rerun = e2e.run_playbook("storage.yml", tree.root, ep.env, overlays=overlays(ep), log=tree.log("after-timeout.log"))
    assert rerun.rc == 0, rerun.tail()
    vid = records(tree.root)["p2"]["facts"]["volume_id"]
    assert volumes_of(ep, vid)
    assert _volumes_named(ep, tree, "p2") - named_p2 == {vid}, "the interrupted create left an orphan"


def _volumes_named(ep, tree, name):
    """This tree's volumes of storage ``name`` (its Name and the tree's csis_config tag): the other
    test files share the endpoint and create volumes of their own, some of the same names."""
    vols = ep.client("ec2").describe_volumes(Filters=[{"Name": "tag:Name", "Values": [name]},
                                                      {"Name": "tag:csis_config", "Values": [tree.key]}])["Volumes"]
    return {v["VolumeId"] for v in vols}


def all_volume_ids(ep, tree):
    """The volumes of this tree's storage p1."""
    return _volumes_named(ep, tree, "p1")


def test_vanished_volume_is_not_recreated_empty(tree, moto_endpoint):
    ep = moto_endpoint
    gone = records(tree.root)["p1"]["facts"]["volume_id"]
    ep.client("ec2").delete_volume(VolumeId=gone)             # out of band; no state query afterwards
    before, vols = e2e.meta_state_digest(tree.root), all_volume_ids(ep, tree)
    run = e2e.run_playbook("storage.yml", tree.root, ep.env, overlays=overlays(ep), log=tree.log("vanished.log"))
    assert run.rc != 0
    line = "missing  storage  p1: recorded active but not found in reality (volume %s) [HARD]" % gone
    assert line in run.out, run.tail()
    assert "playbooks/forget.yml -e forget_storage=p1 -e force=true" in run.out
    assert "Plan to a plan file" not in run.out
    assert all_volume_ids(ep, tree) == vols                         # nothing created
    assert e2e.meta_state_digest(tree.root) == before         # nothing recorded

    # the operator says "gone for good": forget, then the next run creates and records a new volume (answered
    # as the "csis forget" AWX job template's survey passes it: the other name left blank is null, force a string)
    forget = e2e.run_playbook("forget.yml", tree.root, ep.env, overlays=[ep.overlay_path],
                              extra_vars={"forget_storage": "p1", "forget_instance": None, "force": "true"},
                              log=tree.log("forget.log"))
    assert forget.rc == 0, forget.tail()
    again = e2e.run_playbook("storage.yml", tree.root, ep.env, overlays=overlays(ep), log=tree.log("recreated.log"))
    assert again.rc == 0, again.tail()
    assert e2e.plan_summaries(again.out)["storage-aws-ebs"].startswith("Plan: 1 to add, 0 to change, 0 to destroy")
    new = records(tree.root)["p1"]["facts"]["volume_id"]
    assert new != gone and volumes_of(ep, new)


def test_gate_refuses_to_create_a_recorded_storage(tree, moto_endpoint):
    """The volume exists but the terraform state lost it: the reality check passes, the plan
    creates the recorded storage again, and the gate refuses it."""
    ep = moto_endpoint
    address = "module.storage_p1.aws_ebs_volume.this"
    e2e.terraform_in(tree.root_dir, ep.env, "state", "rm", address)
    before, vols = e2e.meta_state_digest(tree.root), all_volume_ids(ep, tree)
    run = e2e.run_playbook("storage.yml", tree.root, ep.env, overlays=overlays(ep), log=tree.log("state-lost.log"))
    assert run.rc != 0
    assert "RECORDED STORAGE WOULD BE CREATED: %s" % address in run.out, run.tail()
    assert "Apply exactly that plan file" not in run.out
    assert all_volume_ids(ep, tree) == vols
    assert e2e.meta_state_digest(tree.root) == before
    # no record changed, and the audit trail holds the refusal (playbooks/history.yml -e history_root=...)
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import history_report
    lines = history_report(tree.root, root="storage-aws-ebs")["lines"]
    assert any("gate refused storage-aws-ebs" in line and "RECORDED STORAGE WOULD BE CREATED: %s" % address in line
               for line in lines), lines
