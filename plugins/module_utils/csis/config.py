# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""One entry point: load + validate a configuration tree with its meta-state."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import os
import re

from .loader import ConfigError, Problem, Tree, load_tree_partial
from .metastate import MetaState, MetaStateError
from .validate import Validation, validate_tree

#: meta-state files the validators read
VALIDATE_META = ("storage-state.yaml", "launch-params.yaml", "pins.yaml", "instance-state.yaml", "verifications.yaml")


def _meta_problem(name: str, exc: MetaStateError) -> Problem:
    """A meta-state error as a problem naming meta-state/<file> and, when known, the key."""
    text = str(exc)
    label = "meta-state/%s" % name
    if text.startswith(label + ": "):
        text = text[len(label) + 2:]
    key = ""
    mk = re.match(r"^'([^']+)' (.*)$", text, re.S)
    if mk:
        key, text = mk.group(1), mk.group(2)
    else:
        mk = re.match(r"^top-level key '([^']+)' (.*)$", text, re.S)
        if mk:
            key, text = mk.group(1), mk.group(2)
    return Problem(label, key, text)


def read_meta(root: str, names: Iterable[str] = VALIDATE_META) -> Tuple[Dict[str, Any], List[Problem]]:
    """Read the meta-state files the validators use. A file that does not load is
    reported and left out of the result (the rules that need it do not run)."""
    ms = MetaState(root)
    out: Dict[str, Any] = {}
    problems: List[Problem] = []
    for n in names:
        try:
            out[n] = ms.load(n)
        except MetaStateError as exc:
            problems.append(_meta_problem(n, exc))
    return out, problems


def load_and_validate(root: str, overlays: Iterable[str] = (), undeclare: Iterable[str] = (),
                      run_version: Optional[Callable[[str], Tuple[Optional[str], Optional[str]]]] = None,
                      extra: Iterable[Callable[[Validation], None]] = ()) -> Tuple[Tree, Dict[str, Any]]:
    """Return (tree, meta) or raise :class:`ConfigError` listing every problem.

    Reads only: the configuration tree, the overlays and ``meta-state/``. Writes nothing
    and makes no network call; the only process started is each declared executable's
    ``<binary> version -json`` (``run_version`` replaces it, e.g. in tests).
    """
    tree, problems = load_tree_partial(root, overlays=overlays, undeclare=undeclare)
    if not os.path.isdir(tree.root):
        raise ConfigError(problems)
    meta, meta_problems = read_meta(tree.root)
    problems += meta_problems
    # cross-file rules also run over what did load, so every error shows at once
    # (references into a file that did not load are not reported as dangling)
    problems += validate_tree(tree, meta, run_version=run_version, extra=extra)
    if problems:
        raise ConfigError(problems)
    return tree, meta
