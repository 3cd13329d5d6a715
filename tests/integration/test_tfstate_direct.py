# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The record reads a root's state from its backend without terraform
(plugins/module_utils/csis/tfstate.py): what it reads must be what ``terraform state pull``
prints, for the S3 backend on the session's moto server and for the local backend, in the
default workspace and in another one; a root whose backend settings need terraform is read by
terraform. Real terraform; the roots hold ``terraform_data`` resources (no provider to start)."""
from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis import terraform, tfstate

import e2e

pytestmark = pytest.mark.integration

DATA = """
resource "terraform_data" "volume" {
  input = { name = %s, size = 110 }
}

output "volume" {
  value = terraform_data.volume.output
}
"""


def held(state):
    """What a state holds: its resources and outputs (an empty state's other keys vary)."""
    return {"resources": state.get("resources") or [], "outputs": state.get("outputs") or {}}


def tf(root, env, *args):
    proc = subprocess.run(["terraform", *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, "terraform %s -> %d\n%s\n%s" % (
        " ".join(args), proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:])
    return proc


def make_root(path, terraform_block: str, name: str) -> str:
    """A root (``main.tf`` written again when it exists) holding one ``terraform_data`` named ``name``."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "main.tf"), "w", encoding="utf-8") as fh:
        fh.write(terraform_block + DATA % json.dumps(name))
    return str(path)


@pytest.fixture()
def env(tf_env, moto_endpoint, monkeypatch):
    """The moto credentials in this process too: boto3 reads them as terraform does."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SSE_CUSTOMER_KEY", "TF_WORKSPACE", "TF_DATA_DIR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in tf_env.items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    return tf_env


def test_s3_backend_read_directly_equals_state_pull(tmp_path, env, moto_endpoint):
    key = "tfstate-direct/%s/aws_ebs.tfstate" % uuid.uuid4().hex[:8]
    backend = e2e.s3_backend_block(moto_endpoint.url, moto_endpoint.state_bucket, key)
    root = make_root(tmp_path / "s3", backend, "mnt_data")
    tf(root, env, "init", "-input=false", "-no-color")
    # before the first apply: no state object yet; state pull prints an empty state
    assert tfstate.read_direct(root) == {"resources": [], "outputs": {}} == held(terraform.state_pull(root))
    tf(root, env, "apply", "-auto-approve", "-input=false", "-no-color")
    direct = tfstate.read_direct(root)
    assert direct is not None and direct["outputs"]["volume"]["value"] == {"name": "mnt_data", "size": 110}
    assert direct == terraform.state_pull(root)
    assert tfstate.read(root) == direct
    # read without terraform: a binary that does not exist is never started
    assert tfstate.read(root, binary=str(tmp_path / "no-such-terraform")) == direct

    # another workspace: <workspace_key_prefix>/<workspace>/<key>, and the default one untouched
    tf(root, env, "workspace", "new", "-no-color", "blue")
    make_root(root, backend, "blue_data")
    tf(root, env, "apply", "-auto-approve", "-input=false", "-no-color")
    blue = tfstate.read_direct(root)
    assert blue["outputs"]["volume"]["value"]["name"] == "blue_data"
    assert blue == terraform.state_pull(root)
    s3 = moto_endpoint.client("s3")
    assert json.loads(s3.get_object(Bucket=moto_endpoint.state_bucket, Key="env:/blue/" + key)["Body"].read()) == blue
    tf(root, env, "workspace", "select", "-no-color", "default")
    assert tfstate.read_direct(root) == direct


def test_local_backend_read_directly_equals_state_pull(tmp_path, env):
    root = make_root(tmp_path / "local", 'terraform {\n  backend "local" {\n    path = "../state/ebs.tfstate"\n  }\n}\n',
                     "scratch")
    tf(root, env, "init", "-input=false", "-no-color")
    assert tfstate.read_direct(root) == {"resources": [], "outputs": {}}
    tf(root, env, "apply", "-auto-approve", "-input=false", "-no-color")
    direct = tfstate.read_direct(root)
    assert os.path.isfile(tmp_path / "state" / "ebs.tfstate")
    assert direct["outputs"]["volume"]["value"]["name"] == "scratch"
    assert direct == terraform.state_pull(root)


def test_settings_only_terraform_honours_are_read_by_terraform(tmp_path, env, moto_endpoint, monkeypatch):
    key = "tfstate-direct/%s/aws_ebs.tfstate" % uuid.uuid4().hex[:8]
    # a DynamoDB lock table (its digest check) and a customer-provided encryption key: terraform reads
    root = make_root(tmp_path / "ssec", e2e.s3_backend_block(moto_endpoint.url, moto_endpoint.state_bucket, key,
                                                             extra='dynamodb_table = "locks"'), "mnt_data")
    tf(root, env, "init", "-input=false", "-no-color")
    assert tfstate.backend_of(root)["config"]["dynamodb_table"] == "locks"
    assert tfstate.read_direct(root) is None
    plain = make_root(tmp_path / "plain", e2e.s3_backend_block(moto_endpoint.url, moto_endpoint.state_bucket, key),
                      "mnt_data")
    tf(plain, env, "init", "-input=false", "-no-color")
    assert tfstate.read_direct(plain) == {"resources": [], "outputs": {}}
    monkeypatch.setenv("AWS_SSE_CUSTOMER_KEY", "c2VjcmV0")
    assert tfstate.read_direct(plain) is None
    monkeypatch.delenv("AWS_SSE_CUSTOMER_KEY")
    # an OpenTofu-encrypted or pre-v4 document in the object: terraform reads it
    s3 = moto_endpoint.client("s3")
    s3.put_object(Bucket=moto_endpoint.state_bucket, Key=key,
                  Body=json.dumps({"serial": 1, "lineage": "x", "meta": {}, "encrypted_data": "AAAA",
                                   "encryption_version": "v0"}).encode())
    assert tfstate.read_direct(plain) is None
    # a root never initialised has no backend to read
    assert tfstate.read_direct(make_root(tmp_path / "bare", "", "x")) is None
