# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The collection as users get it: the artifact of ``ansible-galaxy collection build``,
installed with ``ansible-galaxy collection install`` into a temporary collections path.

Shared by ``tests/integration/test_collection_artifact.py`` and
``tests/integration/test_awx_runner.py``: :func:`session_collection` builds and installs
once per test session (per pytest process) and hands both the same artifact and path.
The installed collection is only read by the tests (runs write into their trees).
"""
from __future__ import annotations

import os
import subprocess
from typing import Dict, Mapping, Optional, Tuple

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
GALAXY_BIN = os.path.join(VENV_BIN, "ansible-galaxy")

_BUILT: Dict[str, Tuple[str, str]] = {}


def version() -> str:
    """galaxy.yml's version (the artifact is ``csis-infra-<version>.tar.gz``)."""
    with open(os.path.join(REPO, "galaxy.yml"), encoding="utf-8") as fh:
        return str(yaml.safe_load(fh)["version"])


def outside_env(extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """An environment that knows nothing of the checkout: no ANSIBLE_* (so no ansible.cfg,
    no .venv/collections), the venv's tools first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "PYTHONUNBUFFERED": "1",
                "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", "")})
    env.update(extra or {})
    return env


def build(out_dir: str) -> str:
    """``ansible-galaxy collection build`` of the checkout into ``out_dir``; the artifact's path."""
    proc = subprocess.run([GALAXY_BIN, "collection", "build", "--force", "--output-path", out_dir, REPO],
                          cwd=out_dir, env=outside_env(), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = os.path.join(out_dir, "csis-infra-%s.tar.gz" % version())
    assert os.path.isfile(path), os.listdir(out_dir)
    return path


def install(artifact: str, collections_path: str) -> str:
    """``ansible-galaxy collection install --offline -p <collections_path> <artifact>``: its
    dependencies resolve (offline) to the community.general and amazon.aws of the venv's
    ansible package. Returns ``collections_path`` (what ANSIBLE_COLLECTIONS_PATH names)."""
    env = outside_env({"ANSIBLE_COLLECTIONS_PATH": collections_path})
    proc = subprocess.run([GALAXY_BIN, "collection", "install", "--offline", "-p", collections_path, artifact],
                          cwd=collections_path, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.path.isfile(os.path.join(collections_path, "ansible_collections", "csis", "infra", "MANIFEST.json"))
    return collections_path


def session_collection(tmp_path_factory) -> Tuple[str, str]:
    """(artifact, collections path): built and installed once per session, under the
    session's temporary directory."""
    key = str(tmp_path_factory.getbasetemp())
    if key not in _BUILT:
        artifact = build(str(tmp_path_factory.mktemp("dist")))
        _BUILT[key] = (artifact, install(artifact, str(tmp_path_factory.mktemp("collections"))))
    return _BUILT[key]
