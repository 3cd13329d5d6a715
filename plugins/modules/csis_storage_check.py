#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_storage_check
short_description: Refuse to plan a root whose recorded storages are gone from reality
version_added: 0.2.0
description:
  - Runs before a root is planned (the C(csis.infra.tofu_root) role). Of the root's storages, those meta-state
    records as existing (C(active), C(archived)) are looked up at their runtime's endpoint by their recorded ids,
    exactly as the state query (M(csis.infra.csis_state_query)) does, without its foreign scan.
  - A storage that is gone (a volume deleted out of band, or in state C(deleting) or C(deleted), an endpoint reset)
    fails the module with the drift report's C(missing ... [HARD]) line and what to do. Terraform would otherwise
    plan to create it again, empty, and the record would silently take the new id. Correct the record first (the
    forget or state import playbooks).
  - A lookup that fails (endpoint down, permission refused) is returned in C(unavailable) and does not fail the
    module; the gate still refuses a create of a recorded storage (C(protect), for
    O(csis.infra.csis_gate_plan#module:refuse_create)).
  - Reads meta-state only; never writes anything.
extends_documentation_fragment:
  - csis.infra.controller.tree_read_only
  - csis.infra.aws.boto3
  - csis.infra.attributes.worker
options:
  storages:
    description:
      - The root's storages, name to C({address, type, ...}) (C(csis_root_item.storages) from M(csis.infra.csis_render)).
        Only those recorded C(active) or C(archived) are looked up.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Check that the recorded storages still exist (a vanished volume is never re-created empty)
  csis.infra.csis_storage_check:
    config_root: "{{ csis_root }}"
    overlays: "{{ csis_overlays }}"
    storages: "{{ csis_root_item.storages }}"
  register: checked
"""

RETURN = r"""
checked:
  description: The storages looked up (recorded C(active) or C(archived)).
  returned: always
  type: list
  elements: str
protect:
  description: The addresses of the resources of the storages recorded C(active) (volume, filesystem, bucket); a plan
    must not create them.
  returned: always
  type: list
  elements: str
drift:
  description: The drift of the checked storages, each C({kind, name, drift, detail, hard}).
  returned: always
  type: list
  elements: dict
hard:
  description: The drift report's line of every HARD finding (the module fails when there is one).
  returned: always
  type: list
  elements: str
unavailable:
  description: "The lookups that failed, one C(<what>: <error>) string each."
  returned: always
  type: list
  elements: str
lines:
  description: The report's lines for the checked storages.
  returned: always
  type: list
  elements: str
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, ModuleRun, argument_spec, reveal_of
from ansible_collections.csis.infra.plugins.module_utils.csis.state.drift import check_recorded_storages

FIX = ("not planning storage {name}: terraform would create it again, empty. Gone for good: playbooks/forget.yml "
       "-e forget_storage={name} -e force=true (a storage declared archived or destroyed: remove its declaration from "
       "storages/ first); replaced: playbooks/state_import.yml -e import_storage={name} -e storage_id=<id> "
       "(docs/drift.md)")


def _check(module, p):
    res = check_recorded_storages(p["config_root"], p["storages"], overlays=p["overlays"], reveal=reveal_of(module))
    for u in res["unavailable"]:
        module.warn("could not check that a recorded storage still exists: %s" % u)
    if res["hard"]:
        fixes = [FIX.format(name=d["name"]) for d in res["drift"] if d.get("hard")]
        module.fail_json(msg="\n".join(res["hard"] + fixes), changed=False, **res)
    return dict(changed=False, **res)


RUN = ModuleRun(_check, argument_spec(CONFIG_ARGS, storages=dict(type="dict", required=True)),
                requires=("PyYAML", "pydantic", "boto3"), options=dict(supports_check_mode=True))


def main():
    RUN.main()


if __name__ == "__main__":
    main()
