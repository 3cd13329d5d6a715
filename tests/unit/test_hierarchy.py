# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Issue 15 items 1 and 2: the hierarchy of cfg/hierarchy.yml (dependency tags and configs flow
farthest -> nearest -> own, the nearest wins, validation shows each value's source), the tags it
gives every storage and instance (module calls and provider default_tags), ``config.required_tags``
at validate, and the gate's required-tags check on plan JSON."""
from __future__ import annotations

import json
import os
import sys

import pytest
from trees import edit_yaml as edit  # noqa: E402  (tests/support)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bad_inputs"))
import corpus  # noqa: E402
from render_trees import copy_tree  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.gate import run_gate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.plan_verdict import evaluate_plan, missing_tags  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.config import hierarchy as h  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError, GateRefused  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.plan import RenderOptions  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.roots import plan_roots  # noqa: E402

RT = "aws-east2-runtime"
HIER = "cfg/hierarchy.yml"


@pytest.fixture
def tree(tmp_path):
    return copy_tree("examples", str(tmp_path))


def validated(root, overlays=()):
    return load_and_validate(root, overlays=overlays, run_version=corpus.version_stub({}))


def flat(text):
    return " ".join(text.split())


def three_levels(root):
    """account -> environment -> (nested) environment, the runtime under the nested one."""
    def add(d):
        d["hierarchy"][0]["dependency_tags"].update(Team="acct-team", Tier="gold")
        d["hierarchy"][0]["dependency_configs"]["default_machine_type"] = "m5.large"
        d["hierarchy"][1]["dependency_tags"]["Tier"] = "silver"
        d["hierarchy"].append({"name": "example-blue", "kind": "environment", "parent": "example-us-east-2",
                               "dependency_tags": {"Tier": "bronze", "Slot": "blue"},
                               "dependency_configs": {"default_machine_type": "t3.small"}})
    edit(root, HIER, add)
    edit(root, "cfg/runtime-builders.yml", lambda d: d["runtime_builders"][0].update(
        environment="example-blue", tags={"Slot": "green", "Own": "yes"}, region="us-west-2"))


# ----------------------------------------------------------------------------- inheritance
def test_the_example_runtime_inherits_from_its_account_and_environment(tree):
    t, _meta = validated(tree)
    rt = t.runtimes[RT]
    assert (rt.region, rt.account_id, rt.default_machine_type) == ("us-east-2", "123456789012", "t3.micro")
    assert h.runtime_tags(t, rt) == {"BillingCode": "CSIS-0001", "Owner": "coastal-ops", "Stage": "development"}
    eff = h.effective(t, rt)
    assert eff["chain"] == ["example-account", "example-us-east-2"]
    assert eff["tags"]["BillingCode"] == {"value": "CSIS-0001", "from": "account 'example-account'", "file": HIER}
    # the environment is nearer than the account: its Owner wins, the account's is shown as overridden
    assert eff["tags"]["Owner"] == {"value": "coastal-ops", "from": "environment 'example-us-east-2'", "file": HIER,
                                    "overrides": [{"value": "platform-team", "from": "account 'example-account'",
                                                   "file": HIER}]}
    assert eff["configs"]["region"]["from"] == "environment 'example-us-east-2'"
    assert eff["configs"]["account_id"] == {"value": "123456789012", "from": "account 'example-account'", "file": HIER}


def test_farthest_to_nearest_to_own_the_nearest_wins(tree):
    three_levels(tree)
    t, _meta = validated(tree)
    rt = t.runtimes[RT]
    # tags: account < example-us-east-2 < example-blue < the runtime's own
    assert h.runtime_tags(t, rt) == {"BillingCode": "CSIS-0001", "Owner": "coastal-ops", "Stage": "development",
                                     "Team": "acct-team", "Tier": "bronze", "Slot": "green", "Own": "yes"}
    eff = h.effective(t, rt)
    assert eff["chain"] == ["example-account", "example-us-east-2", "example-blue"]
    tier = eff["tags"]["Tier"]
    assert (tier["value"], tier["from"]) == ("bronze", "environment 'example-blue'")
    assert [(o["value"], o["from"]) for o in tier["overrides"]] == [
        ("silver", "environment 'example-us-east-2'"), ("gold", "account 'example-account'")]
    slot = eff["tags"]["Slot"]
    assert (slot["value"], slot["from"], slot["file"]) == ("green", "runtime", "cfg/runtime-builders.yml")
    assert [(o["value"], o["from"]) for o in slot["overrides"]] == [("blue", "environment 'example-blue'")]
    assert "overrides" not in eff["tags"]["Own"]
    # configs: the nearest node seeds what the runtime leaves out; the runtime's own value wins
    assert rt.default_machine_type == "t3.small"
    mt = eff["configs"]["default_machine_type"]
    assert (mt["from"], [o["value"] for o in mt["overrides"]]) == ("environment 'example-blue'", ["t3.micro", "m5.large"])
    assert rt.region == "us-west-2"
    region = eff["configs"]["region"]
    assert (region["from"], region["overrides"][0]["value"]) == ("runtime", "us-east-2")
    lines = h.effective_lines(t)
    assert lines[0] == "runtime '%s': environment 'example-blue' (example-account -> example-us-east-2 -> example-blue -> %s)" % (RT, RT)
    assert ("runtime '%s': tag Tier = 'bronze' from environment 'example-blue' (cfg/hierarchy.yml); over 'silver' from "
            "environment 'example-us-east-2' (cfg/hierarchy.yml), 'gold' from account 'example-account' (cfg/hierarchy.yml)"
            % RT) in lines


def test_an_overlay_is_named_as_the_source_of_what_it_sets(tree):
    with open(os.path.join(tree, "overlays", "local.yml"), "w", encoding="utf-8") as fh:
        fh.write("runtime_builders:\n  - name: %s\n    default_machine_type: t3.nano\n    tags: {Owner: me}\n" % RT)
    t, _meta = validated(tree, overlays=["overlays/local.yml"])
    eff = h.effective(t, t.runtimes[RT])
    assert eff["configs"]["default_machine_type"] == {
        "value": "t3.nano", "from": "overlay", "file": "overlays/local.yml",
        "overrides": [{"value": "t3.micro", "from": "environment 'example-us-east-2'", "file": HIER}]}
    assert (eff["tags"]["Owner"]["value"], eff["tags"]["Owner"]["file"]) == ("me", "overlays/local.yml")


def test_a_runtime_of_no_environment_keeps_its_own_values_and_inherits_nothing(tree):
    edit(tree, "cfg/runtime-builders.yml", lambda d: (d["runtime_builders"][0].pop("environment"),
                                                      d["runtime_builders"][0].update(region="eu-west-1")))
    edit(tree, "cfg/_config.yml", lambda d: d["config"].pop("required_tags"))
    t, _meta = validated(tree)
    rt = t.runtimes[RT]
    assert (rt.region, rt.account_id, rt.default_machine_type) == ("eu-west-1", None, "t3.micro")
    assert h.runtime_tags(t, rt) == {} and h.effective_lines(t) == []
    assert h.effective(t, rt)["configs"]["default_machine_type"] == {"value": "t3.micro", "from": "default", "file": None}


def test_a_runtime_left_without_its_region_by_a_broken_chain_reports_only_the_chain(tree):
    # the runtime's region comes from its environment, whose parent is gone: the parent is the
    # problem, not a second "region: required key is missing" at the runtime
    edit(tree, HIER, lambda d: d["hierarchy"][1].update(parent="gone", dependency_configs={}))
    with pytest.raises(ConfigError) as err:
        load_tree(tree)  # a loader problem: every reader of the tree refuses it, not only validation
    assert [(p.file, p.key) for p in err.value.problems] == [(HIER, "hierarchy[1] (example-us-east-2).parent")]


# ----------------------------------------------------------------------------- rendering
def test_every_root_of_the_runtime_gets_the_inherited_tags(tree):
    three_levels(tree)
    t, meta = validated(tree)
    default = ('default_tags { tags = { BillingCode = "CSIS-0001" Own = "yes" Owner = "coastal-ops" Slot = "green" '
               'Stage = "development" Team = "acct-team" Tier = "bronze" } }')
    storage = {r.builder: r for r in plan_roots(t, meta, "storage", RenderOptions())}
    inst = {r.builder: r for r in plan_roots(t, meta, "instance-image", RenderOptions())}
    for r in list(storage.values()) + list(inst.values()):
        main = flat([v for k, v in r.files.items() if k.endswith("generation.tf")][0])
        assert default in main, (r.builder, main)
        assert 'region = "us-west-2"' in main
        assert r.required_tags == ["BillingCode", "Owner"] and r.as_dict(tree)["required_tags"] == ["BillingCode", "Owner"]
    # the module calls: the inherited tags first, then the builder's and the storage's own (which win)
    ebs = flat(storage["aws-ebs"].files["aws-ebs-storage-generation-storage-mnt_data.tf"])
    assert ('tags = { BillingCode = "CSIS-0001" Owner = "coastal-ops" Team = "acct-team" Tier = "bronze" '
            'Stage = "development" Slot = "green" Own = "yes" Project = "MyProject" Environment = "Development" '
            'csis_config = "csis-example" }') in ebs
    s3 = flat(storage["aws-s3"].files["aws-s3-storage-generation-storage-default_bucket.tf"])
    assert 'env = "production" team = "devops" csis_config = "csis-example" }' in s3 and 'BillingCode = "CSIS-0001"' in s3
    test2 = flat(inst["open-tofu"].files["open-tofu-instance-generation-instance-test2.tf"])
    assert 'Own = "yes" hype = "test" csis_config = "csis-example" }' in test2 and 'Tier = "bronze"' in test2
    assert 'instance_type = "t3.medium"' in test2  # its own machine_type
    test = flat(inst["open-tofu"].files["open-tofu-instance-generation-instance-test.tf"])
    assert 'instance_type = "t3.small"' in test  # the runtime's default_machine_type, seeded by example-blue
    sg = flat(inst["open-tofu"].files["open-tofu-instance-generation.tf"])
    assert 'Stage = "development" Slot = "green" Own = "yes" Name = "csis-instances" csis_config = "csis-example" }' in sg


def test_a_storages_own_tag_wins_over_an_inherited_one(tree):
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"][0].update(tags={"Owner": "storage-team"}))
    t, meta = validated(tree)
    (ebs,) = [r for r in plan_roots(t, meta, "storage", RenderOptions()) if r.builder == "aws-ebs"]
    call = flat(ebs.files["aws-ebs-storage-generation-storage-mnt_data.tf"])
    assert 'Owner = "storage-team"' in call and 'Owner = "coastal-ops"' not in call
    assert 'Owner = "coastal-ops"' in flat(ebs.files["aws-ebs-storage-generation.tf"])  # default_tags: the runtime's


# ----------------------------------------------------------------------------- required tags at validate
def test_the_required_tags_may_come_from_any_layer(tree):
    edit(tree, "cfg/_config.yml", lambda d: d["config"].update(required_tags=["BillingCode", "Team"]))
    # Team: the storages' own tags or their builder's, the instances' own, the runtime's for the security group
    edit(tree, "cfg/storage-builders.yml", lambda d: [b["variables"]["tags"].update(Team="x") for b in d["storage_builders"][:2]])
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"][1]["tags"].update(Team="y"))
    edit(tree, "instances/instances.yaml", lambda d: [i.setdefault("tags", {}).update(Team="z") for i in d["instances"]])
    with pytest.raises(ConfigError) as err:
        validated(tree)
    assert [(p.file, p.key) for p in err.value.problems] == [("cfg/runtime-builders.yml", "runtime_builders[0] (%s).tags" % RT)]
    edit(tree, "cfg/runtime-builders.yml", lambda d: d["runtime_builders"][0].update(tags={"Team": "rt"}))
    validated(tree)
    # an empty value over an inherited one blanks the tag: refused, naming the storage's own tags
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"][1]["tags"].update(BillingCode=""))
    with pytest.raises(ConfigError) as err:
        validated(tree)
    assert len(err.value.problems) == 1 and "lacks the required tag BillingCode (empty)" in str(err.value.problems[0])
    assert err.value.problems[0].file == "storages/storage0.yaml"


# ----------------------------------------------------------------------------- the gate on plan JSON
def rc(address, actions, after=None, after_unknown=None, mode="managed"):
    return {"address": address, "mode": mode, "type": address.split(".")[-2], "name": address.split(".")[-1],
            "change": {"actions": list(actions), "before": None, "after": after, "after_unknown": after_unknown or {}}}


def plan(*changes):
    return {"format_version": "1.2", "terraform_version": "1.11.4", "resource_changes": list(changes)}


REQ = ["BillingCode", "Owner"]


def test_missing_tags_reads_tags_all_and_tags_and_known_keys_only():
    full = {"tags": {"Name": "x"}, "tags_all": {"Name": "x", "BillingCode": "b", "Owner": "o"}}
    assert missing_tags({"after": full}, REQ) == []
    assert missing_tags({"after": {"tags": {"BillingCode": "b"}, "tags_all": {"Owner": "o"}}}, REQ) == []
    assert missing_tags({"after": {"tags": {"Owner": "o"}, "tags_all": {"Owner": "o"}}}, REQ) == ["BillingCode"]
    # an empty value is no tag: a leaf cannot blank an inherited cost tag
    assert missing_tags({"after": {"tags": {"Owner": ""}, "tags_all": {"Owner": "", "BillingCode": "b"}}}, REQ) == ["Owner"]
    # a key whose value is known only after the apply is a known key
    assert missing_tags({"after": {"tags_all": {"Owner": "o"}}, "after_unknown": {"tags_all": {"BillingCode": True}}}, REQ) == []
    # a whole map known only after the apply names no key
    assert missing_tags({"after": {"tags": None}, "after_unknown": {"tags_all": True}}, REQ) == REQ
    assert missing_tags({"after": {"tags": None, "tags_all": {}}}, REQ) == REQ
    # not taggable: no tags attribute at all
    assert missing_tags({"after": {"input": "x"}}, REQ) == []


def test_the_gate_refuses_creates_and_updates_that_lack_a_required_tag(tmp_path):
    tagged = {"tags": {}, "tags_all": {"BillingCode": "b", "Owner": "o"}}
    lacking = {"tags": {"Owner": "o"}, "tags_all": {"Owner": "o"}}
    p = plan(
        rc("module.storage_a.aws_ebs_volume.this", ["create"], tagged),
        rc("module.storage_b.aws_ebs_volume.this", ["create"], lacking),
        rc("aws_security_group.csis_instances", ["update"], {"tags": None, "tags_all": {}}),
        rc("module.instance_x.aws_instance.this", ["delete", "create"], lacking),
        rc("module.instance_y.aws_instance.this", ["delete"], None),
        rc("module.instance_z.aws_instance.this", ["no-op"], lacking),
        rc("terraform_data.groups", ["create"], {"input": {"coops": 3000}}),
        rc("data.aws_ami.this", ["read"], {"tags": {}}, mode="data"),
        rc("module.storage_c.aws_s3_bucket.this", ["create"], {"tags": {"Owner": "o"}}, {"tags_all": True}),
    )
    v = evaluate_plan(p, allow_destroy=["module.instance_x", "module.instance_y"], required_tags=REQ)
    assert v.violations == [
        "MISSING REQUIRED TAGS: module.storage_b.aws_ebs_volume.this lacks BillingCode",
        "MISSING REQUIRED TAGS: aws_security_group.csis_instances lacks BillingCode, Owner",
        "MISSING REQUIRED TAGS: module.instance_x.aws_instance.this lacks BillingCode",
        "MISSING REQUIRED TAGS: module.storage_c.aws_s3_bucket.this lacks BillingCode",
    ]
    assert evaluate_plan(p, allow_destroy=["module.instance_x", "module.instance_y"]).violations == []  # no policy
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(p))
    with pytest.raises(GateRefused) as exc:
        run_gate(plan_json=str(path), allow_destroy=["module.instance_x", "module.instance_y"], required_tags=REQ)
    assert exc.value.messages[0] == "MISSING REQUIRED TAGS: module.storage_b.aws_ebs_volume.this lacks BillingCode"
    assert len(exc.value.messages) == 4 and exc.value.result["violations"] == exc.value.messages
    ok = plan(rc("module.storage_a.aws_ebs_volume.this", ["create"], tagged))
    path.write_text(json.dumps(ok))
    assert run_gate(plan_json=str(path), required_tags=REQ)["adds"] == 1


@pytest.mark.parametrize("file,edit_fn,key", [
    ("cfg/hierarchy.yml", lambda d: d["hierarchy"][0]["dependency_tags"].update(Name="prod-account"),
     "hierarchy[0] (example-account).dependency_tags"),
    ("cfg/runtime-builders.yml", lambda d: d["runtime_builders"][0].setdefault("tags", {}).update(Name="east2"),
     "runtime_builders[0] (aws-east2-runtime).tags"),
    ("cfg/storage-builders.yml", lambda d: d["storage_builders"][1]["variables"]["tags"].update(Name="ebs"),
     "storage_builders[1] (aws-ebs).variables.tags"),
])
def test_a_name_tag_above_storages_and_instances_is_refused(tree, file, edit_fn, key):
    """Every module names its resource after its storage or instance, and merges the tags it is
    given over that: a Name inherited from a node, a runtime or a builder renamed every resource
    below it. It is refused where it is written; a storage's or an instance's own Name stays."""
    edit(tree, file, edit_fn)
    with pytest.raises(ConfigError) as exc:
        validated(tree)
    problems = [p for p in exc.value.problems if "tag 'Name' may not be set here" in p.message]
    assert [(p.file, p.key) for p in problems] == [(file, key)], exc.value.problems


def test_a_storages_own_name_tag_is_its_own(tree):
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"][0].setdefault("tags", {}).update(Name="data"))
    validated(tree)


def test_the_inherited_account_id_is_the_only_account_the_provider_plans_in(tree):
    """account_id (here from the account node) is rendered as the provider's allowed_account_ids, so
    credentials of another account are refused at plan; a runtime that skips asking STS for its
    account (skip_requesting_account_id, as the local endpoint does) gets none: the provider could not check."""
    def provider_text(root):
        t, _meta = validated(root)
        (ebs,) = [r for r in plan_roots(t, _meta, "storage", RenderOptions()) if r.builder == "aws-ebs"]
        return flat(ebs.files["aws-ebs-storage-generation.tf"])

    assert "allowed_account_ids" not in provider_text(tree)
    edit(tree, "cfg/runtime-builders.yml", lambda d: d["runtime_builders"][0].update(skip_requesting_account_id=False))
    assert 'allowed_account_ids = ["123456789012"]' in provider_text(tree)
