# -*- coding: utf-8 -*-
"""Root planning and emission over examples/ and the fixture trees (no fmt/init/validate;
the real-terraform checks are in tests/integration/test_render_roots.py).

* the golden: every file ``service.render`` emits for examples/ equals the checked-in
  ``tests/golden/examples/<path under generated/>``; refresh with ``scripts/update-golden``
  (``CSIS_UPDATE_GOLDEN=1`` makes :func:`test_golden_examples` rewrite the golden);
* the variations (tests/fixtures/variations) asserted on the RootPlan data and files;
* use_state_backends off (tests/fixtures/nobackend);
* check mode writes nothing, a second render is unchanged, a failed validation leaves
  ``generated/`` byte-identical.
"""
from __future__ import annotations

import os
import re
import shutil
from typing import Any, Dict, List, Optional

import pytest
import yaml

from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError
from ansible_collections.csis.infra.plugins.module_utils.csis.render import pipeline as service
from ansible_collections.csis.infra.plugins.module_utils.csis.render.plan import MODULES_VERSION, RenderOptions, RootPlan
from ansible_collections.csis.infra.plugins.module_utils.csis.render.roots import plan_roots
from ansible_collections.csis.infra.plugins.module_utils.csis.render.writer import MANIFEST

import render_trees as rt

ALL = rt.LIFECYCLES


def fmt_texts(files, binary):
    """The .tf texts as `terraform fmt` (the real binary) writes them; other files unchanged."""
    import subprocess
    import tempfile

    from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import terraform_env

    out = dict(files)
    tf = [n for n in files if n.endswith(".tf")]
    if not tf:
        return out
    with tempfile.TemporaryDirectory(prefix="csis-fmt-") as tmp:
        for n in tf:
            with open(os.path.join(tmp, n), "w", encoding="utf-8") as fh:
                fh.write(files[n])
        res = subprocess.run([binary, "fmt", "-list=false", "-no-color"] + tf, cwd=tmp, capture_output=True,
                             text=True, env=terraform_env(), check=False)
        assert res.returncode == 0, res.stderr
        for n in tf:
            with open(os.path.join(tmp, n), encoding="utf-8") as fh:
                out[n] = fh.read()
    return out


def plans(root: str, lifecycle: str, overlays: tuple = (), undeclare: tuple = (), **opts: Any) -> List[RootPlan]:
    tree, meta = load_and_validate(root, overlays=overlays, undeclare=undeclare)
    return plan_roots(tree, meta, lifecycle, RenderOptions(**opts))


def norm(text: str) -> str:
    """Text with runs of spaces collapsed (so assertions ignore fmt alignment)."""
    return re.sub(r" +", " ", text)


def by_builder(ps: List[RootPlan]) -> Dict[str, RootPlan]:
    return {p.builder: p for p in ps}


def write_overlay(root: str, name: str, config: Dict[str, Any]) -> str:
    path = os.path.join(root, "overlays", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump({"config": config}, fh)
    return path


# --------------------------------------------------------------------------- golden
def test_golden_examples(tmp_path: Any) -> None:
    """Every emitted file of the identity, storage and instance roots of examples/."""
    root = rt.copy_tree("examples", str(tmp_path))
    res = service.render(root, ALL, dry_run=True, prepare=False)
    assert res["changed"] is True
    got = rt.files_under(os.path.join(root, "generated"))
    # the vendored collection modules are tfmodules/ itself (tests/unit/test_module_vendor.py)
    got = {rel: data for rel, data in got.items() if not rel.startswith(".modules" + os.sep)}
    assert any(p.endswith(MANIFEST) for p in got)
    if os.environ.get("CSIS_UPDATE_GOLDEN") == "1":
        shutil.rmtree(rt.GOLDEN_DIR, ignore_errors=True)
        for rel, data in got.items():
            dest = os.path.join(rt.GOLDEN_DIR, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as fh:
                fh.write(data)
    want = rt.files_under(rt.GOLDEN_DIR)
    assert want, "no golden under %s: run scripts/update-golden" % rt.GOLDEN_DIR
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing, "golden files not emitted: %s" % missing
    assert not extra, "emitted files not in the golden (scripts/update-golden if intended): %s" % extra
    differ = [rel for rel in sorted(want) if want[rel] != got[rel]]
    if differ:
        import difflib
        rel = differ[0]
        diff = "".join(difflib.unified_diff(want[rel].decode().splitlines(True), got[rel].decode().splitlines(True),
                                            "golden/" + rel, "emitted/" + rel))
        pytest.fail("emitted files differ from the golden: %s\n%s" % (differ, diff))


def test_golden_matches_the_manual_file_table() -> None:
    """The golden holds exactly the manual's files per root (Emission table), nothing else."""
    files = set(rt.files_under(rt.GOLDEN_DIR))
    inst = "instance-image/open-tofu/instance-generation/"
    assert {inst + n for n in (
        "open-tofu-instance-generation.tf", "open-tofu-instance-generation.tfbackend.hcl",
        "open-tofu-instance-generation-instance-test.tf", "open-tofu-instance-generation-instance-test2.tf",
        "user-data-test.sh.tftpl", "user-data-test2.sh.tftpl", MANIFEST)} <= files
    for b, s in (("aws-ebs", "mnt_data"), ("aws-efs", "efs_storage"), ("aws-s3", "default_bucket")):
        d = "storage/%s/storage-generation/" % b
        assert {d + "%s-storage-generation.tf" % b, d + "%s-storage-generation.tfbackend.hcl" % b,
                d + "%s-storage-generation-storage-%s.tf" % (b, s), d + MANIFEST} <= files
    ident = "identity/posix-groups/identity-generation/"
    assert {ident + "posix-groups-identity-generation.tf", ident + "posix-groups-identity-generation.tfbackend.hcl"} <= files
    golden = {rel: data.decode() for rel, data in rt.files_under(rt.GOLDEN_DIR).items()}
    test2 = golden[inst + "open-tofu-instance-generation-instance-test2.tf"]
    assert 'ami_id                      = var.test2_ami_id' in test2
    assert 'ami_name_pattern            = "imgfile-basic-dask-pckr-ebs-ans*"' in test2
    assert 'source = "../../../.modules/%s/aws_instance"' % MODULES_VERSION in test2
    assert "aws = aws.open_tofu" in test2
    assert 'device_name = "/dev/xvdf"' in test2
    assert 'group_gids["coops"]' in test2
    main = golden[inst + "open-tofu-instance-generation.tf"]
    for needle in ('backend "s3" {}', 'alias                       = "open_tofu"', 'variable "test_ami_id"',
                   'variable "test2_ami_id"', 'variable "sft_enrollment_token"', 'data "aws_vpc" "csis_instances"',
                   'resource "aws_security_group" "csis_instances"', 'data "terraform_remote_state" "posix_groups"',
                   'data "terraform_remote_state" "aws_ebs"', "create_before_destroy = true"):
        assert needle in main, needle
    assert 'variable "ephemeral_present"' not in main
    ud = golden[inst + "user-data-test2.sh.tftpl"]
    assert ud.index("mount '/mnt/data'") < ud.index("chmod 2770 '/mnt/data/coops'") < ud.index("date -u +%FT%TZ > /var/lib/csis/launch-applied")
    assert "|| true" not in ud
    assert "nvme-Amazon_Elastic_Block_Store_" in ud and "mkfs -t xfs" in ud
    # the mount point's other fstab lines go by their second field compared as a string: '.' or '+'
    # in a mount point is no pattern that takes another mount's line (/mnt/data.1 against /mnt/data-1)
    (line,) = [x for x in ud.splitlines() if x.startswith("awk ") and "/etc/fstab" in x]
    assert line == "awk -v mp='/mnt/data' '$2 != mp' /etc/fstab > /etc/fstab.csis-launch", line
    efs = golden["storage/aws-efs/storage-generation/aws-efs-storage-generation-storage-efs_storage.tf"]
    assert 'transition_to_ia = "AFTER_30_DAYS"' in efs.replace("  ", " ").replace("  ", " ") or "AFTER_30_DAYS" in efs
    assert 'permissions = "2775"' in efs and 'group_gids["stofs"]' in efs
    s3 = golden["storage/aws-s3/storage-generation/aws-s3-storage-generation-storage-default_bucket.tf"]
    assert "STANDARD_IA" in s3 and "public_read = true" in s3.replace("  ", " ")
    be = golden[inst + "open-tofu-instance-generation.tfbackend.hcl"]
    assert 'key          = "statefiles/csis-example/open_tofu.tfstate"' in be


def test_emission_is_already_in_fmt_form(tmp_path: Any) -> None:
    """What render plans is byte-identical to what terraform fmt makes of it (service.render
    writes the planned texts as they are; `fmt -check` runs in every prepared root)."""
    for name in ("examples", "variations", "nobackend", "escaping"):
        root = rt.write_escaping_tree(str(tmp_path)) if name == "escaping" else rt.copy_tree(name, str(tmp_path))
        for lc in ALL:
            for p in plans(root, lc):
                assert fmt_texts(p.files, "terraform") == p.files, (name, p.builder)


# --------------------------------------------------------------------------- variations
@pytest.fixture(scope="module")
def variations(tmp_path_factory: Any) -> Dict[str, Any]:
    root = rt.copy_tree("variations", str(tmp_path_factory.mktemp("variations")))
    return {"root": root, "storage": by_builder(plans(root, "storage")),
            "instance": by_builder(plans(root, "instance-image")), "identity": by_builder(plans(root, "identity"))}


def test_variations_roots(variations: Dict[str, Any]) -> None:
    assert sorted(variations["storage"]) == ["ebs", "efs", "s3"]
    assert sorted(variations["instance"]) == ["tofu-plain", "tofu-vpc"]
    assert sorted(variations["identity"]) == ["posix-groups"]
    ident = variations["identity"]["posix-groups"]
    assert ident.backend_type == "local"
    assert 'groups = {\n    ops = 4000\n    sci = 4001\n  }' in ident.files["posix-groups-identity-generation.tf"]


def test_ephemeral_instance(variations: Dict[str, Any]) -> None:
    p = variations["instance"]["tofu-vpc"]
    assert p.ephemeral == ["eph"]
    f = p.files["tofu-vpc-instance-generation-instance-eph.tf"]
    assert "count  = var.ephemeral_present ? 1 : 0" in f
    main = p.files["tofu-vpc-instance-generation.tf"]
    assert 'variable "ephemeral_present" {' in main and "type        = bool" in main
    # durable instances stay unconditional
    assert "count" not in p.files["tofu-vpc-instance-generation-instance-declared1.tf"]
    assert 'variable "ephemeral_present"' not in variations["instance"]["tofu-plain"].files["tofu-plain-instance-generation.tf"]


def test_deferred_declared_and_pinned_images(variations: Dict[str, Any]) -> None:
    f = variations["instance"]["tofu-vpc"].files
    deferred = f["tofu-vpc-instance-generation-instance-deferred1.tf"]
    assert "ami_id                      = var.deferred1_ami_id" in deferred
    assert 'ami_name_pattern            = "var-deferred-img*"' in deferred
    declared = f["tofu-vpc-instance-generation-instance-declared1.tf"]
    assert 'ami_id                      = "ami-0123456789abcdef0"' in declared
    assert "ami_name_pattern" not in declared
    pinned = f["tofu-vpc-instance-generation-instance-pinned1.tf"]
    assert 'ami_id                      = "ami-0aaaaaaaaaaaaaaa1"' in pinned  # the pin beats the declared image
    assert "ami_name_pattern" not in pinned
    for lab in ("eph", "deferred1", "declared1", "pinned1", "follower"):
        assert 'variable "%s_ami_id" {' % lab in f["tofu-vpc-instance-generation.tf"]


def test_follow_target_is_replaced(variations: Dict[str, Any]) -> None:
    p = variations["instance"]["tofu-vpc"]
    f = p.files["tofu-vpc-instance-generation-instance-follower.tf"]
    assert 'ami_id                      = "ami-0fedcba9876543210"' in f  # the head, not the pin
    assert p.replace == ["module.instance_follower.aws_instance.this"]
    assert "module.instance_follower.aws_instance.this" in p.allow_destroy
    assert "module.instance_follower.aws_volume_attachment.this" in p.allow_destroy
    assert p.instances["follower"]["launch_params"]["hostname"] == "follower-002"  # next generation
    # a pinned (not follow) instance is not replaced, and keeps its hostname
    assert p.instances["pinned1"]["launch_params"]["hostname"] == "pinned1-001"
    assert not any("pinned1.aws_instance" in a for a in p.allow_destroy)


def test_vpc_and_no_vpc_runtimes(variations: Dict[str, Any]) -> None:
    vpc = variations["instance"]["tofu-vpc"].files
    main = vpc["tofu-vpc-instance-generation.tf"]
    assert 'data "aws_vpc" "csis_instances"' in main and 'resource "aws_security_group" "csis_instances"' in main
    # no ssh_ingress_security_group_ids: SSH from the VPC's CIDR
    assert "cidr_blocks = [data.aws_vpc.csis_instances.cidr_block]" in main
    assert 'profile                     = "varprofile"' in main or 'profile = "varprofile"' in main.replace("  ", "")
    decl = vpc["tofu-vpc-instance-generation-instance-declared1.tf"]
    assert ('vpc_security_group_ids      = concat([aws_security_group.csis_instances.id], '
            '["sg-0123456789abcdef0", "sg-0fedcba9876543210"])') in decl
    assert 'iam_instance_profile        = "csis-ssm"' in decl
    plain = variations["instance"]["tofu-plain"].files
    pmain = plain["tofu-plain-instance-generation.tf"]
    assert "aws_vpc" not in pmain and "aws_security_group" not in pmain
    loner = plain["tofu-plain-instance-generation-instance-loner.tf"]
    assert "vpc_security_group_ids" not in loner
    assert "subnet_id" not in loner and "iam_instance_profile" not in loner  # ssh session, no networking
    assert 'instance_type               = "t3.small"' in loner  # the runtime's default machine type
    assert 'region = "us-west-2"' in pmain
    assert 'backend "local" {}' in pmain
    assert "terraform_remote_state" not in pmain  # groupless, mountless


def test_instance_mounts_and_remote_state(variations: Dict[str, Any]) -> None:
    p = variations["instance"]["tofu-vpc"]
    d = p.files["tofu-vpc-instance-generation-instance-deferred1.tf"]
    assert "volume_id   = data.terraform_remote_state.ebs.outputs.storage_data_vol.volume_id" in d
    assert 'access_point_id = data.terraform_remote_state.efs.outputs.storage_shared_efs.access_point_ids["ops"]' in d
    assert "ebs_volumes = {" in d
    assert 'instance_type               = "t3.large"' in d
    main = p.files["tofu-vpc-instance-generation.tf"]
    for ws in ("posix_groups", "ebs", "efs"):
        assert 'data "terraform_remote_state" "%s"' % ws in main
    assert 'data "terraform_remote_state" "s3"' not in main  # an s3 mount reads nothing
    ud = p.files["user-data-deferred1.sh.tftpl"]
    assert ud.index("# mount data-vol (ebs) at /data") < ud.index("# mount shared-efs (efs) at /shared")
    assert "chmod 2770 '/data/ops'" in ud
    assert 'EFS_AP="${efs["shared-efs"].access_point_id}"' in ud
    assert ud.rstrip().endswith("date -u +%FT%TZ > /var/lib/csis/launch-applied")


def test_detach_and_decommission(variations: Dict[str, Any]) -> None:
    p = variations["instance"]["tofu-vpc"]
    assert p.decommission == ["gone-box"]
    assert "module.instance_gone_box" in p.allow_destroy
    assert 'module.instance_pinned1.aws_volume_attachment.this["old-vol"]' in p.allow_destroy
    assert p.require_unmounted == ["pinned1:old-vol"]
    assert p.unmounts == [{"instance": "pinned1", "storage": "old-vol", "mount_point": "/old", "type": "ebs"}]
    assert not any(n.endswith("gone_box.tf") for n in p.files)
    assert variations["instance"]["tofu-plain"].allow_destroy == []


def test_instance_less_root_of_a_decommission(tmp_path: Any) -> None:
    """Every declared instance of a builder gone, one launched on record: the root is
    terraform + provider + backend only and its whitelist is the decommission."""
    root = rt.copy_tree("variations", str(tmp_path))
    with open(os.path.join(root, "instances", "instances.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump({"instances": [{"name": "loner", "type": "tofu-plain", "image": "plain-img"}]}, fh)
    with open(os.path.join(root, "meta-state", "pins.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump({"instances": {}, "pending_replacements": {}, "upgrades": []}, fh)
    with open(os.path.join(root, "meta-state", "instance-state.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump({"instances": {}}, fh)  # no open generation without its launch record
    with open(os.path.join(root, "meta-state", "launch-params.yaml"), encoding="utf-8") as fh:
        lp = yaml.safe_load(fh)
    lp["instances"] = {"gone-box": lp["instances"]["gone-box"]}
    with open(os.path.join(root, "meta-state", "launch-params.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(lp, fh)
    p = by_builder(plans(root, "instance-image"))["tofu-vpc"]
    assert p.decommission == ["gone-box"]
    assert "module.instance_gone_box" in p.allow_destroy
    assert sorted(p.files) == ["tofu-vpc-instance-generation.tf", "tofu-vpc-instance-generation.tfbackend.hcl"]
    main = p.files["tofu-vpc-instance-generation.tf"]
    assert "module " not in main and "aws_security_group" not in main


def test_storage_states(variations: Dict[str, Any]) -> None:
    ebs = variations["storage"]["ebs"]
    f = ebs.files
    # restore: recorded archived, declared active; archived the old way (csis-restored-vol-archive,
    # recorded in facts.archive): restored and deleted by the recorded name
    restored = f["ebs-storage-generation-storage-restored_vol.tf"]
    assert 'snapshot_name = "csis-restored-vol-archive"' in norm(restored)
    # the restore snapshot must carry the storage's and the tree's tags (never another tree's)
    assert 'csis_storage = "restored-vol"' in norm(restored) and "csis_config" in restored
    assert 'availability_zone = "us-east-2b"' in norm(restored)  # the storage's own zone wins
    assert {"storage": "restored-vol", "action": "delete_archive_snapshot", "from": "archived", "to": "active",
            "snapshot_name": "csis-restored-vol-archive"} in [{k: v for k, v in t.items() if k != "tags"}
                                                              for t in ebs.transitions_after]
    # a new storage: no snapshot; the runtime's default subnet gives the zone
    data = f["ebs-storage-generation-storage-data_vol.tf"]
    assert "snapshot_name" not in data and 'subnet_id = "subnet-0123456789abcdef0"' in norm(data)
    assert 'output "storage_data_vol" {' in data
    assert 'volume_type = "gp3"' in data and "encrypted" not in data  # undeclared variables are absent
    # tombstone and archived: comment-only files
    for lab in ("tomb_vol", "archive_vol"):
        text = f["ebs-storage-generation-storage-%s.tf" % lab]
        assert all(line.startswith("#") for line in text.splitlines() if line.strip()), text
    # a new archive takes the manual's name, csis-<label>-archive
    assert "csis-archive_vol-archive" in f["ebs-storage-generation-storage-archive_vol.tf"]
    assert not any("lost_vol" in n for n in f)  # undeclared: no file
    assert ebs.allow_destroy == ["module.storage_archive_vol", "module.storage_tomb_vol", "module.storage_lost_vol"]
    before = {t["storage"]: t for t in ebs.transitions_before}
    assert before["archive-vol"]["action"] == "snapshot" and before["archive-vol"]["snapshot_name"] == "csis-archive_vol-archive"
    assert before["tomb-vol"]["to"] == "destroyed" and before["lost-vol"]["to"] == "destroyed"
    assert "ancient-vol" not in ebs.storages  # destroyed long ago: nothing to plan
    assert ebs.storages["lost-vol"]["undeclared"] is True
    s3 = variations["storage"]["s3"]
    assert s3.allow_destroy == ["module.storage_tomb_bucket"]
    assert s3.transitions_before == [{"storage": "tomb-bucket", "action": "empty_bucket", "from": "active",
                                      "to": "destroyed", "bucket": "tomb-bucket", "address": "module.storage_tomb_bucket"}]


def test_efs_adoption_and_networking(variations: Dict[str, Any]) -> None:
    f = variations["storage"]["efs"].files
    adopted = f["efs-storage-generation-storage-adopted_efs.tf"]
    assert 'existing_file_system_id = "fs-0123456789abcdef0"' in adopted
    assert "transition_to_ia" not in adopted  # an adopted filesystem keeps its own lifecycle
    assert "public_read = true" in norm(adopted)
    shared = f["efs-storage-generation-storage-shared_efs.tf"]
    assert "existing_file_system_id" not in shared
    assert 'transition_to_ia      = "AFTER_30_DAYS"' in shared and 'transition_to_archive = "AFTER_90_DAYS"' in shared
    # one private subnet per zone, in declaration order; the public one is skipped
    assert 'mount_target_subnet_ids   = ["subnet-0123456789abcdef0", "subnet-0123456789abcdef2"]' in shared
    assert 'permissions = "2775"' in shared
    assert 'data "terraform_remote_state" "posix_groups"' in f["efs-storage-generation.tf"]


def test_efs_mount_through_public_read_is_read_only(tmp_path: Any) -> None:
    """An instance whose group is not one of a public_read EFS storage's groups reaches it through
    the public access point (the filesystem's root) and mounts it read-only; a member mounts its
    group's directory read-write."""
    root = rt.copy_tree("variations", str(tmp_path))
    path = os.path.join(root, "storages", "storages.yaml")
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    (adopted,) = [x for x in doc["storages"] if x["name"] == "adopted-efs"]
    adopted["groups"] = ["sci"]  # declared1's image is of group ops: public read only
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh)
    p = by_builder(plans(root, "instance-image"))["tofu-vpc"]
    assert "storage_adopted_efs.public_read_access_point_id" in p.files["tofu-vpc-instance-generation-instance-declared1.tf"]
    (mnt,) = p.instances["declared1"]["launch_params"]["mounts"]
    assert mnt["read_only"] is True
    assert '"$EFS_ID:/ /adopted efs _netdev,tls,accesspoint=$EFS_AP,ro,nofail 0 0"' in p.files["user-data-declared1.sh.tftpl"]
    # a member (deferred1, group ops, of shared-efs's groups): its group's access point, read-write
    (shared,) = [x for x in p.instances["deferred1"]["launch_params"]["mounts"] if x["type"] == "efs"]
    assert "read_only" not in shared
    assert '"$EFS_ID:/ /shared efs _netdev,tls,accesspoint=$EFS_AP,nofail 0 0"' in p.files["user-data-deferred1.sh.tftpl"]


def test_s3_arguments(variations: Dict[str, Any]) -> None:
    f = variations["storage"]["s3"].files["s3-storage-generation-storage-data_bucket.tf"]
    f = norm(f)
    assert "force_destroy = true" in f
    # it declares no bucket_name: its builder's bucket_name is its default (the manual's rule)
    assert 'bucket_name = "csis-variations-data"' in f
    assert 'group_prefixes = ["ops", "sci"]' in f  # sorted
    assert "expire_days = 365" in f and "public_read = true" in f


@pytest.mark.parametrize("flags, apply_runtime, want", [
    ({"apply_storage": False, "apply_instances": False}, None,
     {"ebs": False, "efs": False, "s3": False, "tofu-vpc": False, "tofu-plain": False}),
    ({"apply_storage": True, "apply_instances": True}, None,
     {"ebs": True, "efs": True, "s3": True, "tofu-vpc": True, "tofu-plain": True}),
    # lists name builders, runtimes or runtime aliases
    ({"apply_storage": ["ebs", "s3"], "apply_instances": ["west"]}, None,
     {"ebs": True, "efs": False, "s3": True, "tofu-vpc": False, "tofu-plain": True}),
    ({"apply_storage": ["rt-vpc"], "apply_instances": ["tofu-vpc"]}, None,
     {"ebs": True, "efs": True, "s3": True, "tofu-vpc": True, "tofu-plain": False}),
    # apply_runtime narrows an 'on' flag to that runtime
    ({"apply_storage": True, "apply_instances": True}, "rt-novpc",
     {"tofu-plain": True}),
])
def test_may_apply(tmp_path: Any, flags: Dict[str, Any], apply_runtime: Optional[str], want: Dict[str, bool]) -> None:
    root = rt.copy_tree("variations", str(tmp_path))
    ov = write_overlay(root, "flags.yml", flags)
    got = {}
    for lc in ("storage", "instance-image"):
        for p in plans(root, lc, overlays=(ov,), apply_runtime=apply_runtime):
            got[p.builder] = p.may_apply
    assert got == want


def test_fixture_flags_as_declared(variations: Dict[str, Any]) -> None:
    # cfg/_config.yml: apply_instances [rt-novpc], apply_storage [ebs], apply_identity false
    assert {b: p.may_apply for b, p in variations["instance"].items()} == {"tofu-vpc": False, "tofu-plain": True}
    assert {b: p.may_apply for b, p in variations["storage"].items()} == {"ebs": True, "efs": False, "s3": False}
    assert variations["identity"]["posix-groups"].may_apply is False


def test_only_runtime_scope(tmp_path: Any) -> None:
    root = rt.copy_tree("variations", str(tmp_path))
    assert [p.builder for p in plans(root, "instance-image", only_runtime="rt-novpc")] == ["tofu-plain"]
    assert plans(root, "storage", only_runtime="rt-novpc") == []
    assert plans(root, "identity", only_runtime="west") == []
    res = service.render(root, ALL, only_runtime="rt-novpc", prepare=False)
    assert [r["builder"] for r in res["roots"]] == ["tofu-plain"]
    gen = os.path.join(root, "generated")
    assert sorted(os.listdir(os.path.join(gen, "instance-image"))) == ["tofu-plain"]
    assert not os.path.exists(os.path.join(gen, "storage")) and not os.path.exists(os.path.join(gen, "identity"))


def test_undeclare_is_a_decommission(tmp_path: Any) -> None:
    root = rt.copy_tree("variations", str(tmp_path))
    p = by_builder(plans(root, "instance-image", undeclare=("pinned1",)))["tofu-vpc"]
    assert "module.instance_pinned1" in p.allow_destroy and "pinned1" in p.decommission
    assert not any("pinned1.tf" in n for n in p.files)


# --------------------------------------------------------------------------- no backend
def test_no_state_backends(tmp_path: Any) -> None:
    root = rt.copy_tree("nobackend", str(tmp_path))
    ps = [p for lc in ALL for p in plans(root, lc)]
    assert sorted(p.builder for p in ps) == ["solo-ebs", "solo-s3", "solo-tofu"]
    for p in ps:
        assert p.backend_file is None and p.backend_type is None
        assert not any(n.endswith(".tfbackend.hcl") for n in p.files)
        for text in p.files.values():
            assert 'backend "' not in text
            assert "terraform_remote_state" not in text
    inst = by_builder(ps)["solo-tofu"].files
    box = inst["solo-tofu-instance-generation-instance-solo_box.tf"]
    assert 'name                        = "solo.box"' in box and 'group_gid            = ""' in box
    assert 'profile = "solo-profile"' in inst["solo-tofu-instance-generation.tf"]
    s3 = by_builder(ps)["solo-s3"].files["solo-s3-storage-generation-storage-solo_logs.tf"]
    assert 'storage_class   = "GLACIER_IR"' in s3 and 'prefix          = "logs/"' in s3


def test_no_state_backends_refuses_groups(tmp_path: Any) -> None:
    root = rt.copy_tree("nobackend", str(tmp_path))
    with open(os.path.join(root, "storages", "storages.yaml"), "a", encoding="utf-8") as fh:
        fh.write("  - {name: grouped, type: solo-s3, groups: [nobody]}\n")
    with pytest.raises(ConfigError):
        load_and_validate(root)


# --------------------------------------------------------------------------- escaping
def test_escaping_tree_validates_and_renders(tmp_path: Any) -> None:
    root = rt.write_escaping_tree(str(tmp_path))
    res = service.render(root, ALL, prepare=False)
    d = os.path.join(root, "generated", "instance-image", "solo-tofu", "instance-generation")
    with open(os.path.join(d, "solo-tofu-instance-generation-instance-solo_box.tf"), encoding="utf-8") as fh:
        box = fh.read()
    assert '"we\\"ird key" = "v"' in box
    assert '"for"         = "a key that is an HCL keyword"' in box
    assert '"$${key}"' in box and '"$${var.secret}"' in box
    assert '"%%{ for x in y }$${x}%%{ endfor }"' in box
    assert '"line one, two; and (three)"' in box
    with open(os.path.join(d, "user-data-solo_box.sh.tftpl"), encoding="utf-8") as fh:
        tpl = fh.read()
    assert 'echo "quoted $${HOME} and $$${literal} and %%{ if x }not a directive%%{ endif }"' in tpl
    assert res["changed"] is True


# --------------------------------------------------------------------------- check mode, idempotence
def test_check_mode_writes_nothing(tmp_path: Any) -> None:
    root = rt.copy_tree("examples", str(tmp_path))
    before = rt.tree_hash(str(tmp_path))
    res = service.render(root, ALL, check_mode=True, want_diff=True, prepare=False)
    assert res["changed"] is True
    assert not os.path.exists(os.path.join(root, "generated"))
    assert rt.tree_hash(str(tmp_path)) == before
    assert all(r["changed"] and r["added"] for r in res["roots"])
    assert any(d["after_header"].endswith("user-data-test2.sh.tftpl") for d in res["diff"])
    assert not any(d["after_header"].endswith(MANIFEST) for d in res["diff"])  # bookkeeping beside new files


def test_check_mode_of_a_dry_run_shows_the_following_roots_it_would_prepare(tmp_path: Any) -> None:
    """A dry run writes the following lifecycles' roots too (prepare_ahead); its check mode reports
    them, and their files in the diff, as it reports its own, and writes none of them."""
    root = rt.copy_tree("examples", str(tmp_path))
    before = rt.tree_hash(str(tmp_path))
    res = service.render(root, ["storage"], dry_run=True, check_mode=True, want_diff=True, prepare_ahead=True)
    assert rt.tree_hash(str(tmp_path)) == before
    assert [a["key"] for a in res["prepared_ahead"]] == ["instance-image-open-tofu"], res["prepared_ahead"]
    assert res["prepared_ahead"][0]["changed"] is True and res["prepared_ahead"][0]["commands"] == []
    assert any(d["after_header"].endswith("user-data-test2.sh.tftpl") for d in res["diff"])
    # once a dry run wrote them, check mode has nothing ahead to show
    service.render(root, ["storage", "instance-image"], dry_run=True, prepare=False)
    again = service.render(root, ["storage"], dry_run=True, check_mode=True, want_diff=True, prepare_ahead=True)
    assert again["prepared_ahead"] == [] and again["diff"] == [] and again["changed"] is False, again["diff"]


def test_second_render_is_unchanged(tmp_path: Any) -> None:
    root = rt.copy_tree("variations", str(tmp_path))
    first = service.render(root, ALL, prepare=False)
    assert first["changed"] is True
    gen = os.path.join(root, "generated")
    h = rt.tree_hash(gen)
    second = service.render(root, ALL, prepare=False)
    assert second["changed"] is False
    assert not any(r["changed"] or r["added"] or r["modified"] or r["removed"] for r in second["roots"])
    assert rt.tree_hash(gen) == h
    check = service.render(root, ALL, check_mode=True, want_diff=True, prepare=False)
    assert check["changed"] is False and check["diff"] == []
    # a root whose files are as rendered but whose manifest is gone: changed, and the diff shows the
    # manifest it would write (never "changed" with nothing to show)
    some = first["roots"][0]["directory"]
    with open(os.path.join(some, MANIFEST), encoding="utf-8") as fh:
        manifest = fh.read()
    os.unlink(os.path.join(some, MANIFEST))
    check = service.render(root, ALL, check_mode=True, want_diff=True, prepare=False)
    assert check["changed"] is True
    assert [(d["after_header"], d["before"], d["after"]) for d in check["diff"]] == \
        [(os.path.join(some, MANIFEST), "", manifest)], check["diff"]


def test_only_roots_writes_those_roots_and_leaves_the_others(tmp_path: Any) -> None:
    """only_roots (the record step's render of the one root whose launch pinned an AMI): the
    other roots of the lifecycle keep their files, even where they differ from a render."""
    root = rt.copy_tree("variations", str(tmp_path))
    service.render(root, ["instance-image"], prepare=False)
    gen = os.path.join(root, "generated", "instance-image")
    tampered = {}
    for builder in ("tofu-vpc", "tofu-plain"):
        path = os.path.join(gen, builder, "instance-generation", "%s-instance-generation.tf" % builder)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("# changed by hand\n")
        tampered[builder] = path
    res = service.render(root, ["instance-image"], prepare=False, only_roots=["instance-image-tofu-vpc"])
    assert [r["key"] for r in res["roots"]] == ["instance-image-tofu-vpc"]
    assert res["roots"][0]["modified"] == ["tofu-vpc-instance-generation.tf"] and res["changed"] is True
    with open(tampered["tofu-vpc"], encoding="utf-8") as fh:
        assert "# changed by hand" not in fh.read()
    with open(tampered["tofu-plain"], encoding="utf-8") as fh:
        assert "# changed by hand" in fh.read()
    with pytest.raises(ConfigError, match=r"no root instance-image-nope in this render \(its roots: "
                                          r"instance-image-tofu-vpc, instance-image-tofu-plain\)") as err:
        service.render(root, ["instance-image"], prepare=False, only_roots=["instance-image-nope"])
    assert [p.key for p in err.value.problems] == ["only_roots"]


def test_check_mode_reports_a_change_without_writing(tmp_path: Any) -> None:
    root = rt.copy_tree("examples", str(tmp_path))
    service.render(root, ALL, prepare=False)
    gen = os.path.join(root, "generated")
    h = rt.tree_hash(gen)
    with open(os.path.join(root, "instances", "instances.yaml"), "a", encoding="utf-8") as fh:
        fh.write("  - {name: test3, image: imgfile-basic}\n")
    res = service.render(root, ["instance-image"], check_mode=True, want_diff=True, prepare=False)
    assert res["changed"] is True
    (r,) = res["roots"]
    assert "open-tofu-instance-generation-instance-test3.tf" in r["added"]
    assert "open-tofu-instance-generation.tf" in r["modified"]
    assert rt.tree_hash(gen) == h


def test_removed_instance_file_is_removed(tmp_path: Any) -> None:
    root = rt.copy_tree("examples", str(tmp_path))
    service.render(root, ["instance-image"], prepare=False)
    with open(os.path.join(root, "instances", "instances.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump({"instances": [{"name": "test", "image": "imgfile-basic"}]}, fh)
    res = service.render(root, ["instance-image"], prepare=False)
    (r,) = res["roots"]
    assert sorted(r["removed"]) == ["open-tofu-instance-generation-instance-test2.tf", "user-data-test2.sh.tftpl"]
    d = os.path.join(root, "generated", "instance-image", "open-tofu", "instance-generation")
    assert not os.path.exists(os.path.join(d, "user-data-test2.sh.tftpl"))


@pytest.mark.parametrize("breakage", ["yaml", "reference", "state_machine"])
def test_failed_validation_leaves_generated_as_it_was(tmp_path: Any, breakage: str) -> None:
    root = rt.copy_tree("variations", str(tmp_path))
    service.render(root, ALL, prepare=False)
    # a file that is not ours, inside a root, must survive too
    keep = os.path.join(root, "generated", "storage", "ebs", "storage-generation", "tfplan")
    with open(keep, "w", encoding="utf-8") as fh:
        fh.write("plan")
    gen = os.path.join(root, "generated")
    before = rt.tree_hash(gen)
    if breakage == "yaml":
        with open(os.path.join(root, "instances", "instances.yaml"), "a", encoding="utf-8") as fh:
            fh.write("  - name: [unclosed\n")
    elif breakage == "reference":
        with open(os.path.join(root, "instances", "instances.yaml"), "a", encoding="utf-8") as fh:
            fh.write("  - {name: new-one, image: no-such-image}\n")
    else:
        with open(os.path.join(root, "storages", "storages.yaml"), "a", encoding="utf-8") as fh:
            fh.write("  - {name: born-archived, type: ebs, state: archived}\n")
    with pytest.raises(ConfigError):
        service.render(root, ALL, prepare=False)
    assert rt.tree_hash(gen) == before


def test_deferred_commands_follow_the_chain(variations: Dict[str, Any]) -> None:
    """A dry run lists what a real run executes per root (the manual's deferred commands)."""
    p = variations["instance"]["tofu-vpc"]
    steps = p.deferred()
    assert steps[0].startswith("%s init -input=false -reconfigure" % p.binary)
    # a real run's render skips the init where the root's last one still holds: the line says so
    assert steps[0].endswith("(by the render, unless what init reads is unchanged since the root's last successful init)")
    plan = [s for s in steps if " plan " in s]
    assert len(plan) == 1 and "-replace=module.instance_follower.aws_instance.this" in plan[0]
    gate = [s for s in steps if s.startswith("csis_gate_plan")][0]
    assert "--allow-destroy module.instance_follower.aws_instance.this" in gate
    order = [next(i for i, s in enumerate(steps) if s.startswith(k)) for k in
             ("%s init" % p.binary, "%s plan" % p.binary, "csis_gate_plan")]
    assert order == sorted(order)
    if p.may_apply:
        apply_at = next(i for i, s in enumerate(steps) if " apply " in s)
        check_at = next(i for i, s in enumerate(steps) if s.startswith("csis_apply_check"))
        assert order[-1] < check_at < apply_at < steps.index("csis_record (meta-state: what the state now holds)")
        assert any(s.startswith("verify ephemeral instances eph") for s in steps)
    else:
        assert steps[-1].startswith("(apply flag off")
    assert p.as_dict("/x")["deferred"] == steps


def test_deferred_commands_without_apply_flag(variations: Dict[str, Any]) -> None:
    import dataclasses
    p = dataclasses.replace(variations["storage"]["ebs"], may_apply=False)
    steps = p.deferred()
    assert steps[-1] == "(apply flag off: planned and gated only, nothing applied)"
    assert not any(" apply " in s or s.startswith("csis_record") for s in steps)


def test_backend_settings_cut_short_by_a_killed_init_are_dropped_before_the_next_init(tmp_path):
    """A run SIGKILLed during `terraform init` can leave .terraform/terraform.tfstate empty or cut
    (seen in tests/faults/test_kill_at_every_step.py); every later init then fails with "Failed to
    load state: invalid syntax". The render drops it before its init (init -reconfigure writes it
    again from the backend file); a whole one is kept."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.render import writer

    root = tmp_path / "root"
    (root / ".terraform").mkdir(parents=True)
    settings = root / ".terraform" / "terraform.tfstate"
    assert writer.drop_torn_backend_settings(str(root)) is False  # none: nothing to do
    whole = '{"version": 3, "backend": {"type": "s3", "config": {}, "hash": 1}}'
    settings.write_text(whole, encoding="utf-8")
    assert writer.drop_torn_backend_settings(str(root)) is False and settings.read_text(encoding="utf-8") == whole
    for torn in ("", '{"version": 3, "backend": {"ty', "\x00\x00", "[]"):
        settings.write_text(torn, encoding="utf-8")
        assert writer.drop_torn_backend_settings(str(root)) is True and not settings.exists(), torn


def test_recorded_storages_are_what_the_storage_check_looks_up(tmp_path: Any) -> None:
    """A first create records nothing: no storage to look up (the chain skips csis_storage_check
    and the dry run does not list it); a storage recorded active or archived is looked up, one
    recorded destroyed is not."""
    root = rt.copy_tree("examples", str(tmp_path))
    tree, meta = load_and_validate(root)

    def ebs_root() -> Dict[str, Any]:
        plan = [p for p in plan_roots(tree, meta, "storage", RenderOptions()) if p.builder == "aws-ebs"][0]
        return plan.as_dict(root)

    first = ebs_root()
    assert "mnt_data" in first["storages"] and first["recorded_storages"] == []
    assert not [c for c in first["deferred"] if c.startswith("csis_storage_check")]
    facts = {"builder": "aws-ebs", "type": "ebs", "volume_id": "vol-1"}
    for state, looked_up in (("active", ["mnt_data"]), ("archived", ["mnt_data"]), ("destroyed", [])):
        meta["storage-state.yaml"] = {"storages": {"mnt_data": {"state": state, "generation": 1, "facts": facts}}}
        item = ebs_root()
        assert item["recorded_storages"] == looked_up, state
        listed = [c for c in item["deferred"] if c.startswith("csis_storage_check")]
        assert listed == (["csis_storage_check mnt_data (recorded storages still exist)"] if looked_up else []), state
