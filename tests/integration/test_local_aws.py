# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""scripts/local-aws end to end, in a private state directory (never the demo's)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import yaml

import local_aws  # tests/support, on the path by tests/conftest.py

pytestmark = pytest.mark.integration

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "local-aws")


def run(state_dir, *args, ok=(0,)):
    proc = subprocess.run([sys.executable, SCRIPT, "--state-dir", str(state_dir), *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode in ok, proc.stdout + proc.stderr
    return proc


def test_start_seed_reuse_stop(tmp_path):
    state = tmp_path / "aws"
    run(state, "status", ok=(1,))
    try:
        run(state, "start")
        first = json.loads((state / "endpoint.json").read_text())
        assert first["url"] == "http://127.0.0.1:%d" % first["port"]
        run(state, "start")  # idempotent: the recorded live server is reused
        assert json.loads((state / "endpoint.json").read_text()) == first
        assert json.loads(run(state, "status").stdout) == first

        seeded = json.loads(run(state, "seed").stdout)
        again = json.loads(run(state, "seed").stdout)
        assert again == seeded, "seed finds what it created"

        overlay = yaml.safe_load((state / "overlay.yml").read_text())
        (rb,) = overlay["runtime_builders"]
        assert rb["name"] == "aws-east2-runtime" and rb["endpoints"] == {"url": first["url"]}
        net = rb["networking"]
        assert net["network"] == seeded["vpc_id"]
        assert net["default_subnet_id"] == seeded["subnet_ids"]["private-a"]
        assert net["default_availability_zone"] == "us-east-2a"
        assert net["ssh_ingress_security_group_ids"] == [seeded["security_groups"]["ssh_relay"]]
        assert net["addl_security_groups"] == [seeded["security_groups"]["addl"]]
        assert [(s["name"], s["availability_zone"], s["public"]) for s in net["subnets"]] == [
            ("private-a", "us-east-2a", False), ("private-b", "us-east-2b", False), ("public-a", "us-east-2a", True)]
        assert overlay["state_backends"] == [{"name": "s3-east2", "endpoints": {"url": first["url"]}}]
        assert sorted(seeded["amis"]) == ["imgfile-basic-dask-pckr-ebs-ans-20261101",
                                          "imgfile-basic-dask-pckr-ebs-ans-20261115",
                                          "imgfile-basic-pckr-ebs-ans-20261101"]

        env_sh = run(state, "env").stdout
        assert "export CSIS_AWS_ENDPOINT_URL='%s'" % first["url"] in env_sh
        assert "export AWS_DEFAULT_REGION='us-east-2'" in env_sh

        reset = run(state, "reset").stdout
        assert "re-seeded" in reset
        assert json.loads((state / "seed.json").read_text())["vpc_id"] != seeded["vpc_id"]
    finally:
        run(state, "stop")
    assert not (state / "endpoint.json").exists()
    run(state, "status", ok=(1,))


# The rules tfmodules/aws_storage_s3 renders, as terraform-provider-aws 5.100 sends them
# (PutBucketLifecycleConfiguration bodies read from a TF_LOG=DEBUG apply): a filter with
# a prefix ("" when the storage declares none), a transition and/or an expiration.
STORAGE_S3_RULES = [
    {"ID": "csis", "Status": "Enabled", "Filter": {"Prefix": ""},
     "Transitions": [{"Days": 30, "StorageClass": "STANDARD_IA"}]},
    {"ID": "expire", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 365}},
    {"ID": "logs", "Status": "Enabled", "Filter": {"Prefix": "logs/"},
     "Transitions": [{"Days": 30, "StorageClass": "GLACIER_IR"}], "Expiration": {"Days": 400}},
]


def test_lifecycle_configuration_reads_back_as_put(moto_endpoint):
    """aws_s3_bucket_lifecycle_configuration waits after every put until
    GetBucketLifecycleConfiguration deep-equals what it put, ten reads in a row (5 s
    apart, after 10 s: 55 s at best, also against AWS). Any difference (the
    ``x-amz-transition-default-minimum-object-size`` header, a rule field added or
    dropped) turns that floor into a 3-minute timeout and a failed apply. Guard what the
    module's rules read back as from the endpoint the tests and the demo use."""
    s3 = moto_endpoint.client("s3")
    bucket = "csis-test-lifecycle-readback"
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": moto_endpoint.region})
    try:
        s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": STORAGE_S3_RULES})
        got = s3.get_bucket_lifecycle_configuration(Bucket=bucket)
        # what AWS answers for a configuration put without the header (the provider's
        # default, all_storage_classes_128K, is also AWS's default since September 2024)
        headers = got["ResponseMetadata"]["HTTPHeaders"]
        assert headers.get("x-amz-transition-default-minimum-object-size") == "all_storage_classes_128K"
        assert got["TransitionDefaultMinimumObjectSize"] == "all_storage_classes_128K"
        # every rule back exactly: nothing added (e.g. a top-level Prefix next to the
        # Filter, ExpiredObjectDeleteMarker=false), nothing dropped
        by_id = {r["ID"]: r for r in got["Rules"]}
        assert by_id == {r["ID"]: r for r in STORAGE_S3_RULES}
    finally:
        s3.delete_bucket_lifecycle(Bucket=bucket)
        s3.delete_bucket(Bucket=bucket)


def test_a_retried_call_is_answered_again_not_carried_out_twice(moto_endpoint):
    """An AWS SDK retries a call whose answer got lost (same ``amz-sdk-invocation-id``,
    ``amz-sdk-request: attempt=2``). The endpoint answers the retry of a call it already carried
    out with that same answer: a second CreateSecurityGroup would otherwise fail as a duplicate
    (and a second DetachVolume as "not attached"). A first attempt is always carried out, and a
    retry of a call that failed is carried out again."""
    import uuid

    def client_sending(invocation, attempt):
        ec2 = moto_endpoint.client("ec2")

        def headers(request, **_kwargs):
            request.headers["amz-sdk-invocation-id"] = invocation
            request.headers["amz-sdk-request"] = "attempt=%d; max=3" % attempt

        ec2.meta.events.register_first("before-send.ec2.*", headers)
        return ec2

    name = "csis-retry-%s" % uuid.uuid4().hex[:8]
    invocation = str(uuid.uuid4())
    first = client_sending(invocation, 1).create_security_group(GroupName=name, Description="retry test",
                                                                VpcId=moto_endpoint.vpc_id)["GroupId"]
    again = client_sending(invocation, 2).create_security_group(GroupName=name, Description="retry test",
                                                                VpcId=moto_endpoint.vpc_id)["GroupId"]
    assert again == first
    ec2 = moto_endpoint.client("ec2")
    assert [g["GroupId"] for g in ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [name]}])["SecurityGroups"]] == [first]
    # a new call (another invocation) is carried out: moto refuses the duplicate name as AWS does
    with pytest.raises(Exception, match="Duplicate"):
        client_sending(str(uuid.uuid4()), 1).create_security_group(GroupName=name, Description="retry test",
                                                                   VpcId=moto_endpoint.vpc_id)
    # a retry of a call that failed is carried out again (nothing was answered to replay)
    failed = str(uuid.uuid4())
    with pytest.raises(Exception, match="Duplicate"):
        client_sending(failed, 1).create_security_group(GroupName=name, Description="retry test",
                                                        VpcId=moto_endpoint.vpc_id)
    with pytest.raises(Exception, match="Duplicate"):
        client_sending(failed, 2).create_security_group(GroupName=name, Description="retry test",
                                                        VpcId=moto_endpoint.vpc_id)
    ec2.delete_security_group(GroupId=first)
    with open(os.path.join(moto_endpoint.state_dir, "server.log"), encoding="utf-8") as fh:
        log = fh.read()
    assert "local-aws: RETRY CreateSecurityGroup (attempt=2;max=3, invocation %s" % invocation in log
    assert "the call NOT carried out twice" in log


def test_a_root_device_mapping_without_size_launches_from_the_ami(moto_endpoint):
    """An ``aws_instance`` with a ``root_block_device`` without ``volume_size`` (one that sets tags
    only) makes the provider send a block device mapping for the AMI's root device with neither ``VolumeSize`` nor ``SnapshotId``.
    AWS launches that volume from the AMI's snapshot at the AMI's size; moto 5.2 refused it
    (``MissingParameter``). The endpoint's patch ``ec2-root-device-size-from-ami`` does as AWS does,
    for a device the AMI maps only: a new device without size or snapshot is still refused."""
    ec2 = moto_endpoint.client("ec2")
    image = ec2.describe_images(ImageIds=[moto_endpoint.amis["imgfile-basic-pckr-ebs-ans-20261101"]])["Images"][0]
    (ami_root,) = [m for m in image["BlockDeviceMappings"] if m["DeviceName"] == image["RootDeviceName"]]
    launched = ec2.run_instances(
        ImageId=image["ImageId"], MinCount=1, MaxCount=1, InstanceType="t3.micro",
        SubnetId=moto_endpoint.subnet_ids["private-a"],
        BlockDeviceMappings=[{"DeviceName": image["RootDeviceName"], "Ebs": {"DeleteOnTermination": True}}],
    )["Instances"][0]
    instance_id = launched["InstanceId"]
    try:
        assert launched["RootDeviceName"] == image["RootDeviceName"]
        (root,) = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [instance_id]}])["Volumes"]
        assert root["Attachments"][0]["Device"] == image["RootDeviceName"]
        assert root["SnapshotId"] == ami_root["Ebs"]["SnapshotId"]
        assert root["Size"] == ami_root["Ebs"]["VolumeSize"]
        # the attachment as asked (the provider reads delete_on_termination back from it)
        (mapping,) = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["BlockDeviceMappings"]
        assert mapping["Ebs"]["DeleteOnTermination"] is True and mapping["Ebs"]["VolumeId"] == root["VolumeId"]
        # and DescribeVolumes states it, as AWS does (ec2-volume-attachment-delete-on-termination): the
        # drift report's foreign scan leaves an instance's own volume out by it
        assert root["Attachments"][0]["DeleteOnTermination"] is True
    finally:
        ec2.terminate_instances(InstanceIds=[instance_id])
    with pytest.raises(Exception, match="MissingParameter"):
        ec2.run_instances(ImageId=image["ImageId"], MinCount=1, MaxCount=1, InstanceType="t3.micro",
                          SubnetId=moto_endpoint.subnet_ids["private-a"],
                          BlockDeviceMappings=[{"DeviceName": "/dev/sdx", "Ebs": {"DeleteOnTermination": True}}])
    with open(os.path.join(moto_endpoint.state_dir, "server.log"), encoding="utf-8") as fh:
        applied = [line for line in fh if line.startswith("local-aws: moto patches applied: ")]
    assert applied and "ec2-root-device-size-from-ami" in applied[0], applied
    assert "ec2-volume-attachment-delete-on-termination" in applied[0], applied


def test_the_endpoint_writes_each_log_line_whole(monkeypatch):
    """The request threads share the server log: each ``local-aws:`` line is one write of the
    whole line (print() wrote the text and its newline apart, and lines ran into each other)."""
    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)
            return len(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Recorder())
    log = local_aws.AttemptLog(app=None)
    threads = [threading.Thread(target=lambda i=i: [log.say("local-aws: line %d.%d" % (i, k)) for k in range(50)])
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(writes) == 400
    assert all(w.startswith("local-aws: line ") and w.endswith("\n") and w.count("\n") == 1 for w in writes)
