# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Hypothesis profiles of the fuzz tests (tests/fuzz/).

* ``csis-ci`` (the default): ``derandomize=True`` -- the examples are derived from each
  test function's own hash, so every run (CI, a colleague's machine, a re-run after a
  failure) tries exactly the same inputs and a red build is reproducible by re-running it;
  a fuzz test never turns red on a change that did not touch what it tests. No example
  database (nothing is written into the checkout). No per-example ``deadline``: the machines
  are shared and busy (a 5 s deadline failed the loader property once beside end-to-end runs),
  and the properties are about exceptions, not speed; the number of examples bounds the run.
* ``csis-explore``: random seeds and the example database under the system's temporary
  directory, for hunting new bugs locally, e.g.
  ``CSIS_FUZZ_PROFILE=csis-explore CSIS_FUZZ_SCALE=20 .venv/bin/python -m pytest -p no:cacheprovider tests/fuzz``.
  A failure prints the ``@reproduce_failure`` blob; keep the failing input as an explicit
  regression test next to the property.

Each test sets its own ``max_examples`` (times ``CSIS_FUZZ_SCALE``, default 1): the whole
of tests/fuzz takes well under a minute on a loaded two-core machine.
"""
from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

settings.register_profile(
    "csis-ci",
    derandomize=True,
    database=None,
    deadline=None,  # a timing threshold in a test: none (the examples' count bounds the run)
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "csis-explore",
    derandomize=False,
    database=DirectoryBasedExampleDatabase(os.path.join(tempfile.gettempdir(), "csis-hypothesis")),
    deadline=5000,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("CSIS_FUZZ_PROFILE", "csis-ci"))
