# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""One entry point: load + validate a configuration tree with its meta-state."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import os

from .loader import ConfigError, Problem, Tree, load_tree_partial
from .metastate import MetaState, MetaStateError
from .validate import Validation, validate_tree

#: meta-state files the validators read
VALIDATE_META = ("storage-state.yaml", "launch-params.yaml", "pins.yaml", "instance-state.yaml", "verifications.yaml")


def read_meta(root: str, names: Iterable[str] = VALIDATE_META) -> Tuple[Dict[str, Any], List[Problem]]:
    ms = MetaState(root)
    out: Dict[str, Any] = {}
    problems: List[Problem] = []
    for n in names:
        try:
            out[n] = ms.load(n)
        except MetaStateError as exc:
            problems.append(Problem("", "", str(exc)))
    return out, problems


def load_and_validate(root: str, overlays: Iterable[str] = (), undeclare: Iterable[str] = (),
                      run_version: Optional[Callable[[str], Tuple[Optional[str], Optional[str]]]] = None,
                      extra: Iterable[Callable[[Validation], None]] = ()) -> Tuple[Tree, Dict[str, Any]]:
    """Return (tree, meta) or raise :class:`ConfigError` listing every problem."""
    tree, problems = load_tree_partial(root, overlays=overlays, undeclare=undeclare)
    if not os.path.isdir(tree.root):
        raise ConfigError(problems)
    meta, meta_problems = read_meta(tree.root)
    problems += meta_problems
    if not meta_problems and os.path.exists(os.path.join(tree.root, "cfg", "_config.yml")):
        # cross-file rules also run over what did load, so every error shows at once
        problems += validate_tree(tree, meta, run_version=run_version, extra=extra)
    if problems:
        raise ConfigError(problems)
    return tree, meta
