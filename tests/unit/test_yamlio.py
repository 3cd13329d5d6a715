# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""yamlio.shape_problem: the walk every reader does before a recursive walk follows an alias."""
from __future__ import annotations

import sys

import pytest
import yaml

from ansible_collections.csis.infra.plugins.module_utils.csis.yamlio import VALUE_ERRORS, shape_problem


def _laughs(levels: int, width: int = 10) -> str:
    text = "l0: &l0 [%s]\n" % ",".join(["x"] * width)
    for i in range(1, levels + 1):
        text += "l%d: &l%d [%s]\n" % (i, i, ",".join(["*l%d" % (i - 1)] * width))
    return text


@pytest.mark.parametrize("text, where", [
    ("&x [*x]\n", "[0]"),
    ("a: &x\n  - *x\n", "a[0]"),
    ("a: {b: &x {c: [1, *x]}}\n", "a.b.c[1]"),
    ("a: &x {b: {c: *x}}\n", "a.b.c"),
])
def test_a_cycle_is_named_where_the_alias_is(text: str, where: str) -> None:
    assert shape_problem(yaml.safe_load(text), text) == "%s: a YAML alias refers to a node that contains it (a cycle)" % where


def test_shared_aliases_are_fine_and_a_bomb_is_refused() -> None:
    shared = "t: &t {team: a}\ni: [{tags: *t}, {tags: *t}, {tags: [*t, *t]}]\n"
    assert shape_problem(yaml.safe_load(shared), shared) is None
    ok = _laughs(5)  # 10^6 values: big, but under the limit
    assert shape_problem(yaml.safe_load(ok), ok) is None
    bomb = _laughs(9)  # 10^9 values from ten lines
    msg = shape_problem(yaml.safe_load(bomb), bomb)
    assert msg is not None and msg.startswith("l9[9][9][9]") and "expand to more than 10000000 values" in msg
    assert shape_problem(yaml.safe_load(ok), limit=1000) is not None


def test_a_document_without_anchors_is_not_walked_and_deep_nesting_does_not_recurse() -> None:
    cyclic = yaml.safe_load("&x [*x]\n")
    assert shape_problem(cyclic, "no anchor, no alias in this text") is None  # the text says: not walked
    deep: list = []
    node = deep
    for _level in range(sys.getrecursionlimit() * 3):
        node.append([])
        node = node[0]
    assert shape_problem(deep) is None


@pytest.mark.parametrize("text", ["a: !!int x\n", "a: !!bool x\n", "a: !!int _\n", "a: !!timestamp x\n",
                                  "a: !!timestamp 2024-99-99\n", "a: !!float .\n"])
def test_value_errors_cover_what_the_safe_constructors_raise(text: str) -> None:
    with pytest.raises(VALUE_ERRORS):
        yaml.safe_load(text)


@pytest.mark.parametrize("data", [None, "&x *x", 1, ["&", "*"]])
def test_a_scalar_or_a_flat_document_has_no_shape_problem(data) -> None:
    assert shape_problem(data) is None and shape_problem(data, "&a *a") is None
