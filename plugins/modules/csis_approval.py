#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_approval
short_description: Receipt a gated plan (plan job) or check and record its approval (apply job, terminal run)
version_added: 0.2.0
description:
  - Keeps plan receipts and approval records in the meta-state store, one record per root
    (C(plan-receipts/<root>.yaml), local or S3, so an apply job on another AWX execution node
    finds what the plan job wrote). Every write is a meta-state transaction, so the audit trail
    records it too.
  - O(state=requested) (the plan job, C(csis_phase=plan)) writes the receipt of a gated plan, keyed
    by its digest (M(csis.infra.csis_gate_plan)'s C(plan_digest)), with O(summary), the requester
    O(by) (AWX's C(awx_user_name); the OS user when not given), O(job), O(workflow) and the time.
    Every named O(by) that planned the same digest is kept in C(requesters); a request without a
    name (a job a schedule launched) is kept in C(unnamed_requesters) and is no requester.
  - O(state=approved) checks, in this order, and refuses with one line naming the root otherwise
    - O(pinned), when given (the digest the plan job published and AWX passed on as
    C(csis_approved_plans)), equals O(plan_digest) (C(the plan differs from the one approved in
    the plan job)); with O(require_receipt) the store holds a plan job's receipt for O(plan_digest)
    (a bare digest passed as an extra var approves nothing) and, with O(receipt_max_age), is no older than
    that (C(a plan job receipted this plan ... ago, and approvals.receipt_max_age is ...)); with O(distinct_approver) the approver
    O(by) is named and none of the receipt's C(requesters), a receipt without any (only plan jobs
    AWX passed no C(awx_user_name)) is refused, and a V(prompt) or V(auto-approve) run, where one
    person is both, is refused. Then it appends the approval (approver, time, O(method), O(job),
    O(workflow), O(run_id)) to the receipt, writing the receipt first when there was none (a terminal
    run receipts and approves its own plan).
extends_documentation_fragment:
  - csis.infra.controller.config_root
  - csis.infra.attributes.worker
options:
  root:
    description: The root's key (C(<lifecycle>-<builder>), C(csis_root_item.key)).
    type: str
    required: true
  plan_digest:
    description: The gated plan's digest (M(csis.infra.csis_gate_plan)'s C(plan_digest)).
    type: str
    required: true
  state:
    description: V(requested) writes the plan job's receipt; V(approved) checks and records an approval.
    type: str
    choices: [requested, approved]
    required: true
  by:
    description:
      - The requester (V(requested)) or the approver (V(approved)), as AWX passes it (C(awx_user_name)).
      - When empty, the OS user running the module.
    type: str
    default: ''
  method:
    description: How the approval was given (V(approved) only).
    type: str
    choices: [awx, prompt, auto-approve]
    default: awx
  pinned:
    description:
      - The digest the plan job published for this root (C(csis_approved_plans[root]) in an apply job). When
        given it must equal O(plan_digest); V('') means the apply job got none.
    type: str
  require_receipt:
    description: The store must hold a plan job's receipt for O(plan_digest) (AWX apply jobs).
    type: bool
    default: true
  distinct_approver:
    description: The approver must differ from the requester (the tree's C(approvals.distinct_approver)).
    type: bool
    default: false
  receipt_max_age:
    description:
      - >-
        The tree's C(approvals.receipt_max_age) (V(8h), V(1d): a number and one of s, m, h, d, w). With
        O(require_receipt), a receipt older than that (its C(requested_at): the last plan job that gated the
        same plan) is refused, and so is one whose time cannot be read. V('') (the default) lets receipts
        stand however old.
    type: str
    default: ''
  summary:
    description: The gate's one-line summary, kept in the receipt.
    type: str
    default: ''
  job:
    description: The AWX job id (C(awx_job_id)) of the plan job (V(requested)) or of the apply job (V(approved)).
    type: str
    default: ''
  workflow:
    description: The AWX workflow job id (C(awx_workflow_job_id)).
    type: str
    default: ''
  lifecycle:
    description: The lifecycle, kept in the receipt and the audit record.
    type: str
    default: ''
  run_id:
    description: The csis run id.
    type: str
    default: ''
attributes:
  check_mode:
    support: full
    details: Checks the approval as O(state=approved) would and writes nothing; returns C(changed=true), as a real run would.
notes:
  - AWX passes the identity of a job's launcher (C(awx_user_name)), not the approval node's approver, to later jobs.
    With O(distinct_approver) the apply job must be launched by another user than the plan job (docs/awx.md, "Approvals").
"""

EXAMPLES = r"""
- name: Receipt the gated plan in the plan job
  csis.infra.csis_approval:
    config_root: "{{ csis_root }}"
    root: "{{ csis_root_item.key }}"
    plan_digest: "{{ gate.plan_digest }}"
    summary: "{{ gate.summary }}"
    state: requested
    by: "{{ awx_user_name | default('') }}"
    job: "{{ awx_job_id | default('') }}"

- name: The apply job applies only a receipted plan approved by someone else
  csis.infra.csis_approval:
    config_root: "{{ csis_root }}"
    root: "{{ csis_root_item.key }}"
    plan_digest: "{{ gate.plan_digest }}"
    state: approved
    method: awx
    pinned: "{{ csis_approved_plans[csis_root_item.key] | default('') }}"
    distinct_approver: true
    by: "{{ awx_user_name | default('') }}"
"""

RETURN = r"""
receipt:
  description: >-
    The receipt as written, approvals included; in check mode, the receipt a request would write, without the
    approvals it already holds.
  returned: success
  type: dict
  sample: {"requested_by": "alice", "requested_at": "2026-12-01T10:00:00Z", "plan_job": "41", "summary": "Plan: 1 to add, 0 to change, 0 to destroy",
           "approvals": [{"approved_by": "bob", "approved_at": "2026-12-01T10:20:00Z", "method": "awx", "apply_job": "44", "workflow": "40"}]}
approval:
  description: The approval this call recorded (O(state=approved)).
  returned: when O(state=approved)
  type: dict
where:
  description: The receipt's record in the meta-state store.
  returned: success
  type: str
  sample: meta-state/plan-receipts/storage-aws-ebs.yaml
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.apply import approvals
from ansible_collections.csis.infra.plugins.module_utils.csis.clock import parse_duration
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ROOT_ARGS, ModuleRun, argument_spec


def _run(module, p):
    common = dict(job=p["job"] or None, workflow=p["workflow"] or None, run_id=p["run_id"] or None,
                  lifecycle=p["lifecycle"] or None, check_mode=module.check_mode)
    if p["state"] == "requested":
        receipt = approvals.request(p["config_root"], p["root"], p["plan_digest"], summary=p["summary"],
                                    requested_by=p["by"] or None, **common)
        # a real run always writes the receipt (the approval's record): check mode says it would
        return dict(changed=True, receipt=receipt, where=approvals.where_of(p["config_root"], p["root"]))
    max_age = None
    if p["receipt_max_age"]:
        try:
            max_age = parse_duration(p["receipt_max_age"])
        except ValueError as exc:
            raise approvals.ApprovalRefused("receipt_max_age: %s" % exc) from None
    res = approvals.approve(p["config_root"], p["root"], p["plan_digest"], method=p["method"], approved_by=p["by"] or None,
                            pinned=p["pinned"], require_receipt=p["require_receipt"],
                            distinct_approver=p["distinct_approver"], summary=p["summary"],
                            max_age=max_age, max_age_text=p["receipt_max_age"], **common)
    return dict(changed=True, **res)


RUN = ModuleRun(_run, argument_spec(
    CONFIG_ROOT_ARGS,
    root=dict(type="str", required=True), plan_digest=dict(type="str", required=True),
    state=dict(type="str", required=True, choices=["requested", "approved"]),
    by=dict(type="str", default=""), method=dict(type="str", default="awx", choices=list(approvals.METHODS)),
    pinned=dict(type="str"), require_receipt=dict(type="bool", default=True),
    distinct_approver=dict(type="bool", default=False), summary=dict(type="str", default=""),
    receipt_max_age=dict(type="str", default=""),
    job=dict(type="str", default=""), workflow=dict(type="str", default=""),
    lifecycle=dict(type="str", default=""), run_id=dict(type="str", default=""),
), requires=("PyYAML",), failure=dict(changed=False), options=dict(supports_check_mode=True))


def main():
    RUN.main()


if __name__ == "__main__":
    main()
