# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""``--check`` on a real run (real ansible-playbook): the render shows what it would write and
writes nothing, and every root stops before its init, saying so. Nothing is planned, gated or
applied: no plan is made in check mode, and the plan file an earlier run left behind is not
this run's plan. Before the fix the chain went on in check mode: on a fresh tree the init
failed with Ansible's "Unable to change directory" (the root was never written), and on an
applied tree the gate read the last run's plan file and refused, or passed and "applied", a
plan that was not this run's."""
from __future__ import annotations

import pytest
from render_trees import tree_hash
from trees import EXAMPLES, copy_as_shipped

import e2e

pytestmark = pytest.mark.integration


def test_check_mode_of_a_real_run_renders_in_memory_and_stops_every_root(tmp_path):
    root = copy_as_shipped(EXAMPLES, str(tmp_path / "tree"))
    before = tree_hash(root)
    run = e2e.run_playbook("storage.yml", root, {}, overlays=[e2e.APPLY_ALL], args=["--check", "--diff"], timeout=600)
    out = " ".join(run.out.split())
    assert run.rc == 0, run.tail()
    for key in ("storage-aws-ebs", "storage-aws-efs", "storage-aws-s3"):
        assert "%s: check mode: rendered in memory only (the render shows what would change); not planned, gated or applied" % key \
            in out, run.tail()
    assert "+module \"storage_mnt_data\" {" in run.out  # the render's diff
    for step in ("Initialise the root", "Plan to a plan file", "Gate the plan", "Apply exactly that plan file"):
        assert "TASK [csis.infra.tofu_root : %s" % step not in run.out, step
    assert tree_hash(root) == before
    # a dry run's check mode also shows the following lifecycle's root the dry run writes beside its own
    run = e2e.run_playbook("storage.yml", root, {}, dry_run=True, args=["--check", "--diff"], timeout=600)
    out = " ".join(run.out.split())
    assert run.rc == 0, run.tail()
    assert "(dry run: nothing is planned or applied); would write and validate ahead with them: " \
        "instance-image-open-tofu" in out, run.tail()
    assert "+module \"instance_test2\" {" in run.out  # the following root's files, in the diff
    assert tree_hash(root) == before
