#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_cascade
short_description: Compute the cascade destroy of an environment, leaves first
version_added: 0.2.0
description:
  - Validates the tree as it is, then computes the cascade destroy of one environment of C(cfg/hierarchy.yml) over
    every runtime whose environment chain holds it, in four phases, leaves first - C(ephemeral) instances, then
    C(durable) instances (instance-image lifecycle), then the C(storage) roots (EBS storages archived, or destroyed
    with O(ebs=destroyed); EFS and S3 storages only when the tree declares them destroyed), then the C(identity)
    roots of the environment's group builders.
  - Returns the order, every destroy and data step of every phase (what the one approval of
    C(playbooks/destroy_environment.yml) shows), and the roots whose apply flag is off.
  - Refuses, with every problem at once, what the cascade cannot do safely - a storage of the environment that an
    instance outside it attaches, an EFS or S3 storage the tree does not declare destroyed, a group of the
    environment's identity builders still used outside it.
  - Reads only; each phase is then run by C(playbooks/lifecycle.yml) with the phase as M(csis.infra.csis_render)'s
    C(cascade) option.
extends_documentation_fragment:
  - csis.infra.controller.tree_read_only
  - csis.infra.attributes.worker
options:
  environment:
    description: The environment (a node of kind C(environment) in C(cfg/hierarchy.yml)).
    type: str
    required: true
  ebs:
    description: What the cascade requests of the environment's EBS storages - C(archived) (a snapshot is kept) or C(destroyed).
    type: str
    choices: [archived, destroyed]
    default: archived
attributes:
  check_mode:
    details: Read-only; the same computation runs in check mode.
"""

EXAMPLES = r"""
- name: The cascade of an environment of cfg/hierarchy.yml
  csis.infra.csis_cascade:
    config_root: examples
    environment: example-us-east-2
  register: cascade
"""

RETURN = r"""
cascade:
  description:
    - C(environment), C(runtimes), C(ebs), C(phases) (each with C(phase), C(lifecycle), C(undeclare), C(storage_states),
      C(destroy_identity), C(destroys) (each C(<root key>) then the address) and C(steps) (the data steps)), C(lines) (the order as
      printed), C(approved) (every destroy and every data step, such as an archive snapshot deleted or a bucket
      wiped), C(blocked) (the roots whose apply flag is off), C(approval_rules) (why the
      tree's approval rules forbid a cascade that approves itself - C(approvals.distinct_approver), C(workspace.require_merge);
      empty when they allow it).
  returned: success
  type: dict
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, ModuleRun, argument_spec, fail_from, problems_message
from ansible_collections.csis.infra.plugins.module_utils.csis.render.cascade import cascade_of


def _cascade(module, p):
    try:
        out = cascade_of(p["config_root"], p["environment"], overlays=p["overlays"], ebs=p["ebs"])
    except ConfigError as exc:
        fail_from(module, exc, msg=problems_message(exc, p["config_root"], "; the cascade of '%s' is refused" % p["environment"]))
    return dict(changed=False, cascade=out)


RUN = ModuleRun(
    _cascade,
    argument_spec(CONFIG_ARGS, environment=dict(type="str", required=True),
                  ebs=dict(type="str", choices=["archived", "destroyed"], default="archived")),
    requires=("PyYAML", "pydantic"),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
