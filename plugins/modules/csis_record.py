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
  - Reads the root's terraform state and records what it holds, never what the
    configuration requested. The state is read where the root's backend keeps it (the S3 object
    with boto3, or the local state file) when the backend is one csis.infra renders; any other
    backend, a backend setting only terraform honours (static keys, an assumed role,
    C(sse_customer_key), a DynamoDB lock table, ...) or a state that is not plain version-4 JSON is
    read with C(terraform state pull) (docs/terraform.md, "The state without terraform").
    Storage roots update C(meta-state/storage-state.yaml) (state, generation, facts such as volume
    and filesystem ids, history) and the read-model C(meta-state/storage.yaml).
    Instance roots update C(launch-params.yaml) (the C(launched) marker and the launch parameters),
    C(instance-state.yaml) (generations, instance id, private address, booted AMI) and C(pins.yaml)
    (first binds, moves after a replacement, forgets after a decommission or an ephemeral teardown).
  - Every write is atomic and taken under the meta-state lock. Only the records of the root's own
    instances and storages, their pins and the read-model records of the storages they mount are
    read and written, whatever else meta-state holds (docs/meta-state.md).
  - >-
    Run it after a root's apply step (the C(csis.infra.tofu_root) role does, for every root that may apply), also when
    that run applied nothing: the state then holds what earlier applies did, and a record a run stopped before writing
    (killed, or meta-state unwritable) is written now. It records what the state holds, never what the configuration
    requests; a state changed by hand (C(terraform state rm)) is believed, and the state query reports where it
    departs from what exists.
extends_documentation_fragment:
  - csis.infra.controller.config_root
  - csis.infra.attributes.worker
options:
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
  applied:
    description:
      - What this run applied to the root (for example its plan summary); omitted when nothing was applied.
      - Given, the record's transaction also audits an C(applied) event (the summary and C(context.plan_digest)), so
        the audit trail shows an apply that changed no record (a tag update, an identity root's groups).
      - When meta-state cannot take the record, the failure names it, with what terraform state holds, and says
        that a re-run records it.
    type: str
  deleted:
    description:
      - The addresses this run's apply destroyed (the gate's C(addresses.delete) and C(addresses.replace)); empty when
        the run applied nothing to the root.
      - A storage recorded C(active) that the root's terraform state does not hold is recorded C(destroyed), and a
        launched machine it does not hold is recorded decommissioned or torn down, only when this apply destroyed
        something of its module. Otherwise the record stays, the module warns (the state does not hold it, but
        nothing of this run destroyed it) and lists it in RV(unconfirmed).
      - Omitted, the state alone decides (what a caller that cannot tell gets; the role always passes it).
    type: list
    elements: str
  context:
    description:
      - What the run's audit record of this transaction names besides its changes (meta-state
        C(audit/<revision>.yaml), M(csis.infra.csis_history)), for example C(lifecycle), C(root) and
        C(plan_digest), the digest of the plan the gate passed and the apply applied.
      - Values must not be secrets (secret-shaped values are redacted).
    type: dict
    default: {}
attributes:
  check_mode:
    details: In check mode nothing is read or written.
"""

EXAMPLES = r"""
- name: Record in meta-state what the apply of the root did
  csis.infra.csis_record:
    config_root: "{{ csis_root }}"
    root: "{{ csis_root_item }}"
    run_id: "{{ csis_run_id }}"
"""

RETURN = r"""
written:
  description: The meta-state files this call wrote records of (only the records it changed, each one alone; empty
    when reality matched the records).
  returned: success (empty in check mode, which records nothing)
  type: list
  elements: str
storages:
  description: Storage state changes recorded, as C(name -> [from, to]).
  returned: for storage roots
  type: dict
instances:
  description: What was recorded per instance (C(launched), C(standing), C(decommission), C(ephemeral), C(gone)).
  returned: for instance roots
  type: dict
unconfirmed:
  description:
    - One line per storage or machine the state no longer holds but that this run's apply did not destroy (an import
      that left terraform state untouched, a state edited by hand or lost, a record that failed after the apply that
      destroyed it), whose record was kept; each is also a warning. RV(unconfirmed) lines name the fix
      (M(csis.infra.csis_state_query) first; M(csis.infra.csis_forget) with C(force) records a resource that is gone).
  returned: success (not in check mode)
  type: list
  elements: str
bound:
  description:
    - The durable instances whose first pin this record bound (the AMI their first launch booted). The
      C(csis.infra.tofu_root) role renders the root once more when it is not empty, so the root's files name
      those AMIs as every later render does.
  returned: for instance roots
  type: list
  elements: str
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ROOT_ARGS, ModuleRun, argument_spec
from ansible_collections.csis.infra.plugins.module_utils.csis.state.record import record_root


def _record(module, p):
    if module.check_mode:
        return dict(changed=False, written=[], msg="check mode: nothing recorded")
    out = record_root(p["config_root"], p["root"], p["run_id"], p["done_transitions"], applied=p["applied"],
                      context=p["context"], deleted=p["deleted"])
    for line in out.get("unconfirmed") or []:
        module.warn(line)
    return dict(out, changed=bool(out.get("written")))


RUN = ModuleRun(_record, argument_spec(CONFIG_ROOT_ARGS, root=dict(type="dict", required=True), run_id=dict(type="str", required=True),
                                       done_transitions=dict(type="list", elements="dict", default=[]), applied=dict(type="str"),
                                       deleted=dict(type="list", elements="str"),
                                       context=dict(type="dict", default={})),
                requires=("PyYAML",), options=dict(supports_check_mode=True))


def main():
    RUN.main()


if __name__ == "__main__":
    main()
