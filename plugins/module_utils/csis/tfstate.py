# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A root's terraform state, read where its backend keeps it.

``terraform state pull`` costs about half a second of CPU before it reads a byte: like every
terraform command but ``version``, it first checks the provider packages against the root's
lock file, which means a SHA-256 of the 700 MB AWS provider binary (benchmarks/README.md, "The
state without terraform"). The record runs after every plan of every root, so :func:`read`
reads the state object itself when the root's backend is one csis.infra renders and nothing in
its settings asks for what only terraform does:

* ``s3``: ``GetObject`` of ``<key>`` (``<workspace_key_prefix>/<workspace>/<key>`` in another
  workspace) with boto3, reached as the state-lock check reaches the bucket
  (:func:`.aws.backend_access`: the backend's region, profile and S3 endpoint; credentials from
  the environment, as terraform's). Static keys, assumed roles, customer-provided encryption
  keys (``sse_customer_key``, ``AWS_SSE_CUSTOMER_KEY``), a DynamoDB lock table, proxies, custom
  CA bundles, FIPS or dual-stack endpoints, account allow/deny lists: terraform reads it.
* ``local``: the state file (``path``, or ``<workspace_dir>/<workspace>/terraform.tfstate``).

Anything else, a root not initialised, a read that fails for any reason but "no state yet",
and a state document that is not plain version-4 JSON (an OpenTofu-encrypted state, say) is
read with ``state pull``, which stays the authority: the direct read only ever returns what
``state pull`` would print.

Plain Python: importable without Ansible (boto3 only for an S3 read).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, Optional

from . import aws, terraform

__all__ = ["backend_of", "read", "read_direct", "s3_state_key", "state_object"]

#: what ``state pull`` gives for a root with no state yet
EMPTY: Dict[str, Any] = {"resources": [], "outputs": {}}

#: S3 backend settings whose effect boto3 here does not reproduce: such a root is read by terraform
S3_NEEDS_TERRAFORM = (
    "access_key", "secret_key", "token", "assume_role", "assume_role_with_web_identity", "role_arn",
    "sse_customer_key", "shared_credentials_file", "shared_credentials_files", "shared_config_files",
    "custom_ca_bundle", "http_proxy", "https_proxy", "no_proxy", "insecure", "use_fips_endpoint",
    "use_dualstack_endpoint", "dynamodb_table", "dynamodb_endpoint", "allowed_account_ids",
    "forbidden_account_ids", "sts_endpoint", "sts_region", "iam_endpoint", "ec2_metadata_service_endpoint",
)


def backend_of(root: str, data_dir: Optional[str] = None, workspace: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """``{type, config, workspace}`` of an initialised root, or None before ``init``. ``data_dir``:
    its ``TF_DATA_DIR`` (default ``.terraform``); ``workspace``: its ``TF_WORKSPACE``, which wins
    over the workspace the root has selected."""
    data = os.path.join(root, data_dir or ".terraform")
    try:
        with open(os.path.join(data, "terraform.tfstate"), "r", encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError, RecursionError):  # not as terraform writes it: terraform reads it, and says so
        return None
    backend = doc.get("backend") if isinstance(doc, dict) else None
    if not isinstance(backend, dict) or not isinstance(backend.get("config") or {}, dict):
        return None  # not as terraform writes it: terraform reads the state, and names what is wrong
    ws = "default"
    try:
        with open(os.path.join(data, "environment"), "r", encoding="utf-8") as fh:
            ws = fh.read().strip() or "default"
    except OSError:
        pass
    except UnicodeDecodeError:
        return None  # a workspace name that does not read: terraform reads it, and says what is wrong
    return {"type": backend.get("type"), "config": backend.get("config") or {}, "workspace": workspace or ws}


def s3_state_key(config: Mapping[str, Any], workspace: str) -> str:
    """The S3 backend's object key of ``workspace``'s state."""
    if workspace in ("", "default"):
        return str(config["key"])
    return "%s/%s/%s" % (config.get("workspace_key_prefix") or "env:", workspace, config["key"])


def state_object(backend: Mapping[str, Any], root: str) -> Optional[Dict[str, str]]:
    """Where the state of an initialised root lives, when it can be read without terraform:
    ``{"s3": bucket, "key": key}`` or ``{"path": file}``; None otherwise."""
    cfg = backend.get("config") or {}
    ws = backend.get("workspace") or "default"
    if backend.get("type") == "s3":
        if not cfg.get("bucket") or not cfg.get("key") or not cfg.get("region"):
            return None
        if any(cfg.get(k) not in (None, "", [], {}) for k in S3_NEEDS_TERRAFORM) or os.environ.get("AWS_SSE_CUSTOMER_KEY"):
            return None
        return {"s3": cfg["bucket"], "key": s3_state_key(cfg, ws)}
    if backend.get("type") == "local":
        if not all(isinstance(cfg.get(k) or "", str) for k in ("path", "workspace_dir")):
            return None
        if ws == "default":
            path = cfg.get("path") or "terraform.tfstate"
        else:
            path = os.path.join(cfg.get("workspace_dir") or "terraform.tfstate.d", ws, "terraform.tfstate")
        return {"path": os.path.join(root, path)}
    return None


def _parse(body: bytes) -> Optional[Dict[str, Any]]:
    """The state document, EMPTY for an empty body, None for anything but plain version-4 JSON."""
    if not body.strip():
        return dict(EMPTY)
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != 4 or "encrypted_data" in doc:
        return None
    if not isinstance(doc.get("resources", []), list) or not isinstance(doc.get("outputs", {}), dict):
        return None
    return doc


def read_direct(root: str) -> Optional[Dict[str, Any]]:
    """The root's state read from its backend without terraform, or None when it must be read
    by terraform (see the module doc)."""
    backend = backend_of(root, os.environ.get("TF_DATA_DIR"), os.environ.get("TF_WORKSPACE"))
    where = state_object(backend, root) if backend else None
    if where is None:
        return None
    if "path" in where:
        try:
            with open(where["path"], "rb") as fh:
                return _parse(fh.read())
        except FileNotFoundError:
            return dict(EMPTY)
        except OSError:
            return None
    try:
        client = aws.client("s3", aws.backend_access(backend["config"]))
        body = client.get_object(Bucket=where["s3"], Key=where["key"])["Body"].read()
    except Exception as exc:  # pylint: disable=broad-except
        if aws.error_code(exc) in ("NoSuchKey",):
            return dict(EMPTY)
        return None                      # terraform reads it, and names any real error
    return _parse(body)


def read(root: str, binary: str = "terraform") -> Dict[str, Any]:
    """The root's state: :func:`read_direct`, else ``state pull`` (:func:`.terraform.state_pull`)."""
    state = read_direct(root)
    if state is not None:
        return state
    return terraform.state_pull(root, binary)
