# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The project's venv holds the bytecode of what every run imports (scripts/bootstrap).

``scripts/bootstrap`` installs with ``pip --no-compile`` and then byte-compiles the venv's
packages itself, without the ``ansible`` package's ``ansible_collections/``. Where
``PYTHONDONTWRITEBYTECODE`` is set (these machines set it) a run never writes a ``.pyc``, so a
package left uncompiled is compiled from source at every ``ansible-playbook`` start (0.8 s of CPU
each: benchmarks/README.md, "Session 44"). This checks the venv the suite runs in.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.join(REPO, ".venv")

#: what an ansible-playbook start, the csis modules in the controller and the suite import
IMPORTED_BY_EVERY_RUN = ("ansible.cli.playbook", "ansible.template", "jinja2.environment",
                         "yaml.constructor", "pydantic.main", "botocore.session", "boto3.session")


@pytest.mark.skipif(os.path.realpath(sys.prefix) != os.path.realpath(VENV),
                    reason="runs in the checkout's own venv (scripts/bootstrap), not a copy's")
@pytest.mark.parametrize("name", IMPORTED_BY_EVERY_RUN)
def test_the_packages_every_run_imports_are_byte_compiled(name):
    if sys.pycache_prefix:  # PYTHONPYCACHEPREFIX: the cache is looked for there, which bootstrap does not fill
        pytest.skip("PYTHONPYCACHEPREFIX is set: bytecode is kept under %s" % sys.pycache_prefix)
    source = importlib.import_module(name).__file__
    assert source and source.endswith(".py"), source
    cached = importlib.util.cache_from_source(source)
    assert os.path.isfile(cached), "%s has no bytecode (%s): scripts/bootstrap compiles the venv" % (source, cached)
