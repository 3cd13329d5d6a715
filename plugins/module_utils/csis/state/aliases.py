# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The alias pool: ``meta-state/aliases.txt``, memorable names for new durable machines.

The pool is configuration an operator appends to by hand (one name per line; blank lines and
``#`` comments are ignored); csis.infra never writes it. A missing file means no aliases and
no error. Validation refuses a line that is not a legal hostname label, repeats another, or is
a declared instance name (:func:`pool_problems`).

**The draw.** A durable machine that a run will launch as a new generation (a first launch, a
follow or an upgrade replacement) takes the first name of the pool that is not taken; a
standing machine keeps its alias, an ephemeral one gets none. A dry run shows the name in the
launch parameters it would launch with and takes nothing: the alias becomes the machine's only
when the apply that launched it is recorded (``launch-params.yaml`` ``alias`` and the
generation in ``instance-state.yaml``).

**Retirement.** A name is taken while any launch record carries it and while any generation
of ``instance-state.yaml`` (the standing one, a closed one in its history, or one older than the
50 entries the history keeps: ``retired_aliases``) recorded it: the
alias of a replaced or decommissioned machine is retired, never drawn again for another
machine, also after ``playbooks/forget.yml`` (which closes the standing generation into the
history, as a decommission does).
"""
from __future__ import annotations

import os
import re
from typing import Any, Iterable, List, Mapping, Optional, Set, Tuple

from .store import META_STATE_DIR, MetaStateError

POOL = "aliases.txt"
#: a hostname label (RFC 1123): letters, digits and inner hyphens, at most 63 characters
LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def pool_path(config_root: str) -> str:
    return os.path.join(os.path.abspath(config_root), META_STATE_DIR, POOL)


def read_pool(config_root: str) -> List[Tuple[int, str]]:
    """``[(line number, name)]`` of the pool, in file order ([] without a pool file)."""
    path = pool_path(config_root)
    try:
        with open(path, "r", encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise MetaStateError("meta-state/%s: cannot be read: %s" % (POOL, exc)) from exc
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        name = line.strip()
        if name and not name.startswith("#"):
            out.append((number, name))
    return out


def pool_problems(pool: Iterable[Tuple[int, str]], declared: Iterable[str]) -> List[Tuple[int, str]]:
    """``[(line, message)]``: names that are not hostname labels, repeat an earlier line, or
    are a declared instance's name."""
    names = set(declared)
    seen = {}
    out = []
    for number, name in pool:
        if not LABEL.match(name):
            out.append((number, "alias %r is not a legal hostname label (lower-case letters, digits and inner "
                                "hyphens, at most 63 characters)" % name))
        elif name in seen:
            out.append((number, "alias '%s' repeats line %d" % (name, seen[name])))
        elif name in names:
            out.append((number, "alias '%s' is the name of a declared instance" % name))
        seen.setdefault(name, number)
    return out


def taken(meta: Mapping[str, Any]) -> Set[str]:
    """Every alias a launch record or a generation (standing or closed) carries."""
    out: Set[str] = set()
    for rec in ((meta.get("launch-params.yaml") or {}).get("instances") or {}).values():
        if isinstance(rec, dict) and rec.get("alias"):
            out.add(str(rec["alias"]))
    for rec in ((meta.get("instance-state.yaml") or {}).get("instances") or {}).values():
        if not isinstance(rec, dict):
            continue
        for gen in [rec.get("current")] + list(rec.get("history") or []):
            if isinstance(gen, dict) and gen.get("alias"):
                out.add(str(gen["alias"]))
        # the aliases of generations older than the history keeps (state/record.py add_history)
        out.update(str(a) for a in rec.get("retired_aliases") or [] if a)
    return out


class AliasPool:
    """The draw over one render: names handed out in this render count as taken."""

    def __init__(self, config_root: str, meta: Mapping[str, Any]) -> None:
        self.names = [n for _line, n in read_pool(config_root)]
        self.exists = os.path.exists(pool_path(config_root))
        self.taken = taken(meta)

    def draw(self) -> Optional[str]:
        for name in self.names:
            if name not in self.taken:
                self.taken.add(name)
                return name
        return None

    def empty_message(self, instance: str, hostname: str) -> str:
        return ("Instance %s: the alias pool is EMPTY; launching %s without an alias (append names to %s to "
                "refill it)" % (instance, hostname, POOL))
