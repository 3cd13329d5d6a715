# -*- coding: utf-8 -*-
"""hcl.string / hcl.value / hcl.key / template_literal: configuration text stays literal.

The round trip through the real terraform is in tests/integration/test_render_roots.py
(test_escaping_*); these pin the encoder's exact output.
"""
from __future__ import annotations

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.render import hcl


@pytest.mark.parametrize("text, encoded", [
    ("plain", '"plain"'),
    ('say "hi"', r'"say \"hi\""'),
    ("back\\slash", r'"back\\slash"'),
    ("l1\nl2\r\n\tx", r'"l1\nl2\r\n\tx"'),
    ("${var.x}", '"$${var.x}"'),
    ("%{ if x }", '"%%{ if x }"'),
    ("$${already}", '"$$${already}"'),
    ("%%{already}", '"%%%{already}"'),
    ("cost $5, 100%", '"cost $5, 100%"'),
    ("end$", '"end$"'),
    ("end%", '"end%"'),
    ("\\${x}", '"\\\\$${x}"'),
    ("bell\x07del\x7f", r'"bell\u0007del\u007f"'),
    ("caf\u00e9", '"caf\u00e9"'),
    ("", '""'),
])
def test_string(text: str, encoded: str) -> None:
    assert hcl.string(text) == encoded


def test_string_never_leaves_an_open_template_sequence() -> None:
    for text in ["${", "%{", "$${", "$$${", "a${b}c%{d}e", "${${}}"]:
        enc = hcl.string(text)[1:-1]
        # every '${' / '%{' in the encoding is preceded by its doubling character
        i = enc.find("${")
        while i >= 0:
            assert i > 0 and enc[i - 1] == "$", (text, enc)
            i = enc.find("${", i + 1)
        i = enc.find("%{")
        while i >= 0:
            assert i > 0 and enc[i - 1] == "%", (text, enc)
            i = enc.find("%{", i + 1)


@pytest.mark.parametrize("v, encoded", [
    (None, "null"),
    (True, "true"),
    (False, "false"),
    (0, "0"),
    (100, "100"),
    (1.5, "1.5"),
    ("x", '"x"'),
    ([], "[]"),
    ({}, "{}"),
    (["a", "b${c}"], '["a", "b$${c}"]'),
    ([1, True, None], "[1, true, null]"),
])
def test_value_scalars_and_flat_lists(v: object, encoded: str) -> None:
    assert hcl.value(v) == encoded


def test_value_raw_is_verbatim() -> None:
    assert hcl.value(hcl.Raw("data.x.y[\"k\"]")) == 'data.x.y["k"]'
    assert hcl.value({"a": hcl.Raw("var.z")}) == "{\n  a = var.z\n}"


def test_value_mapping_aligns_and_quotes_keys() -> None:
    out = hcl.value({"Name": "n", "we\"ird": "v", "for": "k", "a-b": "c", "${k}": "i", "1x": "d"})
    assert out == (
        "{\n"
        '  Name      = "n"\n'
        '  "we\\"ird" = "v"\n'
        '  "for"     = "k"\n'
        '  a-b       = "c"\n'
        '  "$${k}"   = "i"\n'
        '  "1x"      = "d"\n'
        "}"
    )


def test_value_nested_breaks_alignment_runs() -> None:
    out = hcl.value({"a": 1, "nested": {"x": "y"}, "bb": 2}, 0)
    assert out == "{\n  a = 1\n  nested = {\n    x = \"y\"\n  }\n  bb = 2\n}"


def test_value_list_of_objects() -> None:
    out = hcl.value([{"id": "csis", "days": 30}])
    assert out == '[\n  {\n    id   = "csis"\n    days = 30\n  },\n]'


def test_value_refuses_unknown_types() -> None:
    with pytest.raises(TypeError):
        hcl.value(object())


@pytest.mark.parametrize("k, out", [
    ("Name", "Name"), ("a-b", "a-b"), ("_x", "_x"), ("for", '"for"'), ("a b", '"a b"'),
    ("1abc", '"1abc"'), ("a.b", '"a.b"'), ("${x}", '"$${x}"'), ("", '""'),
])
def test_key(k: str, out: str) -> None:
    assert hcl.key(k) == out


@pytest.mark.parametrize("text, out", [
    ("echo ${HOME}", "echo $${HOME}"),
    ("%{ if x }y%{ endif }", "%%{ if x }y%%{ endif }"),
    ("$${x} %%{y}", "$$${x} %%%{y}"),
    ('quotes " and \\ stay', 'quotes " and \\ stay'),
    ("100% $5 $HOME", "100% $5 $HOME"),
    ("multi\nline\n", "multi\nline\n"),
])
def test_template_literal(text: str, out: str) -> None:
    assert hcl.template_literal(text) == out


def test_block_render_fmt_form() -> None:
    b = hcl.Block("resource", "aws_x", "y")
    b.attr("name", 'a"b')
    b.attr("count", 1)
    inner = b.block("lifecycle")
    inner.attr("create_before_destroy", True)
    b.attr("tags", {"k": "v"})
    assert b.render() == (
        'resource "aws_x" "y" {\n'
        '  name  = "a\\"b"\n'
        "  count = 1\n"
        "\n"
        "  lifecycle {\n"
        "    create_before_destroy = true\n"
        "  }\n"
        "\n"
        "  tags = {\n"
        '    k = "v"\n'
        "  }\n"
        "}\n"
    )


def test_comment_lines_keep_every_line_commented() -> None:
    assert hcl.comment_lines("a\nb ${x}") == "# a\n# b ${x}\n"
    b = hcl.Block("x")
    b.comment("one\ntwo")
    assert "\n  # one two\n" in b.render()
