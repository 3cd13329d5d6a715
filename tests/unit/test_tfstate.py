# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Where tfstate.read_direct looks for a root's state, and when it leaves the read to
terraform (tests/integration/test_tfstate_direct.py reads real states)."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis import tfstate


def initialised(tmp_path, btype, config, workspace=None):
    data = tmp_path / ".terraform"
    data.mkdir(parents=True, exist_ok=True)
    (data / "terraform.tfstate").write_text(json.dumps({"version": 3, "backend": {"type": btype, "config": config}}))
    if workspace:
        (data / "environment").write_text(workspace)
    return str(tmp_path)


S3 = {"bucket": "b", "key": "statefiles/x/aws_ebs.tfstate", "region": "us-east-2", "encrypt": True,
      "use_lockfile": True, "endpoints": {"s3": "http://127.0.0.1:1"}, "access_key": None, "dynamodb_table": None}


def test_s3_object_in_the_default_and_another_workspace(tmp_path):
    root = initialised(tmp_path, "s3", S3)
    assert tfstate.state_object(tfstate.backend_of(root), root) == {"s3": "b", "key": "statefiles/x/aws_ebs.tfstate"}
    root = initialised(tmp_path, "s3", dict(S3, workspace_key_prefix="ws"), workspace="blue")
    assert tfstate.state_object(tfstate.backend_of(root), root)["key"] == "ws/blue/statefiles/x/aws_ebs.tfstate"
    # TF_WORKSPACE wins over the selected workspace, as in terraform
    assert tfstate.backend_of(root, workspace="green")["workspace"] == "green"
    assert tfstate.state_object(tfstate.backend_of(root, workspace="default"), root)["key"] == S3["key"]


@pytest.mark.parametrize("setting", ["access_key", "assume_role", "sse_customer_key", "dynamodb_table", "https_proxy",
                                     "custom_ca_bundle", "use_fips_endpoint", "allowed_account_ids"])
def test_s3_settings_only_terraform_honours(tmp_path, setting):
    root = initialised(tmp_path, "s3", dict(S3, **{setting: "x"}))
    assert tfstate.state_object(tfstate.backend_of(root), root) is None
    assert tfstate.read_direct(root) is None


def test_customer_key_from_the_environment(tmp_path, monkeypatch):
    root = initialised(tmp_path, "s3", S3)
    monkeypatch.setenv("AWS_SSE_CUSTOMER_KEY", "c2VjcmV0")
    assert tfstate.state_object(tfstate.backend_of(root), root) is None


def test_local_backend_paths(tmp_path):
    root = initialised(tmp_path / "r", "local", {"path": "../state/a.tfstate", "workspace_dir": None})
    assert tfstate.state_object(tfstate.backend_of(root), root) == {"path": os.path.join(root, "../state/a.tfstate")}
    root = initialised(tmp_path / "w", "local", {"path": None, "workspace_dir": "wsd"}, workspace="blue")
    assert tfstate.state_object(tfstate.backend_of(root), root)["path"] == os.path.join(root, "wsd", "blue", "terraform.tfstate")


def test_local_reads(tmp_path):
    root = initialised(tmp_path / "r", "local", {"path": "s.tfstate"})
    assert tfstate.read_direct(root) == {"resources": [], "outputs": {}}          # no state yet
    doc = {"version": 4, "serial": 3, "lineage": "l", "outputs": {"a": {"value": 1, "type": "number"}}, "resources": []}
    (tmp_path / "r" / "s.tfstate").write_text(json.dumps(doc))
    assert tfstate.read_direct(root) == doc
    (tmp_path / "r" / "s.tfstate").write_text("")
    assert tfstate.read_direct(root) == {"resources": [], "outputs": {}}


@pytest.mark.parametrize("body", [
    b"not json", b"[1, 2]", json.dumps({"version": 3, "modules": []}).encode(),
    json.dumps({"version": 4, "encrypted_data": "AAAA", "meta": {}}).encode(),
    json.dumps({"version": 4, "resources": {}}).encode(), b"\xff\xfe",
])
def test_documents_left_to_terraform(tmp_path, body):
    root = initialised(tmp_path, "local", {"path": "s.tfstate"})
    (tmp_path / "s.tfstate").write_bytes(body)
    assert tfstate.read_direct(root) is None


def test_not_initialised_or_other_backends(tmp_path):
    assert tfstate.read_direct(str(tmp_path)) is None
    assert tfstate.read_direct(initialised(tmp_path / "g", "gcs", {"bucket": "b"})) is None
    (tmp_path / "bad" / ".terraform").mkdir(parents=True)
    (tmp_path / "bad" / ".terraform" / "terraform.tfstate").write_text("{")
    assert tfstate.backend_of(str(tmp_path / "bad")) is None


def test_the_backend_is_reached_with_its_own_region_profile_and_endpoint(monkeypatch):
    from ansible_collections.csis.infra.plugins.module_utils.csis import aws

    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    access = aws.backend_access(dict(S3, profile="state-reader", use_path_style=True))
    assert access == {"region": "us-east-2", "profile": "state-reader", "endpoints": {"s3": "http://127.0.0.1:1"},
                      "s3_use_path_style": True}
    assert aws.backend_access({"region": "eu-west-1"})["profile"] is None
