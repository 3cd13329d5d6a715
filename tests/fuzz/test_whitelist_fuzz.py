# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Fuzz: the gate's address matcher (apply/whitelist.py) agrees with a brute-force oracle.

The semantics (whitelist.py, the csis_gate_plan docs, docs/operations.md): an address is a
sequence of whole segments -- names, ``["quoted keys"]`` (HCL string syntax: escapes,
``$${``/``%%{`` for a literal ``${``/``%{``) and ``[0]`` indexes; a whitelist entry covers an
address when the entry's segments are a prefix of the address's (``module.a`` covers
``module.a["x"].b.c`` and ``module.a[0].b``, never ``module.a2.b``); there is no wildcard (an
entry ``module.*`` is a literal name ``*``). Of several covering entries the matcher answers the
one with the fewest segments, the first listed among equal ones.

The oracle here builds addresses as lists of segments, spells them itself (its own quoting,
sometimes with ``\\uXXXX`` escapes the parser must decode) and decides coverage by comparing
the segment lists: no parsing, no shared code with the matcher.
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.whitelist import (
    Whitelist, address_covered_by, format_address, parse_address)

SCALE = int(os.environ.get("CSIS_FUZZ_SCALE", "1"))

Segment = Tuple[str, Any]

#: few names, so that prefixes and near-misses (a / a2, instance_test / instance_test2) collide
NAMES = ["module", "data", "a", "a2", "aws_instance", "aws_ebs_volume", "this", "instance_test", "instance_test2",
         "storage_x", "*", "**", "x-y", "_", "A"]
KEYS = ["", "a", "a.b", "b", '"', "\\", '\\"', "[0]", "]", "[", '["x"]', "x\"]", "${x}", "$${", "%{", "%%{", "$", "%",
        "}", "\u00e9", "e\u0301", "\n", "\t", "\x00", "\x7f", "\u2028", "\U0001f600", " ", "0", "*", "module.a"]

names = st.one_of(st.sampled_from(NAMES), st.from_regex(r"[A-Za-z_][A-Za-z0-9_*-]{0,6}", fullmatch=True))
keys = st.one_of(st.sampled_from(KEYS), st.text(st.characters(blacklist_categories=("Cs",)), max_size=6))
segment_after_name = st.one_of(
    names.map(lambda n: ("name", n)),
    keys.map(lambda k: ("key", k)),
    st.one_of(st.sampled_from([0, 1, 2, 10]), st.integers(0, 10 ** 12)).map(lambda i: ("index", i)),
)


@st.composite
def addresses(draw: Any) -> List[Segment]:
    """Segments: a name first, never two keys/indexes in a row without a name between
    (what terraform writes: module.a["k"].b.c[0])."""
    segs: List[Segment] = [("name", draw(names))]
    for _i in range(draw(st.integers(0, 7))):
        seg = draw(segment_after_name)
        if seg[0] != "name" and segs[-1][0] != "name":
            seg = ("name", draw(names))
        segs.append(seg)
    return segs


def _quote(text: str, draw: Any) -> str:
    """The oracle's own HCL quoting; any character may also be spelled as a \\u escape."""
    out = ['"']
    i = 0
    while i < len(text):
        c = text[i]
        if c in "$%" and text[i + 1:i + 2] == "{":
            out.append(c + c + "{")
            i += 2
            continue
        simple = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
        spelled_as_u = draw is not None and draw(st.integers(0, 4)) == 0
        if c in simple and not spelled_as_u:
            out.append(simple[c])
        elif c in simple or ord(c) < 0x20 or ord(c) == 0x7F or spelled_as_u:
            out.append("\\u%04x" % ord(c) if ord(c) < 0x10000 else "\\U%08X" % ord(c))
        else:
            out.append(c)
        i += 1
    return "".join(out) + '"'


def spell(segs: Sequence[Segment], draw: Any = None) -> str:
    text = ""
    for kind, v in segs:
        if kind == "name":
            text += ("." if text else "") + v
        elif kind == "key":
            text += "[" + _quote(v, draw) + "]"
        else:
            text += "[%d]" % v
    return text


def oracle(address: Sequence[Segment], entries: Sequence[Tuple[Sequence[Segment], str]]) -> Optional[str]:
    """The covering entry (fewest segments, then first listed), by brute force over the entries."""
    best: Optional[Tuple[int, int, str]] = None
    for pos, (segs, text) in enumerate(entries):
        if len(segs) <= len(address) and all(a == b for a, b in zip(segs, address)):
            cand = (len(segs), pos, text)
            if best is None or cand < best:
                best = cand
    return best[2] if best else None


def _near(segs: List[Segment], draw: Any) -> List[Segment]:
    """A prefix of ``segs``, sometimes with one segment changed (a near miss)."""
    out = list(segs[:draw(st.integers(1, len(segs)))])
    if draw(st.booleans()):
        i = draw(st.integers(0, len(out) - 1))
        kind = out[i][0]
        if kind == "name":
            out[i] = ("name", draw(names))
        elif kind == "key":
            out[i] = ("key", draw(keys))
        else:
            out[i] = ("index", draw(st.integers(0, 3)))
    if draw(st.integers(0, 3)) == 0:  # longer than the address: never covers it
        out.append(("name", draw(names)))
    return out


def _canon(segs: Sequence[Segment]) -> Tuple[Segment, ...]:
    return tuple((k, v) for k, v in segs)


@settings(max_examples=400 * SCALE)
@given(st.data())
def test_matcher_agrees_with_oracle(data: Any) -> None:
    draw = data.draw
    address = draw(addresses())
    entry_segs = [(_near(address, draw) if draw(st.integers(0, 2)) else draw(addresses())) for _i in range(draw(st.integers(0, 6)))]
    entries = [(segs, spell(segs, draw)) for segs in entry_segs]
    address_text = spell(address, draw)
    # the parser reads the oracle's spelling as the oracle's segments
    assert parse_address(address_text) == _canon(address), address_text
    for segs, text in entries:
        assert parse_address(text) == _canon(segs), text
    want = oracle(address, entries)
    texts = [text for _segs, text in entries]
    assert Whitelist(texts).covering(address_text) == want, (address_text, texts)
    assert address_covered_by(address_text, texts) == want
    # the canonical spelling is read back the same
    assert parse_address(format_address(parse_address(address_text))) == _canon(address)


@settings(max_examples=300 * SCALE)
@given(st.one_of(
    st.text(max_size=40),
    st.text(st.sampled_from('ab0.[]"\\$%{}u*-_ \n'), max_size=30),
    addresses().map(spell).flatmap(lambda s: st.integers(0, len(s)).map(lambda i: s[:i])),  # cut short
))
def test_parser_refuses_cleanly(text: str) -> None:
    """Any text: a ValueError (the gate turns it into a GateError), or segments whose canonical
    spelling reads back the same."""
    try:
        tokens = parse_address(text)
    except ValueError:
        return
    assert tokens and tokens[0][0] == "name"
    assert parse_address(format_address(tokens)) == tokens


@pytest.mark.parametrize("address, entries, covered", [
    ('module.s["a.b"].x', ['module.s["a"]'], None),
    ('module.s["a"].x', ['module.s["a.b"]'], None),
    ('module.m["]"].x', ['module.m["]"]'], 'module.m["]"]'),
    ('module.m["\\"]"].x', ['module.m["\\u0022]"]'], 'module.m["\\u0022]"]'),
    ('module.m["$${x}"].x', ['module.m["$${x}"]'], 'module.m["$${x}"]'),
    ("module.a.b", ["module.*", "*"], None),
    ("module.a2.b", ["module.a"], None),
    ("module.a[0].b", ["module.a", "module.a[0]"], "module.a"),
    ("x.y", ["x.y", "x"], "x"),
])
def test_matcher_examples(address: str, entries: List[str], covered: Optional[str]) -> None:
    assert Whitelist(entries).covering(address) == covered
