# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The strict models, one file at a time (the corpus in test_validate.py covers whole trees)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.config import models as m
from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import Tree, parse_model
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import Problem


def problems_of(model: Any, data: Dict[str, Any], rel: str = "f.yml") -> List[Problem]:
    out: List[Problem] = []
    parse_model(model, data, rel, out)
    return out


def one(model: Any, data: Dict[str, Any]) -> Problem:
    ps = problems_of(model, data)
    assert len(ps) == 1, ps
    return ps[0]


EBS = {"name": "aws-ebs", "type": "tf-aws-ebs", "runtime": "rt"}


def test_builder_names_are_normalised():
    f = m.StorageBuildersFile.model_validate({"storage_builders": [dict(EBS, name="My EBS", aliases=["Big Disk"])]})
    b = f.storage_builders[0]
    assert (b.name, b.aliases) == ("my_ebs", ["big_disk"])


def test_storage_builder_type_selects_the_model():
    f = m.StorageBuildersFile.model_validate({"storage_builders": [
        EBS, {"name": "e", "type": "tf-aws-efs"}, {"name": "s", "type": "tf-aws-s3", "bucket_name": "abc"},
        {"name": "t", "type": "tf-aws"}]})
    assert [type(b).__name__ for b in f.storage_builders] == [
        "EbsStorageBuilder", "EfsStorageBuilder", "S3StorageBuilder", "TfAwsStorageBuilder"]
    assert f.storage_builders[0].size == 100 and f.storage_builders[0].executable == "tofu"


def test_an_unknown_builder_type_is_one_problem_at_its_key():
    p = one(m.StorageBuildersFile, {"storage_builders": [dict(EBS, type="tf-gcs")]})
    assert (p.key, p.message) == ("storage_builders[0] (aws-ebs).type",
                                  "type 'tf-gcs' is not a storage builder type (expected tf-aws, tf-aws-ebs, tf-aws-efs, tf-aws-s3)")


def test_a_builder_without_type():
    p = one(m.StorageBuildersFile, {"storage_builders": [{"name": "x"}]})
    assert (p.key, p.message) == ("storage_builders[0] (x).type",
                                  "required key is missing (a storage builder's type: tf-aws, tf-aws-ebs, tf-aws-efs, tf-aws-s3)")


@pytest.mark.parametrize("model,data,key,message", [
    (m.StorageBuildersFile, {"storage_builders": [dict(EBS, parameters={"a": 1})]}, "storage_builders[0] (aws-ebs).parameters",
     "'parameters:' is not supported on builders; declare module inputs under 'variables:' instead"),
    (m.InstanceBuildersFile, {"instance_builders": [{"name": "i", "type": "tofu", "parameters": {}}]},
     "instance_builders[0] (i).parameters",
     "'parameters:' is not supported on builders; declare module inputs under 'variables:' instead"),
    (m.GroupBuildersFile, {"group_builders": [{"name": "g", "type": "tf-identity", "parameters": {}}]},
     "group_builders[0] (g).parameters",
     "'parameters:' is not supported on builders; declare module inputs under 'variables:' instead"),
    (m.StorageBuildersFile, {"storage_builders": [dict(EBS, variables={"size": 5})]}, "storage_builders[0] (aws-ebs).variables.size",
     "'size' is a builder field of tf-aws-ebs, not a variable: move it out of 'variables:'"),
    (m.StorageBuildersFile, {"storage_builders": [{"name": "e", "type": "tf-aws-efs", "variables": {"performance-mode": "maxIO"}}]},
     "storage_builders[0] (e).variables.performance-mode",
     "unknown key 'performance-mode'; did you mean 'performance_mode'? (allowed here: encrypted, performance_mode, tags)"),
    (m.StorageBuildersFile, {"storage_builders": [dict(EBS, variables={"volume_type": "gp9"})]},
     "storage_builders[0] (aws-ebs).variables.volume_type",
     "'gp9' is not allowed: expected 'gp2', 'gp3', 'io1', 'io2', 'st1', 'sc1' or 'standard'"),
    (m.StorageBuildersFile, {"storage_builders": [dict(EBS, size=0)]}, "storage_builders[0] (aws-ebs).size",
     "expected greater than 0, got 0"),
    (m.StorageBuildersFile, {"storage_builders": [dict(EBS, name="a\\b")]}, "storage_builders[0] (a\\b).name",
     "builder name 'a\\b' must not contain '/' or '\\'"),
    (m.InstancesFile, {"instances": [{"name": "i", "groups": ["g"]}]}, "instances[0] (i).groups",
     "'groups:' is not allowed on an instance: ownership lives on the image's 'group'"),
    (m.InstancesFile, {"instances": [{"name": "i", "storages": [{"name": "s", "min_size": -1}]}]},
     "instances[0] (i).storages[0] (s).min_size", "min_size must be a positive number of GB, got -1"),
    (m.InstancesFile, {"instances": [{"name": "i", "type": ""}]}, "instances[0] (i).type",
     "type must not be empty: name a builder, or leave the key out for the is_default one"),
    (m.StoragesFile, {"storages": [{"name": "s", "runtime": ""}]}, "storages[0] (s).runtime",
     "runtime must not be empty: name a runtime, or leave the key out for the is_default one"),
    (m.StoragesFile, {"storages": [{"name": "s", "share_mode": 2770.5}]}, "storages[0] (s).share_mode",
     "share_mode 2770.5: expected one of ('2770', '2775') (N15)"),
    (m.GroupsFile, {"groups": [{"name": "ALL", "gid": 5}]}, "groups[0] (ALL).name",
     "the group name 'ALL' is retired; list the groups explicitly"),
    (m.ConfigFile, {"config": {"apply_storage": "false"}}, "config.apply_storage",
     "found the string 'false' (quoted, so not a YAML boolean); it must be true/false or a list of builder/runtime names"),
    (m.ConfigFile, {"config": {"use_state_backends": "yes"}}, "config.use_state_backends",
     "expected a valid boolean, got 'yes'"),
    (m.StateBackendsFile, {"state_backends": [{"name": "l", "type": "local", "bucket": "abc"}]},
     "state_backends[0] (l).bucket", "a local state backend takes 'directory', not bucket/key"),
])
def test_load_time_refusals(model, data, key, message):
    p = one(model, data)
    assert (p.file, p.key, p.message) == ("f.yml", key, message)


def test_share_mode_accepts_the_number():
    s = m.Storage.model_validate({"name": "s", "share_mode": 2775})
    assert s.share_mode == "2775"


@pytest.mark.parametrize("machine_type", ["t3.micro", "c7i.metal-24xl", "u-6tb1.metal", "mac2-m2pro.metal",
                                          "g4dn.12xlarge", "x2iezn.metal", "r7iz.metal-32xl"])
def test_real_ec2_instance_types_are_accepted(machine_type):
    assert m.Instance.model_validate({"name": "i", "machine_type": machine_type}).machine_type == machine_type
    assert m.check_instance_type(machine_type, "default_machine_type") == machine_type


def test_apply_flags():
    c = m.ConfigFlags.model_validate({"apply_storage": ["aws-ebs"], "apply_instances": None})
    assert c.apply_storage == ["aws-ebs"] and c.apply_instances is False and c.apply_identity is None


def test_a_duplicate_mapping_in_an_instance_keeps_the_later():
    i = m.Instance.model_validate({"name": "i", "storages": [{"name": "s", "mount_point": "/a"},
                                                             {"name": "s", "mount_point": "/b"}]})
    assert [(x.name, x.mount_point) for x in i.storages] == [("s", "/b")]


@pytest.mark.parametrize("name", ["a b", "a'b", 'a"b', "a${b}", "a\nb", "-a", "a;b", "a" * 64, ""])
def test_names_that_could_inject_are_refused(name):
    with pytest.raises(ValueError):
        m.check_name(name)


def test_resolution_default_and_aliases():
    ebs = m.EbsStorageBuilder.model_validate(dict(EBS, is_default=True, aliases=["disk"]))
    efs = m.EfsStorageBuilder.model_validate({"name": "aws-efs", "type": "tf-aws-efs"})
    t = Tree(root="/x", config_file=m.ConfigFile(), storage_builders={"aws-ebs": ebs, "aws-efs": efs})
    assert t.storage_builder("default") is ebs
    assert t.storage_builder("disk") is ebs
    assert t.storage_builder("aws-efs") is efs
    assert t.storage_builder("nope") is None
    st = m.Storage.model_validate({"name": "s"})  # no type -> default
    assert t.storage_builder_for(st) is ebs
    st = m.Storage.model_validate({"name": "s", "type": "Disk"})  # normalised reference
    assert t.storage_builder_for(st) is ebs


def test_the_runtime_endpoint_keys():
    rt = m.RuntimeBuilder.model_validate({"name": "rt", "region": "us-east-2",
                                          "endpoints": {"url": "http://127.0.0.1:5000", "services": {"s3": "http://s3.local:9000"}},
                                          "skip_credentials_validation": True, "s3_use_path_style": True})
    assert rt.endpoints.for_service("s3") == "http://s3.local:9000"
    assert rt.endpoints.for_service("ec2") == "http://127.0.0.1:5000"
    p = one(m.RuntimeBuildersFile, {"runtime_builders": [{"name": "rt", "region": "us-east-2",
                                                          "endpoints": {"url": "file:///etc/passwd"}}]})
    assert (p.key, p.message) == ("runtime_builders[0] (rt).endpoints.url", "endpoint 'file:///etc/passwd' must be an http(s) URL")
    # a URL refused with a token in it is shown without it
    for url in ("https://bot:tok%2Den@aws.example.org", "https://tok%2Den@aws.example.org"):
        p = one(m.RuntimeBuildersFile, {"runtime_builders": [{"name": "rt", "region": "us-east-2", "endpoints": {"url": url}}]})
        assert p.message == "endpoint 'https://***@aws.example.org' must be an http(s) URL" and "tok" not in str(p), p
    p = one(m.ConfigFile, {"config": {"module_source_base": "git::https://oauth2:glpat%2Dxyz@gitlab.example.org/mods.git"}})
    assert p.message == ("module_source_base 'git::https://***@gitlab.example.org/mods.git': must be a path or module "
                         "URL without quotes, '$', '%' or newlines") and "glpat" not in str(p), p


def test_a_yaml_merge_key_with_an_override_loads_and_a_key_written_twice_does_not(tmp_path):
    """``<<: *defaults`` then a key of its own: YAML's merge, the key written here wins (it used to be
    refused as a duplicate key); a key written twice in one mapping is still refused."""
    from render_trees import copy_tree  # tests/support

    from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree_partial

    root = copy_tree("examples", str(tmp_path))
    path = Path(root) / "instances" / "instances.yaml"
    path.write_text("instances:\n"
                    "  - &small {name: test, image: imgfile-basic, machine_type: t3.micro, description: small}\n"
                    "  - {<<: *small, name: test2, machine_type: t3.medium}\n", encoding="utf-8")
    tree, problems = load_tree_partial(root)
    assert problems == [], problems
    assert {n: (i.image, i.machine_type, i.description) for n, i in tree.instances.items()} == {
        "test": ("imgfile-basic", "t3.micro", "small"), "test2": ("imgfile-basic", "t3.medium", "small")}
    path.write_text("instances:\n  - {name: test, image: imgfile-basic, name: test2}\n", encoding="utf-8")
    _tree, problems = load_tree_partial(root)
    assert any("duplicate key 'name'" in p.message for p in problems), problems


def test_a_subnet_marked_is_default_is_the_default_subnet():
    """The reference names its default subnet with is_default on the subnet; it was accepted and
    never read (instances then launched in no subnet). Now it is the default subnet, and two marks,
    or a mark beside another default_subnet_id, are refused instead of one silently winning."""
    subnets = [{"name": "a", "subnet_id": "subnet-0a1b2c3d4e5f60718", "availability_zone": "us-east-2a"},
               {"name": "b", "subnet_id": "subnet-0b1b2c3d4e5f60718", "availability_zone": "us-east-2b", "is_default": True}]
    net = m.Networking(subnets=subnets)
    assert net.default_subnet_id == "subnet-0b1b2c3d4e5f60718" and net.effective_zone() == "us-east-2b"
    assert m.Networking(subnets=subnets, default_subnet_id="subnet-0b1b2c3d4e5f60718").default_subnet_id == \
        "subnet-0b1b2c3d4e5f60718"
    assert m.Networking(subnets=subnets[:1], default_subnet_id="subnet-0a1b2c3d4e5f60718").default_subnet_id == \
        "subnet-0a1b2c3d4e5f60718"
    with pytest.raises(ValueError, match="differs from the subnet marked is_default"):
        m.Networking(subnets=subnets, default_subnet_id="subnet-0a1b2c3d4e5f60718")
    with pytest.raises(ValueError, match="more than one subnet is marked is_default"):
        m.Networking(subnets=[dict(s, is_default=True) for s in subnets])
