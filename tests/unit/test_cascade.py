# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The cascade destroy of an environment (render/cascade.py), pure: the order of its phases,
what each undeclares and requests, every destroy, the refusals, and one phase applied to a
loaded tree as csis_render does it (narrowed roots, the emptied identity root)."""
from __future__ import annotations

import os
import sys

import pytest
from trees import edit_yaml as edit, write_meta  # noqa: E402  (tests/support)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bad_inputs"))
import corpus  # noqa: E402
from render_trees import copy_tree  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render import cascade as c  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.pipeline import render  # noqa: E402

ENV = "example-us-east-2"
RT = "aws-east2-runtime"
MNT = {"builder": "aws-ebs", "device": "/dev/xvdf", "group": "coops", "mount_point": "/mnt/data",
       "public_read": False, "share_mode": "2770", "storage": "mnt_data", "type": "ebs"}


def launched(name, mounts=(), ephemeral=False, image="imgfile-basic-dask", group="coops", runtime=RT):
    return {"image": image, "build": "ami-0000000000000aaa1", "builder": "open-tofu", "runtime": runtime,
            "launched": True, "launched_run": "r1", "ephemeral": ephemeral, "hostname": "%s-001" % name,
            "mounts": list(mounts), "group": group, "identity_type": "posix", "machine_type": "t3.medium",
            "region": "us-east-2", "session": "ssm", "tags": {}}


@pytest.fixture
def tree(tmp_path):
    """examples/ with test2 (mounting mnt_data) launched, and the three storages applied; the
    EFS and S3 storages declared destroyed (the tree says their data may go)."""
    root = copy_tree("examples", str(tmp_path))
    d = os.path.join(root, "meta-state")
    for f in os.listdir(d) if os.path.isdir(d) else ():
        os.unlink(os.path.join(d, f))
    edit(root, "instances/instances.yaml", lambda x: x["instances"].pop(1))  # test: never launched
    write_meta(root, "launch-params.yaml", {"instances": {"test2": launched("test2", [MNT])}})
    write_meta(root, "storage-state.yaml", {"storages": {
        n: {"state": "active", "generation": 1, "facts": {"builder": b, "type": t}}
        for n, b, t in (("mnt_data", "aws-ebs", "ebs"), ("default-bucket", "aws-s3", "s3"),
                        ("efs-storage", "aws-efs", "efs"))}})

    def destroyed(x):
        for st in x["storages"]:
            if st["name"] != "mnt_data":
                st["state"] = "destroyed"
    edit(root, "storages/storage0.yaml", destroyed)
    return root


def load(root):
    return load_and_validate(root, run_version=corpus.version_stub({}))


def plan(root, ebs="archived"):
    t, meta = load(root)
    return c.plan_cascade(t, meta, ENV, ebs)


def test_the_order_leaves_first_and_every_destroy(tree):
    cas = plan(tree)
    assert cas["problems"] == [] and cas["runtimes"] == [RT]
    assert [(p["phase"], p["lifecycle"]) for p in cas["phases"]] == [
        ("ephemeral", "instance-image"), ("durable", "instance-image"), ("storage", "storage"), ("identity", "identity")]
    eph, dur, sto, ide = cas["phases"]
    assert eph["undeclare"] == [] and eph["destroys"] == []
    assert dur["undeclare"] == ["test2"]
    assert dur["destroys"] == ["instance-image-open-tofu: module.instance_test2",
                               "instance-image-open-tofu: aws_security_group.csis_instances"]
    # EBS archived (a snapshot kept); S3 and EFS destroyed because the tree declares them so
    assert sto["storage_states"] == {"mnt_data": "archived", "default-bucket": "destroyed", "efs-storage": "destroyed"}
    assert sto["destroys"] == ["storage-aws-s3: module.storage_default_bucket", "storage-aws-efs: module.storage_efs_storage",
                               "storage-aws-ebs: module.storage_mnt_data"]
    assert sto["steps"] == ["storage-aws-s3: wipe bucket csis-example-default-bucket of storage 'default-bucket' (every object version)",
                            "storage-aws-ebs: snapshot storage 'mnt_data' as csis-mnt_data-archive (kept)"]
    assert ide["destroy_identity"] == ["posix-groups"] and ide["destroys"] == ["identity-posix-groups: module.identity"]
    lines = c.order_lines(cas)
    assert lines[0] == "cascade of environment 'example-us-east-2' (runtimes: aws-east2-runtime), leaves first:"
    assert [x for x in lines if x[:2] in ("1.", "2.", "3.", "4.")] == [
        "1. ephemeral (instance-image): nothing to do",
        "2. durable (instance-image): undeclare test2",
        "3. storage (storage): request default-bucket destroyed, efs-storage destroyed, mnt_data archived",
        "4. identity (identity): destroy the identity roots of posix-groups"]
    assert "     destroy storage-aws-ebs: module.storage_mnt_data" in lines


def test_ebs_destroyed_when_told_and_an_archived_one_loses_its_snapshot(tree):
    sto = plan(tree, ebs="destroyed")["phases"][2]
    assert sto["storage_states"]["mnt_data"] == "destroyed"
    assert "storage-aws-ebs: module.storage_mnt_data" in sto["destroys"]
    t, meta = load(tree)
    meta["storage-state.yaml"]["storages"]["mnt_data"].update(state="archived", facts={"builder": "aws-ebs", "archive": "snap-x"})
    archived = c.plan_cascade(t, meta, ENV, "archived")["phases"][2]
    assert archived["storage_states"]["mnt_data"] == "archived" and "mnt_data" not in " ".join(archived["destroys"])
    gone = c.plan_cascade(t, meta, ENV, "destroyed")["phases"][2]
    assert "storage-aws-ebs: delete the archive snapshot snap-x of storage 'mnt_data'" in gone["steps"]
    assert "mnt_data" not in " ".join(gone["destroys"])  # the volume went with the archive


def test_ephemeral_first_and_unlaunched_instances_never_launch(tree):
    edit(tree, "instances/instances.yaml", lambda x: x["instances"].append(
        {"name": "probe", "image": "imgfile-basic", "ephemeral": True, "description": "a probe"}))
    edit(tree, "instances/instances.yaml", lambda x: x["instances"].append(
        {"name": "later", "image": "imgfile-basic", "description": "not launched yet"}))
    t, meta = load(tree)
    meta["launch-params.yaml"]["instances"]["probe"] = launched("probe", ephemeral=True, image="imgfile-basic", group="stofs")
    eph, dur = c.plan_cascade(t, meta, ENV)["phases"][:2]
    assert eph["undeclare"] == ["later", "probe"]
    assert eph["destroys"] == ["instance-image-open-tofu: module.instance_probe"]
    assert dur["undeclare"] == ["later", "probe", "test2"]


def test_refusals_all_at_once(tree):
    # S3 and EFS that the tree does not declare destroyed; an unknown environment
    edit(tree, "storages/storage0.yaml", lambda x: [st.update(state="active") for st in x["storages"]])
    t, meta = load(tree)
    got = sorted((p.file, p.key, p.message) for p in c.plan_cascade(t, meta, ENV)["problems"])
    assert got == [
        ("storages/storage0.yaml", "storages[1] (default-bucket).state",
         "storage 'default-bucket' (s3) cannot be archived, and the tree does not declare it destroyed "
         "(storages/storage0.yaml: storages[1] (default-bucket).state is active): declare state: destroyed there "
         "(its objects are wiped), or force_destroy: true on its builder 'aws-s3', or move it out of the environment"),
        ("storages/storage0.yaml", "storages[2] (efs-storage).state",
         "storage 'efs-storage' (efs) cannot be archived, and the tree does not declare it destroyed "
         "(storages/storage0.yaml: storages[2] (efs-storage).state is active): declare state: destroyed there "
         "(its files are deleted), or move it out of the environment")]
    bad = c.plan_cascade(t, meta, "example-account")["problems"]
    assert [str(p) for p in bad] == ["cfg/hierarchy.yml: 'example-account' is not an environment declared in "
                                     "cfg/hierarchy.yml (environments: example-us-east-2)"]


def test_refused_while_something_outside_the_environment_depends_on_it(tree):
    """A second environment whose runtime keeps a storage allowing group coops and a launched
    instance mounting mnt_data: the cascade of the first refuses both, naming the dependents."""
    edit(tree, "cfg/hierarchy.yml", lambda x: x["hierarchy"].append(
        {"name": "west", "kind": "environment", "parent": "example-account", "dependency_configs": {"region": "us-west-2"}}))

    def runtime(x):
        rt = dict(x["runtime_builders"][0], name="west-runtime", environment="west", is_default=False)
        x["runtime_builders"].append(rt)
    edit(tree, "cfg/runtime-builders.yml", runtime)
    edit(tree, "cfg/storage-builders.yml", lambda x: x["storage_builders"].append(
        dict(x["storage_builders"][1], name="west-ebs", runtime="west-runtime", is_default=False)))
    edit(tree, "storages/storage0.yaml", lambda x: x["storages"].append(
        {"name": "west_data", "type": "west-ebs", "mount_point": "/mnt/west", "groups": ["coops"], "state": "active"}))
    write_meta(tree, "launch-params.yaml", {"instances": {"test2": launched("test2", [MNT]),
                                                          "far1": launched("far1", [MNT], runtime="west-runtime")}})
    t, meta = load(tree)
    cas = c.plan_cascade(t, meta, ENV)
    assert cas["runtimes"] == [RT] and c.environment_runtimes(t, "west") == ["west-runtime"]
    got = sorted(str(p) for p in cas["problems"])
    assert got == [
        "groups/groups.yaml: groups[0] (coops): group 'coops' cannot be destroyed with the identity root of "
        "'posix-groups' (environment 'example-us-east-2') while storage 'west_data' (storages/storage0.yaml: "
        "storages[3] (west_data).groups), launched instance 'far1' (meta-state/launch-params.yaml) use it: move them "
        "out of the group, or leave the group builder out of the environment",
        "meta-state/launch-params.yaml: instances.far1: launched instance 'far1' (outside environment "
        "'example-us-east-2') mounts storage 'mnt_data', which the cascade would destroy: decommission it first"]
    with pytest.raises(ConfigError) as err:
        c.cascade_of(tree, ENV, run_version=corpus.version_stub({}))
    assert len(err.value.problems) == 2


def test_a_phase_changes_the_loaded_tree_for_its_run_only(tree):
    spec = {"environment": ENV, "phase": "storage", "ebs": "archived"}
    t, meta = load(tree)
    runtimes, identity, problems = c.apply_phase(t, meta, spec)
    assert problems == [] and runtimes == {RT} and identity == []
    assert "test2" not in t.instances and t.undeclared == ["test2"]  # the earlier phases hold too
    assert t.storages["mnt_data"].state == "archived" and t.storages["default-bucket"].state == "destroyed"
    assert load(tree)[0].storages["mnt_data"].state == "active"  # the tree on disk is unchanged
    # a destroy the approval did not show is refused
    t, meta = load(tree)
    _r, _i, problems = c.apply_phase(t, meta, dict(spec, approved=["storage-aws-ebs: module.storage_mnt_data"]))
    assert [p.key for p in problems] == ["cascade.approved"]
    assert "storage-aws-s3: module.storage_default_bucket" in problems[0].message
    # a phase with nothing to do renders no root
    t, meta = load(tree)
    assert c.apply_phase(t, meta, dict(spec, phase="ephemeral"))[0] == set()


def test_render_of_a_phase(tree):
    """csis_render with a phase (check mode: nothing written). The storage phase refuses while an
    instance is still launched on the volume (N21: the durable phase's apply forgets its launch
    record), then renders the requested states; the identity root has no module call and
    whitelists module.identity; a phase refuses another lifecycle."""
    with pytest.raises(ConfigError, match=r"mnt_data' cannot move active -> archived while attached by \['test2'\]"):
        render(tree, ["storage"], dry_run=True, check_mode=True, prepare=False,
               cascade={"environment": ENV, "phase": "storage", "ebs": "archived"})
    write_meta(tree, "launch-params.yaml", {"instances": {}})
    out = render(tree, ["storage"], dry_run=True, check_mode=True, prepare=False,
                 cascade={"environment": ENV, "phase": "storage", "ebs": "archived"})
    ebs = next(r for r in out["roots"] if r["key"] == "storage-aws-ebs")
    assert ebs["allow_destroy"] == ["module.storage_mnt_data"]
    assert [t["action"] for t in ebs["transitions_before"]] == ["snapshot"]
    out = render(tree, ["identity"], dry_run=True, check_mode=True, prepare=False,
                 cascade={"environment": ENV, "phase": "identity", "ebs": "archived"})
    (root,) = out["roots"]
    assert root["key"] == "identity-posix-groups" and root["allow_destroy"] == ["module.identity"]
    with pytest.raises(ConfigError, match="phase 'identity' runs the identity lifecycle, not storage"):
        render(tree, ["storage"], dry_run=True, check_mode=True, prepare=False,
               cascade={"environment": ENV, "phase": "identity"})


def test_a_tree_whose_approval_rules_ask_for_another_person_or_a_merge_says_the_cascade_cannot_run(tree):
    """Every phase of a cascade runs with its runner's one approval (csis_auto_approve): under
    approvals.distinct_approver each phase would be refused as self-approved, under
    workspace.require_merge each would stop at its unmerged branch, after the cascade's approval
    was recorded. csis_cascade names why, so the playbook refuses before anything."""
    assert c.cascade_of(tree, "example-us-east-2", run_version=corpus.version_stub({}))["approval_rules"] == []
    edit(tree, "cfg/_config.yml", lambda d: d.update(approvals={"distinct_approver": True}))
    rules = c.cascade_of(tree, "example-us-east-2", run_version=corpus.version_stub({}))["approval_rules"]
    assert len(rules) == 1 and rules[0].startswith("approvals.distinct_approver is set (cfg/_config.yml)")


def test_a_cascade_whose_only_work_is_a_data_step_is_approved(tree):
    """An environment whose only data left is an archived volume's snapshot: the cascade destroys no
    resource, only deletes the snapshot, and that is what the one approval covers (the playbook asks,
    audits and refuses without an answer only when ``approved`` is not empty); a phase whose step the
    approval did not show is refused as a destroy is."""
    edit(tree, "instances/instances.yaml", lambda x: x.update(instances=[]))
    edit(tree, "storages/storage0.yaml", lambda x: [s.update(state="archived" if s["name"] == "mnt_data" else "destroyed")
                                                    for s in x["storages"]])
    write_meta(tree, "launch-params.yaml", {"instances": {}})
    write_meta(tree, "storage-state.yaml", {"storages": {
        "mnt_data": {"state": "archived", "generation": 1,
                     "facts": {"builder": "aws-ebs", "type": "ebs", "archive": "csis-mnt_data-archive"}},
        "default-bucket": {"state": "destroyed", "generation": 1, "facts": {"builder": "aws-s3", "type": "s3"}},
        "efs-storage": {"state": "destroyed", "generation": 1, "facts": {"builder": "aws-efs", "type": "efs"}}}})
    cas = c.cascade_of(tree, ENV, ebs="destroyed", run_version=corpus.version_stub({}))
    steps = [x for ph in cas["phases"] for x in ph["steps"]]
    assert any("delete the archive snapshot csis-mnt_data-archive" in x for x in steps), cas["lines"]
    assert set(steps) <= set(cas["approved"]) and cas["approved"], cas["approved"]
    t, meta = load(tree)
    spec = {"environment": ENV, "phase": "storage", "ebs": "destroyed"}
    _r, _i, problems = c.apply_phase(t, meta, dict(spec, approved=[d for d in cas["approved"] if d not in steps]))
    assert [p.key for p in problems] == ["cascade.approved"], problems
    assert "delete the archive snapshot csis-mnt_data-archive" in problems[0].message
    t, meta = load(tree)
    assert c.apply_phase(t, meta, dict(spec, approved=cas["approved"]))[2] == []


def test_a_declared_machine_outside_whose_launch_record_still_mounts_the_storage_is_refused(tree):
    """A machine outside the environment whose declaration no longer mounts mnt_data (a detach not
    applied yet) still has it attached (its launch record): the cascade is refused before anything
    runs, not at its storage phase with the environment's instances already gone."""
    edit(tree, "cfg/hierarchy.yml", lambda x: x["hierarchy"].append(
        {"name": "west", "kind": "environment", "parent": "example-account", "dependency_configs": {"region": "us-west-2"}}))
    edit(tree, "cfg/runtime-builders.yml", lambda x: x["runtime_builders"].append(
        dict(x["runtime_builders"][0], name="west-runtime", environment="west", is_default=False)))
    edit(tree, "cfg/instance-builders.yml", lambda x: x["instance_builders"].append(
        dict(x["instance_builders"][0], name="west-tofu", runtime="west-runtime", is_default=False)))
    edit(tree, "images/images.yaml", lambda x: x["images"][0]["runtimes"].append("west-runtime"))
    edit(tree, "instances/instances.yaml", lambda x: x["instances"].append(
        {"name": "far1", "image": x["instances"][0]["image"], "type": "west-tofu", "runtime": "west-runtime"}))
    far = dict(launched("far1", [MNT], runtime="west-runtime"), builder="west-tofu")
    write_meta(tree, "launch-params.yaml", {"instances": {"test2": launched("test2", [MNT]), "far1": far}})
    t, meta = load(tree)
    got = [str(p) for p in c.plan_cascade(t, meta, ENV)["problems"] if "far1" in str(p) and "group 'coops'" not in str(p)]
    assert got == ["meta-state/launch-params.yaml: instances.far1: launched instance 'far1' (outside environment "
                   "'example-us-east-2') mounts storage 'mnt_data', which the cascade would destroy: apply its detach "
                   "first (the instance-image lifecycle of its runtime)"], got
