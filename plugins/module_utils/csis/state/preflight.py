# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What a real lifecycle run checks before it renders, plans or applies anything.

* **HARD drift**: the last state query found no HARD line; each one refuses the run with the
  reference's message (:func:`~.drift.hard_lines`). The query keeps its HARD lines in meta-state
  (``drift.yaml``), so every checkout sees them (an AWX job's fresh one too); a store without
  that record falls back to this checkout's ``generated/state-report.json``
  (:func:`~.drift.last_hard`). Neither lets the run start; a report that cannot be read
  refuses it.
* **Meta-state can be read**: every meta-state file loads through the store, so its
  checks run (whole files, shapes, the files agreeing with each other).
* **Meta-state can be written**: when the run may apply, the store proves it could record
  what the apply did (:meth:`~.store.MetaState.check_writable`: a write probe and the lock),
  so an unwritable directory stops the run before the first plan instead of after the apply.
* **Meta-state outlives the run**: a real run that is an AWX job refuses the tree's local store
  (:func:`local_store_under_awx`), unless the operator said the checkout outlives the job.

:func:`preflight` runs the three and reports every finding at once; it writes nothing that
stays. Plain Python: importable without Ansible.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from ..errors import CsisError, printable
from .drift import DRIFT_FILE, DriftError, damaged_record, last_hard
from .backends import require_tree
from .store import FILES, MetaState, MetaStateError, NotWritable

#: what a refusal over meta-state adds: why it matters before anything runs
NOT_WRITABLE = ("a real run records in meta-state what it applies (a plan job its plan receipts), so it stops "
                "before planning anything; "
                "make it writable (its permissions, a read-only mount, chattr -i) and run again")


class PreflightError(CsisError):
    """A real run must not start: the problems say why (one line each)."""

    def __init__(self, problems: List[str], result: Optional[Dict[str, Any]] = None):
        self.result = dict(result or {})
        super().__init__("\n".join(problems), problems)


def hard_drift(config_root: str, ms: Optional[MetaState] = None,
               stored: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``{report, hard_drift, messages}``: the HARD lines of the last state query, from
    meta-state's ``drift.yaml`` or this checkout's report (:func:`~.drift.last_hard`; ``report``
    names the one read, None: neither exists). Raises :class:`~.drift.DriftError` (the report
    cannot be read) or :class:`~.store.MetaStateError` (the record cannot)."""
    ms = ms or MetaState(config_root)
    found = last_hard(config_root, ms.load(DRIFT_FILE) if stored is None else stored, ms.objects.label(DRIFT_FILE))
    return {"report": found["source"], "hard_drift": found["hard_drift"], "messages": found["messages"]}


def meta_state(config_root: str, write: bool = True, lock_timeout: float = 600.0,
               what: Optional[str] = None, ms: Optional[MetaState] = None,
               loaded: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``{path, exists, files, writable}``: (``write``) the write probe and the lock, then every
    meta-state file read through the store (``writable`` stays None without ``write``).
    ``loaded`` (a dict) receives every file as read, so the caller reads none twice.
    Raises :class:`~.store.MetaStateError` (:class:`~.store.NotWritable`: the write probe failed)."""
    ms = ms or MetaState(config_root, lock_timeout=lock_timeout)
    out: Dict[str, Any] = {"path": ms.where, "exists": ms.objects.exists(), "files": [], "writable": None}
    if write:
        try:
            out.update(ms.check_writable(what))
        except NotWritable as exc:
            raise NotWritable("%s; %s" % (exc, NOT_WRITABLE)) from exc
        out["writable"] = True
    ms.revision()  # the store's revision record: every commit reads it first
    for name in sorted(FILES):
        data = ms.load(name)
        if loaded is not None:
            loaded[name] = data
        if ms.exists(name):
            out["files"].append(name)
    return out


def local_store_under_awx(ms: MetaState, awx_job: Optional[str]) -> Optional[str]:
    """The refusal of a real run that is AWX job ``awx_job`` on the tree's local store, or None.

    An AWX job runs in a container of its own, on any execution node: what it records in the
    local store (records, plan receipts, approvals, the audit trail) is gone with the container,
    and its run lock (a lock file in that container) keeps no other job out."""
    awx_job = (awx_job or "").strip()
    if not awx_job or ms.objects.kind != "local":
        return None
    return ("meta-state is the tree's local store (%s), and this run is AWX job %s: what it records (records, plan "
            "receipts, approvals, the audit trail) would be gone with the job's container, and its run lock keeps no "
            "job on another execution node out, so the next job would plan as if nothing had been applied. Declare "
            "the S3 store for AWX (meta_state: {backend: s3, ...} in cfg/_config.yml, docs/awx-setup.md), or pass "
            "-e csis_awx_local_meta_state=true where the checkout outlives the job"
            % (ms.where, printable(str(awx_job))[:40]))


def preflight(config_root: str, write: bool = True, lock_timeout: float = 600.0,
              what: Optional[str] = None, awx_job: Optional[str] = None) -> Dict[str, Any]:
    """Run the checks (see the module docstring); return ``{hard_drift, report, meta_state}``
    or raise :class:`PreflightError` with every finding (its ``result`` holds what was found).
    ``awx_job`` (the AWX job id of a real run, when local meta-state is not accepted under AWX):
    a local store refuses the run (:func:`local_store_under_awx`)."""
    require_tree(config_root)  # a mistyped csis_config_root: refused before meta-state/ is created there
    problems: List[str] = []
    ms = MetaState(config_root, lock_timeout=lock_timeout)
    try:
        under_awx = local_store_under_awx(ms, awx_job)
    except MetaStateError:
        under_awx = None  # a store that cannot be opened: the check below names it
    if under_awx:
        problems.append(under_awx)
    directory = ms.dir
    result: Dict[str, Any] = {"hard_drift": [], "report": None,
                              "meta_state": {"path": directory, "exists": os.path.isdir(directory),
                                             "files": [], "writable": None}}
    loaded: Dict[str, Any] = {}
    try:
        result["meta_state"] = meta_state(config_root, write=write, lock_timeout=lock_timeout, what=what, ms=ms,
                                          loaded=loaded)
    except NotWritable as exc:
        problems.append(str(exc))
        result["meta_state"]["writable"] = False
    except MetaStateError as exc:
        problems.append(str(damaged_record(exc)))
    drift: List[str] = []  # named first, as before meta-state's own problems
    try:
        found = hard_drift(config_root, ms, loaded.get(DRIFT_FILE))  # read above, unless that failed
        result["hard_drift"], result["report"] = found["hard_drift"], found["report"]
        drift += found["messages"]
    except DriftError as exc:
        drift.append(str(exc))
    except MetaStateError as exc:  # a store that cannot be read at all is named once, by the check above
        if str(damaged_record(exc)) not in problems:
            drift.append(str(damaged_record(exc)))
    problems = drift + problems
    if problems:
        raise PreflightError(problems, result)
    return result
