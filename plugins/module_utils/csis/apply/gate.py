# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The plan gate.

The gate reads a saved plan as JSON (``terraform show -json <plan>``), refuses every
destroy (including both kinds of replacement) that no whitelist entry covers
(:mod:`.plan_verdict`, :mod:`.whitelist`), refuses a created or updated resource without
the tree's required tags (:func:`.plan_verdict.missing_tags`), refuses detaches without a successful unmount
receipt (:mod:`.receipts`), and refuses stale or missing plans (:mod:`.binding`).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Mapping, NoReturn, Optional

from ..errors import GateError, GateRefused
from ..terraform import show_json
from .binding import (binding_mismatch, binding_path, clear_gate, missing_plan_message, plan_path_of, planned_empty,
                      read_binding, record_gate, root_files, sha256_file, stale_root_message)
from .plan_verdict import PlanVerdict, change_lines, evaluate_plan, plan_content_digest, plan_diff
from .receipts import RECEIPTS_DIR, check_receipts


#: what ``show -json`` holds of an empty plan, as far as the gate reads it
EMPTY_PLAN: Dict[str, Any] = {"format_version": "1.2", "resource_changes": [], "errored": False}


def approver_view(verdict: PlanVerdict) -> Dict[str, Any]:
    """What the approver reads: ``change_lines`` (printed) and ``resource_changes`` (every
    touched address, its action and its changed attributes, sensitive values masked)."""
    return {"change_lines": change_lines(verdict),
            "resource_changes": [{"address": d["address"], "action": d["kind"], "actions": d["actions"],
                                  "attributes": d.get("attributes") or []} for d in verdict.details]}


def _evaluate(source: str, plan: Any, allow: List[str], refuse_create: Any, required_tags: Any) -> Any:
    """:func:`.plan_verdict.evaluate_plan`, a plan it cannot read named by where it came from."""
    try:
        return evaluate_plan(plan, allow, refuse_create, required_tags)
    except GateError as exc:
        raise GateError("%s: %s" % (source, exc)) from exc
    except RecursionError as exc:  # a value nested deeper than any resource's schema
        raise GateError("%s: a planned value is nested too deeply to be read; refusing" % source) from exc


def _digest(plan: Any, storage_steps: Iterable[Mapping[str, Any]] = ()) -> str:
    try:
        return plan_content_digest(plan, storage_steps)
    except (RecursionError, TypeError, ValueError) as exc:
        raise GateError("the plan's changes cannot be digested (%s); refusing" % exc.__class__.__name__) from exc


def run_gate(project_path: Optional[str] = None, plan_file: Optional[str] = None, *,
             plan_json: Optional[str] = None, binary_path: str = "terraform",
             allow_destroy: Iterable[str] = (), require_unmounted: Iterable[str] = (),
             receipts_dir: Optional[str] = None, receipts_since_binding: bool = True,
             refuse_create: Iterable[str] = (), required_tags: Iterable[str] = (),
             storage_steps: Iterable[Mapping[str, Any]] = (),
             check_mode: bool = False, env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """Evaluate a plan; return the verdict or raise :class:`GateRefused` / :class:`GateError`.

    With ``plan_file`` (the real path) the plan must exist and carry an open binding
    whose root content is unchanged; a pass records the plan's sha256 and the verdict
    in the binding (not in check mode), a refusal clears any earlier gate record.
    With ``plan_json`` (offline: an already-rendered ``show -json`` file) only the
    destroy and receipt checks run and no binding is involved.
    ``refuse_create``: addresses that must not be created (the resources of the storages
    meta-state records as existing, :func:`.plan_verdict.evaluate_plan`).
    ``required_tags``: tag keys every taggable resource the plan creates or updates must carry
    (the tree's ``config.required_tags``, :func:`.plan_verdict.missing_tags`).
    ``storage_steps``: the root's storage steps that touch data (the render's transitions other
    than ``record``), which ``plan_digest`` covers beside the plan's changes (what an AWX apply
    job's approval binds to: :func:`.plan_verdict.plan_content_digest`).
    """
    steps = list(storage_steps or ())
    allow = list(allow_destroy or ())
    required = list(require_unmounted or ())
    if bool(plan_file) == bool(plan_json):
        raise GateError("pass exactly one of plan_file or plan_json")
    root = os.path.abspath(project_path) if project_path else None
    result: Dict[str, Any] = {"changed": False}

    if plan_json:
        rdir = receipts_dir or os.path.join(root or os.getcwd(), RECEIPTS_DIR)
        problems = check_receipts(required, rdir)
        try:
            with open(plan_json, "r", encoding="utf-8") as fh:
                plan = json.load(fh)
        except (OSError, ValueError, RecursionError) as exc:
            raise GateError("cannot read plan JSON %s: %s" % (plan_json, exc))
        verdict = _evaluate(plan_json, plan, allow, refuse_create, required_tags)
        result.update(verdict.as_result())
        result["diff"] = plan_diff(verdict)
        result["plan_digest"] = _digest(plan, steps)
        result.update(approver_view(verdict))
        problems += verdict.violations
        if problems:
            result["violations"] = problems
            raise GateRefused(problems, result)
        return result

    if root is None:
        raise GateError("project_path is required with plan_file")
    plan_path = plan_path_of(root, plan_file)  # type: ignore[arg-type]
    result["plan_file"] = plan_path
    result["binding"] = binding_path(plan_path)
    binding = read_binding(plan_path)

    def refuse(messages: List[str]) -> NoReturn:
        if binding is not None and not check_mode:
            clear_gate(plan_path, binding)
        result["violations"] = messages
        raise GateRefused(messages, result)

    if not os.path.isfile(plan_path):
        refuse([missing_plan_message(plan_file)])
    if binding is None:
        refuse(["STALE PLANFILE: %s has no binding (%s missing or unreadable): csis_plan_binding "
                "state=opened must run just before the plan" % (plan_file, binding_path(plan_path))])
    msg = binding_mismatch(plan_file, binding, root, plan_path)  # type: ignore[arg-type]
    if msg:
        refuse([msg])
    rdir = receipts_dir or os.path.join(root, RECEIPTS_DIR)
    problems = check_receipts(required, rdir,
                              binding["opened"].get("time") if receipts_since_binding else None)
    stale = stale_root_message(plan_file, binding, root_files(root, plan_path))  # type: ignore[arg-type]
    if stale:
        refuse(problems + [stale])
    sha_before = sha256_file(plan_path)
    # terraform said this very plan is empty (csis_plan): nothing to read, no provider to start
    result["show_skipped"] = planned_empty(binding, sha_before)
    plan = EMPTY_PLAN if result["show_skipped"] else show_json(plan_path, root, binary_path, env)
    sha_after = sha256_file(plan_path)
    if sha_before != sha_after:
        refuse(problems + ["STALE PLANFILE: %s changed while the gate read it" % plan_file])
    verdict = _evaluate("%s (terraform show -json)" % plan_file, plan, allow, refuse_create, required_tags)
    result.update(verdict.as_result())
    result["diff"] = plan_diff(verdict)
    result["plan_sha256"] = sha_after
    result["plan_digest"] = _digest(plan, steps)
    result.update(approver_view(verdict))
    problems += verdict.violations
    if problems:
        refuse(problems)
    if not check_mode:
        record_gate(plan_path, binding, {"plan_sha256": sha_after, "allow_destroy": allow,
                                         "refuse_create": list(refuse_create or ()),
                                         "required_tags": list(required_tags or ()),
                                         "require_unmounted": required, "verdict": verdict.as_result()})
    return result
