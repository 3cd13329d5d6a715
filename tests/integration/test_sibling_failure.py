# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""One root's apply fails while another root of the same lifecycle applies (real terraform, the
session's moto server, real ansible-playbook).

The roots apply in parallel, one task for all of them; ``any_errors_fatal`` then stops every
root at that task, including the one whose apply succeeded, before its record. Its apply
happened, so it is recorded anyway (tofu_root's rescue), and meta-state holds what exists; the
root whose apply failed is not recorded, and the run fails. Before the fix the succeeded root
was left unrecorded until the next run.

The S3 root fails because its bucket already exists (made here, outside the tree); the EBS
root creates its volume.
"""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.state import store
from day2_trees import Runner, make_tree, meta, tail, text

pytestmark = pytest.mark.integration

TAG = "csis-sibling"
BUCKET = "%s-taken" % TAG
STORAGES = [
    {"name": "mnt_data", "mount_point": "/mnt/data", "groups": ["coops"], "state": "active"},
    {"name": "takenb", "type": "aws-s3", "bucket_name": BUCKET, "state": "active"},
]


def test_a_root_that_applied_is_recorded_when_another_roots_apply_fails(tmp_path, moto_endpoint):
    t = Runner(make_tree(str(tmp_path), TAG, STORAGES, []), moto_endpoint)
    moto_endpoint.client("s3").create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-east-2"})

    # First without an answer (stdin is no terminal): each root that waited for it is refused
    # itself, in the summary and the audit trail, not one refused and the other "stopped"
    refused = t.play("storage.yml", csis_auto_approve=False)
    assert refused.returncode != 0, tail(refused)
    assert text(refused).count("Not approved (no answer: stdin is not interactive, or an empty line): nothing applied.") >= 2, tail(refused)
    assert "Apply exactly that plan file" not in text(refused), tail(refused)
    with open(os.path.join(t.root, "generated", "run-summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)["roots"]
    assert {k: (r["status"], r["failed_step"]) for k, r in summary.items()} == dict.fromkeys(
        ("storage-aws-ebs", "storage-aws-s3"), ("failed", "Refuse without approval")), summary
    kinds = {(e["root"], e["kind"]) for doc in store.audit_trail(store.MetaState(t.root)) for e in doc["events"]}
    assert kinds == {("storage-aws-ebs", "not approved"), ("storage-aws-s3", "not approved")}, kinds
    assert "storage-state.yaml" not in os.listdir(os.path.join(t.root, "meta-state"))

    res = t.play("storage.yml")
    out = text(res)
    assert res.returncode != 0, tail(res)
    assert "storage-aws-s3: Apply exactly that plan file failed" in out, tail(res)

    records = meta(t.root, "storage-state.yaml")["storages"]
    assert set(records) == {"mnt_data"}, records  # the bucket's root failed: nothing of it recorded
    assert records["mnt_data"]["state"] == "active"
    vid = records["mnt_data"]["facts"]["volume_id"]
    vols = moto_endpoint.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"]
    assert len(vols) == 1 and vols[0]["Size"] == 100
    with open(os.path.join(t.root, "generated", "run-summary.json"), encoding="utf-8") as fh:
        roots = json.load(fh)["roots"]
    ebs, s3 = roots["storage-aws-ebs"], roots["storage-aws-s3"]
    # stopped with the failed root, not failed itself: the summary, the audit and the message say so
    assert (ebs["status"], ebs["applied"]) == ("stopped", True) and "storage-state.yaml" in ebs["recorded"], ebs
    assert "storage-aws-ebs: stopped: another root of the lifecycle failed (see its failure above)" in out, tail(res)
    assert (s3["status"], s3["applied"], s3["recorded"]) == ("failed", False, []), s3
    # the bucket's apply began and failed: the summary does not call that "nothing applied"
    assert s3["apply_failed"] is True and ebs["apply_failed"] is False, (s3, ebs)
    assert s3["gate"]["verdict"] == "passed" and s3["failed_step"].startswith("Apply exactly that plan file"), s3
    # the failure is in the history of the storage its root declares (the role's csis_audit names it)
    lines = store.history_report(t.root, storage="takenb")["lines"]
    assert any("failed storage-aws-s3" in line and "Apply exactly that plan file" in line for line in lines), lines
    shown = t.play("summary.yml")
    assert shown.returncode == 0, tail(shown)
    line = text(shown).split("storage-aws-s3: failed; at ", 1)[-1].split("storage-aws-", 1)[0]
    assert "Apply exactly that plan file" in line and "nothing applied" not in line, tail(shown)
    assert "the apply failed partway: resources may have been created, changed or destroyed" in line, tail(shown)
