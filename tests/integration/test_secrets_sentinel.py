# -*- coding: utf-8 -*-
"""Secrets never reach logs, generated files or meta-state (issue 14, item 5).

Sentinel values are injected as the AWS credentials (the secret access key and the session
token), as a ``TF_VAR_`` and as a tag value of the storage; and (issue 15, item 5) as the
runtime's static credentials in the tree, ``!vault`` values encrypted with a test vault
password (``ansible-vault encrypt_string``) that every run is given by
``--vault-password-file``. The playbooks of a storage lifecycle then run for real at
``-vvv``: validate, the AWX plan job (its ``set_stats`` artifacts printed as custom stats:
the approver's ``csis_plan_changes`` and the digests), the apply, the drift report and the
audit trail. The whole output, ``generated/`` (the plan file included) and meta-state are
searched: the credentials, the vault values and the TF_VAR appear nowhere; the tag value
where it belongs (the rendered root, the approver's listing, the volume at the endpoint).
The rendered root's provider takes the vault values as required ``ephemeral`` variables, so
the plan and the apply of exactly that plan file succeed only when both got them.

A tree whose ``!vault`` value the run cannot decrypt (a wrong password) fails validate and the
lifecycle's render with one line naming file and key, and nothing is written.
"""
from __future__ import annotations

import os
import re
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
# the runtime's static credentials, as !vault values of cfg/runtime-builders.yml
VAULT_KEY_ID = "AKIACSISSENTINEL0VLT"
VAULT_SECRET_KEY = "csisSentinel0VaultKey1Do2Not3Leak4XyZw"
VAULT_PASSWORD = "csis-test-vault-password"


def _password_file(tmp_path, name, password):
    path = tmp_path / name
    path.write_text(password + "\n")
    return str(path)


def _files(root, top):
    for dirpath, _dirs, files in os.walk(os.path.join(root, top)):
        if os.sep + ".terraform" in dirpath or os.sep + ".modules" in dirpath:
            continue  # providers and the collection's own modules: no run output
        for name in files:
            yield os.path.join(dirpath, name)


def _zip_holds(path, needle):
    import zipfile
    with zipfile.ZipFile(path) as zf:
        return any(needle.encode() in zf.read(name) for name in zf.namelist())


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
    vault_file = _password_file(tmp_path, "vault-pass", VAULT_PASSWORD)
    e2e.vault_runtime_keys(root, vault_file, VAULT_KEY_ID, VAULT_SECRET_KEY)
    storages = os.path.join(root, "storages", "storage0.yaml")
    doc = e2e.read_yaml(storages)
    doc["storages"][0]["tags"] = {"Note": TAG_VALUE}
    e2e.write_yaml(storages, doc)
    # Ansible's async directory as a user's usually is: made under a 022 umask
    async_dir = str(tmp_path / "async")
    os.makedirs(async_dir, mode=0o755)
    os.chmod(async_dir, 0o755)
    env = dict(ep.env, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_SESSION_TOKEN=SESSION_TOKEN,
               TF_VAR_csis_sentinel=TF_VAR_VALUE, ANSIBLE_SHOW_CUSTOM_STATS="1", ANSIBLE_ASYNC_DIR=async_dir)
    overlays = [ep.overlay_path, e2e.APPLY_ALL]
    outputs = []

    def play(playbook, diff=False, **extra):
        run = e2e.run_playbook(playbook, root, env, overlays=overlays, extra_vars=extra,
                               args=["-vvv", "--vault-password-file", vault_file] + (["--diff"] if diff else []),
                               log=str(tmp_path / ("%s-%d.log" % (playbook, len(outputs)))))
        assert run.rc == 0, run.tail()
        outputs.append(run.out)
        return run

    play("validate.yml")
    planned = play("storage.yml", csis_phase="plan", awx_user_name="alice")
    # the AWX artifacts, as the plan job publishes them: the tag value is part of the change
    assert "csis_plan_changes" in planned.out and "csis_approved_plans" in planned.out, planned.tail()
    assert TAG_VALUE in planned.out
    # with --diff (AWX's "Show Changes"): community.general.terraform's diff would be the plan's
    # every before and after value, sensitive ones in clear; the apply runs without it
    applied = play("storage.yml", diff=True)
    apply_tasks = re.findall(r"^TASK \[csis\.infra\.tofu_root : Apply exactly that plan file\].*?(?=^TASK \[)", applied.out,
                             re.M | re.S)
    assert apply_tasks and "changed: [csis-storage-aws-ebs]" in apply_tasks[0], applied.tail()
    assert not [t for t in apply_tasks if "+++ after" in t or '"diff":' in t], apply_tasks
    # what the apply wrote, and the async directory its result (sensitive outputs in clear) passed
    # through, are the owner's only, though async_wrapper runs the job under a 022 umask
    logs = [p for p in _files(root, "generated") if p.endswith(".apply.log")]
    assert logs and all(os.stat(p).st_mode & 0o077 == 0 for p in logs), [oct(os.stat(p).st_mode) for p in logs]
    assert os.stat(async_dir).st_mode & 0o077 == 0, oct(os.stat(async_dir).st_mode)
    # csis_plan got the decrypted values in the controller's worker: no module process, so no
    # module file or argument file held them; the one module Ansible started is the apply's
    used = sorted(set(re.findall(r"Using module file (\S+)", applied.out)))
    assert used and all(u.endswith("/community/general/plugins/modules/terraform.py") for u in used), used
    play("state_query.yml")
    play("history.yml")

    output = "\n".join(outputs)
    assert "<127.0.0.1>" in output or "ESTABLISH LOCAL CONNECTION" in output  # really -vvv
    run_files = list(_files(root, "generated")) + list(_files(root, "meta-state"))
    assert any(p.endswith(".apply.log") for p in run_files) and any("plan-receipts" in p for p in run_files)
    # the plan file is there to be searched (a zip: its members are searched uncompressed too)
    plans = [p for p in run_files if os.path.basename(p) == "tfplan"]
    assert plans
    for what, needle in (("the secret access key", SECRET_KEY), ("the session token", SESSION_TOKEN),
                         ("the TF_VAR", TF_VAR_VALUE), ("the vaulted access key id", VAULT_KEY_ID),
                         ("the vaulted secret access key", VAULT_SECRET_KEY)):
        assert needle not in output, "%s is in the -vvv output" % what
        assert not _holding(run_files, needle), "%s is in %s" % (what, _holding(run_files, needle))
        assert not [p for p in plans if _zip_holds(p, needle)], "%s is in the plan file" % what
    # the root's provider takes them as sensitive, ephemeral variables (set as TF_VAR_ by csis_plan
    # and csis_apply_start: the apply of the saved plan fails without them)
    main = [p for p in run_files if p.endswith("-storage-generation.tf")]
    text = open(main[0], encoding="utf-8").read()
    assert "secret_key                  = var.csis_aws_secret_key" in text, text
    assert 'variable "csis_aws_secret_key" {' in text and "ephemeral   = true" in text and "sensitive   = true" in text
    # the tag value is where it belongs: the rendered root and the volume it tags
    assert any(p.endswith(".tf") for p in _holding(run_files, TAG_VALUE))
    vid = e2e.meta(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    tags = {t["Key"]: t["Value"] for t in ep.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"][0]["Tags"]}
    assert tags["Note"] == TAG_VALUE


def test_a_vault_value_that_does_not_decrypt_names_file_and_key_and_writes_nothing(moto_endpoint, tmp_path):
    """Validate and the lifecycle's render with a wrong vault password: one line naming the file
    and the key, rc != 0, and the tree byte-identical (nothing rendered, no meta-state)."""
    ep = moto_endpoint
    root = e2e.make_ebs_tree(str(tmp_path), "sentinel-bad-%s" % uuid.uuid4().hex[:8])
    e2e.vault_runtime_keys(root, _password_file(tmp_path, "vault-pass", VAULT_PASSWORD), VAULT_KEY_ID, VAULT_SECRET_KEY)
    wrong = _password_file(tmp_path, "wrong-pass", "not-the-password")
    before = e2e.meta_state_digest(root, with_state_dir=True)
    where = ("cfg/runtime-builders.yml: runtime_builders[0] (aws-east2-runtime).credentials.secret_access_key: "
             "cannot decrypt this !vault value: the vault secret(s) given do not decrypt it")
    for playbook in ("validate.yml", "storage.yml"):
        run = e2e.run_playbook(playbook, root, ep.env, overlays=[ep.overlay_path],
                               args=["--vault-password-file", wrong])
        assert run.rc != 0, run.tail()
        assert where in run.out, run.tail()
        assert VAULT_SECRET_KEY not in run.out
    assert not os.path.exists(os.path.join(root, "generated"))
    assert e2e.meta_state_digest(root, with_state_dir=True) == before
