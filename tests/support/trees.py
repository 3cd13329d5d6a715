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
from typing import Any, Callable, List

import yaml

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


def read_meta(root: str, name: str) -> Any:
    """The records of meta-state file ``name`` (e.g. ``storage-state.yaml``) as the store reads
    them, whatever its on-disk layout: the empty shape when there are none. A test that checks
    what a run recorded asks the store, as every reader of the collection does."""
    import sys

    coll = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        ".venv", "collections")
    if coll not in sys.path:
        sys.path.insert(0, coll)
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState

    return MetaState(root).load(name)


def meta_files(root: str) -> dict:
    """{path relative to meta-state/: bytes} of every meta-state record file (the lock files, the
    audit trail, ``audit/`` and ``revision.yaml``, and the plan receipts excluded: history of who
    asked for and approved which plan, which a refused run extends, not records of what exists)."""
    base = os.path.join(root, "meta-state")
    out = {}
    for dirpath, dirs, names in os.walk(base):
        if dirpath == base:  # the audit trail is history, not records (a refused run extends it)
            dirs[:] = [x for x in dirs if x not in ("audit", "plan-receipts")]
            names = [n for n in names if n != "revision.yaml"]
        for n in sorted(names):
            if n.startswith(".") and n.endswith("lock"):
                continue
            p = os.path.join(dirpath, n)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, base)] = fh.read()
    return out


def write_meta(root: str, name: str, data: Any) -> None:
    """Write a meta-state file by hand, as a test's starting point (not through the store)."""
    os.makedirs(os.path.join(root, "meta-state"), exist_ok=True)
    with open(os.path.join(root, "meta-state", name), "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh)


def edit_yaml(root: str, rel: str, change: Callable[[Any], None]) -> None:
    """Load ``<root>/<rel>``, let ``change`` edit the data in place, write it back."""
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    change(data)
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)


def replace_text(path: str, old: str, new: str) -> None:
    """Replace ``old`` with ``new`` in the file at ``path``; ``old`` must be there (a test that
    edits a shipped file fails loudly when the file changes under it)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    assert old in text, (path, old)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text.replace(old, new))


def declare_s3_store(root: str, endpoint_url: str, prefix: str) -> None:
    """Give a copy of the example tree the S3 meta-state store on its S3 state backend, whose
    endpoint becomes ``endpoint_url`` (the store reads the tree's declaration, not a run's
    overlays), and put every root's terraform state there too: validate refuses a root on local
    state beside the S3 store, and the example's identity root keeps its state on the controller's
    disk. What checkouts that share nothing but the cloud (AWX jobs) need (docs/awx-setup.md)."""
    replace_text(os.path.join(root, "cfg", "state-backends.yml"), "url: http://127.0.0.1:5055", "url: %s" % endpoint_url)
    with open(os.path.join(root, "cfg", "_config.yml"), "a", encoding="utf-8") as fh:
        fh.write("meta_state:\n  backend: s3\n  state_backend: s3-east2\n  prefix: %s\n" % prefix)
    replace_text(os.path.join(root, "cfg", "group-builders.yml"), "state_configuration: local-state",
                 "state_configuration: s3-east2")
