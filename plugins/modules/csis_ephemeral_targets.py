#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_ephemeral_targets
short_description: The ephemeral machines of an applied csis.infra instance root, as hosts to verify
version_added: 0.2.0
description:
  - After the apply and the record of an instance root (C(csis.infra.tofu_root)), lists its ephemeral machines
    that stand (the record step said C(launched) or C(standing)), those to verify where they run, those torn down
    without re-verifying (C(teardown_after) elapsed since a failed verdict) and those a failed verdict keeps
    standing (C(on_failure=keep)).
  - Each machine to verify comes with its address (its recorded private IP from C(meta-state/instance-state.yaml),
    read through the meta-state store; its name when none is recorded) and its host variables (I(defaults), then
    its own entry of I(host_vars) over them).
  - Reads only.
extends_documentation_fragment:
  - csis.infra.controller.config_root
  - csis.infra.attributes.worker
options:
  root:
    description: The instance root, one entry of the C(roots) list that M(csis.infra.csis_render) returned.
    type: dict
    required: true
  recorded:
    description: What M(csis.infra.csis_record) recorded per instance of the root (its C(instances) return value).
    type: dict
    default: {}
  connection:
    description: The connection to a machine whose host variables name no C(ansible_connection).
    type: str
    default: ssh
  defaults:
    description: Host variables for every machine.
    type: dict
    default: {}
  host_vars:
    description: Host variables per instance name, merged over I(defaults) (key by key).
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    details: Read-only.
  diff_mode:
    support: N/A
    details: This action does not modify state.
"""

EXAMPLES = r"""
- name: The ephemeral machines to verify
  csis.infra.csis_ephemeral_targets:
    config_root: "{{ csis_root }}"
    root: "{{ csis_root_item }}"
    recorded: "{{ tofu_root_recorded.instances | default({}) }}"
    connection: ssh
    host_vars:
      eph1: {ansible_connection: local, csis_verify_fs_root: /srv/check-root}
  register: eph
"""

RETURN = r"""
standing:
  description: The ephemeral machines up after the apply (the ones the teardown removes).
  returned: success
  type: list
  elements: str
verify:
  description: The machines to verify where they run.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: The instance name (the host name to add).
      type: str
    address:
      description: The recorded private IP (the instance name when none is recorded).
      type: str
    connection:
      description: The connection to reach it.
      type: str
    instance_id:
      description: The recorded instance id.
      type: str
    vars:
      description: Its host variables (I(defaults), then its own I(host_vars) entry).
      type: dict
host_vars:
  description: Every host variable of the machines to verify, one C({host, key, value}) each (to set them on the hosts).
  returned: success
  type: list
  elements: dict
skipped:
  description: The standing machines torn down without re-verifying, each C({name, reason}).
  returned: success
  type: list
  elements: dict
keep_on_failure:
  description: The ephemeral machines that stay standing after a failed verification (C(on_failure=keep)).
  returned: success
  type: list
  elements: str
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ROOT_ARGS, ModuleRun, argument_spec
from ansible_collections.csis.infra.plugins.module_utils.csis.state.ephemeral import targets


def _targets(module, p):
    res = targets(p["config_root"], p["root"], recorded=p["recorded"], connection=p["connection"],
                  defaults=p["defaults"], per_host=p["host_vars"])
    return dict(res, changed=False)


RUN = ModuleRun(
    _targets,
    argument_spec(CONFIG_ROOT_ARGS, root=dict(type="dict", required=True),
                  recorded=dict(type="dict", default={}),
                  connection=dict(type="str", default="ssh"),
                  defaults=dict(type="dict", default={}),
                  host_vars=dict(type="dict", default={})),
    requires=("PyYAML",),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
