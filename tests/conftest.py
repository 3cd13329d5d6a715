# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Shared test set-up.

* ``<repo>/.venv/collections`` goes on ``sys.path`` so the library imports as
  ``ansible_collections.csis.infra.plugins.module_utils.csis.<mod>``.
* ``moto_endpoint`` (session): ONE moto server for the whole test session, on a free
  port with its own temporary state directory (never the demo's ``.local/aws``),
  seeded like ``scripts/local-aws seed``; stopped at the end of the session.
* ``tf_env`` (session): the terraform environment (``tfcli.terraform_env()``) plus
  the dummy AWS credentials and region.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(REPO_ROOT, ".venv", "collections")
SUPPORT = os.path.join(REPO_ROOT, "tests", "support")
for _p in (COLLECTIONS, SUPPORT):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import local_aws  # noqa: E402  (tests/support/local_aws.py, shared with scripts/local-aws)


@dataclass
class MotoEndpoint:
    """The session's local AWS endpoint and what the seed created there."""

    url: str
    env: Dict[str, str]
    overlay_path: str
    env_path: str
    state_dir: str
    seeded: Dict[str, Any]
    region: str = local_aws.REGION
    _la: Any = field(default=None, repr=False)

    # seeded ids, for convenience
    @property
    def account_id(self) -> str:
        return str(self.seeded["account_id"])

    @property
    def vpc_id(self) -> str:
        return str(self.seeded["vpc_id"])

    @property
    def subnet_ids(self) -> Dict[str, str]:
        return dict(self.seeded["subnet_ids"])

    @property
    def subnets(self) -> list:
        return list(self.seeded["subnets"])

    @property
    def security_groups(self) -> Dict[str, str]:
        return dict(self.seeded["security_groups"])

    @property
    def amis(self) -> Dict[str, str]:
        return dict(self.seeded["amis"])

    @property
    def instance_profile(self) -> str:
        return str(self.seeded["instance_profile"]["name"])

    @property
    def state_bucket(self) -> str:
        return str(self.seeded["state_bucket"])

    def client(self, service: str) -> Any:
        return self._la.client(service, self.url)


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoEndpoint]:
    shared = os.environ.get(SHARED_MOTO_ENV)
    if shared:
        # xdist: the controller started and seeded ONE server for every worker
        la = local_aws.LocalAws(shared)
        rec = la.recorded()
        assert rec, "the shared moto server recorded in %s is gone" % shared
        seeded = la.seeded() or la.seed()
        yield MotoEndpoint(url=rec["url"], env=la.env(rec["url"]), overlay_path=la.overlay_path,
                           env_path=la.env_path, state_dir=shared, seeded=seeded, _la=la)
        return
    state_dir = str(tmp_path_factory.mktemp("local-aws"))
    la = local_aws.LocalAws(state_dir)
    # any free port (never clash with a demo server on 5055); the server exits with this
    # test process even when the session is killed before its teardown
    rec = la.start(prefer_port=None, tie_to_caller=True)
    try:
        seeded = la.seed()
        yield MotoEndpoint(
            url=rec["url"], env=la.env(rec["url"]), overlay_path=la.overlay_path,
            env_path=la.env_path, state_dir=state_dir, seeded=seeded, _la=la,
        )
    finally:
        la.stop()


SHARED_MOTO_ENV = "CSIS_TEST_SHARED_MOTO_DIR"


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, start one moto server in the controller for all workers (the workers
    inherit its directory through the environment); it stops with the controller."""
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get(SHARED_MOTO_ENV):
        return
    if not getattr(config.option, "numprocesses", None):
        return
    if "not integration" in (getattr(config.option, "markexpr", "") or ""):
        return
    import tempfile

    state_dir = tempfile.mkdtemp(prefix="csis-test-moto-")
    la = local_aws.LocalAws(state_dir)
    la.start(prefer_port=None, tie_to_caller=True)
    la.seed()
    os.environ[SHARED_MOTO_ENV] = state_dir
    config._csis_shared_moto = la  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    la = getattr(config, "_csis_shared_moto", None)
    if la is not None:
        la.stop()
        os.environ.pop(SHARED_MOTO_ENV, None)


@pytest.fixture(scope="session")
def tf_env() -> Dict[str, str]:
    from ansible_collections.csis.infra.plugins.module_utils.csis.tfcli import terraform_env

    env = terraform_env()
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        env.pop(key, None)
    env.update(local_aws.DUMMY_CREDENTIALS)
    env["AWS_DEFAULT_REGION"] = local_aws.REGION
    env["AWS_REGION"] = local_aws.REGION
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env
