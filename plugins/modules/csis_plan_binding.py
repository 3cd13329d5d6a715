#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r'''
---
module: csis_plan_binding
short_description: Bind a terraform plan file to the content of the root it was planned from
version_added: 0.1.0
description:
  - Keeps C(<plan_file>.csis-binding.json) next to the plan file, so that only a plan made from
    the root as it is now, and passed by M(csis.infra.csis_gate_plan), can be applied.
    File modification times are never trusted.
  - V(opened), run just before C(terraform plan) (after C(init)), deletes any old plan file and
    binding and records the sha256 of every file in the root that can affect the plan
    (C(*.tf), C(*.tf.json), C(*.tftpl), C(*.tfvars), C(*.tfbackend.hcl), C(.terraform.lock.hcl),
    every other non-hidden file except plan files, bindings, local state and unmount receipts;
    C(.terraform/) excluded) plus C(.terraform/modules/modules.json) and the files of every
    module directory it lists (local module sources included), the time and a random nonce.
  - M(csis.infra.csis_gate_plan) then checks the root is unchanged and records the plan's sha256.
  - >-
    V(verified), run just before C(terraform apply <plan_file>), fails with C(STALE PLANFILE: ...)
    unless the plan file exists, the gate passed it, its bytes are the ones the gate read, and
    the root's files are the ones recorded at the opening (the changed files are named).
  - >-
    With O(check_state), V(verified) also reads the root's state (as M(csis.infra.csis_record) reads it: the
    state object of an S3 or local backend directly, else C(terraform state pull)) and fails with
    C(STALE PLANFILE: ...) when it is not the state the plan file was made against (another lineage, another
    serial: terraform's own rule for a saved plan). terraform refuses such a plan file itself, but only at the
    apply: the role asks for this check before the steps it runs ahead of the apply (machines stopped before
    their volumes detach, archive snapshots, bucket wipes), so that a state another terraform run changed
    after the plan stops the root before any of them.
extends_documentation_fragment:
  - csis.infra.controller
  - csis.infra.attributes.worker
options:
  project_path:
    description: The terraform root.
    type: path
    required: true
  plan_file:
    description: The plan file, relative to O(project_path) unless absolute.
    type: path
    default: tfplan
  state:
    description:
      - V(opened) starts a new binding (run just before the plan).
      - V(verified) checks the binding (run just before the apply).
    type: str
    required: true
    choices: [opened, verified]
  check_state:
    description:
      - With V(verified), also require the root's state to be the one the plan file was made against.
      - A plan file that does not name its state (one OpenTofu encrypted) is not checked (RV(state_check) says so);
        a state that cannot be read fails the task.
    type: bool
    default: false
    version_added: 0.2.0
  binary_path:
    description: The terraform (or tofu) binary that reads the state with O(check_state) when its backend is not read directly.
    type: str
    default: terraform
    version_added: 0.2.0
notes:
  - Inputs outside the root (C(-var-file) elsewhere, C(TF_VAR_*) variables) are not part of the digest;
    terraform itself binds the plan to the state it was made against.
  - In check mode V(opened) writes and removes nothing and reports what it would do.
seealso:
  - module: csis.infra.csis_gate_plan
    description: Refuses unsanctioned destroys and stale plans.
attributes:
  check_mode:
    details: V(opened) writes and removes nothing and reports what it would do.
'''

EXAMPLES = r'''
- name: Open the binding (after init, before any unmount step and the plan)
  csis.infra.csis_plan_binding:
    project_path: "{{ root_dir }}"
    state: opened

# ... plan to tfplan, csis.infra.csis_gate_plan, approval, csis.infra.csis_apply_check ...

- name: Verify the plan is the one the gate passed, for the root as it is now
  csis.infra.csis_plan_binding:
    project_path: "{{ root_dir }}"
    state: verified

- name: Apply exactly that plan
  community.general.terraform:
    project_path: "{{ root_dir }}"
    plan_file: "{{ root_dir }}/tfplan"
    state: present
'''

RETURN = r'''
binding:
  description: Path of the binding file.
  returned: always
  type: str
  sample: /srv/cfg/generated/storage/aws-ebs/storage-generation/tfplan.csis-binding.json
plan_file:
  description: Absolute path of the plan file.
  returned: always
  type: str
root_digest:
  description: sha256 over the root's files as recorded at the opening.
  returned: always
  type: str
nonce:
  description: Random identifier of this binding.
  returned: always
  type: str
opened:
  description: UTC time the binding was opened.
  returned: always
  type: str
  sample: "2025-01-31T10:00:00Z"
files:
  description: Number of files in the digest.
  returned: when state=opened
  type: int
removed_plan:
  description: Whether an old plan file was (or, in check mode, would be) removed.
  returned: when state=opened
  type: bool
removed_binding:
  description: Whether an old binding file was (or, in check mode, would be) replaced.
  returned: when state=opened
  type: bool
plan_sha256:
  description: sha256 of the verified plan file.
  returned: when state=verified
  type: str
gated:
  description: UTC time the gate passed the plan (recorded in the binding).
  returned: when state=verified
  type: str
verdict:
  description: The gate's verdict recorded in the binding (counts, addresses, whitelisted, summary).
  returned: when state=verified
  type: dict
summary:
  description: The gate's one-line summary.
  returned: when state=verified
  type: str
state_check:
  description: What the state check found (O(check_state)).
  returned: when state=verified
  type: str
  sample: the state is the one the plan was made against
'''

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.binding import open_binding, verify_binding
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError, GateRefused
from ansible_collections.csis.infra.plugins.module_utils.csis.module import ModuleRun, fail_from


def _run(module, p):
    try:
        if p['state'] == 'opened':
            return open_binding(p['project_path'], p['plan_file'], check_mode=module.check_mode)
        return verify_binding(p['project_path'], p['plan_file'], check_state=p['check_state'], binary=p['binary_path'])
    except GateRefused as exc:
        fail_from(module, exc, problems_key="violations", changed=False)
    except (CsisError, OSError) as exc:
        fail_from(module, exc, prefix="plan binding: ", changed=False)


RUN = ModuleRun(_run, dict(
    project_path=dict(type='path', required=True),
    plan_file=dict(type='path', default='tfplan'),
    state=dict(type='str', required=True, choices=['opened', 'verified']),
    check_state=dict(type='bool', default=False),
    binary_path=dict(type='str', default='terraform'),
), options=dict(supports_check_mode=True))


def main():
    RUN.main()


if __name__ == '__main__':
    main()
