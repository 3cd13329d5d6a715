# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Validation of whole trees: the example is clean; every case of the bad-input corpus
(tests/bad_inputs/*.yaml, one small mutation of examples/ each) fails with exactly the
problems it lists, naming file and key, and leaves the tree (generated/, meta-state/)
byte-identical."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bad_inputs"))
import corpus  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError  # noqa: E402

CASES = corpus.case_files()


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 45


@pytest.fixture
def example(tmp_path):
    return corpus.copy_examples(str(tmp_path / "tree"))


def test_the_example_tree_is_valid(example):
    before = corpus.tree_hash(example)
    tree, meta = load_and_validate(example, run_version=corpus.version_stub({}))
    assert sorted(tree.instances) == ["test", "test2"]
    assert sorted(tree.storages) == ["default-bucket", "efs-storage", "mnt_data"]
    assert corpus.tree_hash(example) == before


def test_the_example_tree_is_valid_with_the_real_executable(example):
    load_and_validate(example)  # runs `terraform version -json`


def test_the_example_overlay_applies(example):
    tree, _validation = load_and_validate(example, overlays=["overlays/apply-all.yml"], run_version=corpus.version_stub({}))
    assert tree.config.apply_storage is True and tree.config.apply_instances is True
    assert tree.config_source["apply_storage"] == "overlays/apply-all.yml"


def test_load_tree_raises_with_every_problem(example):
    corpus.apply_mutation(example, {"file": "storages/storage0.yaml", "set": {"storages.0.share_mode": "1"}})
    corpus.apply_mutation(example, {"file": "instances/instances.yaml", "set": {"instances.0.bogus": 1}})
    with pytest.raises(ConfigError) as err:
        load_tree(example)
    assert [(p.file, p.key) for p in err.value.problems] == [
        ("storages/storage0.yaml", "storages[0] (mnt_data).share_mode"),
        ("instances/instances.yaml", "instances[0] (test2).bogus")]
    assert str(err.value).splitlines() == [str(p) for p in err.value.problems]


def test_every_problem_is_reported_at_once(example):
    """Problems of several files and of both stages (load and cross-file) come together."""
    muts = [
        {"file": "storages/storage0.yaml", "set": {"storages.2.share_mode": "2700"}},
        {"file": "instances/instances.yaml", "set": {"instances.1.image": "nope"}},
        {"file": "cfg/storage-builders.yml", "set": {"storage_builders.1.variables.size": 5}},
        {"file": "cfg/_config.yml", "set": {"config.apply_storage": "no"}},
        {"file": "storages/storage0.yaml", "set": {"storages.1.lifecycle": {"expire_days": 0}}},
    ]
    for mut in muts:
        corpus.apply_mutation(example, mut)
    with pytest.raises(ConfigError) as err:
        load_and_validate(example, run_version=corpus.version_stub({}))
    keys = sorted((p.file, p.key) for p in err.value.problems)
    assert keys == sorted([
        ("storages/storage0.yaml", "storages[2] (efs-storage).share_mode"),
        ("instances/instances.yaml", "instances[1] (test).image"),
        ("cfg/storage-builders.yml", "storage_builders[1] (aws-ebs).variables.size"),
        ("cfg/_config.yml", "config.apply_storage"),
        ("storages/storage0.yaml", "storages[1] (default-bucket).lifecycle"),
    ])
    for p in err.value.problems:
        assert p.file and p.key and p.message and "\n" not in str(p)


@pytest.mark.parametrize("path", CASES, ids=[os.path.basename(c)[:-5] for c in CASES])
def test_bad_input(path, tmp_path):
    case = corpus.load_case(path)
    root = corpus.prepare(case, str(tmp_path / "tree"))
    before = corpus.tree_hash(root)
    assert any(p.startswith("generated" + os.sep) for p in before)  # generated/ is part of what is hashed
    with pytest.raises(ConfigError) as err:
        load_and_validate(root, overlays=case.get("overlays") or (), undeclare=case.get("undeclare") or (),
                          run_version=corpus.version_stub(case), extra=corpus.vault_rules(case))
    got = sorted((p.file, p.key, p.message) for p in err.value.problems)
    assert got == corpus.expected(case)
    for p in err.value.problems:
        assert p.file, p  # every problem names its file
        assert "\n" not in str(p), p  # and prints on one line
    assert corpus.tree_hash(root) == before, "validation changed the tree"
    assert not os.path.exists(os.path.join(root, "meta-state")) or case.get("meta"), "validation created meta-state/"


def test_the_s3_meta_state_needs_every_used_root_on_shared_state(example):
    """A record in the shared store must not point at a terraform state on one controller's
    disk: another checkout would plan to create again what exists (issue 10)."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import validate_tree

    with open(os.path.join(example, "cfg", "_config.yml"), "a", encoding="utf-8") as fh:
        fh.write("meta_state: {backend: s3, state_backend: s3-east2}\n")
    tree = load_tree(example)
    found = [(p.file, p.key, p.message) for p in validate_tree(tree, {}, run_version=corpus.version_stub({}))]
    assert found == [("cfg/group-builders.yml", "group_builders[0] (posix-groups).state_configuration",
                      "keeps its terraform state in the local state backend 'local-state' (on one controller's disk); "
                      "the s3 meta-state (cfg/_config.yml meta_state) shares records between checkouts, so every "
                      "root's terraform state must be shared too: name an s3 state backend")]
    corpus.apply_mutation(example, {"file": "cfg/group-builders.yml",
                                    "set": {"group_builders.0.state_configuration": "s3-east2"}})
    assert validate_tree(load_tree(example), {}, run_version=corpus.version_stub({})) == []
    corpus.apply_mutation(example, {"file": "cfg/_config.yml", "set": {"config.use_state_backends": False}})
    found = [(p.file, p.key) for p in validate_tree(load_tree(example), {}, run_version=corpus.version_stub({}))]
    assert ("cfg/_config.yml", "config.use_state_backends") in found


def test_an_unreadable_store_is_named_once(example, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with open(os.path.join(example, "cfg", "_config.yml"), "a", encoding="utf-8") as fh:
        fh.write("meta_state: {backend: s3, state_backend: s3-east2}\n")
    with pytest.raises(ConfigError) as err:
        load_and_validate(example, run_version=corpus.version_stub({}))
    store = [p for p in err.value.problems if p.file.startswith("s3://")]
    assert len(store) == 1 and "cannot read" in store[0].message, err.value.problems


@pytest.mark.parametrize("with_id", [True, False])
def test_a_tree_whose_name_is_not_the_tag_its_resources_carry_is_refused(tmp_path, with_id):
    """The tree's name is the csis_config tag of every resource and part of each EFS creation token:
    checked out under another directory name without id: (an AWX project), or with its id changed, it
    would re-tag everything and replace every EFS filesystem. meta-state records the tag each applied
    storage and machine carries; validate names the id: to set."""
    root = corpus.copy_examples(str(tmp_path / "awx_project_8"))
    if not with_id:
        corpus.apply_mutation(root, {"file": "cfg/_config.yml", "replace_text": {"\nid: csis-example\n": "\n"}})
    corpus.write_meta(root, {
        "storage-state.yaml": {"storages": {"mnt_data": {"state": "active", "generation": 1, "facts": {
            "builder": "aws-ebs", "type": "ebs", "volume_id": "vol-1", "csis_config": "csis-example-old"}}}},
    })
    with pytest.raises(ConfigError) as err:
        load_and_validate(root, run_version=corpus.version_stub({}))
    (problem,) = [p for p in err.value.problems if p.key == "id"]
    mine = "csis-example" if with_id else os.path.basename(root).lower()
    where = "its id" if with_id else "its directory's name (cfg/_config.yml sets no id:)"
    assert (problem.file, problem.message) == ("cfg/_config.yml", (
        "the tree names itself '%s' (from %s), but its applied resources carry csis_config 'csis-example-old' "
        "(storage mnt_data, meta-state): its plans would re-tag every resource and replace every EFS filesystem "
        "(the name is part of the creation token); set `id: csis-example-old` in cfg/_config.yml" % (mine, where)))
    # what the message says to do
    text = open(os.path.join(root, "cfg", "_config.yml"), encoding="utf-8").read()
    text = text.replace("\nid: csis-example\n", "\n") if with_id else text
    with open(os.path.join(root, "cfg", "_config.yml"), "w", encoding="utf-8") as fh:
        fh.write(text.replace("\nconfig:", "\nid: csis-example-old\nconfig:", 1))
    load_and_validate(root, run_version=corpus.version_stub({}))


def test_storages_and_instances_without_a_runtime_take_their_builders_without_a_default_runtime(example):
    """Two runtimes, neither is_default: a storage or instance that names no runtime (or "default") is built
    on its builder's runtime, which every builder names, as the manual reads the key ("the builder's
    runtime governs"); only a runtime named outright must exist."""
    import yaml

    path = os.path.join(example, "cfg", "runtime-builders.yml")
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    doc["runtime_builders"][0]["is_default"] = False
    doc["runtime_builders"].append(dict(doc["runtime_builders"][0], name="aws-east2-other"))
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    tree, _meta = load_and_validate(example, run_version=corpus.version_stub({}))
    assert tree.storages["default-bucket"].runtime == "default" and tree.instances["test"].runtime == "default"
    assert tree.builder_runtime(tree.instance_builder_for(tree.instances["test"])).name == "aws-east2-runtime"
    inst = os.path.join(example, "instances", "instances.yaml")
    with open(inst, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    doc["instances"][1]["runtime"] = "aws-nowhere"
    with open(inst, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    with pytest.raises(ConfigError) as exc:
        load_and_validate(example, run_version=corpus.version_stub({}))
    assert "names unknown runtime 'aws-nowhere'" in str(exc.value)


def test_userdata_that_makes_the_user_data_too_large_for_ec2_is_refused(example):
    """EC2 takes 16,384 bytes of user data: an instance whose userdata, with csis.infra's launch script, is over it
    is refused at validate, naming the file and key (not by the launch's RunInstances); one that fits is not."""
    corpus.apply_mutation(example, {"file": "instances/instances.yaml", "set": {"instances.0.userdata": "echo hi\n" * 2000}})
    with pytest.raises(ConfigError) as err:
        load_and_validate(example, run_version=corpus.version_stub({}))
    [problem] = err.value.problems
    assert (problem.file, problem.key) == ("instances/instances.yaml", "instances[0] (test2).userdata")
    assert problem.message.startswith("the machine's user data would be ") and "over the 16384 EC2 takes" in problem.message
    corpus.apply_mutation(example, {"file": "instances/instances.yaml", "set": {"instances.0.userdata": "echo hi\n" * 1000}})
    load_and_validate(example, run_version=corpus.version_stub({}))


@pytest.mark.parametrize("muts", [
    # the least AWS takes: a 30-day transition to STANDARD_IA / ONEZONE_IA, an expiration a day later
    [{"file": "storages/storage0.yaml", "set": {"storages.1.lifecycle": {
        "transition_days": 30, "storage_class": "ONEZONE_IA", "expire_days": 31}}}],
    # an earlier transition to a class without that minimum
    [{"file": "storages/storage0.yaml", "set": {"storages.1.lifecycle": {"transition_days": 1, "storage_class": "GLACIER_IR"}}}],
    # an archive transition without an IA one; the builder's performance mode written out
    [{"file": "cfg/storage-builders.yml", "set": {"storage_builders.0.variables.performance_mode": "generalPurpose"}},
     {"file": "storages/storage0.yaml", "set": {"storages.2.lifecycle": {"archive_days": 90}}}],
    # maxIO without an archive transition
    [{"file": "cfg/storage-builders.yml", "set": {"storage_builders.0.variables.performance_mode": "maxIO"}}],
    # each volume type at the ends of its sizes
    [{"file": "cfg/storage-builders.yml", "set": {"storage_builders.1.variables.volume_type": "sc1",
                                                  "storage_builders.1.size": 125}}],
    [{"file": "cfg/storage-builders.yml", "set": {"storage_builders.1.variables.volume_type": "standard",
                                                  "storage_builders.1.size": 1024}}],
    [{"file": "cfg/storage-builders.yml", "set": {"storage_builders.1.variables.volume_type": "gp2",
                                                  "storage_builders.1.size": 16384}}],
    [{"file": "cfg/storage-builders.yml", "delete": ["storage_builders.1.variables.volume_type"],
      "set": {"storage_builders.1.size": 65536}}],  # the module's default, gp3
])
def test_what_aws_takes_at_the_edges_is_valid(example, muts):
    for mut in muts:
        corpus.apply_mutation(example, mut)
    load_and_validate(example, run_version=corpus.version_stub({}))


NO_MOUNT_TARGETS = {"file": "cfg/runtime-builders.yml", "set": {"runtime_builders.0.networking.addl_security_groups": []}}
MOUNTS_THE_EFS = {"file": "instances/instances.yaml",
                  "set": {"instances.1.storages": [{"name": "efs-storage", "mount_point": "/mnt/shared"}]}}


@pytest.mark.parametrize("muts", [
    # nobody mounts the file system (the example tree's efs-storage): no mount target is needed
    [NO_MOUNT_TARGETS],
    # an adopted file system may have mount targets of its own
    [NO_MOUNT_TARGETS, MOUNTS_THE_EFS,
     {"file": "storages/storage0.yaml", "set": {"storages.2.config": {"file_system_id": "fs-0123456789abcdef0"}}}],
    # the runtime gives it mount targets
    [MOUNTS_THE_EFS],
])
def test_an_efs_storage_without_mount_targets_is_refused_only_when_mounted_and_created_here(example, muts):
    for mut in muts:
        corpus.apply_mutation(example, mut)
    load_and_validate(example, run_version=corpus.version_stub({}))


def test_sizes_past_the_edges_are_refused(example):
    corpus.apply_mutation(example, {"file": "cfg/storage-builders.yml", "set": {
        "storage_builders.1.variables.volume_type": "gp2", "storage_builders.1.size": 16385}})
    with pytest.raises(ConfigError) as err:
        load_and_validate(example, run_version=corpus.version_stub({}))
    assert [(p.key, p.message) for p in err.value.problems] == [
        ("storage_builders[1] (aws-ebs).size",
         "storage builder 'aws-ebs': size 16385 GiB is outside what AWS takes for volume_type gp2: 1 to 16384 GiB")]


def _launched_under(example, name):
    """Record the instance as launched under ``name`` (its launch parameters as a launch records them)."""
    import yaml
    from ansible_collections.csis.infra.plugins.module_utils.csis.render.launch import compute_launch_params

    tree = load_tree(example)
    params = dict(compute_launch_params(tree, {}, tree.instances[name], replacing=False, user_data=False),
                  launched=True, run="r1", launched_run="r1")
    os.makedirs(os.path.join(example, "meta-state"), exist_ok=True)
    with open(os.path.join(example, "meta-state", "launch-params.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump({"instances": {name: params}}, fh, sort_keys=False)


def test_a_hostname_too_long_is_refused_for_a_machine_to_launch_not_for_one_standing(example):
    """A machine still to be launched whose canonical hostname (<name>-NNN) is over 63 characters is
    refused (the launch could not set it); one launched with it keeps it: a standing machine is
    never refused for the name it runs under."""
    long_name = "b" * 60
    corpus.apply_mutation(example, {"file": "instances/instances.yaml", "set": {"instances.1.name": long_name}})
    with pytest.raises(ConfigError) as err:
        load_and_validate(example, run_version=corpus.version_stub({}))
    [problem] = err.value.problems
    assert problem.key == "instances[1] (%s).name" % long_name and "would be 64 characters" in problem.message
    _launched_under(example, long_name)
    load_and_validate(example, run_version=corpus.version_stub({}))


@pytest.mark.parametrize("bad, fix", [("web_1", "web-1"), ("db..a", "db-a"), ("end.", "end")])
def test_an_invalid_hostname_is_refused_for_a_machine_to_launch_not_for_one_standing(example, bad, fix):
    """An instance name with ``_`` (or a dot beside a hyphen or another dot) gives a canonical
    hostname that is no valid hostname: hostnamectl changes it (drops the character) or refuses it,
    and the machine does not get the name the inventory and verification expect. Refused for a
    machine still to be launched, with a name that works; a machine launched under it keeps it."""
    corpus.apply_mutation(example, {"file": "instances/instances.yaml", "set": {"instances.1.name": bad}})
    with pytest.raises(ConfigError) as err:
        load_and_validate(example, run_version=corpus.version_stub({}))
    [problem] = err.value.problems
    assert problem.key == "instances[1] (%s).name" % bad
    assert problem.message == (
        "instance '%s': its machine's canonical hostname '%s-001' is not a valid hostname (letters, digits and "
        "hyphens, single dots between them): the machine would not get it as written (hostnamectl changes or "
        "refuses it); give the instance a name such as '%s'" % (bad, bad, fix))
    _launched_under(example, bad)
    load_and_validate(example, run_version=corpus.version_stub({}))


@pytest.mark.skipif(not __import__("shutil").which("terraform"), reason="needs terraform on PATH")
def test_a_relative_binary_is_relative_to_the_tree_wherever_the_run_starts(example, tmp_path, monkeypatch):
    """``binary: tools/terraform`` names the tree's own tools/terraform: the validation's version
    check (run from wherever ansible-playbook started) and the render (which starts terraform in
    each root) read the same file. It was resolved against the working directory: validation
    refused it from anywhere but the tree, and from the tree the render then failed in the root."""
    import shutil
    from ansible_collections.csis.infra.plugins.module_utils.csis.render import pipeline

    os.makedirs(os.path.join(example, "tools"))
    os.symlink(shutil.which("terraform"), os.path.join(example, "tools", "terraform"))
    corpus.apply_mutation(example, {"file": "cfg/executables.yml", "replace_text": {"binary: terraform": "binary: tools/terraform"}})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    tree, _meta = load_and_validate(example)  # the real `<binary> version -json`
    assert {ex.binary for ex in tree.executables.values()} == {os.path.join(example, "tools", "terraform")}
    res = pipeline.render(example, ["storage"], dry_run=True, prepare=False)
    assert {r["binary"] for r in res["roots"]} == {os.path.join(example, "tools", "terraform")}
    # a binary gone after the validation (the version check is cached per process): the render names it
    os.unlink(os.path.join(example, "tools", "terraform"))
    from ansible_collections.csis.infra.plugins.module_utils.csis.render.writer import EmitError
    with pytest.raises(EmitError) as err:
        pipeline.render(example, ["storage"], dry_run=True)
    assert str(err.value).startswith("cannot start terraform '%s' (cfg/executables.yml binary): No such file or directory"
                                     % os.path.join(example, "tools", "terraform")), err.value


def test_required_tags_may_name_csis_config(example):
    """A declared tag ``csis_config`` is refused (csis.infra sets it), but requiring it is meaningful
    (the gate then checks every created or updated taggable resource carries it) and validates."""
    corpus.apply_mutation(example, {"file": "cfg/_config.yml", "replace_text": {
        "required_tags: [BillingCode, Owner]": "required_tags: [BillingCode, Owner, csis_config]"}})
    tree, _meta = load_and_validate(example, run_version=corpus.version_stub({}))
    assert "csis_config" in tree.config.required_tags
