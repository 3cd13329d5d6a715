#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_record
short_description: Record in meta-state what an apply of one csis.infra root really did
version_added: 0.1.0
description:
  - Reads the root's terraform state (C(state pull)) and records what it holds, never what the
    configuration requested. Storage roots update C(meta-state/storage-state.yaml) (state, generation,
    facts such as volume and filesystem ids, history) and the read-model C(meta-state/storage.yaml).
    Instance roots update C(launch-params.yaml) (the C(launched) marker and the launch parameters),
    C(instance-state.yaml) (generations, instance id, private address, booted AMI) and C(pins.yaml)
    (first binds, moves after a replacement, forgets after a decommission or an ephemeral teardown).
  - Every write is atomic and taken under the meta-state lock.
  - Run it only after an apply that happened (the C(csis.infra.tofu_root) role does).
author:
  - csis.infra maintainers (@csis-infra)
extends_documentation_fragment:
  - csis.infra.attributes
  - csis.infra.attributes.platform
  - csis.infra.attributes.action_group
options:
  config_root:
    description: The configuration root.
    type: path
    required: true
  root:
    description: One entry of the C(roots) list that M(csis.infra.csis_render) returned.
    type: dict
    required: true
  run_id:
    description: The run identifier written into history entries.
    type: str
    required: true
  done_transitions:
    description: Storage transitions that ran before the apply in this run (for example the archive snapshot).
    type: list
    elements: dict
    default: []
attributes:
  check_mode:
    support: full
    details: In check mode nothing is read or written.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Record what the apply did
  csis.infra.csis_record:
    config_root: "{{ csis_root }}"
    root: "{{ csis_root_item }}"
    run_id: "{{ csis_run_id }}"
"""

RETURN = r"""
written:
  description: The meta-state files this call rewrote (empty when reality matched the records).
  returned: success
  type: list
  elements: str
storages:
  description: Storage state changes recorded, as C(name -> [from, to]).
  returned: for storage roots
  type: dict
instances:
  description: What was recorded per instance (C(launched), C(standing), C(decommission), C(ephemeral)).
  returned: for instance roots
  type: dict
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ROOT_ARGS, argument_spec, csis_module, fail_from
from ansible_collections.csis.infra.plugins.module_utils.csis.state.record import record_root


def main():
    module = csis_module(
        argument_spec=argument_spec(
            CONFIG_ROOT_ARGS,
            root=dict(type="dict", required=True),
            run_id=dict(type="str", required=True),
            done_transitions=dict(type="list", elements="dict", default=[]),
        ),
        requires=("PyYAML",),
        supports_check_mode=True,
    )
    if module.check_mode:
        module.exit_json(changed=False, msg="check mode: nothing recorded")
    p = module.params
    try:
        out = record_root(p["config_root"], p["root"], p["run_id"], p["done_transitions"])
    except CsisError as exc:
        fail_from(module, exc)
    changed = bool(out.get("written"))
    module.exit_json(changed=changed, **out)


if __name__ == "__main__":
    main()
