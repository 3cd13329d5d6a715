# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Settings the reference manual describes that used to be accepted and ignored (issue 13
items 1, 2, 3, 5, 10, 12) and tag values AWS would alter (issue 16): each is now either
honoured as the manual says or a documented, configurable difference (docs/differences.md)."""
from __future__ import annotations

import os
import sys

import pytest
from trees import edit_yaml as edit, write_meta  # noqa: E402  (tests/support)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bad_inputs"))
import corpus  # noqa: E402
from render_trees import copy_tree  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.config import models as m  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.plan import RenderOptions  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.roots import plan_roots  # noqa: E402

RT = "aws-east2-runtime"
RELEASED, HEAD, OTHER = "ami-0000000000000aaa1", "ami-0000000000000ccc2", "ami-0000000000000ddd3"


@pytest.fixture
def tree(tmp_path):
    return copy_tree("examples", str(tmp_path))


def validated(root):
    return load_and_validate(root, run_version=corpus.version_stub({}))


def problems(root):
    with pytest.raises(ConfigError) as err:
        validated(root)
    return [(p.file, p.key, p.message) for p in err.value.problems]


def root_of(root, lifecycle, builder):
    t, meta = validated(root)
    (plan,) = [r for r in plan_roots(t, meta, lifecycle, RenderOptions()) if r.builder == builder]
    return plan


def flat(text):
    return " ".join(text.split())


# --------------------------------------------------------------------------- 1. S3 bucket_name
def test_an_s3_storage_without_bucket_name_takes_its_builders_bucket_name(tree):
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"][1].pop("bucket_name"))
    edit(tree, "cfg/storage-builders.yml", lambda d: d["storage_builders"][2].update(bucket_name="csis-builder-default"))
    s3 = root_of(tree, "storage", "aws-s3")
    assert 'bucket_name = "csis-builder-default"' in flat(s3.files["aws-s3-storage-generation-storage-default_bucket.tf"])
    assert s3.storages["default-bucket"]["bucket_name"] == "csis-builder-default"


def test_a_storages_own_bucket_name_wins(tree):
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"][1].update(bucket_name="csis-own-bucket"))
    s3 = root_of(tree, "storage", "aws-s3")
    assert 'bucket_name = "csis-own-bucket"' in flat(s3.files["aws-s3-storage-generation-storage-default_bucket.tf"])


def test_two_storages_on_the_builders_default_bucket_are_refused(tree):
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"].append({"name": "second", "type": "aws-s3"}))
    assert problems(tree) == [(
        "storages/storage0.yaml", "storages[3] (second).bucket_name",
        "bucket 'csis-example-default-bucket' (its builder 'aws-s3''s default bucket_name; declare the storage's own "
        "bucket_name) is already the bucket of storage 'default-bucket': each S3 storage needs its own bucket")]


# --------------------------------------------------------------------------- 2. runtime tags
def test_runtime_tags_are_the_providers_default_tags_in_every_root(tree):
    edit(tree, "cfg/runtime-builders.yml", lambda d: d["runtime_builders"][0].update(tags={"cost-center": "cc-42", "Team": "infra"}))
    t, meta = validated(tree)
    seen = 0
    for lc in ("storage", "instance-image"):
        for r in plan_roots(t, meta, lc, RenderOptions()):
            main = flat([v for k, v in r.files.items() if k.endswith("generation.tf")][0])
            # the runtime's own tags join those its environment inherits (cfg/hierarchy.yml)
            assert ('default_tags { tags = { BillingCode = "CSIS-0001" Owner = "coastal-ops" Stage = "development" '
                    'Team = "infra" cost-center = "cc-42" } }') in main, (r.builder, main)
            seen += 1
    assert seen == 4  # aws-ebs, aws-efs, aws-s3, open-tofu


def test_no_runtime_tags_no_default_tags(tree):
    # a runtime of no environment (so no inherited tags), with its own region, and no tag policy
    edit(tree, "cfg/runtime-builders.yml", lambda d: (d["runtime_builders"][0].pop("environment"),
                                                      d["runtime_builders"][0].update(region="us-east-2")))
    edit(tree, "cfg/_config.yml", lambda d: d["config"].pop("required_tags"))
    t, meta = validated(tree)
    for r in plan_roots(t, meta, "storage", RenderOptions()):
        assert "default_tags" not in "".join(r.files.values())


# --------------------------------------------------------------------------- 3. released builds
def _pinned(tree, pin, released=(), ami_id=None, verifications=(), pending=None):
    def img(d):
        d["images"][1]["released_builds"] = list(released)
        if ami_id:
            d["images"][1]["ami_id"] = ami_id
    edit(tree, "images/images.yaml", img)
    edit(tree, "cfg/_config.yml", lambda d: d["config"].update(require_released_builds=True))
    edit(tree, "instances/instances.yaml", lambda d: d["instances"].pop(0))  # keep 'test' (imgfile-basic)
    write_meta(tree, "launch-params.yaml", {"instances": {"test": {
        "image": "imgfile-basic", "build": pin, "builder": "open-tofu", "runtime": RT, "launched": True,
        "launched_run": "r1", "ephemeral": False, "hostname": "test-001", "mounts": [], "group": "stofs",
        "identity_type": "posix", "machine_type": "t3.micro", "region": "us-east-2", "session": "ssm", "tags": {}}}})
    write_meta(tree, "pins.yaml", {"instances": {"test": pin}, "pending_replacements": pending or {}, "upgrades": []})
    write_meta(tree, "verifications.yaml", {"verifications": list(verifications)})


def test_a_released_pin_passes(tree):
    _pinned(tree, RELEASED, released=[RELEASED])
    validated(tree)


def test_an_unreleased_pin_is_refused(tree):
    _pinned(tree, OTHER, released=[RELEASED], ami_id=HEAD)
    assert problems(tree) == [(
        "instances/instances.yaml", "instances[0] (test).image",
        "instance 'test' is pinned to build %s of 'imgfile-basic', which is not a released build "
        "(config.require_released_builds; no grace: it is not the series head %s of 'imgfile-basic'); release it "
        "(the image's released_builds) or upgrade the instance onto a released build" % (OTHER, HEAD))]


def test_the_release_grace_admits_the_series_head(tree):
    _pinned(tree, HEAD, released=[RELEASED], ami_id=HEAD)
    validated(tree)


def test_no_grace_for_a_head_with_a_failed_verification(tree):
    _pinned(tree, HEAD, ami_id=HEAD, verifications=[{"instance": "test", "build": HEAD, "run": "r7", "ok": False}])
    (p,) = problems(tree)
    assert p[2].startswith("instance 'test' is pinned to build %s of 'imgfile-basic', which is not a released build "
                           "(config.require_released_builds; no grace: a failed verification of it is recorded "
                           "(instance test, run r7))" % HEAD)


def test_no_grace_for_a_head_whose_latest_post_bake_tests_failed(tree):
    _pinned(tree, HEAD, ami_id=HEAD)
    write_meta(tree, "image-tests.yaml", {"builds": {HEAD: {"results": [
        {"instance": "eph1", "run": "r8", "ok": True, "tests": []},
        {"instance": "eph2", "run": "r9", "ok": False, "tests": [{"command": "/opt/check", "ok": False}]}]}}})
    (p,) = problems(tree)
    assert ("no grace: its latest post-bake tests failed (meta-state/image-tests.yaml: instance eph2, run r9)"
            in p[2]), p
    # a later passing result restores the grace
    write_meta(tree, "image-tests.yaml", {"builds": {HEAD: {"results": [
        {"instance": "eph2", "run": "r9", "ok": False, "tests": []}, {"instance": "eph3", "run": "r10", "ok": True}]}}})
    validated(tree)


def test_a_pending_upgrade_onto_an_unreleased_build_is_refused(tree):
    _pinned(tree, RELEASED, released=[RELEASED], ami_id=HEAD,
            pending={"test": {"to": OTHER, "from": RELEASED, "run": "r2"}})
    (p,) = problems(tree)
    assert "is being upgraded to build %s of 'imgfile-basic', which is not a released build" % OTHER in p[2]


def test_released_builds_off_by_default(tree):
    _pinned(tree, OTHER)
    edit(tree, "cfg/_config.yml", lambda d: d["config"].update(require_released_builds=False))
    validated(tree)


# --------------------------------------------------------------------------- 5. archive snapshot name
def test_the_archive_snapshot_has_the_manuals_name():
    assert m.archive_snapshot_name("mnt_data") == "csis-mnt_data-archive"
    assert m.archive_snapshot_name("data.x-y") == "csis-data_x_y-archive"
    assert m.legacy_archive_snapshot_name("mnt_data") == "csis-mnt-data-archive"


def _archived(tree, facts):
    write_meta(tree, "storage-state.yaml", {"storages": {"mnt_data": {"state": "archived", "generation": 1,
                                                                      "facts": dict({"builder": "aws-ebs", "type": "ebs"}, **facts)}}})


def test_a_restore_uses_the_recorded_old_style_snapshot_name(tree):
    _archived(tree, {"archive": "csis-mnt-data-archive"})
    ebs = root_of(tree, "storage", "aws-ebs")
    assert 'snapshot_name = "csis-mnt-data-archive"' in flat(ebs.files["aws-ebs-storage-generation-storage-mnt_data.tf"])
    (after,) = ebs.transitions_after
    assert after["action"] == "delete_archive_snapshot" and after["snapshot_name"] == "csis-mnt-data-archive"


def test_a_restore_without_a_recorded_name_uses_the_manuals_name(tree):
    _archived(tree, {})
    ebs = root_of(tree, "storage", "aws-ebs")
    assert 'snapshot_name = "csis-mnt_data-archive"' in flat(ebs.files["aws-ebs-storage-generation-storage-mnt_data.tf"])


def test_an_old_style_archive_is_deleted_by_its_recorded_name(tree):
    _archived(tree, {"archive": "csis-mnt-data-archive"})
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"][0].update(state="destroyed"))
    edit(tree, "instances/instances.yaml", lambda d: d["instances"].pop(0))
    ebs = root_of(tree, "storage", "aws-ebs")
    (after,) = ebs.transitions_after
    assert after["action"] == "delete_archive_snapshot" and after["snapshot_name"] == "csis-mnt-data-archive"


def test_a_new_archive_takes_the_manuals_name(tree):
    write_meta(tree, "storage-state.yaml", {"storages": {"mnt_data": {
        "state": "active", "generation": 1, "facts": {"builder": "aws-ebs", "type": "ebs", "archive": "csis-mnt-data-archive"}}}})
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"][0].update(state="archived"))
    edit(tree, "instances/instances.yaml", lambda d: d["instances"].pop(0))
    ebs = root_of(tree, "storage", "aws-ebs")
    (snap,) = ebs.transitions_before
    assert snap["action"] == "snapshot" and snap["snapshot_name"] == "csis-mnt_data-archive"


# --------------------------------------------------------------------------- 10. enrollment token
def _token(tree):
    edit(tree, "cfg/group-builders.yml",
         lambda d: d["group_builders"][0].update(enrollment_token={"ssm_parameter": "/csis/sft/enrollment-token"}))


def test_the_identity_root_publishes_the_group_builders_token(tree):
    _token(tree)
    ident = root_of(tree, "identity", "posix-groups")
    main = flat(ident.files["posix-groups-identity-generation.tf"])
    assert ('data "aws_ssm_parameter" "enrollment_token" { provider = aws.posix_groups '
            'name = "/csis/sft/enrollment-token" with_decryption = true }') in main
    assert 'output "sft_enrollment_token" {' in main and "value = data.aws_ssm_parameter.enrollment_token.value" in main
    assert "sensitive = true" in main
    assert 'provider "aws" { alias = "posix_groups"' in main


def test_the_instance_root_takes_the_token_reference_unless_tf_var_overrides(tree):
    _token(tree)
    inst = root_of(tree, "instance-image", "open-tofu")
    f = flat(inst.files["open-tofu-instance-generation-instance-test2.tf"])
    assert ('enrollment_token_b64 = base64encode(var.sft_enrollment_token != "" ? var.sft_enrollment_token : '
            'data.terraform_remote_state.posix_groups.outputs.sft_enrollment_token)') in f
    assert 'data "terraform_remote_state" "posix_groups"' in inst.files["open-tofu-instance-generation.tf"]


def test_without_a_token_reference_only_tf_var_feeds_the_token(tree):
    ident = root_of(tree, "identity", "posix-groups")
    assert "aws_ssm_parameter" not in "".join(ident.files.values()) and 'provider "aws"' not in "".join(ident.files.values())
    inst = root_of(tree, "instance-image", "open-tofu")
    assert "enrollment_token_b64 = base64encode(var.sft_enrollment_token)" in flat(
        inst.files["open-tofu-instance-generation-instance-test2.tf"])


# --------------------------------------------------------------------------- 12. provider constraint
def test_the_provider_constraint_is_a_configurable_default(tree):
    ebs = flat(root_of(tree, "storage", "aws-ebs").files["aws-ebs-storage-generation.tf"])
    assert 'required_version = ">= 1.5.0"' in ebs and 'version = ">= 5.0, < 6.0"' in ebs
    edit(tree, "cfg/_config.yml", lambda d: d["config"].update(aws_provider_version=None, terraform_required_version=None))
    ebs = flat(root_of(tree, "storage", "aws-ebs").files["aws-ebs-storage-generation.tf"])
    assert "required_version" not in ebs and 'aws = { source = "hashicorp/aws" }' in ebs  # the manual's emission
    edit(tree, "cfg/_config.yml", lambda d: d["config"].update(aws_provider_version="~> 5.100", terraform_required_version=">= 1.9"))
    ebs = flat(root_of(tree, "storage", "aws-ebs").files["aws-ebs-storage-generation.tf"])
    assert 'required_version = ">= 1.9"' in ebs and 'version = "~> 5.100"' in ebs


# --------------------------------------------------------------------------- issue 16: tag values
@pytest.mark.parametrize("value,why", [
    ("production\n", "contains the control character(s) '\\n'"),
    ("a\tb", "contains the control character(s) '\\t'"),
    (" padded", "has leading or trailing whitespace"),
])
def test_tag_values_aws_would_alter_are_refused(value, why):
    assert why in m.tag_text_problem(value)


@pytest.mark.parametrize("value", ["production", "a b", "caf\u00e9", 'say "hi" ${x}', "k=v:/@+-._", ""])
def test_ordinary_tag_values_pass(value):
    assert m.tag_text_problem(value) is None
