# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The one way tests copy a configuration tree: as shipped, never with what a run left in it.

A user may have run the playbooks on ``examples/`` in place (the README's first steps once
did, and ``scripts/demo`` did before it moved to ``.local/demo/``): ``generated/``,
``meta-state/``, ``state/`` and ``unmount-receipts/`` there are run output, not part of the
example. No test may depend on them, so every copy of a shipped tree goes through
:func:`copy_as_shipped`. The fixture trees under ``tests/fixtures`` keep their
``meta-state/``: there it is tracked input (``keep_meta_state=True``).
"""
from __future__ import annotations

import os
import shutil
from typing import List

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")

#: what a run writes at a tree's top level
RUN_OUTPUTS = ("generated", "meta-state", "state", "unmount-receipts")
#: what terraform leaves anywhere in a tree
TERRAFORM_DEBRIS = (".terraform", "tfplan", ".terraform.lock.hcl")


def copy_as_shipped(src: str, dest: str, keep_meta_state: bool = False) -> str:
    """Copy the tree ``src`` to ``dest`` without run output; return ``dest``.

    Nothing is linked next to the copy: without ``module_source_base`` the roots call the
    collection's own modules, which csis_render copies into ``generated/.modules/``.
    """
    top = os.path.abspath(src)
    skip_top = tuple(n for n in RUN_OUTPUTS if not (keep_meta_state and n == "meta-state"))

    def ignore(directory: str, names: List[str]) -> List[str]:
        out = [n for n in names if n in TERRAFORM_DEBRIS or n.endswith((".tfstate", ".tfstate.backup"))]
        if os.path.abspath(directory) == top:
            out += [n for n in names if n in skip_top]
        return out

    shutil.copytree(top, dest, symlinks=True, ignore=ignore)
    return dest
