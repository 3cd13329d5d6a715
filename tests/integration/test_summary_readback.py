# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""``summary.yml``'s "What exists" (state/readback.py ``summarize``) against the session's moto
server: two runtimes of one account and region see the same resources, and each resource is
listed once (it was listed under every runtime), a bucket read through its storage's runtime.
No terraform: the resources are made here with boto3, tagged as the tree's roots tag them.
"""
from __future__ import annotations

import copy

import pytest

from day2_trees import make_tree, read_yaml, write_yaml

from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree
from ansible_collections.csis.infra.plugins.module_utils.csis.state.readback import summarize, summary_lines

pytestmark = pytest.mark.integration

TAG = "csis-readback-twins"


def test_two_runtimes_of_one_account_and_region_list_each_resource_once(tmp_path, moto_endpoint, monkeypatch):
    for key, value in moto_endpoint.env.items():
        monkeypatch.setenv(key, value)
    root = make_tree(str(tmp_path), TAG, [{"name": "logs", "type": "aws-s3", "bucket_name": TAG + "-logs",
                                           "state": "active"}], [])
    runtimes = read_yaml(root, "cfg/runtime-builders.yml")
    twin = copy.deepcopy(runtimes["runtime_builders"][0])
    twin["name"] = "aws-east2-twin"  # sorts after aws-east2-runtime: the same account, region and endpoint
    twin["endpoints"] = {"url": moto_endpoint.url}  # the overlay points the first one there
    runtimes["runtime_builders"].append(twin)
    write_yaml(root, "cfg/runtime-builders.yml", runtimes)
    tree = load_tree(root, overlays=[moto_endpoint.overlay_path])
    assert sorted(tree.runtimes) == ["aws-east2-runtime", "aws-east2-twin"]
    twin_rt = tree.runtimes["aws-east2-twin"]
    assert twin_rt.region == tree.runtimes["aws-east2-runtime"].region

    tags = [{"Key": "csis_config", "Value": tree.resource_tag()["csis_config"]}, {"Key": "Name", "Value": "mnt_data"}]
    ec2, efs, s3 = moto_endpoint.client("ec2"), moto_endpoint.client("efs"), moto_endpoint.client("s3")
    vol = ec2.create_volume(AvailabilityZone="us-east-2a", Size=8,
                            TagSpecifications=[{"ResourceType": "volume", "Tags": tags}])["VolumeId"]
    fs = efs.create_file_system(CreationToken=TAG, Tags=[dict(t, Value="shared") if t["Key"] == "Name" else t
                                                         for t in tags])["FileSystemId"]
    s3.create_bucket(Bucket=TAG + "-logs", CreateBucketConfiguration={"LocationConstraint": "us-east-2"})
    s3.put_bucket_tagging(Bucket=TAG + "-logs", Tagging={"TagSet": [tags[0]]})
    meta = {"storage-state.yaml": {"storages": {"logs": {"state": "active", "facts": {
        "type": "s3", "bucket_name": TAG + "-logs"}}}}}
    try:
        got = summarize(tree, meta)
    finally:
        ec2.delete_volume(VolumeId=vol)
        efs.delete_file_system(FileSystemId=fs)
        s3.delete_bucket_tagging(Bucket=TAG + "-logs")
        s3.delete_bucket(Bucket=TAG + "-logs")
    assert [v["volume_id"] for v in got["volumes"]] == [vol], got["volumes"]
    assert [f["file_system_id"] for f in got["filesystems"]] == [fs], got["filesystems"]
    assert [(b["storage"], b["bucket"]) for b in got["buckets"]] == [("logs", TAG + "-logs")], got["buckets"]
    lines = summary_lines(got)
    assert len(lines) == 3 and len(set(lines)) == 3, lines
