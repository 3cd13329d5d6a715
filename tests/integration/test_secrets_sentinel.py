# -*- coding: utf-8 -*-
"""Secrets never reach logs, generated files or meta-state (issue 14, item 5).

Sentinel values are injected as the AWS credentials (the secret access key and the session
token), as a ``TF_VAR_`` and as a tag value of the storage. The playbooks of a storage
lifecycle then run for real at ``-vvv``: validate, the AWX plan job (its ``set_stats``
artifacts printed as custom stats: the approver's ``csis_plan_changes`` and the digests),
the apply, the drift report and the audit trail. The whole output, ``generated/`` and
meta-state are searched: the credentials and the TF_VAR appear nowhere; the tag value where
it belongs (the rendered root, the approver's listing, the volume at the endpoint).
"""
from __future__ import annotations

import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

pytestmark = [pytest.mark.integration]

# shaped like the real things (the store's secret scan would refuse them in meta-state anyway)
SECRET_KEY = "csisSentinel0SecretKey1Do2Not3Leak4AbCdE"
SESSION_TOKEN = "IQoJb3JpZ2luX2VjCSISSENTINEL0SESSION0TOKEN0DoNotLeak0123456789"
TF_VAR_VALUE = "csis-sentinel-tfvar-4c8e1d"
TAG_VALUE = "csis-sentinel-tag-9b27aa"


def _files(root, top):
    for dirpath, _dirs, files in os.walk(os.path.join(root, top)):
        if os.sep + ".terraform" in dirpath or os.sep + ".modules" in dirpath:
            continue  # providers and the collection's own modules: no run output
        for name in files:
            yield os.path.join(dirpath, name)


def _holding(paths, needle):
    found = []
    for path in paths:
        with open(path, "rb") as fh:
            if needle.encode() in fh.read():
                found.append(path)
    return found


def test_sentinel_secrets_appear_nowhere_at_vvv(moto_endpoint, tmp_path):
    ep = moto_endpoint
    root = e2e.make_ebs_tree(str(tmp_path), "sentinel-%s" % uuid.uuid4().hex[:8])
    storages = os.path.join(root, "storages", "storage0.yaml")
    doc = e2e.read_yaml(storages)
    doc["storages"][0]["tags"] = {"Note": TAG_VALUE}
    e2e.write_yaml(storages, doc)
    env = dict(ep.env, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_SESSION_TOKEN=SESSION_TOKEN,
               TF_VAR_csis_sentinel=TF_VAR_VALUE, ANSIBLE_SHOW_CUSTOM_STATS="1")
    overlays = [ep.overlay_path, e2e.APPLY_ALL]
    outputs = []

    def play(playbook, **extra):
        run = e2e.run_playbook(playbook, root, env, overlays=overlays, extra_vars=extra, args=["-vvv"],
                               log=str(tmp_path / ("%s-%d.log" % (playbook, len(outputs)))))
        assert run.rc == 0, run.tail()
        outputs.append(run.out)
        return run

    play("validate.yml")
    planned = play("storage.yml", csis_phase="plan", awx_user_name="alice")
    # the AWX artifacts, as the plan job publishes them: the tag value is part of the change
    assert "csis_plan_changes" in planned.out and "csis_approved_plans" in planned.out, planned.tail()
    assert TAG_VALUE in planned.out
    play("storage.yml")
    play("state_query.yml")
    play("history.yml")

    output = "\n".join(outputs)
    assert "<127.0.0.1>" in output or "ESTABLISH LOCAL CONNECTION" in output  # really -vvv
    run_files = list(_files(root, "generated")) + list(_files(root, "meta-state"))
    assert any(p.endswith(".apply.log") for p in run_files) and any("plan-receipts" in p for p in run_files)
    for what, needle in (("the secret access key", SECRET_KEY), ("the session token", SESSION_TOKEN),
                         ("the TF_VAR", TF_VAR_VALUE)):
        assert needle not in output, "%s is in the -vvv output" % what
        assert not _holding(run_files, needle), "%s is in %s" % (what, _holding(run_files, needle))
    # the tag value is where it belongs: the rendered root and the volume it tags
    assert any(p.endswith(".tf") for p in _holding(run_files, TAG_VALUE))
    vid = e2e.meta(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    tags = {t["Key"]: t["Value"] for t in ep.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"][0]["Tags"]}
    assert tags["Note"] == TAG_VALUE
