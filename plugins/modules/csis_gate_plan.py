#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r'''
---
module: csis_gate_plan
short_description: Refuse a terraform plan that destroys what nobody sanctioned, or that is stale
version_added: 0.1.0
description:
  - Reads a saved plan as JSON (C(<binary_path> show -json <plan_file>) run in O(project_path)
    with the collection's terraform CLI configuration) and classifies every resource change.
  - Every change whose actions include C(delete) is a destroy, so both replacement orders
    (C(["delete","create"]) and C(["create","delete"])) count; replacements are also reported
    on their own. C(["forget"]) (a C(removed) block) is reported but is not a destroy;
    C(read) and C(no-op) are ignored; an action the module does not know is refused.
  - >-
    Each destroy that no O(allow_destroy) entry covers is refused with
    C(DESTROY NOT WHITELISTED: <address>); all of them are listed.
  - >-
    Each taggable resource the plan creates, updates or replaces that lacks one of the O(required_tags)
    is refused with C(MISSING REQUIRED TAGS: <address> lacks <key>, <key>); all of them are listed.
  - >-
    Each O(require_unmounted) pair without a successful unmount receipt is refused with
    C(DETACH NOT UNMOUNTED: <instance>:<storage> has no successful unmount receipt).
  - >-
    The plan must be bound to the root's content by M(csis.infra.csis_plan_binding)
    (O(csis.infra.csis_plan_binding#module:state=opened) just before the plan). A missing
    plan, a plan without a binding, or a root whose files changed since the opening is
    refused with C(STALE PLANFILE: ...) naming the changed files. File times are not used.
  - >-
    A plan made by M(csis.infra.csis_plan) that terraform called empty is not read again: the binding
    records terraform's answer with the plan file's sha256, and only for those very bytes is C(show -json) skipped.
  - When the plan passes, the module records the plan file's sha256 and its verdict in the
    binding, for O(csis.infra.csis_plan_binding#module:state=verified) to check just before
    the apply. A refusal clears any earlier gate record.
extends_documentation_fragment:
  - csis.infra.controller
  - csis.infra.attributes.worker
options:
  project_path:
    description:
      - The terraform root the plan was made in. Required with O(plan_file).
    type: path
  plan_file:
    description:
      - The saved plan (C(terraform plan -out=...)), relative to O(project_path) unless absolute.
      - Mutually exclusive with O(plan_json).
    type: path
  plan_json:
    description:
      - An already-rendered C(show -json) output, for offline use and tests. No binding is
        read or written; only the plan checks (destroys, creates, tags) and the receipt checks run.
    type: path
  binary_path:
    description: The terraform or OpenTofu executable.
    type: str
    default: terraform
  allow_destroy:
    description:
      - Whitelist of addresses whose destroys are sanctioned. An entry covers the addresses
        it is a whole-segment prefix of (V(module.instance_test) covers
        V(module.instance_test.aws_instance.this), V(module.instance_test["x"].aws_instance.this)
        and V(module.instance_test[0].aws_instance.this), never
        V(module.instance_test2.aws_instance.this)); an exact address covers itself.
    type: list
    elements: str
    default: []
  refuse_create:
    description:
      - >-
        Addresses of resources that must never be created (the volume, filesystem or bucket of
        each storage meta-state records as existing, from M(csis.infra.csis_storage_check)).
        A plan that creates one (not a replacement, which is a destroy) is refused with
        C(RECORDED STORAGE WOULD BE CREATED: <address>: ...). An entry covers itself and its
        indexed instances (V(<address>[0])).
    type: list
    elements: str
    default: []
  required_tags:
    description:
      - >-
        Tag keys every taggable resource being created or updated (replacements included) must carry:
        the tree's C(config.required_tags), which M(csis.infra.csis_render) returns in each root's C(required_tags).
      - >-
        A resource is taggable when its planned values (C(after)) have a C(tags_all) or C(tags) attribute.
        A key counts when it is in C(tags_all) (where the provider's C(default_tags) land) or C(tags); a key
        whose value is known only after the apply counts, a tag map known only after the apply names no key.
      - Empty (the default) checks no tag.
    type: list
    elements: str
    default: []
  storage_steps:
    description:
      - >-
        The root's storage steps that touch data and that the plan does not show, such as the deletion of
        an archive snapshot when an archived storage is destroyed: the transitions other than C(record) that
        M(csis.infra.csis_render) returns in each root's C(transitions_before) and C(transitions_after).
      - >-
        RV(plan_digest) covers them beside the plan's changes, so an AWX apply job whose root would take
        other storage steps than its plan job's (an empty plan both times) is refused, not approved by the
        receipt of another empty plan. Empty (the default) leaves the digest the plan's alone.
    type: list
    elements: dict
    default: []
  require_unmounted:
    description:
      - V(<instance>:<storage>) pairs that must have a successful unmount receipt
        C(<receipts_dir>/<instance>__<storage>.json) (JSON, matching names, C(ok) true).
    type: list
    elements: str
    default: []
  receipts_dir:
    description: Where unmount receipts are. Default C(<project_path>/unmount-receipts).
    type: path
  receipts_since_binding:
    description:
      - Refuse receipts whose C(time) is before the binding was opened, so a receipt left by an
        earlier run does not count (open the binding before the unmount step). Ignored with O(plan_json).
    type: bool
    default: true
notes:
  - Check mode evaluates the plan fully but does not write the binding.
  - Diff mode returns the touched addresses before and after the plan. The gate always returns C(changed=false), and
    Ansible's callbacks print a diff only for a changed result, so read it from the registered result (the
    C(csis.infra.tofu_root) role's approval step prints the same changes).
  - Always returns C(changed=false).
seealso:
  - module: csis.infra.csis_plan_binding
    description: Binds the plan file to the root's content.
  - module: csis.infra.csis_apply_check
    description: Re-reads the apply flags just before the apply.
attributes:
  diff_mode:
    support: partial
    details: >-
      Returns the classified changes of the plan as C(diff); the result is never changed, so Ansible's callbacks do
      not print it (read it from the registered result, or the approval step that prints the same changes).
'''

EXAMPLES = r'''
- name: Open the plan binding (just before the plan)
  csis.infra.csis_plan_binding:
    project_path: "{{ root_dir }}"
    plan_file: tfplan
    state: opened

- name: Plan
  community.general.terraform:
    project_path: "{{ root_dir }}"
    plan_file: "{{ root_dir }}/tfplan"
    state: planned

- name: Gate the plan
  csis.infra.csis_gate_plan:
    project_path: "{{ root_dir }}"
    plan_file: tfplan
    allow_destroy:
      - module.instance_test
      - module.instance_web.aws_volume_attachment.this
    require_unmounted:
      - web:data
    required_tags: [BillingCode, Owner]
'''

RETURN = r'''
adds:
  description: Resources to create (replacements included).
  returned: when the plan was read
  type: int
  sample: 2
changes:
  description: Resources to update in place.
  returned: when the plan was read
  type: int
  sample: 0
destroys:
  description: Resources to destroy (pure destroys plus replacements).
  returned: when the plan was read
  type: int
  sample: 1
replacements:
  description: Resources to replace (either order).
  returned: when the plan was read
  type: int
  sample: 1
forgets:
  description: Resources to remove from state without destroying them.
  returned: when the plan was read
  type: int
  sample: 0
moves:
  description:
    - >-
      Resources only moved to a new address (a C(moved) block), with no other change. A moved resource that is
      destroyed or replaced must be whitelisted at its new address and where it was.
  returned: when the plan was read
  type: int
  sample: 0
imports:
  description: Resources the apply imports into the state (an C(import) block); one also updated is in RV(changes) too.
  returned: when the plan was read
  type: int
  sample: 0
outputs:
  description:
    - >-
      The root outputs the apply changes. A plan of only moves, imports or output changes still has something to
      apply (terraform's exit code 2); the role applies it.
  returned: when the plan was read
  type: list
  elements: str
  sample: []
failed_checks:
  description:
    - >-
      The check blocks and conditions terraform found failing (the approver reads them in RV(summary) and
      RV(change_lines); terraform applies in spite of them).
  returned: when the plan was read
  type: list
  elements: str
  sample: ["check.health"]
addresses:
  description:
    - >-
      Addresses by kind (C(delete) holds pure destroys; C(replace) the replacements; a moved one reads
      C(<address> (moved from <old>))).
  returned: when the plan was read
  type: dict
  sample: {"create": ["terraform_data.y"], "update": [], "delete": [], "replace": ["terraform_data.x"], "forget": [],
           "move": [], "import": []}
whitelisted:
  description: Destroys admitted, each with the entry that admitted it.
  returned: when the plan was read
  type: list
  elements: dict
  sample: [{"address": "module.instance_test.aws_instance.this", "entry": "module.instance_test", "kind": "replace"}]
violations:
  description: Every refusal line (also joined into C(msg) on failure).
  returned: always
  type: list
  elements: str
  sample: ["DESTROY NOT WHITELISTED: terraform_data.x"]
summary:
  description: One human line.
  returned: when the plan was read
  type: str
  sample: "Plan: 2 to add, 0 to change, 1 to destroy (1 replacement); 1 destroy whitelisted by module.instance_test"
plan_sha256:
  description: sha256 of the plan file the gate read (recorded in the binding on a pass).
  returned: with plan_file, when the plan was read
  type: str
binding:
  description: Path of the binding file.
  returned: with plan_file
  type: str
plan_digest:
  description:
    - sha256 over every change the plan makes (address, actions, before and after values; a move's former
      address, an import's id), over the root outputs when they are all the plan changes, and over the
      O(storage_steps) when there are any.
    - Equal digests mean the same changes; an AWX apply job compares it with the digest its plan job published.
  returned: when the plan was read
  type: str
change_lines:
  description:
    - What the approver reads - every touched address with its action, then the attributes it sets or changes
      (values terraform marks sensitive, and secret-shaped ones, as C((sensitive value)); values known only after
      the apply as C((known after apply))). At most 400 lines; the last one says how many were left out.
  returned: when the plan was read
  type: list
  elements: str
  sample: ["+ module.storage_mnt_data.aws_ebs_volume.this: create", "    size = 100"]
resource_changes:
  description:
    - Every touched address, its action (C(create), C(update), C(delete), C(replace), C(forget)), terraform's
      actions and its changed attributes (C(name), C(before), C(after) as shown text, masked like RV(change_lines)).
    - An AWX plan job publishes it as the C(csis_plan_changes) artifact.
  returned: when the plan was read
  type: list
  elements: dict
  sample: [{"address": "aws_ebs_volume.v", "action": "create", "actions": ["create"], "attributes": [{"name": "size", "before": "", "after": "8"}]}]
show_skipped:
  description:
    - True when C(show -json) was not run because M(csis.infra.csis_plan) recorded that terraform called
      these very plan bytes empty (C(-detailed-exitcode) 0); the plan is then gated as one without changes.
  returned: with O(plan_file), once the plan's binding checks passed
  type: bool
plan_file:
  description: The absolute path of the plan file gated.
  returned: with O(plan_file)
  type: str
'''

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.gate import run_gate
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError, GateRefused
from ansible_collections.csis.infra.plugins.module_utils.csis.module import ModuleRun, fail_from


def _run(module, p):
    try:
        result = run_gate(
            p['project_path'], p['plan_file'], plan_json=p['plan_json'], binary_path=p['binary_path'],
            allow_destroy=p['allow_destroy'], require_unmounted=p['require_unmounted'],
            receipts_dir=p['receipts_dir'], receipts_since_binding=p['receipts_since_binding'],
            refuse_create=p['refuse_create'], required_tags=p['required_tags'], storage_steps=p['storage_steps'],
            check_mode=module.check_mode,
        )
    except GateRefused as exc:
        found = dict(exc.result, changed=False, violations=exc.messages)
        found.pop('diff', None)
        fail_from(module, exc, problems_key=None, **found)
    except CsisError as exc:
        fail_from(module, exc, prefix="gate: ", changed=False, violations=[])
    diff = result.pop('diff', None)
    result['violations'] = []
    if module._diff and diff is not None:
        result['diff'] = diff
    return result


RUN = ModuleRun(_run, dict(
    project_path=dict(type='path'),
    plan_file=dict(type='path'),
    plan_json=dict(type='path'),
    binary_path=dict(type='str', default='terraform'),
    allow_destroy=dict(type='list', elements='str', default=[]),
    require_unmounted=dict(type='list', elements='str', default=[]),
    refuse_create=dict(type='list', elements='str', default=[]),
    required_tags=dict(type='list', elements='str', default=[]),
    storage_steps=dict(type='list', elements='dict', default=[]),
    receipts_dir=dict(type='path'),
    receipts_since_binding=dict(type='bool', default=True),
), options=dict(
    mutually_exclusive=[('plan_file', 'plan_json')],
    required_one_of=[('plan_file', 'plan_json')],
    required_by={'plan_file': 'project_path'},
    supports_check_mode=True,
))


def main():
    RUN.main()


if __name__ == '__main__':
    main()
