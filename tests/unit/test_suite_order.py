# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The suite's own file order (tests/conftest.py, ``pytest_collection_modifyitems``): the
longest files first, then unlisted end-to-end files before the unit files. A name in
``HEAVIEST_FIRST`` that no longer exists would silently send its renamed file to the end."""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, List

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def suite_conftest(request: pytest.FixtureRequest) -> Any:
    """tests/conftest.py as pytest registered it."""
    wanted = os.path.join(REPO, "tests", "conftest.py")
    for plugin in request.config.pluginmanager.get_plugins():
        if os.path.abspath(str(getattr(plugin, "__file__", ""))) == wanted:
            return plugin
    raise AssertionError("tests/conftest.py is not registered")


def _ordered(conftest: Any, nodeids: List[str]) -> List[str]:
    items = [SimpleNamespace(nodeid=n) for n in nodeids]
    config = SimpleNamespace(getoption=lambda name, default=None: False)
    conftest.pytest_collection_modifyitems(None, config, items)
    return [i.nodeid for i in items]


def test_every_listed_file_exists(suite_conftest: Any) -> None:
    missing = [p for p in suite_conftest.HEAVIEST_FIRST if not os.path.isfile(os.path.join(REPO, p))]
    assert not missing, "HEAVIEST_FIRST names files that are gone (renamed?): %s" % missing
    assert len(set(suite_conftest.HEAVIEST_FIRST)) == len(suite_conftest.HEAVIEST_FIRST)


def test_listed_first_then_unlisted_end_to_end_files_then_the_rest(suite_conftest: Any) -> None:
    first, second = suite_conftest.HEAVIEST_FIRST[:2]
    nodeids = [
        "tests/unit/test_many.py::a", "tests/unit/test_many.py::b", "tests/unit/test_many.py::c",
        "tests/integration/test_new_e2e.py::only",
        second + "::x",
        "tests/faults/test_new_fault.py::one", "tests/faults/test_new_fault.py::two",
        first + "::y", first + "::z",
    ]
    assert _ordered(suite_conftest, nodeids) == [
        first + "::y", first + "::z",      # the list's order, each file's own order kept
        second + "::x",
        "tests/faults/test_new_fault.py::one", "tests/faults/test_new_fault.py::two",  # more tests first
        "tests/integration/test_new_e2e.py::only",  # one test, but end-to-end: before the unit file
        "tests/unit/test_many.py::a", "tests/unit/test_many.py::b", "tests/unit/test_many.py::c",
    ]
