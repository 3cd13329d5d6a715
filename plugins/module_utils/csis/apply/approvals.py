# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Plan receipts and approval records, kept in the meta-state store (``plan-receipts/<root>.yaml``).

* A **plan job** (``csis_phase=plan``) that gated a plan with changes writes a *receipt* for
  the root: the plan's digest (:func:`.plan_verdict.plan_content_digest`), its summary, the
  requester (the plan job's ``awx_user_name``, or the OS user), the job and workflow ids and
  the time (:func:`request`).
* An **apply job** (``csis_phase=apply``) applies a root only when (:func:`approve`):
  the digest AWX passed from the plan job (``csis_approved_plans``) equals its own plan's
  digest, *and* the store holds a receipt for that digest that a plan job of this tree wrote
  (an extra var alone approves nothing), *and*, with ``approvals.distinct_approver`` set in
  ``cfg/_config.yml``, its launcher differs from the receipt's requester.
* A **terminal run** (``csis_phase=all``) writes the receipt and the approval at once, after
  the prompt (or ``csis_auto_approve``), naming the OS user.

Every approval is appended to the receipt (who, when, which job and workflow, how), and the
store's audit trail records the transaction. At most :data:`KEEP` receipts stay per root
(the oldest go first).

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import getpass
import hashlib
import os
import re
from typing import Any, Dict, List, Mapping, Optional

from .. import clock
from ..config.names import NAME_RE
from ..errors import CsisError
from ..state.backends import now_iso
from ..state.store import MetaState, record_object

__all__ = ["ApprovalRefused", "RECEIPTS", "KEEP", "METHODS", "approve", "os_user", "receipt_key", "receipts_of", "request", "where_of"]

RECEIPTS = "plan-receipts.yaml"
KEEP = 20
#: how an approval was given
METHODS = ("awx", "prompt", "auto-approve")


class ApprovalRefused(CsisError):
    """The apply of this plan is not approved; the message says why."""


def os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers): the uid
        return "uid-%d" % os.getuid()


def receipt_key(root_key: str) -> str:
    """The record name of a root's receipts: the root key, or (too long for a record name)
    its first 48 characters and a hash."""
    if NAME_RE.match(root_key or ""):
        return root_key
    digest = hashlib.sha256((root_key or "").encode("utf-8")).hexdigest()[:12]
    head = "".join(c if c.isalnum() or c in "_.-" else "_" for c in (root_key or "root"))[:48].lstrip("_.-") or "root"
    return "%s-%s" % (head, digest)


def _short(digest: str) -> str:
    return (digest or "")[:12]


def where_of(config_root: str, root_key: str) -> str:
    """The receipt record of ``root_key`` as messages name it (path or S3 URL)."""
    return MetaState(config_root).objects.label(record_object(RECEIPTS, receipt_key(root_key)))


def receipts_of(config_root: str, root_key: str) -> Dict[str, Any]:
    """The receipts of one root (``{digest: receipt}``), read without a lock."""
    rec = MetaState(config_root).load_record(RECEIPTS, receipt_key(root_key)) or {}
    plans = rec.get("plans")
    return dict(plans) if isinstance(plans, dict) else {}


def _trim(plans: Dict[str, Any]) -> Dict[str, Any]:
    if len(plans) <= KEEP:
        return plans
    keep = sorted(plans, key=lambda d: str((plans[d] or {}).get("requested_at") or ""))[-KEEP:]
    return {d: plans[d] for d in plans if d in keep}


_DIGEST = re.compile(r"[0-9a-f]{64}")


def _check_digest(root_key: str, digest: str, what: str) -> None:
    """Refuse a missing or malformed plan digest (the gate's ``plan_digest``: 64 hex characters)."""
    if not digest:
        raise ApprovalRefused("%s: no plan digest to %s (the gate returns plan_digest)" % (root_key, what))
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ApprovalRefused("%s: %r is not a plan digest (64 hex characters, the gate's plan_digest); nothing to %s"
                              % (root_key, str(digest)[:80], what))


def _record(tx: Any, root_key: str) -> Dict[str, Any]:
    rec = tx.load_record(RECEIPTS, receipt_key(root_key)) or {}
    plans = rec.get("plans") if isinstance(rec.get("plans"), dict) else {}
    return {"root": root_key, "plans": dict(plans)}


def request(config_root: str, root_key: str, digest: str, *, summary: str = "", requested_by: Optional[str] = None,
            job: Optional[str] = None, workflow: Optional[str] = None, run_id: Optional[str] = None,
            lifecycle: Optional[str] = None, check_mode: bool = False) -> Dict[str, Any]:
    """Write (or refresh) the receipt of ``digest`` for ``root_key``. Returns it.

    ``requested_by``: the plan job's launcher as AWX passes it (``awx_user_name``). Without it (a
    job a schedule launched, a run outside AWX) the receipt names the OS user, but as an unnamed
    request (``unnamed_requesters``), not as one of ``requesters``: the OS user of an execution
    node is nobody's name, so ``approvals.distinct_approver`` cannot check it against an approver."""
    _check_digest(root_key, digest, "receipt")
    receipt = {"requested_by": requested_by or os_user(), "requested_at": now_iso(), "plan_job": job,
               "workflow": workflow, "run": run_id, "lifecycle": lifecycle, "summary": summary}
    receipt = {k: v for k, v in receipt.items() if v not in (None, "")}
    if check_mode:
        return receipt
    ms = MetaState(config_root)
    with ms.transaction(what="csis.infra plan receipt %s" % root_key,
                        context={"root": root_key, "plan_digest": digest, "lifecycle": lifecycle, "run": run_id}) as tx:
        rec = _record(tx, root_key)
        old = rec["plans"].get(digest) or {}
        receipt["approvals"] = list(old.get("approvals") or [])
        # everyone who asked for this very plan (a later plan job of the same digest refreshes the
        # receipt): approvals.distinct_approver refuses an approver who is any of them
        requesters = _requesters(old)
        unnamed = _unnamed(old)
        mine = requesters if requested_by else unnamed
        if receipt["requested_by"] not in mine:
            mine.append(receipt["requested_by"])
        receipt["requesters"] = requesters[-KEEP:]
        if unnamed:
            receipt["unnamed_requesters"] = unnamed[-KEEP:]
        rec["plans"][digest] = receipt
        rec["plans"] = _trim(rec["plans"])
        tx.save_record(RECEIPTS, receipt_key(root_key), rec)
    return receipt


def _requesters(receipt: Mapping[str, Any]) -> List[str]:
    """Who asked for a receipted plan, by the names AWX passed: its ``requesters`` (a receipt
    written before there was such a list: its ``requested_by``). A plan job that AWX passed no
    name is not among them (``unnamed_requesters``)."""
    if "requesters" in receipt:
        return [r for r in receipt.get("requesters") or [] if isinstance(r, str) and r]
    last = receipt.get("requested_by")
    return [last] if isinstance(last, str) and last else []


def _unnamed(receipt: Mapping[str, Any]) -> List[str]:
    """The OS users of the plan jobs of a receipted plan that AWX passed no name (not requesters)."""
    return [u for u in receipt.get("unnamed_requesters") or [] if isinstance(u, str) and u]


#: how far ahead of this machine's clock a receipt's time may be (the plan job's node's clock) and
#: still count as written now
CLOCK_SKEW = 300


def _check_age(root_key: str, digest: str, receipt: Mapping[str, Any], max_age: int, max_age_text: str,
               where: str) -> None:
    """Refuse a receipt older than ``max_age`` seconds, or one whose time cannot be read."""
    what = "approvals.receipt_max_age is %s (cfg/_config.yml)" % (max_age_text or "%d s" % max_age)
    then = clock.parse(receipt.get("requested_at"))
    if then is None:
        raise ApprovalRefused("%s: %s, and the receipt of this plan (%s) in %s has no readable requested_at (%r); "
                              "run the workflow from its plan job again; not applying"
                              % (root_key, what, _short(digest), where, receipt.get("requested_at")))
    age = (clock.parse(now_iso()) - then).total_seconds()  # type: ignore[operator]
    if age < -CLOCK_SKEW:
        raise ApprovalRefused("%s: %s, and the receipt of this plan (%s) in %s is dated %s, %s ahead of this "
                              "machine's clock: its age cannot be told. Check the clocks of the plan job's and this "
                              "job's nodes, then run the workflow from its plan job again; not applying"
                              % (root_key, what, _short(digest), where, receipt.get("requested_at"), clock.age_text(-age)))
    if age > max_age:
        raise ApprovalRefused(
            "%s: a plan job receipted this plan (%s) at %s, %s ago, and %s: an approval that old is not applied. "
            "Run the workflow from its plan job again (a plan job that gates the same plan refreshes its receipt); "
            "not applying" % (root_key, _short(digest), receipt.get("requested_at"), clock.age_text(age), what))


def approve(config_root: str, root_key: str, digest: str, *, method: str, approved_by: Optional[str] = None,
            pinned: Optional[str] = None, require_receipt: bool = True, distinct_approver: bool = False,
            job: Optional[str] = None, workflow: Optional[str] = None, run_id: Optional[str] = None,
            lifecycle: Optional[str] = None, summary: str = "", check_mode: bool = False,
            max_age: Optional[int] = None, max_age_text: str = "") -> Dict[str, Any]:
    """Check that ``digest`` may be applied and record who approved it; raise
    :class:`ApprovalRefused` otherwise. Returns ``{"receipt", "approval"}``.

    ``pinned``: the digest the plan job published and AWX passed on (``csis_approved_plans``;
    None: not an AWX apply job). ``require_receipt``: the store must hold a plan job's receipt
    for ``digest`` (AWX apply jobs); without it (terminal runs) the receipt is written here.
    ``max_age`` (seconds; ``approvals.receipt_max_age``, as written: ``max_age_text``): that
    receipt must be younger (its ``requested_at``: the last plan job that gated the same plan).
    """
    if method not in METHODS:
        raise ApprovalRefused("%s: approval method %r is not one of %s" % (root_key, method, ", ".join(METHODS)))
    _check_digest(root_key, digest, "approve")
    if pinned is not None and pinned != digest:
        raise ApprovalRefused("%s: the plan differs from the one approved in the plan job (%s != %s); not applying"
                              % (root_key, pinned or "none approved", digest))
    approver = approved_by or os_user()
    ms = MetaState(config_root)
    where = ms.objects.label(record_object(RECEIPTS, receipt_key(root_key)))
    approval = {"approved_by": approver, "approved_at": now_iso(), "method": method, "apply_job": job,
                "workflow": workflow, "run": run_id}
    approval = {k: v for k, v in approval.items() if v not in (None, "")}

    def decide(receipt: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        if receipt is None and require_receipt:
            raise ApprovalRefused(
                "%s: no plan job receipted this plan (%s): %s holds no receipt for it. An apply job applies only a "
                "plan that a plan job of this tree gated and receipted in the meta-state store (an extra var alone "
                "approves nothing); run the workflow from its plan job; not applying" % (root_key, _short(digest), where))
        if receipt is not None and require_receipt and max_age:
            _check_age(root_key, digest, receipt, max_age, max_age_text, where)
        out = dict(receipt or {"requested_by": approver, "requested_at": approval["approved_at"], "run": run_id,
                               "lifecycle": lifecycle, "summary": summary})
        out = {k: v for k, v in out.items() if v not in (None, "")}
        if distinct_approver:
            if method != "awx":
                raise ApprovalRefused(
                    "%s: approvals.distinct_approver is set (cfg/_config.yml): the approver must differ from the "
                    "requester, and a %s run is both; apply through a plan job and an apply job launched by someone "
                    "else (docs/awx.md); not applying" % (root_key, "prompted" if method == "prompt" else "self-approved"))
            requesters = _requesters(out)
            if not requesters:
                unnamed = _unnamed(out)
                raise ApprovalRefused(
                    "%s: approvals.distinct_approver is set (cfg/_config.yml): no plan job of this plan was launched "
                    "by a named user (AWX passed no awx_user_name%s: a schedule, or a run outside AWX), so whether "
                    "its requester differs from the apply job's launcher cannot be checked; run the plan job as a "
                    "user, then the apply job as another; not applying"
                    % (root_key, "; it ran as OS user %s" % ", ".join(unnamed) if unnamed else ""))
            if not approved_by or approved_by in requesters:
                raise ApprovalRefused(
                    "%s: approvals.distinct_approver is set (cfg/_config.yml): the apply job's launcher (%s) must differ "
                    "from the plan job's requester (%s); not applying"
                    % (root_key, approved_by or "unknown: AWX passed no awx_user_name",
                       ", ".join(requesters) or "unknown"))
        out["approvals"] = (list(out.get("approvals") or []) + [approval])[-KEEP:]
        return out

    if check_mode:
        receipt = receipts_of(config_root, root_key).get(digest)
        return {"receipt": decide(receipt), "approval": approval, "where": where}
    with ms.transaction(what="csis.infra approval %s" % root_key,
                        context={"root": root_key, "plan_digest": digest, "lifecycle": lifecycle, "run": run_id}) as tx:
        rec = _record(tx, root_key)
        receipt = decide(rec["plans"].get(digest))
        rec["plans"][digest] = receipt
        rec["plans"] = _trim(rec["plans"])
        tx.save_record(RECEIPTS, receipt_key(root_key), rec)
        tx.note({"kind": "approval", "root": root_key, "plan_digest": digest,
                 "requested_by": receipt.get("requested_by"), "approved_by": approver, "method": method,
                 "workflow": workflow, "apply_job": job})
    return {"receipt": receipt, "approval": approval, "where": where}


def approvals_of(receipt: Mapping[str, Any]) -> List[Dict[str, Any]]:
    return [a for a in (receipt.get("approvals") or []) if isinstance(a, dict)]
