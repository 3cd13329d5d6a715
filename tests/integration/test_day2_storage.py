# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The storage state machine end to end (real terraform, the session's moto server, real
ansible-playbook): EBS archive -> restore of ``mnt_data``; S3 ``-> destroyed`` of a bucket
holding objects and of a versioned one; nothing data-destroying with ``apply_storage`` off.

One tree for the module (no instance mounts ``mnt_data``: the state machine refuses to
archive an attached volume), applied once by the fixture; the tests run in order.
"""
from __future__ import annotations

import os
import re

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.render import pipeline
from day2_trees import Runner, make_tree, meta, meta_bytes, tail, text, write_yaml
from e2e import changed_tasks

pytestmark = pytest.mark.integration

TAG = "csis-h8-st"
PLAIN = "%s-plain" % TAG
VERSIONED = "%s-versioned" % TAG


#: a hostile tag value (issue 14 item 6): quotes, HCL interpolation and directive openers, a
#: backslash and non-ASCII text go through validate, render, plan and apply and come back as written
HOSTILE = 'it\'s "quoted" ${var.nope} %{ if true }x%{ endif } back\\slash \u00fcn\u00efc\u00f8d\u00e9 \u65e5\u672c'


def storages(mnt_data: str = "active", plain: str = "active", versioned: str = "active"):
    return [
        {"name": "mnt_data", "mount_point": "/mnt/data", "groups": ["coops"], "state": mnt_data,
         "tags": {"hostile": HOSTILE}},
        {"name": "plainb", "type": "aws-s3", "bucket_name": PLAIN, "state": plain},
        {"name": "versb", "type": "aws-s3", "bucket_name": VERSIONED, "state": versioned},
    ]


def declare(t, **states):
    write_yaml(t.root, "storages/storage0.yaml", {"storages": storages(**states)})


def archive_snaps(t):
    ec2 = t.moto.client("ec2")
    return ec2.describe_snapshots(OwnerIds=["self"], Filters=[
        {"Name": "tag:Name", "Values": ["csis-mnt_data-archive"]},
        {"Name": "tag:csis_config", "Values": [TAG]}])["Snapshots"]


def volume(t, vid):
    ec2 = t.moto.client("ec2")
    try:
        return ec2.describe_volumes(VolumeIds=[vid])["Volumes"]
    except Exception as exc:  # InvalidVolume.NotFound
        assert "NotFound" in str(exc), exc
        return []


def bucket_objects(t, bucket):
    s3 = t.moto.client("s3")
    try:
        vs = s3.list_object_versions(Bucket=bucket)
    except s3.exceptions.NoSuchBucket:
        return None
    return sorted((v["Key"], v["VersionId"]) for v in vs.get("Versions", []))


def bucket_exists(t, bucket):
    s3 = t.moto.client("s3")
    try:
        s3.head_bucket(Bucket=bucket)
        return True
    except Exception:
        return False


@pytest.fixture(scope="module")
def tree(moto_endpoint, tmp_path_factory):
    root = make_tree(str(tmp_path_factory.mktemp("day2-storage")), TAG, storages(), [])
    t = Runner(root, moto_endpoint)
    res = t.play("storage.yml")
    assert res.returncode == 0, tail(res)
    st = meta(root, "storage-state.yaml")["storages"]
    assert {n: r["state"] for n, r in st.items()} == {"mnt_data": "active", "plainb": "active", "versb": "active"}
    s3 = moto_endpoint.client("s3")
    for i in range(3):
        s3.put_object(Bucket=PLAIN, Key="team/precious-%d.txt" % i, Body=b"data")
    s3.put_bucket_versioning(Bucket=VERSIONED, VersioningConfiguration={"Status": "Enabled"})
    for i in range(3):
        s3.put_object(Bucket=VERSIONED, Key="team/doc.txt", Body=b"v%d" % i)
    s3.delete_object(Bucket=VERSIONED, Key="team/doc.txt")  # a delete marker too
    t.volume_id = st["mnt_data"]["facts"]["volume_id"]
    tags = {x["Key"]: x["Value"] for x in volume(t, t.volume_id)[0].get("Tags") or []}
    assert tags.get("hostile") == HOSTILE, tags  # read back from the endpoint, byte for byte
    return t


def test_bucket_destroy_with_apply_storage_off_destroys_nothing(tree):
    declare(tree, plain="destroyed", versioned="destroyed")
    before_objects = bucket_objects(tree, PLAIN), bucket_objects(tree, VERSIONED)
    before_meta = meta_bytes(tree.root)
    res = tree.play("storage.yml", overlays=())  # a real run; apply_storage: false in cfg/_config.yml
    assert res.returncode == 0, tail(res)
    out = text(res)
    assert "apply flag off: planned and gated only" in out
    assert (bucket_objects(tree, PLAIN), bucket_objects(tree, VERSIONED)) == before_objects
    assert len(before_objects[0]) == 3 and len(before_objects[1]) == 3
    assert meta_bytes(tree.root) == before_meta
    assert "empty_bucket" not in "".join(l for l in res.stdout.splitlines() if l.startswith("changed:"))


def test_archive_and_bucket_destroys_in_one_run(tree):
    declare(tree, mnt_data="archived", plain="destroyed", versioned="destroyed")
    res = tree.play("storage.yml")
    assert res.returncode == 0, tail(res)
    # the wipe ran first (the module does not force_destroy: a non-empty bucket's delete fails)
    assert not bucket_exists(tree, PLAIN) and not bucket_exists(tree, VERSIONED)
    snaps = archive_snaps(tree)
    assert len(snaps) == 1 and snaps[0]["VolumeId"] == tree.volume_id
    assert volume(tree, tree.volume_id) == []
    st = meta(tree.root, "storage-state.yaml")["storages"]
    assert st["mnt_data"]["state"] == "archived"
    assert st["mnt_data"]["history"][-1]["from"] == "active" and st["mnt_data"]["history"][-1]["to"] == "archived"
    assert st["mnt_data"]["history"][-1]["action"] == "snapshot"
    assert "volume_id" not in st["mnt_data"]["facts"]
    for b in ("plainb", "versb"):
        assert st[b]["state"] == "destroyed"
        assert st[b]["history"][-1] == {**st[b]["history"][-1], "from": "active", "to": "destroyed", "action": "wipe"}
    # the roots were rendered again with the recorded states (their files name them): the next
    # run's render writes nothing, so a re-run reports no change
    assert "Render the root again, with the storage states this pass recorded" in res.stdout
    again = pipeline.render(tree.root, ["storage"], dry_run=False, check_mode=True, prepare=False,
                            overlays=[tree.moto.overlay_path, os.path.join(tree.root, "overlays", "apply-all.yml")])
    assert [r["key"] for r in again["roots"] if r["changed"]] == [], again["roots"]


def test_restore_brings_the_volume_back_from_the_snapshot_and_deletes_it(tree):
    snap_id = archive_snaps(tree)[0]["SnapshotId"]
    declare(tree, mnt_data="active", plain="destroyed", versioned="destroyed")
    res = tree.play("storage.yml")
    assert res.returncode == 0, tail(res)
    st = meta(tree.root, "storage-state.yaml")["storages"]
    assert st["mnt_data"]["state"] == "active"
    assert [(h["from"], h["to"]) for h in st["mnt_data"]["history"]] == [(None, "active"), ("active", "archived"),
                                                                         ("archived", "active")]
    assert st["mnt_data"]["history"][-1]["action"] == "restore"
    vid = st["mnt_data"]["facts"]["volume_id"]
    assert vid != tree.volume_id
    vols = volume(tree, vid)
    assert len(vols) == 1 and vols[0]["SnapshotId"] == snap_id
    assert archive_snaps(tree) == []
    # the tombstones stay
    assert st["plainb"]["state"] == "destroyed" and st["versb"]["state"] == "destroyed"
    # and the next run is quiet: empty plans, and no task reports a change (the restore's root was
    # rendered again once the restore was recorded, so this run's render writes nothing)
    res = tree.play("storage.yml")
    assert res.returncode == 0, tail(res)
    plans = re.findall(r"Plan: (\d+) to add, (\d+) to change, (\d+) to destroy", text(res))
    assert plans and all(p == ("0", "0", "0") for p in plans), plans
    assert changed_tasks(res.stdout) == [], changed_tasks(res.stdout)
