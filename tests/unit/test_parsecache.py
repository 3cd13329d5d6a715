# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""config/parsecache.py: a large configuration file's parse kept by its content."""
from __future__ import annotations

import os
from typing import Any, List

import pytest
import yaml

from ansible_collections.csis.infra.plugins.module_utils.csis.config import loader, parsecache
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import Problem


def _instances(count: int, extra: str = "") -> str:
    return "instances:\n" + "".join("  - name: node%05d\n    image: base\n    description: instance number %d of the fleet%s\n"
                                    % (i, i, extra) for i in range(count))


@pytest.fixture(name="cache")
def fixture_cache(tmp_path: Any, monkeypatch: Any) -> str:
    where = str(tmp_path / "cache")
    monkeypatch.setenv("CSIS_CONFIG_CACHE", where)
    return where


def _read(path: str) -> Any:
    problems: List[Problem] = []
    data, _tagged = loader.read_config_yaml(path, "instances/instances.yaml", problems, "instances")
    assert problems == []
    return data


def test_a_large_file_is_parsed_once_per_content(tmp_path: Any, cache: str, monkeypatch: Any) -> None:
    path = str(tmp_path / "instances.yaml")
    text = _instances(4000)
    assert len(text) >= parsecache.MIN_BYTES
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    first = _read(path)
    assert len(os.listdir(cache)) == 1
    # the same bytes again: no YAML parse at all
    real_load = yaml.load
    monkeypatch.setattr(yaml, "load", lambda *a, **k: pytest.fail("parsed again"))
    assert _read(path) == first
    # one byte changed: a miss, parsed again, a second entry
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text.replace("node00007", "node0000x"))
    monkeypatch.setattr(yaml, "load", real_load)
    assert _read(path)["instances"][7]["name"] == "node0000x"
    assert len(os.listdir(cache)) == 2


def test_only_plain_json_data_of_large_clean_files_is_kept(tmp_path: Any, cache: str) -> None:
    small = str(tmp_path / "small.yaml")
    with open(small, "w", encoding="utf-8") as fh:
        fh.write(_instances(3))
    _read(small)
    dated = str(tmp_path / "dated.yaml")
    with open(dated, "w", encoding="utf-8") as fh:
        fh.write(_instances(4000) + "released: 2024-01-01\n")
    _read(dated)
    numbered = str(tmp_path / "numbered.yaml")
    with open(numbered, "w", encoding="utf-8") as fh:
        fh.write(_instances(4000) + "counts: {1: one}\n")
    _read(numbered)
    assert not os.path.isdir(cache) or os.listdir(cache) == []
    broken = str(tmp_path / "broken.yaml")
    with open(broken, "w", encoding="utf-8") as fh:
        fh.write(_instances(4000) + "instances: again\n")  # a duplicate key: a problem, nothing kept
    problems: List[Problem] = []
    assert loader.read_config_yaml(broken, "x.yaml", problems, "instances")[0] is None and problems
    assert not os.path.isdir(cache) or os.listdir(cache) == []


def test_a_damaged_entry_is_a_miss_and_off_turns_it_off(tmp_path: Any, cache: str, monkeypatch: Any) -> None:
    path = str(tmp_path / "instances.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(_instances(4000))
    first = _read(path)
    (entry,) = os.listdir(cache)
    with open(os.path.join(cache, entry), "w", encoding="utf-8") as fh:
        fh.write('{"format": 1, "da')
    assert _read(path) == first
    monkeypatch.setenv("CSIS_CONFIG_CACHE", "off")
    assert parsecache.directory() is None
    assert _read(path) == first
