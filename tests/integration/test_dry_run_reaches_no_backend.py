# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A dry run reaches no state backend, also in a root that a real run initialised (real
terraform; the S3 backend on the session's moto server).

A dry run validates a root alone (one root of its binary, or when the roots' joint validate
failed) with ``init -backend=false``. In a root whose ``.terraform/`` records the S3 backend of
a real run's init, terraform then uses that backend ("what was previously initialized"): the dry
run listed and read the state bucket, and without credentials it failed with the backend's
"No valid credential sources found" instead of the configuration's own error. The dry run now
inits and validates such a root in a data directory of its own and leaves the real run's
initialisation as it was."""
from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.render import writer

import e2e

pytestmark = pytest.mark.integration

MAIN = """
resource "terraform_data" "volume" {
  input = "mnt_data"
}
"""
NO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
                  "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials", "AWS_CONFIG_FILE": "/nonexistent/config",
                  "AWS_EC2_METADATA_DISABLED": "true"}


def test_a_dry_run_validates_a_really_initialised_root_without_its_backend(tmp_path, tf_env, moto_endpoint):
    root = tmp_path / "root"
    root.mkdir()
    key = "dry-run/%s/aws_ebs.tfstate" % uuid.uuid4().hex[:8]
    (root / "main.tf").write_text(e2e.s3_backend_block(moto_endpoint.url, moto_endpoint.state_bucket, key) + MAIN)
    proc = subprocess.run(["terraform", "init", "-input=false", "-no-color"], cwd=str(root), env=tf_env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recorded = (root / ".terraform" / "terraform.tfstate").read_text()
    assert json.loads(recorded)["backend"]["type"] == "s3"

    out = writer.prepare_roots([(str(root), "terraform", None)], dry_run=True, extra_env=NO_CREDENTIALS)
    cmds = [c["cmd"] for c in out[str(root)]]
    assert cmds[-2:] == ["terraform init -input=false -no-color -backend=false", "terraform validate -no-color"], cmds
    # the real run's initialisation is as it was; the dry run's data directory is gone
    assert (root / ".terraform" / "terraform.tfstate").read_text() == recorded
    assert not [p for p in os.listdir(str(tmp_path)) if p != "root"]
    # validated: the same inputs are not validated again
    again = writer.prepare_roots([(str(root), "terraform", None)], dry_run=True, extra_env=NO_CREDENTIALS)
    assert [c["cmd"] for c in again[str(root)]] == [writer.UNCHANGED]
