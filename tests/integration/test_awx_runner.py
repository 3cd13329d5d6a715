# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The AWX workflow, run the way AWX runs jobs: ``ansible_runner.run`` on a private data
directory with ``project/`` (the collection checkout), ``inventory/`` and ``env/``
(``extravars``, and ``envvars`` standing in for a credential type's injectors).

plan job (``csis_phase=plan``) -> approval node -> apply job (``csis_phase=apply``) with
the plan job's ``set_stats`` artifact ``csis_approved_plans`` as extra vars (what an AWX
workflow passes from one node to the next). An apply job whose plan differs from the
approved one (same addresses, other values) refuses. See docs/awx.md.
"""
from __future__ import annotations

import os
import shutil
import sys
import uuid

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

ansible_runner = pytest.importorskip("ansible_runner")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("terraform") is None or not os.path.exists(e2e.PLAYBOOK_BIN),
                       reason="needs terraform on PATH and the project venv"),
]

ROOT_KEY = "storage-aws-ebs"


def _private_data_dir(parent, ep):
    pdd = os.path.join(parent, "pdd")
    os.makedirs(os.path.join(pdd, "inventory"))
    os.makedirs(os.path.join(pdd, "env"))
    os.symlink(e2e.REPO, os.path.join(pdd, "project"))          # AWX: the project's SCM checkout
    with open(os.path.join(pdd, "inventory", "hosts"), "w", encoding="utf-8") as fh:
        fh.write("localhost ansible_connection=local ansible_python_interpreter=%s\n"
                 % os.path.join(e2e.VENV_BIN, "python"))
    # AWX: a credential type injecting the AWS credentials as environment variables
    envvars = dict(ep.env)
    envvars["PATH"] = e2e.VENV_BIN + os.pathsep + os.environ.get("PATH", "")
    with open(os.path.join(pdd, "env", "envvars"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(envvars, fh)
    return pdd


def _job(pdd, ident, extravars):
    """One AWX job: extra vars written to env/extravars, then ansible-runner."""
    with open(os.path.join(pdd, "env", "extravars"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(extravars, fh)
    r = ansible_runner.run(private_data_dir=pdd, playbook="playbooks/storage.yml", ident=ident, quiet=True)
    stdout = r.stdout.read() if hasattr(r.stdout, "read") else ""
    stats = [e for e in r.events if e.get("event") == "playbook_on_stats"]
    artifact = (stats[-1]["event_data"].get("artifact_data") if stats else None) or {}
    return r, stdout, artifact


def _ran(out, task):
    """The statuses (ok, changed, skipping, fatal) the task printed, in order."""
    import re
    text = re.sub(r"\x1b\[[0-9;]*m", "", out)
    statuses = []
    for block in text.split("TASK [")[1:]:
        if block.split("]", 1)[0].endswith(task):
            statuses += re.findall(r"^(ok|changed|skipping|fatal): \[", block, re.M)
    return statuses


def test_plan_job_approval_apply_job(moto_endpoint, tmp_path, monkeypatch):
    ep = moto_endpoint
    # the execution environment's ansible-playbook (AWX: the EE image; here: the project venv)
    monkeypatch.setenv("PATH", e2e.VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    key = "awx-%s" % uuid.uuid4().hex[:8]
    root = e2e.make_ebs_tree(str(tmp_path), key)
    pdd = _private_data_dir(str(tmp_path), ep)
    base = {"csis_config_root": root, "csis_dry_run": False, "csis_overlays": [ep.overlay_path, e2e.APPLY_ALL]}

    # 1. the plan job: plans and gates, publishes the approved digests, applies nothing
    r, out, artifact = _job(pdd, "plan", dict(base, csis_phase="plan"))
    assert r.status == "successful", out[-4000:]
    approved = artifact.get("csis_approved_plans")
    assert isinstance(approved, dict) and set(approved) == {ROOT_KEY}, artifact
    assert len(approved[ROOT_KEY]) == 64
    assert _ran(out, "Apply exactly that plan file") == ["skipping"]
    assert not os.path.exists(os.path.join(root, "meta-state", "storage-state.yaml"))

    # (the approval node: a human approves the plan job's output in the AWX UI)

    # 2. the configuration moved between the approval and the apply job: the volume would
    #    be created with another size (same address, same action, other values): refused
    builders = os.path.join(root, "cfg", "storage-builders.yml")
    original = open(builders, "rb").read()
    e2e.set_storage_builder_size(root, "aws-ebs", 120)
    try:
        r, out, _pdd = _job(pdd, "apply-moved", dict(base, csis_phase="apply", csis_approved_plans=approved))
    finally:
        open(builders, "wb").write(original)
    assert r.status == "failed", out[-4000:]
    assert "the plan differs from the one approved in the plan job" in out, out[-4000:]
    assert "Apply exactly that plan file" not in out
    assert not os.path.exists(os.path.join(root, "meta-state", "storage-state.yaml"))
    assert not ep.client("ec2").describe_volumes(
        Filters=[{"Name": "tag:csis_config", "Values": ["csis-example"]}, {"Name": "size", "Values": ["120"]}])["Volumes"]

    # 3. the apply job with the approved digests, on the approved configuration: applies
    r, out, _pdd = _job(pdd, "apply", dict(base, csis_phase="apply", csis_approved_plans=approved))
    assert r.status == "successful", out[-4000:]
    assert _ran(out, "Apply exactly that plan file") == ["changed"]
    recs = e2e.meta(root, "storage-state.yaml")["storages"]
    vid = recs["mnt_data"]["facts"]["volume_id"]
    assert recs["mnt_data"]["state"] == "active"
    vol = ep.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"][0]
    assert vol["Size"] == 100
    # the plan job's artifact is where AWX keeps it: in the job's events
    assert os.path.isdir(os.path.join(pdd, "artifacts", "plan"))
