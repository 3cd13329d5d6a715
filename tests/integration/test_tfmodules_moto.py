# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The terraform modules (tfmodules/) applied for real against the session's moto server.

One root calls every storage module and the instance module, applied once for the file
(``init`` + ``apply``), then a second ``plan -detailed-exitcode`` must be empty (exit 0): a
module that moto (or AWS) makes non-idempotent fails there. Each test checks one module's
outputs and what the endpoint holds with boto3. The S3 backend and remote-state test has
roots of its own.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Dict, List, Optional

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.render.plan import ENDPOINT_ENV_NAMES

import e2e

pytestmark = pytest.mark.integration

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TFMODULES = os.path.join(REPO_ROOT, "tfmodules")
MODULES = ("aws_instance", "aws_storage_ebs", "aws_storage_efs", "aws_storage_s3", "identity_groups")


def hcl(value) -> str:
    """HCL literal for a JSON-able value (JSON is valid HCL expression syntax)."""
    return json.dumps(value)


def provider_block(url: str, region: str = "us-east-2") -> str:
    """The provider settings that work against a moto server (see docs/local-endpoint.md); the
    endpoints come from the environment (:func:`endpoint_env`), as in csis.infra's own runs."""
    del url
    return """provider "aws" {
  region                      = %s
  s3_use_path_style           = true
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  skip_region_validation      = true
}
""" % hcl(region)


def endpoint_env(url: str) -> Dict[str, str]:
    """``AWS_ENDPOINT_URL_<SERVICE>`` for every service the modules use: what csis.infra hands
    terraform in place of an endpoints block (render/plan.py ENDPOINT_ENV_NAMES)."""
    return {name: url for name in ENDPOINT_ENV_NAMES.values()}


def module_block(label: str, module: str, inputs: Dict[str, object]) -> str:
    lines = ['module "%s" {' % label, "  source = %s" % hcl(os.path.join(TFMODULES, module))]
    lines += ["  %s = %s" % (k, hcl(v)) for k, v in inputs.items()]
    lines.append("}")
    return "\n".join(lines) + "\n"


def outputs_block(label: str, names: List[str]) -> str:
    return "".join('output "%s" {\n  value = module.%s.%s\n}\n' % (n, label, n) for n in names)


class Root:
    def __init__(self, path, env: Dict[str, str]) -> None:
        self.path = str(path)
        self.env = env
        os.makedirs(self.path, exist_ok=True)

    def write(self, name: str, text: str) -> None:
        with open(os.path.join(self.path, name), "w", encoding="utf-8") as fh:
            fh.write(text)

    def tf(self, *args: str, ok=(0,)) -> subprocess.CompletedProcess:
        proc = subprocess.run(["terraform", *args], cwd=self.path, env=self.env,
                              capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode not in ok:
            raise AssertionError("terraform %s -> %d\n%s\n%s" % (" ".join(args), proc.returncode,
                                                                 proc.stdout[-6000:], proc.stderr[-6000:]))
        return proc

    def init(self) -> None:
        self.tf("init", "-input=false", "-no-color")

    def apply(self) -> None:
        self.tf("apply", "-auto-approve", "-input=false", "-no-color")

    def outputs(self) -> Dict[str, object]:
        raw = json.loads(self.tf("output", "-json").stdout)
        return {k: v["value"] for k, v in raw.items()}

    def assert_no_changes(self) -> None:
        proc = self.tf("plan", "-detailed-exitcode", "-input=false", "-no-color", ok=(0, 2))
        assert proc.returncode == 0, "second plan is not empty (perpetual diff):\n" + proc.stdout[-6000:]

    def apply_and_converge(self) -> Dict[str, object]:
        self.init()
        self.apply()
        self.assert_no_changes()
        return self.outputs()


def make_root(tmp_path, tf_env, moto_endpoint, body: str, backend: Optional[str] = None) -> Root:
    root = Root(tmp_path, dict(tf_env, **endpoint_env(moto_endpoint.url)))
    root.write("providers.tf", provider_block(moto_endpoint.url))
    if backend:
        root.write("backend.tf", backend)
    root.write("main.tf", body)
    return root


def tags_of(items) -> Dict[str, str]:
    return {t["Key"]: t["Value"] for t in items or []}


# -- static checks --------------------------------------------------------------------
def test_fmt_clean(tf_env):
    proc = subprocess.run(["terraform", "fmt", "-check", "-recursive", "-diff", TFMODULES],
                          env=tf_env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("module", MODULES)
def test_module_files(module):
    for name in ("versions.tf", "variables.tf", "main.tf", "outputs.tf", "README.md"):
        assert os.path.isfile(os.path.join(TFMODULES, module, name)), (module, name)
    with open(os.path.join(TFMODULES, module, "versions.tf"), encoding="utf-8") as fh:
        versions = fh.read()
    assert 'required_version = ">= 1.5"' in versions
    if module != "identity_groups":
        assert 'version = ">= 5.0, < 6.0"' in versions
    for name in ("main.tf", "variables.tf", "outputs.tf"):
        with open(os.path.join(TFMODULES, module, name), encoding="utf-8") as fh:
            assert 'provider "' not in fh.read(), "modules take the provider from the caller"


# -- one root calling every storage module and the instance module ---------------------
# The modules are applied together, once for the file: one init, one apply (terraform creates
# the resources in parallel, so the S3 lifecycle configuration's 55 s wait, the instance's
# and the EFS mount targets' overlap), one second plan that must be empty. Each test below
# checks its module's outputs and what the endpoint holds.
INSTANCE_USER_DATA = "#!/bin/bash\necho csis > /etc/csis-node\n"


def _instance_calls(moto_endpoint) -> str:
    subnet = moto_endpoint.subnet_ids["private-a"]
    sgs = [moto_endpoint.security_groups["addl"], moto_endpoint.security_groups["ssh_relay"]]
    return module_block("node_data", "aws_storage_ebs", {
        "name": "tfm-node-data", "size": 10, "subnet_id": subnet,
    }) + """
module "node" {
  source                 = %s
  name                   = "tfm-node-1"
  ami_name_pattern       = "imgfile-basic-dask-pckr-ebs-ans-*"
  instance_type          = "t3.small"
  subnet_id              = %s
  vpc_security_group_ids = %s
  iam_instance_profile   = %s
  user_data              = %s
  tags                   = { "csis:instance" = "node-1" }
  ebs_volumes = {
    data = { volume_id = module.node_data.volume_id, device_name = "/dev/xvdf" }
  }
}
""" % (hcl(os.path.join(TFMODULES, "aws_instance")), hcl(subnet), hcl(sgs),
       hcl(moto_endpoint.instance_profile), hcl(INSTANCE_USER_DATA))


def prefixed_outputs(label: str, names: List[str]) -> str:
    """``output "<label>__<name>"`` for each of the module's outputs ``names``."""
    return "".join('output "%s__%s" {\n  value = module.%s.%s\n}\n' % (label, n, label, n) for n in names)


@pytest.fixture(scope="module")
def applied(tmp_path_factory, tf_env, moto_endpoint):
    """Every module applied in one root; ``out[label][output]``, plus what the tests need."""
    ec2, efs = moto_endpoint.client("ec2"), moto_endpoint.client("efs")
    # what two of the calls start from: an archive snapshot to restore, a file system to adopt
    src = ec2.create_volume(AvailabilityZone="us-east-2a", Size=12)["VolumeId"]
    snap = ec2.create_snapshot(VolumeId=src, TagSpecifications=[
        {"ResourceType": "snapshot", "Tags": [{"Key": "Name", "Value": "tfm-archive"}]}])["SnapshotId"]
    adopted_fs = efs.create_file_system(CreationToken="tfm-efs-preexisting")["FileSystemId"]
    subnets = [moto_endpoint.subnet_ids["private-a"], moto_endpoint.subnet_ids["private-b"]]
    calls = {
        "data": ("aws_storage_ebs", {
            "name": "tfm-ebs-data", "size": 20, "subnet_id": moto_endpoint.subnet_ids["private-b"],
            "tags": {"csis:storage": "data", "Team": "infra"},
        }, ["volume_id", "volume_arn", "availability_zone"]),
        "restored": ("aws_storage_ebs", {
            "name": "tfm-ebs-restored", "size": 12, "availability_zone": "us-east-2a",
            "snapshot_name": "tfm-archive",
            # asks for no encryption (null, not false: under EBS encryption by default an explicit false
            # would plan a replacement on every run); the second plan of apply_and_converge is empty
            "encrypted": False,
        }, ["volume_id"]),
        "shared_efs": ("aws_storage_efs", {
            "name": "tfm-efs-shared",
            "transition_to_ia": "AFTER_30_DAYS",
            "access_points": {
                "team": {"gid": 3000, "path": "/team", "permissions": "2770"},
                "ops": {"gid": 3001, "path": "/ops", "permissions": "2750"},
            },
            "public_read": True,
            "vpc_id": moto_endpoint.vpc_id,
            "mount_target_subnet_ids": subnets,
            "client_security_group_ids": [moto_endpoint.security_groups["addl"]],
            "tags": {"csis:storage": "shared"},
        }, ["file_system_id", "access_point_ids", "public_read_access_point_id", "security_group_id", "mount_target_ids"]),
        "archive_efs": ("aws_storage_efs", {
            "name": "tfm-efs-archive",
            "transition_to_ia": "AFTER_30_DAYS",
            "transition_to_archive": "AFTER_90_DAYS",
        }, ["file_system_id"]),
        "adopted": ("aws_storage_efs", {
            "name": "tfm-efs-adopted",
            "existing_file_system_id": adopted_fs,
            "access_points": {"team": {"gid": 3000, "path": "/team", "permissions": "2770"}},
        }, ["file_system_id", "access_point_ids", "public_read_access_point_id"]),
        "shared_s3": ("aws_storage_s3", {
            "bucket_name": "tfm-s3-shared",
            "force_destroy": True,
            "group_prefixes": ["team", "ops"],
            "public_read": True,
            "lifecycle_rules": [
                {"id": "team-archive", "prefix": "team/", "transition_days": 30,
                 "storage_class": "STANDARD_IA", "expire_days": 365},
                {"id": "ops-expire", "prefix": "ops/", "transition_days": 0,
                 "storage_class": "", "expire_days": 7},
            ],
            "tags": {"csis:storage": "shared"},
        }, ["bucket", "bucket_arn", "group_prefixes"]),
    }
    body = "".join(module_block(label, module, inputs) + prefixed_outputs(label, names)
                   for label, (module, inputs, names) in calls.items())
    body += _instance_calls(moto_endpoint) + prefixed_outputs(
        "node", ["instance_id", "private_ip", "ami_id", "desired_ami_id", "availability_zone"]) + prefixed_outputs(
        "node_data", ["volume_id"])
    root = make_root(tmp_path_factory.mktemp("tfmodules"), tf_env, moto_endpoint, body)
    flat = root.apply_and_converge()
    out: Dict[str, Dict[str, object]] = {}
    for name, value in flat.items():
        label, output = name.split("__", 1)
        out.setdefault(label, {})[output] = value
    return {"out": out, "root": root, "body": body, "snapshot": snap, "adopted_fs": adopted_fs, "subnets": subnets}


# -- EBS ------------------------------------------------------------------------------
def test_ebs_volume(applied, moto_endpoint):
    out = applied["out"]["data"]
    assert out["availability_zone"] == "us-east-2b"
    vol = moto_endpoint.client("ec2").describe_volumes(VolumeIds=[out["volume_id"]])["Volumes"][0]
    assert vol["AvailabilityZone"] == "us-east-2b"
    assert vol["Size"] == 20
    assert vol["VolumeType"] == "gp3"
    assert vol["Encrypted"] is True
    assert tags_of(vol["Tags"]) == {"Name": "tfm-ebs-data", "csis:storage": "data", "Team": "infra"}
    assert out["volume_arn"].endswith(":volume/" + out["volume_id"])


def test_ebs_volume_from_snapshot(applied, moto_endpoint):
    out = applied["out"]["restored"]
    vol = moto_endpoint.client("ec2").describe_volumes(VolumeIds=[out["volume_id"]])["Volumes"][0]
    assert vol["SnapshotId"] == applied["snapshot"]
    assert vol["Encrypted"] is False  # encrypted = false: none asked, and this account encrypts none by default


# -- EFS ------------------------------------------------------------------------------
def test_efs_access_points_and_mount_targets(applied, moto_endpoint):
    out, subnets = applied["out"]["shared_efs"], applied["subnets"]
    client_sg = moto_endpoint.security_groups["addl"]
    efs = moto_endpoint.client("efs")
    fs_id = out["file_system_id"]
    fs = efs.describe_file_systems(FileSystemId=fs_id)["FileSystems"][0]
    assert fs["CreationToken"] == "tfm-efs-shared"
    assert fs["Encrypted"] is True
    assert fs["PerformanceMode"] == "generalPurpose"
    assert fs["ThroughputMode"] == "bursting"  # no archive transition: the provider's default
    assert tags_of(fs["Tags"]) == {"Name": "tfm-efs-shared", "csis:storage": "shared"}
    policies = efs.describe_lifecycle_configuration(FileSystemId=fs_id)["LifecyclePolicies"]
    assert {"TransitionToIA": "AFTER_30_DAYS"} in policies

    aps = {ap["AccessPointId"]: ap for ap in efs.describe_access_points(FileSystemId=fs_id)["AccessPoints"]}
    assert set(out["access_point_ids"]) == {"team", "ops"}
    team = aps[out["access_point_ids"]["team"]]
    assert team["PosixUser"]["Uid"] == 0 and team["PosixUser"]["Gid"] == 3000
    assert team["RootDirectory"]["Path"] == "/team"
    assert team["RootDirectory"]["CreationInfo"] == {"OwnerUid": 0, "OwnerGid": 3000, "Permissions": "2770"}
    assert tags_of(team["Tags"])["csis:group"] == "team"
    assert tags_of(team["Tags"])["Name"] == "tfm-efs-shared-team"
    public = aps[out["public_read_access_point_id"]]
    assert public["RootDirectory"]["Path"] == "/"

    mts = efs.describe_mount_targets(FileSystemId=fs_id)["MountTargets"]
    assert sorted(mt["SubnetId"] for mt in mts) == sorted(subnets)
    sg_id = out["security_group_id"]
    for mt in mts:
        assert efs.describe_mount_target_security_groups(
            MountTargetId=mt["MountTargetId"])["SecurityGroups"] == [sg_id]
    sg = moto_endpoint.client("ec2").describe_security_groups(GroupIds=[sg_id])["SecurityGroups"][0]
    assert sg["GroupName"].startswith("csis-efs-tfm-efs-shared-")
    assert sg["VpcId"] == moto_endpoint.vpc_id
    nfs = [p for p in sg["IpPermissions"] if p.get("FromPort") == 2049]
    assert len(nfs) == 1 and nfs[0]["IpProtocol"] == "tcp" and nfs[0]["ToPort"] == 2049
    assert [g["GroupId"] for g in nfs[0]["UserIdGroupPairs"]] == [client_sg]


def test_efs_archive_is_elastic(applied, moto_endpoint):
    """AWS archives only file systems in the Elastic throughput mode: an archive transition makes
    the module create one; adding one to a file system without it is an update in place, which
    changes nothing else."""
    efs = moto_endpoint.client("efs")
    fs_id = applied["out"]["archive_efs"]["file_system_id"]
    fs = efs.describe_file_systems(FileSystemId=fs_id)["FileSystems"][0]
    assert fs["ThroughputMode"] == "elastic" and fs["PerformanceMode"] == "generalPurpose"
    policies = efs.describe_lifecycle_configuration(FileSystemId=fs_id)["LifecyclePolicies"]
    assert {"TransitionToArchive": "AFTER_90_DAYS"} in policies and {"TransitionToIA": "AFTER_30_DAYS"} in policies

    # shared_efs (no archive, bursting) gains one
    root = applied["root"]
    body = applied["body"].replace('transition_to_ia = "AFTER_30_DAYS"\n  access_points',
                                   'transition_to_ia = "AFTER_30_DAYS"\n  transition_to_archive = "AFTER_90_DAYS"\n  access_points')
    assert body.count("transition_to_archive") == 2, body
    root.write("main.tf", body)
    try:
        root.tf("plan", "-input=false", "-no-color", "-out=archive.tfplan")
        shown = json.loads(root.tf("show", "-json", "archive.tfplan").stdout)
    finally:
        root.write("main.tf", applied["body"])
    changes = {rc["address"]: rc["change"] for rc in shown["resource_changes"] if rc["change"]["actions"] != ["no-op"]}
    assert list(changes) == ["module.shared_efs.aws_efs_file_system.this[0]"], list(changes)
    change = changes["module.shared_efs.aws_efs_file_system.this[0]"]
    assert change["actions"] == ["update"]
    assert (change["before"]["throughput_mode"], change["after"]["throughput_mode"]) == ("bursting", "elastic")


def test_efs_adopt_existing(applied, moto_endpoint):
    out, fs_id = applied["out"]["adopted"], applied["adopted_fs"]
    efs = moto_endpoint.client("efs")
    assert out["file_system_id"] == fs_id
    assert out.get("public_read_access_point_id") is None  # null outputs are left out of `output -json`
    fss = [f for f in efs.describe_file_systems()["FileSystems"] if f["CreationToken"] == "tfm-efs-adopted"]
    assert fss == [], "adopting must not create a file system"
    aps = efs.describe_access_points(FileSystemId=fs_id)["AccessPoints"]
    assert [ap["AccessPointId"] for ap in aps] == [out["access_point_ids"]["team"]]


# -- S3 -------------------------------------------------------------------------------
def test_s3_bucket(applied, moto_endpoint):
    out, bucket = applied["out"]["shared_s3"], "tfm-s3-shared"
    s3 = moto_endpoint.client("s3")
    assert out["bucket"] == bucket
    assert out["bucket_arn"] == "arn:aws:s3:::" + bucket
    assert out["group_prefixes"] == {"team": "team/", "ops": "ops/"}
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))
    assert keys == ["ops/", "team/"]
    assert tags_of(s3.get_object_tagging(Bucket=bucket, Key="team/")["TagSet"])["csis:group"] == "team"
    assert tags_of(s3.get_bucket_tagging(Bucket=bucket)["TagSet"]) == {"Name": bucket, "csis:storage": "shared"}

    policy = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])
    (stmt,) = policy["Statement"]
    assert stmt["Sid"] == "AccountWideReadOnly" and stmt["Effect"] == "Allow"
    assert sorted(stmt["Action"]) == ["s3:GetObject", "s3:ListBucket"]
    assert sorted(stmt["Resource"]) == ["arn:aws:s3:::" + bucket, "arn:aws:s3:::%s/*" % bucket]
    assert stmt["Condition"] == {"StringEquals": {"aws:PrincipalAccount": moto_endpoint.account_id}}

    rules = {r["ID"]: r for r in s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]}
    assert set(rules) == {"team-archive", "ops-expire"}
    team = rules["team-archive"]
    assert team["Status"] == "Enabled"
    assert team["Filter"] == {"Prefix": "team/"}
    assert team["Transitions"] == [{"Days": 30, "StorageClass": "STANDARD_IA"}]
    assert team["Expiration"] == {"Days": 365}
    assert "Transitions" not in rules["ops-expire"]
    assert rules["ops-expire"]["Expiration"] == {"Days": 7}


# -- instance -------------------------------------------------------------------------
def test_instance_with_volume(applied, moto_endpoint):
    out, root = applied["out"]["node"], applied["root"]
    subnet = moto_endpoint.subnet_ids["private-a"]
    sgs = [moto_endpoint.security_groups["addl"], moto_endpoint.security_groups["ssh_relay"]]
    newest = moto_endpoint.amis["imgfile-basic-dask-pckr-ebs-ans-20261115"]
    assert out["ami_id"] == newest and out["desired_ami_id"] == newest
    assert out["availability_zone"] == "us-east-2a"
    ec2 = moto_endpoint.client("ec2")
    inst = ec2.describe_instances(InstanceIds=[out["instance_id"]])["Reservations"][0]["Instances"][0]
    assert inst["State"]["Name"] == "running"
    assert inst["ImageId"] == newest
    assert inst["InstanceType"] == "t3.small"
    assert inst["SubnetId"] == subnet
    assert inst["PrivateIpAddress"] == out["private_ip"]
    assert "PublicIpAddress" not in inst
    assert sorted(g["GroupId"] for g in inst["SecurityGroups"]) == sorted(sgs)
    assert inst["IamInstanceProfile"]["Arn"].endswith(":instance-profile/" + moto_endpoint.instance_profile)
    assert inst["MetadataOptions"]["HttpTokens"] == "required"
    assert tags_of(inst["Tags"]) == {"Name": "tfm-node-1", "csis:instance": "node-1"}
    attrs = ec2.describe_instance_attribute(InstanceId=out["instance_id"], Attribute="userData")
    import base64
    assert base64.b64decode(attrs["UserData"]["Value"]).decode() == INSTANCE_USER_DATA
    vol = ec2.describe_volumes(VolumeIds=[applied["out"]["node_data"]["volume_id"]])["Volumes"][0]
    assert [(a["InstanceId"], a["Device"]) for a in vol["Attachments"]] == [(out["instance_id"], "/dev/xvdf")]
    # the root volume carries the instance's tags (root_block_device); the attached data volume
    # keeps its own (aws_storage_ebs's), and the fixture's second plan was empty (converged)
    volumes = {a["Device"]: v for v in ec2.describe_volumes(Filters=[
        {"Name": "attachment.instance-id", "Values": [out["instance_id"]]}])["Volumes"] for a in v["Attachments"]}
    assert sorted(volumes) == [inst["RootDeviceName"], "/dev/xvdf"]
    assert tags_of(volumes[inst["RootDeviceName"]].get("Tags")) == tags_of(inst["Tags"])
    assert tags_of(volumes["/dev/xvdf"].get("Tags")) == {"Name": "tfm-node-data"}

    # user_data and ami are ignored after creation: a change plans nothing
    root.write("main.tf", applied["body"].replace(hcl(INSTANCE_USER_DATA), hcl(INSTANCE_USER_DATA + "# v2\n")))
    try:
        root.assert_no_changes()
    finally:
        root.write("main.tf", applied["body"])


def _module_without_root_block_device(text: str) -> str:
    """tfmodules/aws_instance/main.tf as it was before the root volume carried the instance's
    tags: the same text without its ``root_block_device`` block (and the comment above it)."""
    old, n = re.subn(r"\n(?:  #[^\n]*\n)*  root_block_device \{\n(?:    [^\n]*\n)*  \}\n\n", "\n", text)
    assert n == 1, "tfmodules/aws_instance/main.tf has no root_block_device block to take out"
    return old


def test_instance_root_volume_tags_upgrade_in_place(tmp_path, tf_env, moto_endpoint):
    """An instance launched by the module before its root volume carried the instance's tags (the
    upgrade of every existing deployment): the module with ``root_block_device { tags }`` plans an
    update in place of the instance (the root volume's tags), no replacement, nothing destroyed;
    applied, the root volume carries the instance's tags and the next plan is empty. With the
    provider's default_tags, as csis.infra's roots have them (the inherited tags are in both)."""
    module_dir = tmp_path / "aws_instance"
    shutil.copytree(os.path.join(TFMODULES, "aws_instance"), str(module_dir))
    with open(os.path.join(TFMODULES, "aws_instance", "main.tf"), encoding="utf-8") as fh:
        new_main = fh.read()
    (module_dir / "main.tf").write_text(_module_without_root_block_device(new_main), encoding="utf-8")
    inherited = {"BillingCode": "CSIS-0001", "Owner": "coastal-ops"}
    own = dict(inherited, **{"csis:instance": "upgrade-1"})
    root = Root(tmp_path / "root", dict(tf_env, **endpoint_env(moto_endpoint.url)))
    root.write("providers.tf", provider_block(moto_endpoint.url).replace(
        "}\n", "  default_tags {\n    tags = %s\n  }\n}\n" % hcl(inherited)))
    root.write("main.tf", module_block("node", "aws_instance", {
        "name": "tfm-upgrade-1", "ami_name_pattern": "imgfile-basic-pckr-ebs-ans-*",
        "subnet_id": moto_endpoint.subnet_ids["private-b"], "tags": own,
    }).replace(hcl(os.path.join(TFMODULES, "aws_instance")), hcl(str(module_dir))) + outputs_block("node", ["instance_id"]))
    instance_id = root.apply_and_converge()["instance_id"]
    ec2 = moto_endpoint.client("ec2")

    def root_volume_tags() -> Dict[str, str]:
        inst = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        (vol,) = [v for v in ec2.describe_volumes(Filters=[
            {"Name": "attachment.instance-id", "Values": [instance_id]}])["Volumes"]
            if v["Attachments"][0]["Device"] == inst["RootDeviceName"]]
        return tags_of(vol.get("Tags"))

    instance_tags = dict(own, Name="tfm-upgrade-1")
    assert root_volume_tags() != instance_tags, "the old module left the root volume without the instance's tags"

    (module_dir / "main.tf").write_text(new_main, encoding="utf-8")
    root.tf("plan", "-input=false", "-no-color", "-out=upgrade.tfplan")
    shown = json.loads(root.tf("show", "-json", "upgrade.tfplan").stdout)
    changes = {rc["address"]: rc["change"] for rc in shown["resource_changes"] if rc["change"]["actions"] != ["no-op"]}
    assert list(changes) == ["module.node.aws_instance.this"], list(changes)
    change = changes["module.node.aws_instance.this"]
    assert change["actions"] == ["update"], change["actions"]
    assert not change.get("replace_paths"), change.get("replace_paths")
    changed = sorted(k for k in set(change["before"]) | set(change["after"])
                     if change["before"].get(k) != change["after"].get(k) and k not in change.get("after_unknown", {}))
    assert changed == ["root_block_device"], changed
    (before,), (after,) = change["before"]["root_block_device"], change["after"]["root_block_device"]
    assert after["tags"] == instance_tags
    assert {k: v for k, v in before.items() if k not in ("tags", "tags_all")} == \
        {k: v for k, v in after.items() if k not in ("tags", "tags_all")}

    root.tf("apply", "-auto-approve", "-input=false", "-no-color", "upgrade.tfplan")
    root.assert_no_changes()
    assert root_volume_tags() == instance_tags
    inst = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    assert inst["State"]["Name"] == "running" and tags_of(inst["Tags"]) == instance_tags


# -- S3 backend with lock file, and remote state between roots -------------------------
def test_s3_backend_and_remote_state(tmp_path, tf_env, moto_endpoint):
    url, bucket = moto_endpoint.url, moto_endpoint.state_bucket
    key = "tfm-test/identity/terraform.tfstate"
    identity = make_root(tmp_path / "identity", tf_env, moto_endpoint,
                         module_block("identity", "identity_groups", {"groups": {"team": 3000, "ops": 3001}})
                         + outputs_block("identity", ["group_gids"]),
                         backend=e2e.s3_backend_block(url, bucket, key))
    out = identity.apply_and_converge()
    assert out["group_gids"] == {"team": 3000, "ops": 3001}

    s3 = moto_endpoint.client("s3")
    state = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    assert state["outputs"]["group_gids"]["value"] == {"team": 3000, "ops": 3001}
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="tfm-test/").get("Contents", [])]
    assert key + ".tflock" not in keys, "the lock file is removed after the run"

    consumer = Root(tmp_path / "consumer", tf_env)
    consumer.write("main.tf", """
data "terraform_remote_state" "identity" {
  backend = "s3"
  config = {
    bucket                      = %s
    key                         = %s
    region                      = "us-east-2"
    use_path_style              = true
    skip_credentials_validation = true
    skip_requesting_account_id  = true
    skip_metadata_api_check     = true
    skip_region_validation      = true
    endpoints                   = { s3 = %s, sts = %s }
  }
}

output "team_gid" {
  value = data.terraform_remote_state.identity.outputs.group_gids["team"]
}
""" % (hcl(bucket), hcl(key), hcl(url), hcl(url)))
    assert consumer.apply_and_converge()["team_gid"] == 3000


def test_allowed_account_ids_refuse_credentials_of_another_account(tmp_path, tf_env, moto_endpoint):
    """What csis_render puts in the provider block of a runtime with an account_id (and no
    skip_requesting_account_id): the provider asks STS whose credentials these are and plans only in
    that account. moto's credentials are account 123456789012's."""
    body = 'data "aws_caller_identity" "me" {}\noutput "account" {\n  value = data.aws_caller_identity.me.account_id\n}\n'
    root = Root(tmp_path, dict(tf_env, **endpoint_env(moto_endpoint.url)))
    provider = """provider "aws" {
  region                      = "us-east-2"
  s3_use_path_style           = true
  skip_credentials_validation = true
  skip_metadata_api_check     = true
  skip_region_validation      = true
  allowed_account_ids         = [%s]
}
"""
    root.write("main.tf", body)
    root.write("providers.tf", provider % hcl(moto_endpoint.account_id))
    root.init()
    proc = root.tf("plan", "-input=false", "-no-color")
    assert moto_endpoint.account_id in proc.stdout
    root.write("providers.tf", provider % hcl("999999999999"))
    proc = root.tf("plan", "-input=false", "-no-color", ok=(1,))
    assert "AWS account ID not allowed: %s" % moto_endpoint.account_id in proc.stderr, proc.stderr[-2000:]
