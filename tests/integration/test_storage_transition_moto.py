# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""csis_storage_transition's steps against the session's moto server (apply/transitions.py):
check mode reads what the step would find and changes nothing, and a step is ``changed`` only
when it changed something (a snapshot taken, not reused; a snapshot deleted; an object
removed). The end-to-end archive, restore and bucket destroy are tests/integration/test_day2_storage.py."""
from __future__ import annotations

import json
import os
import uuid

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis import aws
from ansible_collections.csis.infra.plugins.module_utils.csis.apply import transitions
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.transitions import (
    TransitionError, changed_by, probe_transition, run_transition)

pytestmark = pytest.mark.integration


@pytest.fixture()
def root(moto_endpoint, monkeypatch, tmp_path):
    for key, value in moto_endpoint.env.items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    url = moto_endpoint.url
    return {"key": "storage-aws-ebs", "aws": {"region": "us-east-2", "endpoints": {"ec2": url, "s3": url}},
            "directory": str(tmp_path / "root")}


def hold_volume(root, storage, volume):
    """The root's terraform state (a local backend, read as a run reads it) holds ``volume`` as ``storage``'s."""
    data = os.path.join(root["directory"], ".terraform")
    os.makedirs(data, exist_ok=True)
    with open(os.path.join(data, "terraform.tfstate"), "w", encoding="utf-8") as fh:
        json.dump({"version": 3, "backend": {"type": "local", "config": {"path": None}}}, fh)
    resources = [{"mode": "managed", "module": "module.storage_%s" % storage, "type": "aws_ebs_volume", "name": "this",
                  "instances": [{"attributes": {"id": volume}}]}] if volume else []
    with open(os.path.join(root["directory"], "terraform.tfstate"), "w", encoding="utf-8") as fh:
        json.dump({"version": 4, "serial": 1, "lineage": "l", "outputs": {}, "resources": resources}, fh)


def step(root, t):
    """What check mode says, then what the step does, as the module reports them."""
    probe = probe_transition(root, t)
    res = run_transition(root, t)
    return probe, res, changed_by(t["action"], res)


def test_check_mode_tells_the_step_that_changes_from_the_one_that_does_not(root, moto_endpoint):
    ec2, s3 = moto_endpoint.client("ec2"), moto_endpoint.client("s3")
    tag = "csis-tr-%s" % uuid.uuid4().hex[:8]
    storage = "mnt_data"
    name = "csis-%s-archive" % storage
    vol = ec2.create_volume(AvailabilityZone="us-east-2a", Size=1)["VolumeId"]
    hold_volume(root, storage, vol)
    snap = {"storage": storage, "action": "snapshot", "snapshot_name": name, "tags": {"csis_config": tag},
            "cost_tags": {"BillingCode": "CSIS-0001", "csis_config": "not-the-trees"}}

    probe = probe_transition(root, snap)
    assert probe == {"would": "snapshot storage mnt_data as %s" % name, "changed": True}
    assert not ec2.describe_snapshots(OwnerIds=["self"], Filters=[{"Name": "tag:csis_config", "Values": [tag]}])["Snapshots"]
    taken = transitions.snapshot(root, snap, aws.root_access(root["aws"], None), timeout=120)
    assert taken["created"] is True and changed_by("snapshot", taken)
    # labelled with the volume's cost tags; the tags it is found by win over them
    (made,) = ec2.describe_snapshots(SnapshotIds=[taken["snapshot_id"]])["Snapshots"]
    assert {t["Key"]: t["Value"] for t in made["Tags"]} == {"BillingCode": "CSIS-0001", "Name": name,
                                                            "csis_storage": storage, "csis_config": tag}
    # a second archive run finds it: reused, not changed, and check mode says so first
    probe, res, changed = step(root, snap)
    assert probe == {"would": "reuse archive snapshot %s" % taken["snapshot_id"], "changed": False}
    assert (res["snapshot_id"], res["created"], changed) == (taken["snapshot_id"], False, False)

    delete = {"storage": storage, "action": "delete_archive_snapshot", "snapshot_name": name, "tags": {"csis_config": tag}}
    probe, res, changed = step(root, delete)
    assert probe == {"would": "delete archive snapshot(s) %s" % taken["snapshot_id"], "changed": True}
    assert (res["deleted"], changed) == ([taken["snapshot_id"]], True)
    probe, res, changed = step(root, delete)
    assert probe == {"would": "nothing (no archive snapshot %s)" % name, "changed": False}
    assert (res["deleted"], changed) == ([], False)

    bucket = tag + "-bucket"
    wipe = {"storage": "b", "action": "empty_bucket", "bucket": bucket}
    assert probe_transition(root, wipe) == {"would": "nothing (no bucket %s)" % bucket, "changed": False}
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-east-2"})
    assert probe_transition(root, wipe) == {"would": "nothing (bucket %s is empty)" % bucket, "changed": False}
    s3.put_object(Bucket=bucket, Key="team/precious.txt", Body=b"data")
    probe, res, changed = step(root, wipe)
    assert probe == {"would": "empty bucket %s" % bucket, "changed": True}
    assert (res["removed"], changed) == (1, True)
    assert s3.list_object_versions(Bucket=bucket).get("Versions") is None
    probe, res, changed = step(root, wipe)
    assert (probe["changed"], res["removed"], changed) == (False, 0, False)

    with pytest.raises(TransitionError, match="unknown storage transition action 'shred'"):
        probe_transition(root, {"storage": storage, "action": "shred"})
    record = probe_transition(root, {"storage": storage, "action": "record"})
    assert record == {"would": "nothing (a record only)", "changed": False}


def test_an_earlier_archives_snapshot_left_behind_is_never_taken_for_this_one(root, moto_endpoint):
    """A restore whose snapshot deletion failed leaves the earlier archive's snapshot behind, with
    the archive's tags. The next archive of the restored volume must snapshot that volume: taking the
    old snapshot as its own would let the apply destroy the volume with an old copy of its data."""
    ec2 = moto_endpoint.client("ec2")
    tag = "csis-tr-%s" % uuid.uuid4().hex[:8]
    storage = "mnt_data"
    name = "csis-%s-archive" % storage
    snap = {"storage": storage, "action": "snapshot", "snapshot_name": name, "tags": {"csis_config": tag}}
    first = ec2.create_volume(AvailabilityZone="us-east-2a", Size=1)["VolumeId"]
    hold_volume(root, storage, first)
    old = run_transition(root, dict(snap, volume_id=first))  # meta-state records the volume it archives
    assert old["created"] is True
    # restored from it: a new volume; the old snapshot's deletion never happened
    restored = ec2.create_volume(AvailabilityZone="us-east-2a", Size=1, SnapshotId=old["snapshot_id"])["VolumeId"]
    hold_volume(root, storage, restored)
    snap = dict(snap, volume_id=restored)

    probe, res, changed = step(root, snap)
    assert probe == {"would": "snapshot storage mnt_data as %s" % name, "changed": True}
    assert res["created"] is True and changed and res["snapshot_id"] != old["snapshot_id"]
    assert ec2.describe_snapshots(SnapshotIds=[res["snapshot_id"]])["Snapshots"][0]["VolumeId"] == restored
    # that run stopped after its snapshot: the next takes it, not the old one
    probe, again, changed = step(root, snap)
    assert probe == {"would": "reuse archive snapshot %s" % res["snapshot_id"], "changed": False}
    assert (again["snapshot_id"], again["created"], changed) == (res["snapshot_id"], False, False)
    # and once the apply destroyed the volume (the state holds none), the snapshot of the volume meta-state
    # recorded is this archive's, never the older one (moto's snapshots of one second tie on StartTime)
    hold_volume(root, storage, None)
    probe, after, changed = step(root, snap)
    assert (after["snapshot_id"], after["created"], changed) == (res["snapshot_id"], False, False)
    assert probe == {"would": "reuse archive snapshot %s" % res["snapshot_id"], "changed": False}
