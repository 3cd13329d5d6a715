# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The AWX workflow, run the way AWX runs jobs: ``ansible_runner.run`` on a private data
directory with ``project/``, ``inventory/`` and ``env/`` (``extravars``, and ``envvars``
standing in for a credential type's injectors).

``project/`` is a plain ``git clone`` of an AWX project as docs/awx-setup.md lays it out
(issue 11, item 2): the configuration tree at its root, on the S3 meta-state store and S3
state, as the page asks of AWX, plus the template of
docs/awx-project/ (``collections/requirements.yml``, ``inventory/hosts.csis.yml``, wrapper
playbooks importing ``csis.infra.<name>``). No symlink to this checkout and no ansible.cfg:
csis.infra comes only from the built artifact, installed into a temporary collections path
(tests/support/artifact.py, shared with test_collection_artifact.py) that
``ANSIBLE_COLLECTIONS_PATH`` names, as AWX names the path it installed the project's
requirements into. The jobs run the project's ``playbooks/storage.yml`` with
``csis_config_root: .`` (ansible-runner, like AWX, starts ansible-playbook in the project).
The plan job and the apply jobs run in two private data directories, each with its own clone
(two execution nodes that share nothing but the cloud): the apply jobs' checkout has never
seen a render, a terraform working directory or a record, and finds the plan job's receipt in
the S3 store; the approved digest must not depend on where a checkout lies.

plan job (``csis_phase=plan``) -> approval node -> apply job (``csis_phase=apply``) with
the plan job's ``set_stats`` artifact ``csis_approved_plans`` as extra vars (what an AWX
workflow passes from one node to the next). The plan job shows every change and receipts
its plan in the meta-state store; an apply job whose plan differs from the approved one
(same addresses, other values), whose receipt is older than ``approvals.receipt_max_age``, or (``approvals.distinct_approver``)
that the requester launched, refuses; the applying one records who approved. See docs/awx.md.
"""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import uuid

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import artifact as artifact_support  # noqa: E402  (tests/support/artifact.py)
import e2e  # noqa: E402
from trees import declare_s3_store  # noqa: E402

ansible_runner = pytest.importorskip("ansible_runner")

pytestmark = e2e.needs_terraform()

ROOT_KEY = "storage-aws-ebs"
PROJECT_TEMPLATE = os.path.join(e2e.REPO, "docs", "awx-project")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The collections path holding the artifact's csis.infra (AWX: the project's requirements)."""
    return artifact_support.session_collection(tmp_path_factory)[1]


def _git(cwd, *args):
    proc = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "init.defaultBranch=main"]
                          + list(args), cwd=cwd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _project_repository(parent, key, endpoint_url):
    """The configuration tree's repository: the EBS tree at its root plus docs/awx-project/, its
    meta-state in the S3 store (docs/awx-setup.md: every AWX job template needs it)."""
    repo = e2e.make_ebs_tree(parent, key, name="tree-repo")
    shutil.copytree(PROJECT_TEMPLATE, repo, dirs_exist_ok=True)
    declare_s3_store(repo, endpoint_url, "awx/%s" % key)
    # the two-person rule: the apply job's launcher must not be the plan job's requester; and
    # a receipt older than 8 hours approves nothing
    with open(os.path.join(repo, "cfg", "_config.yml"), "a", encoding="utf-8") as fh:
        fh.write("approvals:\n  distinct_approver: true\n  receipt_max_age: 8h\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "the configuration tree")
    return repo


def _private_data_dir(parent, node, ep, repo, installed):
    """An execution node's private data directory for a job, with its own clone of the project."""
    pdd = os.path.join(parent, node, "pdd")
    os.makedirs(os.path.join(pdd, "inventory"))
    os.makedirs(os.path.join(pdd, "env"))
    _git(parent, "clone", "-q", repo, os.path.join(pdd, "project"))  # AWX: the project's SCM checkout
    with open(os.path.join(pdd, "inventory", "hosts"), "w", encoding="utf-8") as fh:
        fh.write("localhost ansible_connection=local ansible_python_interpreter=%s\n"
                 % os.path.join(e2e.VENV_BIN, "python"))
    # AWX: a credential type injecting the AWS credentials as environment variables
    envvars = dict(ep.env)
    envvars["PATH"] = e2e.VENV_BIN + os.pathsep + os.environ.get("PATH", "")
    envvars["ANSIBLE_COLLECTIONS_PATH"] = installed  # AWX: where the project sync installed collections/requirements.yml
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


def _storages(root):
    """The storage records of the tree's meta-state, read through the store (whatever its layout)."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState
    return MetaState(root).load("storage-state.yaml").get("storages") or {}


def _ran(out, task):
    """The statuses (ok, changed, skipping, fatal) the task printed, in order."""
    import re
    text = re.sub(r"\x1b\[[0-9;]*m", "", out)
    statuses = []
    for block in text.split("TASK [")[1:]:
        if block.split("]", 1)[0].endswith(task):
            statuses += re.findall(r"^(ok|changed|skipping|fatal): \[", block, re.M)
    return statuses


def test_plan_job_approval_apply_job(moto_endpoint, installed, tmp_path, monkeypatch):
    ep = moto_endpoint
    # the execution environment's ansible-playbook (AWX: the EE image; here: the project venv),
    # knowing nothing of this checkout (no ANSIBLE_CONFIG, no .venv/collections)
    monkeypatch.setenv("PATH", e2e.VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    for name in [n for n in os.environ if n.startswith("ANSIBLE_")]:
        monkeypatch.delenv(name)
    for name, value in ep.env.items():  # this process reads the S3 store too
        monkeypatch.setenv(name, value)
    key = "awx-%s" % uuid.uuid4().hex[:8]
    repo = _project_repository(str(tmp_path), key, ep.url)
    # the plan job on one execution node, the apply jobs on another: two clones, two paths
    pdd = _private_data_dir(str(tmp_path), "node-a", ep, repo, installed)
    pdd_b = _private_data_dir(str(tmp_path), "node-b", ep, repo, installed)
    root, root_b = os.path.join(pdd, "project"), os.path.join(pdd_b, "project")  # the tree is the project's root
    for checkout in (root, root_b):
        assert not os.path.islink(checkout) and not os.path.exists(os.path.join(checkout, "ansible.cfg"))
        assert os.path.isfile(os.path.join(checkout, "collections", "requirements.yml"))
    base = {"csis_config_root": ".", "csis_dry_run": False, "csis_overlays": [ep.overlay_path, e2e.APPLY_ALL]}

    # AWX's own extra vars: who launched the job, the job and its workflow
    alice = {"awx_user_name": "alice", "awx_job_id": 41, "awx_workflow_job_id": 40}
    bob = {"awx_user_name": "bob", "awx_job_id": 44, "awx_workflow_job_id": 40}

    # 1. the plan job: plans and gates, shows and publishes every change and the approved
    #    digests, receipts the plan in the meta-state store, applies nothing
    r, out, artifact = _job(pdd, "plan", dict(base, csis_phase="plan", **alice))
    assert r.status == "successful", out[-4000:]
    approved = artifact.get("csis_approved_plans")
    assert isinstance(approved, dict) and set(approved) == {ROOT_KEY}, artifact
    assert len(approved[ROOT_KEY]) == 64
    # the steps from the approval to the apply (tofu_root tasks/apply.yml) are skipped whole
    assert _ran(out, "Approve and apply the gated plan") == ["skipping"]
    assert _ran(out, "Apply exactly that plan file") == []
    assert not _storages(root)
    # what the approver reads: the address, its action, the values it sets
    changes = artifact["csis_plan_changes"][ROOT_KEY]
    volume = [c for c in changes if c["address"].endswith("aws_ebs_volume.this")]
    assert len(volume) == 1 and volume[0]["action"] == "create", changes
    assert {"name": "size", "before": "", "after": "100"} in volume[0]["attributes"]
    assert "+ %s: create" % volume[0]["address"] in out and "size = 100" in out, out[-4000:]
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply import approvals
    receipt = approvals.receipts_of(root, ROOT_KEY)[approved[ROOT_KEY]]
    assert (receipt["requested_by"], receipt["plan_job"], receipt["workflow"]) == ("alice", "41", "40")
    # ... in the S3 store, not on the plan job's node
    assert not os.path.exists(os.path.join(root, "meta-state", "plan-receipts"))
    # csis.infra ran from the installed artifact: its modules vendored into the tree, nothing of the checkout
    assert os.path.isdir(os.path.join(root, "generated", ".modules", artifact_support.version()))
    assert e2e.REPO not in out, out[-4000:]

    # (the approval node: a human approves the plan job's output in the AWX UI)

    # 2. the configuration moved between the approval and the apply job: the volume would
    #    be created with another size (same address, same action, other values): refused
    #    (every apply job below runs on node B, whose checkout no run has touched)
    assert not os.path.exists(os.path.join(root_b, "generated"))
    builders = os.path.join(root_b, "cfg", "storage-builders.yml")
    original = open(builders, "rb").read()
    e2e.set_storage_builder_size(root_b, "aws-ebs", 120)
    try:
        r, out, _pdd = _job(pdd_b, "apply-moved", dict(base, csis_phase="apply", csis_approved_plans=approved, **bob))
    finally:
        open(builders, "wb").write(original)
    assert r.status == "failed", out[-4000:]
    assert "the plan differs from the one approved in the plan job" in out, out[-4000:]
    assert "Apply exactly that plan file" not in out
    assert not _storages(root)
    assert not ep.client("ec2").describe_volumes(
        Filters=[{"Name": "tag:csis_config", "Values": [key]}, {"Name": "size", "Values": ["120"]}])["Volumes"]

    # 3. the digest alone approves nothing: the apply job reads the plan job's receipt from the store
    #    (a digest computed elsewhere, passed as an extra var, finds none: "no plan job receipted this
    #    plan", tests/unit/test_approvals.py; the age check below runs on the receipt the job read)
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState
    ms_b = MetaState(root_b)
    kept = ms_b.load_record(approvals.RECEIPTS, approvals.receipt_key(ROOT_KEY))
    assert kept, "the plan job's receipt is not in the S3 store"

    def apply_job_with_receipts(name, receipts):
        """An apply job by bob while the store holds ``receipts`` (None: none) for the root; the
        plan job's receipts are put back after it."""
        with ms_b.transaction("test: the receipts as %s" % name) as tx:
            tx.save_record(approvals.RECEIPTS, approvals.receipt_key(ROOT_KEY), receipts)
        try:
            return _job(pdd_b, name, dict(base, csis_phase="apply", csis_approved_plans=approved, **bob))
        finally:
            with ms_b.transaction("test: the receipts back") as tx:
                tx.save_record(approvals.RECEIPTS, approvals.receipt_key(ROOT_KEY), kept)

    # 3b. approvals.receipt_max_age (8h): a receipt from two days ago (an approval node denied
    #     then, the digest applied by hand now) approves nothing
    aged = copy.deepcopy(kept)
    aged["plans"][approved[ROOT_KEY]]["requested_at"] = "2000-01-01T00:00:00Z"
    r, out, _pdd = apply_job_with_receipts("apply-aged", aged)
    assert r.status == "failed", out[-4000:]
    flat = " ".join(out.split())
    assert "at 2000-01-01T00:00:00Z," in flat and "and approvals.receipt_max_age is 8h (cfg/_config.yml)" in flat, out[-4000:]
    assert "Apply exactly that plan file" not in out
    assert not _storages(root)

    # 4. approvals.distinct_approver: the requester cannot apply her own plan
    r, out, _pdd = _job(pdd_b, "apply-self", dict(base, csis_phase="apply", csis_approved_plans=approved, **alice))
    assert r.status == "failed", out[-4000:]
    assert "the apply job's launcher (alice) must differ from the plan job's requester (alice)" in out, out[-4000:]
    assert not _storages(root)

    # 5. the apply job with the approved digests, on the approved configuration, launched by
    #    someone else: applies, and the receipt records who approved it in which workflow
    r, out, _pdd = _job(pdd_b, "apply", dict(base, csis_phase="apply", csis_approved_plans=approved, **bob))
    assert r.status == "successful", out[-4000:]
    assert _ran(out, "Apply exactly that plan file") == ["changed"]
    receipt = approvals.receipts_of(root, ROOT_KEY)[approved[ROOT_KEY]]
    assert [(a["approved_by"], a["method"], a["apply_job"], a["workflow"]) for a in receipt["approvals"]] == [
        ("bob", "awx", "44", "40")]
    recs = _storages(root)
    vid = recs["mnt_data"]["facts"]["volume_id"]
    assert recs["mnt_data"]["state"] == "active"
    vol = ep.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"][0]
    assert vol["Size"] == 100
    # the audit trail names the AWX job that recorded the apply, and the plan it applied (the
    # approved digest): the lifecycle playbooks export AWX's extra vars to every module
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import store
    recorded = [d for d in store.audit_trail(store.MetaState(root), storage="mnt_data")
                if str(d.get("what", "")).startswith("csis_record")]
    assert recorded, store.history_report(root)["lines"]
    who, context = recorded[-1]["who"], recorded[-1]["context"]
    assert (who.get("awx_user_name"), who.get("awx_job_id"), who.get("awx_workflow_job_id")) == ("bob", "44", "40"), who
    assert (context["root"], context["plan_digest"]) == (ROOT_KEY, approved[ROOT_KEY]), context
    # the plan job's artifact is where AWX keeps it: in the job's events
    assert os.path.isdir(os.path.join(pdd, "artifacts", "plan"))
