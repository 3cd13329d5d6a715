# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""HCL emission: values from the configuration land as the literal text they were.

* :func:`string` escapes quotes, backslashes, control characters and the template
  sequences ``${`` and ``%{`` (doubled to ``$${`` / ``%%{``), so a tag or a name can
  never become an interpolation or a directive.
* :class:`Raw` marks a terraform expression written by csis.infra itself (references,
  ``templatefile(...)``); configuration values are never wrapped in it.
* :func:`template_literal` escapes text for a ``templatefile`` template (``.tftpl``).
* Output is in ``terraform fmt`` canonical form (aligned ``=`` in attribute runs).
"""
from __future__ import annotations

import re
from typing import Any, Iterable, List, Mapping, Sequence, Tuple, Union

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class Raw(str):
    """A terraform expression emitted verbatim."""


def string(value: str) -> str:
    out = ['"']
    i = 0
    n = len(value)
    while i < n:
        c = value[i]
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif c in "$%" and i + 1 < n and value[i + 1] == "{":
            out.append(c + c + "{")
            i += 2
            continue
        elif not c.isprintable():
            # what `terraform fmt` writes for a block label (hclwrite: every rune that Go's
            # unicode.IsPrint refuses: controls, format characters, separators but ' ')
            out.append(_escape(c))
        else:
            out.append(c)
        i += 1
    out.append('"')
    return "".join(out)


def _escape(c: str) -> str:
    return "\\u%04x" % ord(c) if ord(c) < 0x10000 else "\\U%08x" % ord(c)


def template_literal(text: str) -> str:
    """Escape ``text`` so that ``templatefile`` renders it unchanged."""
    return text.replace("${", "$${").replace("%{", "%%{")


def key(k: str) -> str:
    """An object key: bare when it is an identifier, quoted otherwise.

    ``for`` is always quoted: ``{ for = ...`` would parse as a ``for`` expression.
    A quoted key spells every non-ASCII character as an escape: ``terraform fmt`` aligns
    the ``=`` of a run by grapheme clusters (a combining accent, a ZWJ emoji sequence or a
    flag is one), which the code-point count of :func:`_attrs` cannot follow."""
    if _IDENT.fullmatch(k) and k != "for":  # fullmatch: "$" alone also matches before a final newline
        return k
    return "".join(_escape(c) if ord(c) > 0x7E else c for c in string(k))


def value(v: Any, indent: int = 0) -> str:
    pad = "  " * indent
    if isinstance(v, Raw):
        return str(v)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return string(v)
    if isinstance(v, (list, tuple)):
        if not v:
            return "[]"
        if all(not isinstance(x, (dict, list, tuple)) for x in v):
            return "[" + ", ".join(value(x, indent) for x in v) + "]"
        inner = ",\n".join(pad + "  " + value(x, indent + 1) for x in v)
        return "[\n" + inner + ",\n" + pad + "]"
    if isinstance(v, Mapping):
        if not v:
            return "{}"
        return "{\n" + _attrs([(key(str(k)), x) for k, x in v.items()], indent + 1) + pad + "}"
    raise TypeError("cannot encode %r as HCL" % (v,))


def _attrs(items: Sequence[Tuple[str, Any]], indent: int) -> str:
    """Attribute lines with ``terraform fmt`` alignment: a run of single-line values
    aligns its ``=``; a multi-line value stands alone (it ends the run before it and is
    not padded to it)."""
    pad = "  " * indent
    lines: List[str] = []
    run: List[Tuple[str, str]] = []

    def flush() -> None:
        if run:
            w = max(len(k) for k, _value in run)
            for k, s in run:
                lines.append("%s%s = %s\n" % (pad, k.ljust(w), s))
            run.clear()

    for k, v in items:
        s = value(v, indent)
        if "\n" in s:
            flush()
            run.append((k, s))
            flush()
        else:
            run.append((k, s))
    flush()
    return "".join(lines)


class Block:
    """``type "label" "label" { attrs; nested blocks }`` in fmt form."""

    def __init__(self, btype: str, *labels: str) -> None:
        self.btype = btype
        self.labels = labels
        self.items: List[Union[Tuple[str, Any], "Block", str]] = []

    def attr(self, name: str, v: Any) -> "Block":
        self.items.append((name, v))
        return self

    def attrs(self, pairs: Iterable[Tuple[str, Any]]) -> "Block":
        for k, v in pairs:
            self.attr(k, v)
        return self

    def block(self, btype: str, *labels: str) -> "Block":
        b = Block(btype, *labels)
        self.items.append(b)
        return b

    def comment(self, text: str) -> "Block":
        self.items.append("# " + text.replace("\n", " "))
        return self

    def render(self, indent: int = 0) -> str:
        pad = "  " * indent
        head = pad + self.btype + "".join(" " + string(x) for x in self.labels)
        if not self.items:
            return head + " {}\n"
        out = [head + " {\n"]
        pending: List[Tuple[str, Any]] = []
        prev_kind = None
        for it in self.items:
            kind = "attr" if isinstance(it, tuple) else ("block" if isinstance(it, Block) else "comment")
            if kind == "attr":
                if prev_kind == "block":
                    out.append("\n")
                pending.append(it)  # type: ignore[arg-type]
            else:
                if pending:
                    out.append(_attrs(pending, indent + 1))
                    pending = []
                if kind == "block":
                    if prev_kind is not None:
                        out.append("\n")
                    out.append(it.render(indent + 1))  # type: ignore[union-attr]
                else:
                    out.append(pad + "  " + str(it) + "\n")
            prev_kind = kind
        if pending:
            out.append(_attrs(pending, indent + 1))
        out.append(pad + "}\n")
        return "".join(out)


def document(*parts: Union[Block, str]) -> str:
    """Blocks and comment lines separated by blank lines."""
    chunks: List[str] = []
    for p in parts:
        if isinstance(p, Block):
            chunks.append(p.render())
        elif p:
            chunks.append(p if p.endswith("\n") else p + "\n")
    return "\n".join(chunks)


def comment_lines(text: str) -> str:
    return "".join("# %s\n" % line for line in text.splitlines())
