# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A leftover ``errored.tfstate`` in a root (issue 16, defect 5).

terraform writes ``errored.tfstate`` into the working directory when an apply changed
reality but the new state could not be written to the backend (endpoint down, lock lost,
permissions). The backend then holds the state from BEFORE that apply: a plan made now
would create again what the apply created (or miss what it destroyed). A root holding
such a file is therefore refused before its plan, with what to do:
``<binary> -chdir=<root> state push errored.tfstate``, then remove the file.

The role's apply runs under csis-tf-supervise, which pushes the file itself right after the
failed apply (``CSIS_TF_PUSH_WAIT``, the role's ``csis_state_push_wait``): a root holds one only
when that push failed too, or for an apply run outside the role.

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from typing import Any, Dict, Optional

from ..errors import CsisError

__all__ = ["ERRORED_STATE", "ErroredStateError", "errored_state", "check_errored_state"]

ERRORED_STATE = "errored.tfstate"


class ErroredStateError(CsisError):
    """A root holds the state of an apply that its backend never received."""


def errored_state(root: str) -> Optional[Dict[str, Any]]:
    """``{path, modified, serial, lineage, resources}`` of ``<root>/errored.tfstate``, or None
    when there is none (values it cannot read are None)."""
    path = os.path.join(os.path.abspath(root), ERRORED_STATE)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    info: Dict[str, Any] = {
        "path": path, "serial": None, "lineage": None, "resources": None,
        "modified": _dt.datetime.fromtimestamp(st.st_mtime, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    try:
        with open(path, "r", encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return info
    if isinstance(doc, dict):
        info["serial"] = doc.get("serial")
        info["lineage"] = doc.get("lineage")
        if isinstance(doc.get("resources"), list):
            info["resources"] = sum(len(r["instances"]) for r in doc["resources"]
                                    if isinstance(r, dict) and r.get("mode") == "managed"
                                    and isinstance(r.get("instances"), list))
    return info


def check_errored_state(root: str, binary: str = "terraform") -> None:
    """Raise :class:`ErroredStateError` (what happened, what to do) when ``root`` holds an
    ``errored.tfstate``; return quietly otherwise. Call it before every plan of a root."""
    info = errored_state(root)
    if info is None:
        return
    root = os.path.abspath(root)
    facts = ", ".join(part for part in (
        "written %s" % info["modified"],
        "serial %s" % info["serial"] if info["serial"] is not None else "",
        "lineage %s" % info["lineage"] if info["lineage"] else "",
        "%d managed resource instance(s)" % info["resources"] if info["resources"] is not None else "not readable",
    ) if part)
    raise ErroredStateError(
        "%s: terraform left %s (%s): an earlier apply changed reality but its state never reached the "
        "backend, so a plan now would be made against the state from before that apply. Push it first: "
        "%s -chdir=%s state push %s, then remove %s and run again"
        % (root, ERRORED_STATE, facts, binary, root, ERRORED_STATE, info["path"]))
