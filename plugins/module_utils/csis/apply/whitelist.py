# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Terraform addresses, split into whole segments, and the destroy whitelist matched on them.

``module.instance_test`` covers ``module.instance_test.aws_instance.this``,
``module.instance_test["x"]...`` and ``module.instance_test[0]...`` but never
``module.instance_test2...``: a whitelist entry is a prefix of segments, not of text.
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..render.hcl import string as hcl_string

# A token is ("name", str), ("key", str) for ["k"], or ("index", int) for [0].
Token = Tuple[str, Any]

_NAME_STOP = set('.[]"')


def _decode_quoted(text: str, start: int, address: str) -> Tuple[str, int]:
    """Decode an HCL-quoted string starting after the opening quote; return (value, index after closing quote)."""
    out: List[str] = []
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\":
            if i + 1 >= n:
                break
            e = text[i + 1]
            simple = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}
            if e in simple:
                out.append(simple[e])
                i += 2
                continue
            if e in ("u", "U"):
                width = 4 if e == "u" else 8
                hexdigits = text[i + 2:i + 2 + width]
                if len(hexdigits) != width or not all(h in "0123456789abcdefABCDEF" for h in hexdigits):
                    raise ValueError("bad \\%s escape in address %r" % (e, address))
                out.append(chr(int(hexdigits, 16)))
                i += 2 + width
                continue
            raise ValueError("bad escape \\%s in address %r" % (e, address))
        # HCL template escapes: "$${" is a literal "${", "%%{" a literal "%{"
        if c in "$%" and text.startswith(c + c + "{", i):
            out.append(c + "{")
            i += 3
            continue
        out.append(c)
        i += 1
    raise ValueError("unterminated quoted key in address %r" % address)


def parse_address(address: str) -> Tuple[Token, ...]:
    """Split a terraform address into whole segments.

    ``module.a["k.x"].module.b.aws_instance.this[0]`` ->
    ``(name module)(name a)(key k.x)(name module)(name b)(name aws_instance)(name this)(index 0)``.
    Quoted keys may contain dots, brackets and escaped quotes.
    """
    if not isinstance(address, str) or not address.strip():
        raise ValueError("empty address")
    text = address.strip()
    tokens: List[Token] = []
    i = 0
    n = len(text)
    expect_name = True
    while i < n:
        if expect_name:
            j = i
            while j < n and text[j] not in _NAME_STOP:
                j += 1
            if j == i:
                raise ValueError("expected a name at position %d in address %r" % (i, address))
            tokens.append(("name", text[i:j]))
            i = j
            expect_name = False
            continue
        c = text[i]
        if c == ".":
            i += 1
            expect_name = True
            if i >= n:
                raise ValueError("address %r ends with a dot" % address)
            continue
        if c == "[":
            if i + 1 < n and text[i + 1] == '"':
                value, j = _decode_quoted(text, i + 2, address)
                if j >= n or text[j] != "]":
                    raise ValueError("expected ] after quoted key in address %r" % address)
                tokens.append(("key", value))
                i = j + 1
                continue
            j = text.find("]", i)
            if j < 0:
                raise ValueError("unterminated [ in address %r" % address)
            inner = text[i + 1:j]
            if not re.fullmatch(r"[0-9]+", inner):
                raise ValueError("index %r is neither a number nor a quoted key in address %r" % (inner, address))
            tokens.append(("index", int(inner)))
            i = j + 1
            continue
        raise ValueError("unexpected %r at position %d in address %r" % (c, i, address))
    return tuple(tokens)


_quote_key = hcl_string  # an address key is spelled as an HCL string


def format_address(tokens: Iterable[Token]) -> str:
    """Inverse of :func:`parse_address` (canonical spelling)."""
    parts: List[str] = []
    for kind, value in tokens:
        if kind == "name":
            parts.append(("." if parts else "") + value)
        elif kind == "key":
            parts.append("[" + _quote_key(value) + "]")
        else:
            parts.append("[%d]" % value)
    return "".join(parts)


def address_covered_by(address: str, entries: Iterable[str]) -> Optional[str]:
    """The whitelist entry whose segments are a prefix of ``address``'s, else None.

    ``module.instance_test`` covers ``module.instance_test.aws_instance.this``,
    ``module.instance_test["x"].aws_instance.this`` and ``module.instance_test[0]...``
    but never ``module.instance_test2...``. An exact entry covers itself.
    """
    return Whitelist(entries).covering(address)


class Whitelist:
    """Whitelist entries parsed once; a lookup costs one set probe per address segment."""

    def __init__(self, entries: Iterable[str]) -> None:
        self._by_tokens: Dict[Tuple[Token, ...], str] = {}
        for entry in entries:
            self._by_tokens.setdefault(parse_address(entry), entry)

    def covering(self, address: str) -> Optional[str]:
        addr = parse_address(address)
        for n in range(1, len(addr) + 1):
            hit = self._by_tokens.get(addr[:n])
            if hit is not None:
                return hit
        return None
