# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The state query: compare meta-state with what the AWS endpoint reports, and its report.

Three layers, so that the classification is testable without an endpoint:

1. :func:`~.expectations.expectations` -- what meta-state (and the tree) say should exist;
2. :func:`~.lookups.observe` -- the boto3 lookups (by recorded id; errors kept as errors);
3. :func:`classify` (here) -- pure: expectations + observations -> the report
   (``drift`` lines, ``unavailable``, ``notes``, ``summary``).

:func:`query` runs the three, :func:`write_report` writes ``generated/state-report.json``
atomically, :func:`console_lines` / :func:`hard_lines` render it.

A report's HARD lines are also kept in meta-state (:data:`DRIFT_FILE`, :func:`record_hard`):
the report is a file of the checkout that ran the query, while meta-state is where every
checkout of the tree looks (an AWX job's fresh checkout, a second controller: the S3 store).
:func:`last_hard` is what the lifecycle runs' preflight and the graph read: the record when the
store holds one, else the checkout's report.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ..aws import efs_transition
from ..errors import CsisError, printable
from ..fsutil import read_json, write_atomic

if TYPE_CHECKING:  # pragma: no cover
    from ..aws import ClientFactory
    from ..config.secrets import Reveal

REPORT_NAME = "state-report.json"
#: the meta-state file holding the last state query's HARD lines (store.py ``FILES``)
DRIFT_FILE = "drift.yaml"
DRIFTS = ("missing", "stale", "foreign", "changed")
#: provider states in which a recorded active storage is healthy (a volume or filesystem
#: ``deleting``/``deleted`` is not present at all: lookups.py ``GONE_STORAGE_STATES``, ``missing``)
HEALTHY_STATES = ("available", "in-use", "active", "ready", "completed")
#: the mark of a reality entry whose record holds no id to look it up by (nothing was asked): its
#: ``present`` is null as an unavailable lookup's is, but a HARD line about it is not kept (:func:`_unseen`)
NOTHING_TO_LOOK_UP = "nothing_to_look_up"
#: instance states in which a launched instance is healthy
RUNNING_STATES = ("pending", "running")


class DriftError(CsisError):
    """The query cannot run at all (no tree, unreadable meta-state)."""


# --------------------------------------------------------------------------- classification
def _line(kind: str, name: str, drift: str, detail: str, hard: bool = False) -> Dict[str, Any]:
    return {"kind": kind, "name": name, "drift": drift, "detail": detail, "hard": hard}


def _describe(obs: Mapping[str, Any]) -> str:
    return "%s %s" % (obs.get("what") or "resource", obs.get("id"))


def _efs_expected(lc: Mapping[str, Any]) -> Dict[str, str]:
    out = {}
    if "ia_days" in lc:
        out["TransitionToIA"] = efs_transition(lc["ia_days"])
    if "archive_days" in lc:
        out["TransitionToArchive"] = efs_transition(lc["archive_days"])
    return out


def _s3_rule_matches(rule: Mapping[str, Any], lc: Mapping[str, Any]) -> bool:
    if rule.get("Status", "Enabled") != "Enabled":
        return False
    prefix = lc.get("prefix", "")
    flt = rule.get("Filter") or {}
    rule_prefix = flt.get("Prefix", rule.get("Prefix", ""))
    if (flt.get("And") or {}).get("Prefix") is not None:
        rule_prefix = flt["And"]["Prefix"]
    if (rule_prefix or "") != (prefix or ""):
        return False
    if lc.get("transition_days"):
        if not any(int(t.get("Days") or -1) == int(lc["transition_days"])
                   and t.get("StorageClass") == lc.get("storage_class") for t in rule.get("Transitions") or []):
            return False
    if lc.get("expire_days"):
        if int((rule.get("Expiration") or {}).get("Days") or -1) != int(lc["expire_days"]):
            return False
    return True


def lifecycle_gap(stype: str, declared: Optional[Mapping[str, Any]], obs: Mapping[str, Any]) -> Optional[str]:
    """What of the declared lifecycle the resource does not carry (None: all of it, or nothing declared)."""
    if not declared or "lifecycle" not in obs:
        return None
    if stype == "efs":
        want = _efs_expected(declared)
        have = obs.get("lifecycle") or {}
        miss = ["%s=%s" % (k, v) for k, v in sorted(want.items()) if have.get(k) != v]
        return ", ".join(miss) or None
    if stype == "s3":
        if any(_s3_rule_matches(r, declared) for r in obs.get("lifecycle") or []):
            return None
        bits = []
        if declared.get("transition_days"):
            bits.append("transition to %s after %s days" % (declared.get("storage_class"), declared["transition_days"]))
        if declared.get("expire_days"):
            bits.append("expiration after %s days" % declared["expire_days"])
        return " and ".join(bits) or "rule"
    return None


_FOREIGN_WHAT_TYPE = {"volume": "ebs", "snapshot": "ebs", "filesystem": "efs", "bucket": "s3"}


def classify(exps: Mapping[str, Any], reality: Mapping[str, Any], run: str = "") -> Dict[str, Any]:
    """Pure: expectations + observations -> the report (see docs/drift.md for the lines)."""
    tag = exps.get("tag")
    drift: List[Dict[str, Any]] = []
    unavailable: List[str] = []
    notes: List[str] = []
    rep_st: Dict[str, Any] = {}
    rep_in: Dict[str, Any] = {}
    storages = exps.get("storages") or {}
    obs_st = reality.get("storages") or {}

    # foreign resources that carry the Name of a storage recorded destroyed (or archived, for a
    # volume) are that storage's leftovers: stale, not foreign
    leftovers: Dict[str, List[Dict[str, Any]]] = {}
    foreign_items: List[Dict[str, Any]] = []
    for it in reality.get("foreign") or []:
        exp = storages.get(it.get("name")) if it.get("kind") == "storage" else None
        if (exp is not None and _FOREIGN_WHAT_TYPE.get(it["what"]) == exp["type"] and it["what"] != "snapshot"
                and (exp.get("recorded_state") == "destroyed"
                     or (exp.get("recorded_state") == "archived" and it["what"] == "volume"))):
            leftovers.setdefault(exp["name"], []).append(it)
        else:
            foreign_items.append(it)

    for name, exp in sorted(storages.items()):
        obs = obs_st.get(name) or {}
        rec = exp.get("recorded_state")
        rep_st[name] = {"present": obs.get("present"), "type": exp["type"], "id": obs.get("id"),
                        "state": obs.get("state"), "size": obs.get("size"), "tags": obs.get("tags") or {}}
        if name in obs_st and obs_st[name] == {}:
            rep_st[name][NOTHING_TO_LOOK_UP] = True  # no id recorded (lookups.lookup_storage): nothing asked
        if "error" in obs:
            rep_st[name]["present"] = None
            unavailable.append("storage %s: %s" % (name, obs["error"]))
            continue
        other = (obs.get("tags") or {}).get("csis_config")
        if obs.get("present") and other and tag and other != tag:
            notes.append("storage %s: %s carries csis_config=%s, another tree's tag (this tree is %s)"
                         % (name, _describe(obs), other, tag))
        if obs.get("others"):
            notes.append("storage %s: more %ss named %s: %s"
                         % (name, obs["what"], exp.get("archive"), ", ".join(obs["others"])))
        for it in leftovers.get(name, []):
            drift.append(_line("storage", name, "stale", "recorded %s but %s %s (Name %s) still exists"
                               % (rec, it["what"], it["id"], it["name"])))
        if rec is None:
            if obs.get("present"):
                drift.append(_line("storage", name, "foreign", "%s exists but meta-state has no record of it%s"
                                   % (_describe(obs), "" if exp.get("declared") else " (and it is not in the YAML)")))
            continue
        if rec == "destroyed":
            if obs.get("present"):
                drift.append(_line("storage", name, "stale", "recorded destroyed but %s still exists" % _describe(obs)))
            continue
        if not obs:
            what = {"ebs": "volume id", "efs": "filesystem id", "s3": "bucket name"}[exp["type"]]
            notes.append("storage %s: recorded %s but meta-state holds no %s to look it up by; record it with "
                         "state_import" % (name, rec, what))
            continue
        if not obs.get("present"):
            # a volume or filesystem being deleted (or deleted) is gone, as a terminated instance is
            detail = ("recorded %s but %s is %s" % (rec, _describe(obs), obs["state"]) if obs.get("state")
                      else "recorded %s but not found in reality (%s)" % (rec, _describe(obs)))
            drift.append(_line("storage", name, "missing", detail, hard=True))
            continue
        if obs.get("state") not in HEALTHY_STATES:
            drift.append(_line("storage", name, "stale", "recorded %s but %s is %s" % (rec, _describe(obs), obs.get("state"))))
        if obs.get("lifecycle_error"):
            unavailable.append("storage %s: lifecycle of %s: %s" % (name, _describe(obs), obs["lifecycle_error"]))
        gap = lifecycle_gap(exp["type"], exp.get("lifecycle"), obs) if rec == "active" else None
        if gap:
            drift.append(_line("storage", name, "stale", "declared lifecycle (%s) is not on %s" % (gap, _describe(obs))))

    obs_in = reality.get("instances") or {}
    for name, exp in sorted((exps.get("instances") or {}).items()):
        obs = obs_in.get(name) or {}
        rep_in[name] = {"present": obs.get("present"), "id": exp.get("instance_id"), "state": obs.get("state"),
                        "ami": obs.get("ami"), "private_ip": obs.get("private_ip")}
        if not exp.get("instance_id"):
            rep_in[name][NOTHING_TO_LOOK_UP] = True
            notes.append("instance %s: recorded launched but instance-state.yaml holds no instance id to look it up by"
                         % name)
            continue
        if "error" in obs:
            rep_in[name]["present"] = None
            unavailable.append("instance %s: %s" % (name, obs["error"]))
            continue
        iid = exp["instance_id"]
        if not obs.get("present"):
            detail = ("recorded launched but not found in reality (instance %s)" % iid if not obs.get("state")
                      else "recorded launched but instance %s is %s" % (iid, obs["state"]))
            drift.append(_line("instance", name, "missing", detail, hard=True))
            continue
        other = (obs.get("tags") or {}).get("csis_config")
        if other and tag and other != tag:
            notes.append("instance %s: instance %s carries csis_config=%s, another tree's tag (this tree is %s)"
                         % (name, iid, other, tag))
        if obs.get("state") not in RUNNING_STATES:
            drift.append(_line("instance", name, "stale", "recorded launched but instance %s is %s" % (iid, obs.get("state"))))
        booted, pin = obs.get("ami"), exp.get("pin") or exp.get("recorded_ami")
        if exp.get("is_pending"):
            pend = exp.get("pending")
            target = (pend.get("to") or pend.get("build")) if isinstance(pend, dict) else pend
            notes.append("instance %s: pending replacement: boots %s, pinned %s%s" % (
                name, booted, exp.get("pin"), (", to be replaced by %s" % target) if target else ""))
        elif booted and pin and booted != pin:
            drift.append(_line("instance", name, "changed", "instance %s boots %s but its pinned build is %s"
                               % (iid, booted, pin)))
        if exp.get("ephemeral"):
            # a run tears an ephemeral down after it passed (or failed under on_failure: teardown): one still
            # standing failed under keep (or its run was stopped), and stands until it is decommissioned
            verdict = exp.get("verification") or {}
            when = " at %s" % verdict["time"] if verdict.get("time") else ""
            why = ", its last verification failed%s: %s" % (when, verdict["failed"]) if verdict.get("ok") is False else ""
            notes.append("instance %s: ephemeral instance is STANDING (instance %s%s) until it is decommissioned: "
                         "undeclare it and run instance_image.yml with the root allowed to apply" % (name, iid, why))

    for it in sorted(foreign_items, key=lambda x: (x["kind"], x["name"], x["id"])):
        exp = storages.get(it["name"]) if it["kind"] == "storage" else None
        rec_inst = (exps.get("instances") or {}).get(it["name"]) if it["kind"] == "instance" else None
        extra = ""
        if exp is not None and _FOREIGN_WHAT_TYPE.get(it["what"]) == exp["type"]:
            managed = exp.get("volume_id") or exp.get("file_system_id") or (exp.get("bucket") if exp["type"] == "s3" else None)
            if managed and it["what"] != "snapshot":
                extra = "; the managed %s of storage %s is %s" % (it["what"], it["name"], managed)
        elif rec_inst is not None and rec_inst.get("instance_id"):
            extra = "; the managed instance %s is %s" % (it["name"], rec_inst["instance_id"])
        declared = (it["name"] in storages and storages[it["name"]].get("declared")) if it["kind"] == "storage" \
            else it["name"] in (exps.get("instances") or {})
        drift.append(_line(it["kind"], it["name"], "foreign", "%s %s (tagged csis_config=%s) exists but meta-state has no "
                           "record of it%s%s" % (it["what"], it["id"], tag, "" if declared else " (and it is not in the YAML)",
                                                 extra)))

    unavailable += list(reality.get("unavailable") or [])  # the foreign scans, after the records
    summary = {d: sum(1 for x in drift if x["drift"] == d) for d in DRIFTS}
    summary["hard"] = sum(1 for x in drift if x["hard"])
    summary["unavailable"] = len(unavailable)
    summary["notes"] = len(notes)
    return {"run": run, "tree": tag,
            "reality": {"storages": rep_st, "instances": rep_in,
                        "foreign": [{k: it.get(k) for k in ("kind", "what", "name", "id", "state", "runtime")}
                                    for it in reality.get("foreign") or []]},
            "drift": drift, "unavailable": unavailable, "notes": notes, "summary": summary}


# --------------------------------------------------------------------------- rendering
def drift_text(d: Mapping[str, Any]) -> str:
    return printable("%-8s %-8s %s: %s%s" % (d["drift"], d["kind"], d["name"], d["detail"], " [HARD]" if d.get("hard") else ""))


def console_lines(report: Mapping[str, Any]) -> List[str]:
    lines = [printable("state report for run %s" % report.get("run"))]
    lines += [printable("  unavailable: %s" % u) for u in report.get("unavailable") or []]
    lines += [printable("  note: %s" % n) for n in report.get("notes") or []]
    drift = report.get("drift") or []
    if drift:
        lines += ["  " + drift_text(d) for d in drift]
    elif report.get("unavailable"):
        lines.append("  no drift in what could be read (%d lookup(s) unavailable)" % len(report["unavailable"]))
    else:
        lines.append("  no drift: meta-state agrees with reality")
    return lines


def hard_lines(report: Mapping[str, Any], source: str = REPORT_NAME) -> List[str]:
    """The refusal lines of a report's HARD drift (what makes a lifecycle run refuse to start);
    ``source`` names where they were read (the report, or meta-state's :data:`DRIFT_FILE`)."""
    # one line each, whatever a run id or a hand-edited record holds (a newline, a terminal escape)
    return [printable("state: %s %s %s: %s (from %s; re-run 'state query' after fixing)"
                      % (d["drift"], d["kind"], d["name"], d["detail"], source))
            for d in report.get("drift") or [] if d.get("hard")]


def _hard_of(report: Mapping[str, Any]) -> List[Dict[str, str]]:
    """A report's HARD lines as meta-state keeps them (:data:`~.store.DRIFT_FIELDS`)."""
    from .store import DRIFT_FIELDS
    return [{k: str(d.get(k)) for k in DRIFT_FIELDS} for d in report.get("drift") or [] if d.get("hard")]


def _unseen(report: Mapping[str, Any]) -> set:
    """``(kind, name)`` of what the query could not look up: its lookup failed (``present`` null,
    an ``unavailable`` line), so the query cannot say whether a HARD line about it still holds.

    Not a subject with nothing to look up (``present`` null too, but marked
    :data:`NOTHING_TO_LOOK_UP`): its record holds no id any more (a storage forgotten, so
    ``forget.yml`` clears its ``missing`` line; a launch record without an instance id), and no
    lookup will ever see it, so keeping its line would refuse every run for good. A ``present``
    null without the mark (a report not written by :func:`classify`) counts as unseen: a line is
    never dropped on a guess."""
    reality = report.get("reality") or {}
    return {(kind, name) for kind, key in (("storage", "storages"), ("instance", "instances"))
            for name, seen in (reality.get(key) or {}).items()
            if isinstance(seen, dict) and seen.get("present") is None and seen.get(NOTHING_TO_LOOK_UP) is not True}


def _stored(data: Optional[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    """The drift record of meta-state's :data:`DRIFT_FILE` as loaded (None: the store holds
    none). A written record always has a ``run``; one with HARD lines and none (written by
    hand) is a record all the same: its lines are never ignored."""
    return data if data and (data.get("run") or data.get("hard")) else None


def damaged_record(exc: BaseException) -> BaseException:
    """A meta-state error about :data:`DRIFT_FILE` itself, with what to do about it: the record is
    derived (the query computes its lines anew), so removing it and querying again loses nothing."""
    from .store import MetaStateError
    text = str(exc)
    if isinstance(exc, MetaStateError) and DRIFT_FILE in text.split(":", 1)[0]:
        return MetaStateError("%s. It holds only the last state query's HARD lines: remove it and run "
                              "playbooks/state_query.yml again, which writes it anew" % text.rstrip("."))
    return exc


def record_hard(config_root: str, report: Mapping[str, Any], what: Optional[str] = None,
                write: bool = True) -> Dict[str, Any]:
    """Keep ``report``'s HARD lines in meta-state (:data:`DRIFT_FILE`), where every checkout of
    the tree reads them. A line of the record about something this query could not look up
    (:func:`_unseen`: the endpoint down, expired credentials) is kept: only a query that saw the
    thing clears its line. Written only when the lines differ from the record's (no record and
    no HARD line: nothing to write), in one transaction (the lock, an audit record). Returns
    ``{"where": the record's label, "changed": bool, "revision": the new revision or None,
    "kept": [the record's lines kept unseen]}`` (``write`` False: nothing is written, ``changed``
    says whether it would be). Raises :class:`~.store.MetaStateError` (not readable, not
    writable, the lock not obtained; a damaged record says how to replace it)."""
    from .store import MetaState
    ms = MetaState(config_root)
    found = _hard_of(report)
    unseen = _unseen(report)
    out: Dict[str, Any] = {"where": ms.objects.label(DRIFT_FILE), "changed": False, "revision": None, "kept": []}

    def wanted(data: Optional[Mapping[str, Any]]) -> Tuple[List[Dict[str, str]], List[Dict[str, str]]]:
        """(the lines the record should hold, those of them kept unseen); the record's lines as well"""
        stored = _stored(data)
        old = [dict(d) for d in (stored["hard"] if stored else [])]
        subjects = {(d["kind"], d["name"]) for d in found}
        kept = [d for d in old if (d["kind"], d["name"]) in unseen and (d["kind"], d["name"]) not in subjects]
        return found + kept, kept

    try:
        data = ms.load(DRIFT_FILE)
        lines, out["kept"] = wanted(data)
        if lines == ((_stored(data) or {}).get("hard") or []):
            return out
        if not write:
            out["changed"] = True
            return out
        with ms.transaction(what or "csis_state_query %s" % report.get("run"),
                            context={"run": report.get("run"), "hard": len(lines)}) as txn:
            data = txn.load(DRIFT_FILE)  # read again under the lock: another query may have written it
            lines, out["kept"] = wanted(data)
            if lines != ((_stored(data) or {}).get("hard") or []):
                txn.save(DRIFT_FILE, {"hard": lines, "run": str(report.get("run")),
                                      "time": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")})
    except Exception as exc:  # noqa: BLE001 - a damaged record gets its remedy; anything else as it is
        raised = damaged_record(exc)
        if raised is exc:
            raise
        raise raised from exc
    out.update(changed=bool(txn.written), revision=txn.revision)
    return out


def last_hard(config_root: str, stored: Optional[Mapping[str, Any]], where: str = DRIFT_FILE) -> Dict[str, Any]:
    """The HARD lines a lifecycle run must refuse on: ``{source, hard_drift, messages}``.

    Both places count, so a run refuses when either holds a line: meta-state's :data:`DRIFT_FILE`
    (``stored``, as loaded; its label ``where``), which the query of any checkout writes and
    every checkout reads, and this checkout's own ``generated/state-report.json`` (a query here
    whose record could not be written, a report from before the record existed). A line of the
    report names the report (the reference's message); a line only the record holds names the
    record and its query. A checkout whose report still holds a line another checkout cleared
    refuses until its own query runs again, as the message says. ``source``: what was read (the
    record's label, the report's path, both joined by " and ", or None when neither exists).
    Raises :class:`DriftError` when the report cannot be read."""
    report = read_report(config_root, strict=True)
    record = _stored(stored)
    mine = [dict(d) for d in (report or {}).get("drift") or [] if isinstance(d, dict) and d.get("hard")]
    messages = hard_lines({"drift": mine})
    seen = _hard_of({"drift": mine})  # as the record keeps them: the lines both hold are named once
    theirs = [dict(d, hard=True) for d in (record or {}).get("hard") or [] if d not in seen]
    if theirs:
        messages += hard_lines({"drift": theirs}, source="meta-state %s, state query %s"
                               % (DRIFT_FILE, (record or {}).get("run") or "unknown"))
    sources = ([where] if record is not None else []) + ([report_path(config_root)] if report is not None else [])
    return {"source": " and ".join(sources) or None, "hard_drift": mine + theirs, "messages": messages}


def report_path(config_root: str) -> str:
    return os.path.join(os.path.abspath(config_root), "generated", REPORT_NAME)


def _findings(report: Optional[Mapping[str, Any]]) -> Any:
    return None if report is None else [report.get(k) for k in ("drift", "unavailable", "notes")]


def report_changes(config_root: str, report: Mapping[str, Any]) -> bool:
    """Whether writing ``report`` would change the findings of the last one (check mode's answer)."""
    return _findings(read_report(config_root)) != _findings(report)


def write_report(config_root: str, report: Mapping[str, Any]) -> Tuple[str, bool]:
    """Write ``generated/state-report.json`` atomically; return (path, whether the findings changed)."""
    path = report_path(config_root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    changed = report_changes(config_root, report)
    write_atomic(path, (json.dumps(report, indent=2, sort_keys=True) + "\n").encode("utf-8"), mode=0o644)
    return path, changed


def read_report(config_root: str, strict: bool = False) -> Optional[Dict[str, Any]]:
    """The last report (None: none written yet). A report that cannot be read or parsed is
    None too, unless ``strict``: then :class:`DriftError` names the file."""
    path = report_path(config_root)
    try:
        report = read_json(path)
    except (OSError, ValueError, RecursionError) as exc:
        if strict:
            raise DriftError("%s: cannot be read (%s); run 'state query' again to rewrite it"
                             % (path, getattr(exc, "strerror", None) or exc)) from exc
        return None
    if report is None:
        return None
    problem = "is not a state report (a JSON object)" if not isinstance(report, dict) else _report_problem(report)
    if problem:
        if strict:
            raise DriftError("%s: %s; run 'state query' again to rewrite it" % (path, problem))
        return None
    return report


def _report_problem(report: Mapping[str, Any]) -> Optional[str]:
    """What makes a report's drift lines other than the query writes them (what the refusal and the
    record of its HARD lines read), or None."""
    from .store import DRIFT_FIELDS
    drift = report.get("drift")
    if drift is None:
        return None
    if not isinstance(drift, list):
        return "'drift' is not a list"
    for i, d in enumerate(drift):
        if not isinstance(d, dict):
            return "drift[%d] is not an object" % i
        if d.get("hard"):
            for field in DRIFT_FIELDS:
                if not isinstance(d.get(field), str) or not d[field]:
                    return "drift[%d] (a HARD line) has no %s" % (i, field)
    return None


def run_id() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


# --------------------------------------------------------------------------- entry point
def query(config_root: str, overlays: Iterable[str] = (), run: Optional[str] = None,
          factory: Optional[ClientFactory] = None, reveal: Optional[Reveal] = None) -> Dict[str, Any]:
    """Load the tree and meta-state, look everything up (a runtime's static keys revealed by
    ``reveal``: ``aws.tree_access``), classify. Writes nothing."""
    from ..aws import tree_access
    from ..config.loader import load_tree
    from ..config.validate import read_meta
    from .expectations import expectations
    from .lookups import observe
    tree = load_tree(config_root, overlays=overlays)
    meta, problems = read_meta(tree.root, ("storage-state.yaml", "launch-params.yaml", "instance-state.yaml",
                                           "pins.yaml", "verifications.yaml"))
    if problems:
        raise DriftError("\n".join(str(p) for p in problems))
    exps = expectations(tree, meta)
    reality = observe(exps, lambda rt: tree_access(tree, rt, reveal), factory)
    return classify(exps, reality, run or run_id())


#: the resource of each storage type that IS the storage (its data); a plan that creates it for
#: a storage meta-state records as existing would make a new, empty one
PRIMARY_RESOURCE = {"ebs": "aws_ebs_volume.this", "efs": "aws_efs_file_system.this", "s3": "aws_s3_bucket.this"}
#: recorded states in which a storage's data exists (the volume, filesystem or bucket; the archive snapshot)
EXISTING_STATES = ("active", "archived")


def check_recorded_storages(config_root: str, storages: Mapping[str, Mapping[str, Any]], overlays: Iterable[str] = (),
                            run: Optional[str] = None, factory: Optional[ClientFactory] = None,
                            reveal: Optional[Reveal] = None) -> Dict[str, Any]:
    """Before a root is planned: do the storages meta-state records as existing still exist?

    ``storages`` is the root's ``storages`` (name -> ``{"address", "type", ...}``, from the
    render). The storages of it recorded ``active`` or ``archived`` are looked up like the
    state query does (by recorded id; no foreign scan; ``reveal`` as :func:`query`) and classified by :func:`classify`.
    Returns ``{"checked": [names], "drift", "unavailable", "lines" (the report's lines),
    "hard" ([the drift lines of HARD drift]), "protect" ([addresses of the resources that
    must not be created: those of the storages recorded active])}``. Writes nothing.
    """
    from ..aws import tree_access
    from ..config.loader import load_tree
    from ..config.validate import read_meta
    from .expectations import expectations
    from .lookups import observe
    tree = load_tree(config_root, overlays=overlays)
    meta, problems = read_meta(tree.root, ("storage-state.yaml",))
    if problems:
        raise DriftError("\n".join(str(p) for p in problems))
    exps = expectations(tree, meta)
    mine = {n: e for n, e in exps["storages"].items() if n in storages and e.get("recorded_state") in EXISTING_STATES}
    narrowed = dict(exps, storages=mine, instances={})
    report = classify(narrowed, observe(narrowed, lambda rt: tree_access(tree, rt, reveal), factory, foreign=False),
                      run or run_id())
    protect = []
    for name, exp in sorted(mine.items()):
        address = (storages.get(name) or {}).get("address")
        if exp.get("recorded_state") == "active" and address and exp["type"] in PRIMARY_RESOURCE:
            protect.append("%s.%s" % (address, PRIMARY_RESOURCE[exp["type"]]))
    return {"checked": sorted(mine), "drift": report["drift"], "unavailable": report["unavailable"],
            "lines": console_lines(report)[1:], "protect": protect,
            "hard": [drift_text(d) for d in report["drift"] if d.get("hard")]}
