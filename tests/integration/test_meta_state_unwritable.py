# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Issue 16, defect 4: meta-state writability used to be found out after the apply.

The reproduction of the issue (real ansible-playbook, real terraform, the session's moto
server): the meta-state directory of a fresh EBS tree is made immutable (``chattr +i``: root
ignores permission bits, not the attribute), then ``storage.yml`` runs for real with every
apply flag on. It used to create the volume, then fail at the record with ``cannot write:
Operation not permitted``. Now the run's preflight (``csis.infra.csis_preflight``, before
anything is rendered) stops it, naming the directory; nothing is rendered, planned or
created at the endpoint, and nothing is left in the directory. An AWX plan job
(``csis_phase=plan``), which writes its plan receipts and holds the run lock, is stopped the
same way.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

pytestmark = e2e.needs_terraform()


def _chattr(flag, path):
    return subprocess.run(["chattr", flag, path], capture_output=True, text=True, check=False)


def test_an_unwritable_meta_state_stops_a_real_run_before_any_plan(moto_endpoint, tmp_path):
    ep = moto_endpoint
    key = "unwritable-%s" % uuid.uuid4().hex[:8]
    # its own tree id: the volume it would create carries a csis_config tag no other test's has
    # (the endpoint is shared with the other workers' tests, which create volumes meanwhile)
    root = e2e.make_ebs_tree(str(tmp_path), key, tree_id=key)
    meta_dir = os.path.join(root, "meta-state")
    os.makedirs(meta_dir)
    if os.geteuid() != 0 or shutil.which("chattr") is None or _chattr("+i", meta_dir).returncode != 0:
        pytest.skip("chattr +i does not work here (not root, or the file system has no attributes)")
    ec2 = ep.client("ec2")
    try:
        real = e2e.run_playbook("storage.yml", root, ep.env, overlays=[ep.overlay_path, e2e.APPLY_ALL],
                                log=os.path.join(str(tmp_path), "storage.log"))
        # an AWX plan job writes its plan receipts and holds the run lock: refused the same way
        plan_job = e2e.run_playbook("storage.yml", root, ep.env, overlays=[ep.overlay_path, e2e.APPLY_ALL],
                                    extra_vars={"csis_phase": "plan"}, log=os.path.join(str(tmp_path), "plan-job.log"))
    finally:
        _chattr("-i", meta_dir)
    for run in (real, plan_job):
        assert run.rc != 0, run.tail()
        flat = " ".join(run.out.split())
        assert ("meta-state: the directory %s cannot be written: Operation not permitted; a real run records in "
                "meta-state what it applies (a plan job its plan receipts), so it stops before planning anything"
                % meta_dir) in flat, run.tail()
        assert "TASK [csis.infra.render : Refuse to start while the last state query found HARD drift" in run.out
        # stopped before the render: nothing rendered, planned, applied or recorded
        assert "TASK [csis.infra.render : Render the storage roots]" not in run.out
        assert "Plan to a plan file" not in run.out and "Apply exactly that plan file" not in run.out
    assert not os.path.exists(os.path.join(root, "generated", "storage"))
    assert os.listdir(meta_dir) == []
    # nothing at the endpoint: no new volume, no state object under the tree's key
    assert ec2.describe_volumes(Filters=[{"Name": "tag:csis_config", "Values": [key]}])["Volumes"] == []
    objects = ep.client("s3").list_objects_v2(Bucket=ep.state_bucket, Prefix="statefiles/%s" % key).get("Contents", [])
    assert objects == []


def test_an_awx_job_on_the_trees_local_store_is_refused_before_any_plan(moto_endpoint, tmp_path):
    """An AWX job (``awx_job_id``, what AWX passes every job) runs in a container of its own: what
    it would record in the tree's local store is gone with it, and its run lock keeps no other
    node's job out. A real run is refused by the preflight, before anything is rendered
    (``csis_awx_local_meta_state=true``, for a checkout that outlives its jobs, lets it go on:
    test_destroy_environment.py runs the cascade so)."""
    ep = moto_endpoint
    key = "awx-local-%s" % uuid.uuid4().hex[:8]
    root = e2e.make_ebs_tree(str(tmp_path), key, tree_id=key)
    overlays = [ep.overlay_path, e2e.APPLY_ALL]
    real = e2e.run_playbook("storage.yml", root, ep.env, overlays=overlays, extra_vars={"awx_job_id": 4242},
                            log=os.path.join(str(tmp_path), "awx-real.log"))
    assert real.rc != 0, real.tail()
    flat = " ".join(real.out.split())
    assert ("meta-state is the tree's local store (%s), and this run is AWX job 4242: what it records (records, plan "
            "receipts, approvals, the audit trail) would be gone with the job's container" % os.path.join(root, "meta-state")) \
        in flat, real.tail()
    assert "-e csis_awx_local_meta_state=true where the checkout outlives the job" in flat
    assert "TASK [csis.infra.render : Render the storage roots]" not in real.out
    assert not os.path.exists(os.path.join(root, "generated", "storage"))
