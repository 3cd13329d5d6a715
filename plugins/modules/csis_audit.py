#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r'''
---
module: csis_audit
short_description: Add an event that changed no record (a refused gate, a refused apply check) to the meta-state audit trail
version_added: 0.2.0
description:
  - Commits one audit record to the tree's meta-state store (local or S3) that holds the event and
    no record change, under the next revision, with who ran it (the OS user, or the AWX user, job and
    workflow ids the environment carries).
  - The C(csis.infra.tofu_root) role calls it when a root's chain fails, so refused gates, refused
    apply checks and failed steps are in the trail that C(playbooks/history.yml) prints (filter by root),
    and when its plan step released a state lock (V(state lock released)).
  - Secret-shaped values are refused, as in every meta-state write.
extends_documentation_fragment:
  - csis.infra.controller.config_root
  - csis.infra.attributes.worker
options:
  kind:
    description: What happened (for example V(gate refused), V(apply check refused), V(failed)).
    type: str
    required: true
  root:
    description: The root's key (C(csis_root_item.key)).
    type: str
    required: true
  detail:
    description: What was refused or failed (the gate's violations, the module's message), shortened.
    type: str
    default: ''
  step:
    description: The task that failed.
    type: str
  run_id:
    description: The run's id.
    type: str
  lifecycle:
    description: The root's lifecycle.
    type: str
  plan_digest:
    description: The digest of the plan the event is about, when there was one.
    type: str
  instances:
    description:
      - The instances the root declares (C(csis_root_item.instances)), so that C(playbooks/history.yml
        -e history_instance=<name>) shows the root's refusals and failures in each one's history.
    type: list
    elements: str
    default: []
  storages:
    description: The storages the root declares (C(csis_root_item.storages)), as O(instances) for C(history_storage).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    details: Nothing is written; returns C(changed=true), as a real run would.
'''

EXAMPLES = r'''
- name: Audit a refused gate
  csis.infra.csis_audit:
    config_root: "{{ csis_root }}"
    kind: gate refused
    root: storage-aws-ebs
    detail: "DESTROY NOT WHITELISTED: module.storage_mnt_data.aws_ebs_volume.this"
    run_id: "{{ csis_run_id }}"
'''

RETURN = r'''
revision:
  description: The revision of the audit record (0 in check mode).
  returned: always
  type: int
'''

from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ROOT_ARGS, ModuleRun, argument_spec
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import audit_root_event


def _audit(module, p):
    if module.check_mode:  # a real run always writes the record
        return dict(changed=True, revision=0)
    revision = audit_root_event(p["config_root"], p["kind"], p["root"], detail=p["detail"], step=p["step"],
                                run=p["run_id"], lifecycle=p["lifecycle"], plan_digest=p["plan_digest"],
                                instances=p["instances"], storages=p["storages"])
    return dict(changed=True, revision=revision)


RUN = ModuleRun(
    _audit,
    argument_spec(
        CONFIG_ROOT_ARGS,
        kind=dict(type="str", required=True),
        root=dict(type="str", required=True),
        detail=dict(type="str", default=""),
        step=dict(type="str"),
        run_id=dict(type="str"),
        lifecycle=dict(type="str"),
        plan_digest=dict(type="str"),
        instances=dict(type="list", elements="str", default=[]),
        storages=dict(type="list", elements="str", default=[]),
    ),
    requires=("PyYAML",),
    failure={"changed": False},
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
