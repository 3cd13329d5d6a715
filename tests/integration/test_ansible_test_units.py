# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The unit tests as Ansible's own tool runs them: ``scripts/units`` (``ansible-test units``
in a copy of the checkout laid out as ``ansible_collections/csis/infra``, outside it).

ansible-test runs pytest with its own configuration, from the copy, and each test in a fork of
its own. What that changes, and what this test holds to:

* a test that starts a Python process importing the library hands it the path it imported the
  library from, not the checkout's ``.venv`` (``test_metastate.py``'s lock holders; they
  failed under ansible-test when they named ``.venv/collections``);
* the suite's per-file CPU table counts a forked test from zero (it printed negative seconds);
* a run of library tests alone starts no moto server.

The whole of tests/unit passes the same way (``scripts/units``: about two minutes, so not part
of ``scripts/test``, which runs those files through plain pytest in the checkout).
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS = os.path.join(REPO, "scripts", "units")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.exists(os.path.join(REPO, ".venv", "bin", "ansible-test")),
                       reason="needs the project venv (scripts/bootstrap)"),
]


def test_ansible_test_units_runs_the_library_tests_from_a_collection_copy():
    files = ["tests/unit/test_metastate.py", "tests/unit/test_gate.py"]
    # not this suite's worker (PYTEST_XDIST_WORKER) nor its shared endpoint: the copy's
    # tests/conftest.py decides for itself whether to start one
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "ANSIBLE_")) and k != "CSIS_TEST_SHARED_MOTO_DIR"}
    proc = subprocess.run([UNITS] + files, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "ansible_collections/csis/infra" in out, out[-3000:]
    m = re.search(r"=+ (\d+) passed", out)
    assert m and int(m.group(1)) > 200, out[-3000:]
    assert not re.search(r"\d+ (failed|error)", out), out[-3000:]
    # the per-file table: both files, each with its CPU counted from zero in every fork
    row = re.compile(r"^\s+[\d.]+ s\s+(-?[\d.]+) s CPU\s+\d+ tests\s+(\S+)$", re.M)
    rows = {path: float(cpu) for cpu, path in row.findall(out)}
    assert set(rows) == set(files), out[-3000:]
    assert all(cpu > 0 for cpu in rows.values()), rows
    assert "shared moto server" not in out, out[-3000:]
