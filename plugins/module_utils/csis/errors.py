# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The errors the library raises on purpose.

Every one derives from :class:`CsisError`: a message and the list of problems behind it
(``problems``; empty when the message says it all). ``module.fail_from`` turns any of
them into a module failure. Plain Python: importable without Ansible.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence


class CsisError(Exception):
    """A message and the problems behind it (``str()`` is the message)."""

    def __init__(self, message: str = "", problems: Optional[Iterable[Any]] = None):
        self.problems = list(problems or ())
        if not message and self.problems:
            message = "\n".join(str(p) for p in self.problems)
        super().__init__(message)


@dataclass(frozen=True)
class Problem:
    """One finding in a configuration tree: the file, the key in it, what is wrong."""

    file: str
    key: str
    message: str

    def __str__(self) -> str:
        if not self.file:
            return printable(self.message)
        where = self.file + (": " + self.key if self.key else "")
        return printable("%s: %s" % (where, self.message))


def printable(text: str) -> str:
    """``text`` on one line: control and other unprintable characters (a newline in a file name,
    an escape sequence in a key) as Python escapes (``\\n``, ``\\x1b``), so a problem is one line
    that cannot forge another or drive the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class ConfigError(CsisError):
    """Raised with every problem found; ``str()`` lists them one per line."""

    def __init__(self, problems: Sequence[Problem]):
        super().__init__("\n".join(str(p) for p in problems), problems)


class MissingDependency(CsisError):
    """A Python library the operation needs is not installed on this host."""

    def __init__(self, library: str, error: Optional[str] = None):
        self.library = library
        self.error = error
        super().__init__("%s is required for this operation (%s)" % (library, error or "not installed"))


class GateError(CsisError):
    """The gate could not do its work (bad input, an unreadable plan)."""


class GateRefused(CsisError):
    """The gate, or a binding check, refuses: ``messages`` (also ``problems``) are the refusal
    lines, ``result`` what the gate found before refusing."""

    def __init__(self, messages: Sequence[str], result: Optional[Dict[str, Any]] = None):
        self.result = dict(result or {})
        super().__init__("\n".join(messages), messages)

    @property
    def messages(self) -> List[str]:
        return list(self.problems)
