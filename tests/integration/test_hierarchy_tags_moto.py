# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Issue 15 items 1 and 2 against real terraform, the real AWS provider and the session's moto
server, plan only (nothing is applied):

* the tags a runtime inherits from its account and environment (cfg/hierarchy.yml) reach a real
  plan: in the EBS volume's ``tags`` (the module call) and ``tags_all`` (the provider's
  ``default_tags``), and the gate passes it under the tree's ``config.required_tags``;
* the same root, re-rendered for a runtime of no environment (its volume carries neither tag),
  plans a volume that the gate refuses under that policy, naming its address.

One EBS storage, no instance: one root, one init, two plans.
"""
from __future__ import annotations

import os

import pytest

from day2_trees import make_tree, write_yaml, read_yaml

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.gate import run_gate
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.tfplan import make_plan
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import GateRefused
from ansible_collections.csis.infra.plugins.module_utils.csis.render import pipeline as service
from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import show_json, terraform_env

pytestmark = pytest.mark.integration

TAG = "csis-hier-tags"
VOLUME = "module.storage_mnt_data.aws_ebs_volume.this"


def _render_and_plan(root, moto, env):
    res = service.render(root, ["storage"], dry_run=False, overlays=[moto.overlay_path], prepare=True, workers=1,
                         extra_env=moto.env)
    (ebs,) = [r for r in res["roots"] if r["builder"] == "aws-ebs"]
    d = ebs["directory"]
    planned = make_plan(d, env=env, timeout=600)
    assert planned["changes"] is True, planned
    return ebs, d


def test_inherited_tags_reach_a_real_plan_and_the_gate_refuses_a_plan_without_them(moto_endpoint, tmp_path):
    root = make_tree(str(tmp_path), TAG, [{"name": "mnt_data", "mount_point": "/mnt/data", "state": "active"}], [])
    env = terraform_env(dict(os.environ, **moto_endpoint.env))
    env["AWS_EC2_METADATA_DISABLED"] = "true"

    ebs, d = _render_and_plan(root, moto_endpoint, env)
    assert ebs["required_tags"] == ["BillingCode", "Owner"]  # what csis_render hands the gate
    shown = show_json(os.path.join(d, "tfplan"), d, "terraform", env)
    (vol,) = [rc for rc in shown["resource_changes"] if rc["address"] == VOLUME]
    after = vol["change"]["after"]
    inherited = {"BillingCode": "CSIS-0001", "Owner": "coastal-ops", "Stage": "development"}
    for attr in ("tags", "tags_all"):  # the module call's tags, and the provider's default tags
        assert {k: after[attr].get(k) for k in inherited} == inherited, (attr, after[attr])
    assert after["tags"]["csis_config"] == TAG and after["tags_all"]["Name"] == "mnt_data"
    # the provider's default_tags alone (the root's provider block) carry the inherited tags too
    cfg = shown["configuration"]["provider_config"]
    (provider,) = [p for p in cfg.values() if p.get("alias") == "aws_ebs"]
    assert provider["expressions"]["default_tags"][0]["tags"]["constant_value"] == inherited
    passed = run_gate(d, "tfplan", required_tags=ebs["required_tags"], env=env)
    assert passed["violations"] == [] and VOLUME in passed["addresses"]["create"]

    # the same root for a runtime of no environment and no policy: its plan lacks the tags
    rb = read_yaml(root, "cfg/runtime-builders.yml")
    rb["runtime_builders"][0].pop("environment")
    rb["runtime_builders"][0]["region"] = "us-east-2"
    write_yaml(root, "cfg/runtime-builders.yml", rb)
    cfg_file = read_yaml(root, "cfg/_config.yml")
    cfg_file["config"].pop("required_tags")
    write_yaml(root, "cfg/_config.yml", cfg_file)
    ebs2, d2 = _render_and_plan(root, moto_endpoint, env)
    assert d2 == d and ebs2["required_tags"] == []
    with pytest.raises(GateRefused) as exc:
        run_gate(d, "tfplan", required_tags=["BillingCode", "Owner"], env=env)
    assert exc.value.messages == ["MISSING REQUIRED TAGS: %s lacks BillingCode, Owner" % VOLUME]
