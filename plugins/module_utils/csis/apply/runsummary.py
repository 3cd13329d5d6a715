# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""``generated/run-summary.json``: what the last run did, root by root.

Each root of a real run adds its entry when its chain ends, passed or failed (the
``csis.infra.tofu_root`` role's last step): the plan summary, the gate's verdict, whether it
applied, what meta-state recorded, and how long the run took for it. The roots of a lifecycle
run in parallel, so an entry is merged in under an exclusive lock
(``generated/.run-summary.lock``) and the file is replaced atomically. A run with another run
id starts the file afresh: the file always describes one run (``site.yml`` runs three
lifecycles under one run id).

It is a report, not meta-state: nothing reads it to decide anything. ``playbooks/summary.yml``
shows it (:func:`summary_lines`).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional

from ..clock import now
from ..errors import CsisError
from ..fsutil import read_json, write_json_atomic

RUN_SUMMARY = os.path.join("generated", "run-summary.json")
LOCK = os.path.join("generated", ".run-summary.lock")
VERSION = 1
#: what an entry may carry (anything else is dropped: the file stays a small, known shape)
ENTRY_KEYS = ("key", "lifecycle", "builder", "runtime", "status", "failed_step", "plan", "gate", "applied",
              "apply_failed", "recorded", "started", "finished", "seconds", "apply_seconds")


class RunSummaryError(CsisError):
    pass


def path_of(config_root: str) -> str:
    return os.path.join(os.path.abspath(config_root), RUN_SUMMARY)


@contextlib.contextmanager
def _locked(config_root: str) -> Iterator[None]:
    lock_path = os.path.join(os.path.abspath(config_root), LOCK)
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    with open(lock_path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def read(config_root: str) -> Optional[Dict[str, Any]]:
    """The last run's summary, or None when no real run wrote one. A damaged file is refused."""
    path = path_of(config_root)
    try:
        data = read_json(path)
    except (OSError, ValueError, RecursionError) as exc:
        raise RunSummaryError("%s: cannot be read as the run summary: %s" % (path, exc)) from exc
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("roots"), dict):
        raise RunSummaryError("%s: is not a csis.infra run summary (version %s)" % (path, VERSION))
    return data


def add_root(config_root: str, run_id: str, entry: Mapping[str, Any]) -> Dict[str, Any]:
    """Merge one root's entry into the summary of run ``run_id`` (a new run id starts afresh)."""
    if not run_id:
        raise RunSummaryError("a run summary entry needs the run id")
    key = str(entry.get("key") or "")
    if not key:
        raise RunSummaryError("a run summary entry needs the root's key")
    clean = normalise({k: entry[k] for k in ENTRY_KEYS if k in entry})
    with _locked(config_root):
        try:
            data = read(config_root)
        except RunSummaryError:
            data = None  # a damaged report is replaced: it decides nothing
        if data is None or data.get("run_id") != run_id:
            data = {"version": VERSION, "run_id": run_id, "started": clean.get("started") or now(), "roots": {}}
        data["roots"][key] = clean
        data["updated"] = now()
        starts = [r.get("started") for r in data["roots"].values() if r.get("started")]
        if starts:
            data["started"] = min([data.get("started") or starts[0]] + starts)
        data["totals"] = totals(data["roots"])
        write_json_atomic(path_of(config_root), data)
    return data


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1")
    return bool(value)


def normalise(entry: Dict[str, Any]) -> Dict[str, Any]:
    """Plain types whatever the templating gave (``"True"``, ``"12.5"``...)."""
    for k in ("applied", "apply_failed"):
        if k in entry:
            entry[k] = _bool(entry[k])
    for k in ("seconds", "apply_seconds"):
        if k not in entry:
            continue
        try:
            entry[k] = round(float(entry[k]), 1)
        except (TypeError, ValueError):  # "" (nothing applied), None, junk
            entry.pop(k)
    if "recorded" in entry:
        rec = entry["recorded"]
        entry["recorded"] = [str(x) for x in rec] if isinstance(rec, (list, tuple)) else ([str(rec)] if rec else [])
    gate = entry.get("gate")
    if gate is not None and not isinstance(gate, dict):
        entry["gate"] = {"verdict": str(gate)}
    for k in ("key", "lifecycle", "builder", "runtime", "status", "failed_step", "plan", "started", "finished"):
        if k in entry and entry[k] is not None:
            entry[k] = str(entry[k])
    return entry


def totals(roots: Mapping[str, Mapping[str, Any]]) -> Dict[str, int]:
    out = {"roots": len(roots), "applied": 0, "failed": 0, "refused": 0, "stopped": 0}
    for r in roots.values():
        out["applied"] += 1 if r.get("applied") else 0
        out["failed"] += 1 if r.get("status") == "failed" else 0
        out["stopped"] += 1 if r.get("status") == "stopped" else 0
        out["refused"] += 1 if (r.get("gate") or {}).get("verdict") == "refused" else 0
    return out


def summary_lines(data: Optional[Mapping[str, Any]]) -> List[str]:
    """One line per root, for ``playbooks/summary.yml``. The file is this checkout's: with a
    shared (S3) meta-state another checkout's later runs are in ``playbooks/history.yml``."""
    if not data:
        return ["no real run of this checkout has written generated/run-summary.json yet"]
    t = data.get("totals") or {}
    lines = ["this checkout's last real run %s (started %s): %s root(s), %s applied, %s failed, %s refused by the gate%s"
             % (data.get("run_id"), data.get("started"), t.get("roots", 0), t.get("applied", 0), t.get("failed", 0),
                t.get("refused", 0), ", %s stopped as another failed" % t["stopped"] if t.get("stopped") else "")]
    for key in sorted(data.get("roots") or {}):
        r = data["roots"][key]
        gate = r.get("gate") or {}
        parts = ["%s: %s" % (key, r.get("status"))]
        if r.get("failed_step"):
            parts.append("at '%s'" % r["failed_step"])
        if r.get("plan"):
            parts.append(str(r["plan"]))
        if gate.get("verdict"):
            parts.append("gate %s" % gate["verdict"])
        if r.get("apply_failed"):
            # terraform stopped partway: what it did before is in the root's state, not in meta-state
            # (an ephemeral root's launch pass may have applied and recorded before its teardown failed)
            applied = ("%s apply failed partway: resources may have been created, changed or destroyed before it "
                       "stopped, and what it did is not recorded (playbooks/state_query.yml compares meta-state with "
                       "the provider; the next run plans from the state)"
                       % ("an earlier pass of the root applied; this pass's" if r.get("applied") else "the"))
        else:
            applied = "applied" if r.get("applied") else "nothing applied"
        if r.get("applied") and r.get("apply_seconds") is not None:
            applied += " in %.0f s" % float(r["apply_seconds"])  # the apply's own time
        parts.append(applied)
        if r.get("recorded"):
            parts.append("recorded %s" % ", ".join(r["recorded"]))
        if r.get("seconds") is not None:
            # the root's whole pass: a lifecycle's roots go step by step together, so this includes
            # waiting for a slower sibling's step
            parts.append("%.0f s in all" % float(r["seconds"]))
        lines.append("; ".join(parts))
    return lines
