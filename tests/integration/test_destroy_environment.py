# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The cascade destroy of an environment end to end (real terraform, the session's moto server,
real ansible-playbook), on the smallest tree that has every phase: one runtime in the example's
environment, one EBS storage, one durable instance mounting it, the identity root of its group.

Three playbook runs: ``site.yml`` applies the tree; ``destroy_environment.yml`` as a dry run
prints the order and every destroy and changes nothing (meta-state byte-identical, no plan);
the real cascade then decommissions the instance, archives the volume (snapshot kept, then the
volume's destroy) and destroys the identity root, in that order, each root through plan,
gate (with its whitelist), apply-check and apply. The endpoint (boto3) and meta-state are
read back.
"""
from __future__ import annotations

import re

import pytest

from day2_trees import Runner, make_tree, meta, meta_bytes, register_ami, tail, text

pytestmark = pytest.mark.integration

TAG = "csis-cascade"
DASK = "cascade-dask-pckr"
RT = "aws-east2-runtime"
ENV = "example-us-east-2"


@pytest.fixture(scope="module")
def tree(moto_endpoint, tmp_path_factory):
    register_ami(moto_endpoint, DASK + "-1")
    images = [{"name": "imgfile-basic-dask", "group": "coops", "name_pattern": DASK, "storage_types": ["ebs"],
               "runtimes": [RT]}]
    storages = [{"name": "mnt_data", "mount_point": "/mnt/data", "groups": ["coops"], "state": "active"}]
    instances = [{"name": "test2", "image": "imgfile-basic-dask",
                  "storages": [{"name": "mnt_data", "mount_point": "/mnt/data"}]}]
    root = make_tree(str(tmp_path_factory.mktemp("cascade")), TAG, storages, instances, images=images)
    t = Runner(root, moto_endpoint)
    res = t.play("site.yml")
    assert res.returncode == 0, tail(res)
    return t


def test_dry_run_prints_the_order_and_changes_nothing(tree):
    before = meta_bytes(tree.root)
    res = tree.play("destroy_environment.yml", real=False, csis_environment=ENV)
    assert res.returncode == 0, tail(res)
    # the documented variable: no Ansible warning (`-e environment=`, the real run below, has one)
    assert "[WARNING]" not in res.stdout + res.stderr, tail(res)
    out = text(res).replace("''", "'")  # the YAML callback doubles the quotes of quoted lines
    order = ["cascade of environment '%s' (runtimes: %s), leaves first:" % (ENV, RT),
             "1. ephemeral (instance-image): nothing to do",
             "2. durable (instance-image): undeclare test2",
             "destroy instance-image-open-tofu: module.instance_test2",
             "3. storage (storage): request mnt_data archived",
             "storage-aws-ebs: snapshot storage 'mnt_data' as csis-mnt_data-archive (kept)",
             "destroy storage-aws-ebs: module.storage_mnt_data",
             "4. identity (identity): destroy the identity roots of posix-groups",
             "destroy identity-posix-groups: module.identity",
             "(dry run: nothing is planned or applied)"]
    at = [out.find(x) for x in order]
    assert -1 not in at and at == sorted(at), (at, out[-6000:])
    assert "Plan to a plan file" not in out and "Plan:" not in out
    assert meta_bytes(tree.root) == before


def test_check_mode_asks_for_no_approval_and_changes_nothing(tree):
    """--check of the real cascade shows the order and every destroy, as the dry run does, and runs
    no phase (each plans on what the one before it applied, which check mode does not apply): it
    asks for no approval, which a non-interactive check (an AWX job) could not give."""
    before = meta_bytes(tree.root)
    res = tree.play("destroy_environment.yml", args=["--check"], csis_environment=ENV, csis_auto_approve=False)
    assert res.returncode == 0, tail(res)
    out = text(res)
    assert "Type 'yes'" not in out and "Not approved" not in out and "Plan:" not in out, tail(res)
    assert "destroy instance-image-open-tofu: module.instance_test2" in out, tail(res)
    assert "(check mode: nothing is planned or applied; each phase plans on what the one before it applied)" in out
    # no phase ran: each phase's render is skipped
    renders = re.findall(r"^TASK \[csis\.infra\.render : Render the [^\n]*\n(?:[^\n]*\+0000 [^\n]*\n)?(\w+)", res.stdout, re.M)
    assert renders and set(renders) == {"skipping"}, (renders, tail(res))
    assert meta_bytes(tree.root) == before


def test_a_real_cascade_refuses_on_hard_drift_before_its_approval(tree):
    """What every phase's render refuses to start on (here the last state query's HARD line, kept in
    meta-state) stops the real cascade before it asks for, and records, its one approval: not after
    the approval, at the first phase, leaving an approval in the trail for work that never ran."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.drift import record_hard
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState, audit_trail

    line = {"kind": "storage", "name": "mnt_data", "drift": "missing", "hard": True,
            "detail": "recorded active but not found in reality (volume vol-0gone)"}
    record_hard(tree.root, {"drift": [line]})
    try:
        revision = MetaState(tree.root).revision()
        res = tree.play("destroy_environment.yml", csis_environment=ENV)
        assert res.returncode != 0, tail(res)
        out = " ".join(text(res).split())
        assert "state: missing storage mnt_data: recorded active but not found in reality (volume vol-0gone)" in out, \
            tail(res)
        assert "Plan:" not in out and "Type 'yes'" not in out, tail(res)
        assert MetaState(tree.root).revision() == revision   # no approval recorded, nothing else
        assert not [d for d in audit_trail(MetaState(tree.root))
                    if any(e.get("kind") == "cascade approved" for e in d.get("events") or [])]
    finally:
        record_hard(tree.root, {"drift": []})  # the line cleared, as a state query that saw the volume does


def test_the_cascade_destroys_leaves_first(tree):
    ec2 = tree.moto.client("ec2")
    vol = meta(tree.root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    iid = meta(tree.root, "instance-state.yaml")["instances"]["test2"]["current"]["instance_id"]
    # as an AWX job runs it: the cascade's approval names the AWX user and job, as every record does;
    # `-e environment=<name>`, the variable's other name, is read as well. The tree's store is local,
    # which an AWX job refuses unless its checkout outlives it (csis_awx_local_meta_state)
    res = tree.play("destroy_environment.yml", environment=ENV, awx_user_name="carol", awx_job_id=77,
                    awx_workflow_job_id=70, csis_awx_local_meta_state=True)
    assert res.returncode == 0, tail(res)
    out = text(res)
    plans = re.findall(r"([\w-]+): Plan: (\d+) to add, (\d+) to change, (\d+) to destroy", out)
    destroyed = [k for k, _a, _c, d in plans if d != "0"]
    assert sorted(set(destroyed), key=destroyed.index) == ["instance-image-open-tofu", "storage-aws-ebs", "identity-posix-groups"], plans
    assert all(a == "0" for _k, a, _c, _d in plans), plans  # a cascade creates nothing
    # the endpoint: the machine and the volume are gone, the archive snapshot is kept
    state = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("terminated", "shutting-down")
    assert not [v for v in ec2.describe_volumes()["Volumes"] if v["VolumeId"] == vol]
    archive = [{"Name": "tag:Name", "Values": ["csis-mnt_data-archive"]}, {"Name": "tag:csis_config", "Values": [TAG]}]
    snaps = ec2.describe_snapshots(OwnerIds=["self"], Filters=archive)["Snapshots"]
    assert [s["VolumeId"] for s in snaps] == [vol]
    # meta-state: the instance decommissioned (its history kept), the storage archived
    assert "test2" not in meta(tree.root, "launch-params.yaml")["instances"]
    hist = meta(tree.root, "instance-state.yaml")["instances"]["test2"]
    assert hist["current"] is None and hist["history"][-1]["instance_id"] == iid
    rec = meta(tree.root, "storage-state.yaml")["storages"]["mnt_data"]
    assert rec["state"] == "archived" and rec["facts"]["archive"] == "csis-mnt_data-archive"
    assert [h["to"] for h in rec["history"]][-1] == "archived"
    # the one approval is in the trail, before every phase's records, naming the destroys
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState, audit_trail

    trail = audit_trail(MetaState(tree.root))
    approvals = [d for d in trail if any(e.get("kind") == "cascade approved" for e in d.get("events") or [])]
    assert len(approvals) == 1, [d.get("what") for d in trail]
    event = [e for e in approvals[0]["events"] if e.get("kind") == "cascade approved"][0]
    assert event["root"] == "environment %s" % ENV and event["detail"].startswith("auto-approve")
    assert "instance-image-open-tofu: module.instance_test2" in event["detail"]
    who = approvals[0]["who"]
    assert (who.get("awx_user_name"), who.get("awx_job_id"), who.get("awx_workflow_job_id")) == ("carol", "77", "70"), who
    later = [d for d in trail if d["revision"] > approvals[0]["revision"] and d.get("changes")]
    assert later, "no phase recorded after the approval"
