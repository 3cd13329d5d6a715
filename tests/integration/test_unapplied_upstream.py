# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A root that reads another root's state, before that root's first apply (real terraform, the
session's moto server, real ansible-playbook).

An EFS root reads the identity root's gids (``data "terraform_remote_state"``); terraform cannot
plan it until the identity root has applied once. On a fresh tree with the apply flags off (as
``examples/`` ships), a real run plans and gates every root it can, leaves that one unplanned
with a line saying what it waits for, and succeeds: the README's "a real run with an apply flag
off plans and gates every root and applies nothing". A run that would apply the EFS root, while
the identity root stays unapplied, fails naming the identity root and its apply flag, before
anything is applied. Before the fix both runs failed with terraform's bare "Unable to find remote
state" on every root of the lifecycle.

The tree holds the EFS storage only (no EBS, no bucket, no instance): one small root to plan.
"""
from __future__ import annotations

import json
import os

import pytest

from day2_trees import Runner, make_tree, meta_bytes, tail, text, write_yaml

pytestmark = pytest.mark.integration

TAG = "csis-upstream"
EFS = {"name": "efs-storage", "type": "aws-efs", "groups": ["coops", "stofs"], "share_mode": "2775"}


def file_systems(t):
    efs = t.moto.client("efs")
    return [fs for fs in efs.describe_file_systems()["FileSystems"]
            if {"Key": "csis_config", "Value": TAG} in (fs.get("Tags") or [])]


def test_a_root_whose_upstream_was_never_applied(tmp_path, moto_endpoint):
    t = Runner(make_tree(str(tmp_path), TAG, [EFS], []), moto_endpoint)
    before = meta_bytes(t.root)

    # apply flags off (cfg/_config.yml as shipped): plan and gate only; the EFS root waits
    res = t.play("storage.yml", overlays=())
    out = text(res)
    assert res.returncode == 0, tail(res)
    assert ("storage-aws-efs: not planned: it reads identity-posix-groups, never applied (this run does not "
            "apply it; it is planned by the first run after identity-posix-groups applied)") in out, tail(res)
    assert "config.apply_identity" in out  # the warning: what to apply first, and its flag
    with open(os.path.join(t.root, "generated", "run-summary.json"), encoding="utf-8") as fh:
        entry = json.load(fh)["roots"]["storage-aws-efs"]
    assert (entry["status"], entry["plan"], entry["gate"]["verdict"], entry["applied"]) == (
        "not planned", "it reads identity-posix-groups, never applied", "not reached", False), entry
    assert meta_bytes(t.root) == before

    # the EFS root would apply (apply_storage on) while identity stays off: it cannot be planned,
    # and the run fails naming what to apply first; nothing is applied
    write_yaml(t.root, "overlays/storage-only.yml", {"config": {"apply_identity": False, "apply_storage": True}})
    res = t.play("storage.yml", overlays=("overlays/storage-only.yml",))
    out = text(res)
    assert res.returncode != 0, tail(res)
    efs_root = os.path.join(t.root, "generated", "storage", "aws-efs", "storage-generation")
    assert ("storage-aws-efs: Plan to a plan file (stale lock of a dead run released, binding opened first) failed: "
            "plan: %s: this root reads the state of identity-posix-groups (data.terraform_remote_state.posix_groups), "
            "and no state is stored for it in its backend" % efs_root) in out, tail(res)
    assert "apply flag on: config.apply_identity" in out
    assert "Apply exactly that plan file" not in out
    assert not file_systems(t)
    assert meta_bytes(t.root) == before
