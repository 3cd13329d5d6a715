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


def test_dry_and_real_runs_in_turn_neither_init_nor_validate_again(tmp_path, tf_env, moto_endpoint):
    """Each kind of run keeps its own stamp: a dry run between two real runs (validated in a data
    directory of its own) leaves the real run's init standing, and a real run between two dry
    runs leaves the dry run's validation standing, while the root's files are the same."""
    root = tmp_path / "root"
    key = "dry-run/%s/turns.tfstate" % uuid.uuid4().hex[:8]
    text = e2e.s3_backend_block(moto_endpoint.url, moto_endpoint.state_bucket, key) + MAIN
    d = str(root)
    writer.write_root(d, {"main.tf": text})  # as csis_render writes a root (its manifest: what the stamp keys)

    def cmds(dry_run, env):
        return [c["cmd"] for c in writer.prepare_roots([(d, "terraform", None)], dry_run=dry_run, extra_env=env)[d]]

    first = cmds(False, tf_env)
    assert [c.split()[1] for c in first] == ["fmt", "init"], first
    dry = cmds(True, NO_CREDENTIALS)
    assert dry[-2:] == ["terraform init -input=false -no-color -backend=false", "terraform validate -no-color"], dry
    assert cmds(False, tf_env) == [writer.UNCHANGED]
    assert cmds(True, NO_CREDENTIALS) == [writer.UNCHANGED]
    # a changed argument: the real run checks the format and inits nothing; the dry run validates
    writer.write_root(d, {"main.tf": text.replace('"mnt_data"', '"mnt_data2"')})
    real = cmds(False, tf_env)
    assert real[1:] == [writer.INIT_UNCHANGED] and real[0].startswith("terraform fmt"), real
    assert cmds(True, NO_CREDENTIALS)[-1] == "terraform validate -no-color"
    assert cmds(False, tf_env) == [writer.UNCHANGED]
    # and terraform still finds the real run's backend there
    plan = subprocess.run(["terraform", "plan", "-input=false", "-no-color", "-lock=false"], cwd=d, env=tf_env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert plan.returncode == 0, plan.stdout + plan.stderr
