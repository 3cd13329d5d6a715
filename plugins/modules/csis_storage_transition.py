#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_storage_transition
short_description: Run one storage transition step of a csis.infra storage root
version_added: 0.1.0
description:
  - C(snapshot) (EBS C(active -> archived)) snapshots the volume terraform recorded in the root's
    state as C(csis-<label>-archive), reusing an existing archive snapshot, refusing a volume that is
    still attached, and waits for completion.
  - C(delete_archive_snapshot) deletes the archive snapshot (after a restore, or C(archived -> destroyed)).
  - C(empty_bucket) deletes every object version and delete marker of the bucket before its destroy.
  - The C(csis.infra.tofu_root) role runs these only after the gate passed and
    M(csis.infra.csis_apply_check) allowed the apply in the same run.
  - Uses boto3 with the root's runtime (region, profile, endpoints). A runtime with static keys is reached with them
    (the root's C(secrets), decrypted on the controller with the run's vault secrets), never with the environment's
    credentials; otherwise credentials come from the environment.
  - The task is C(changed) when the step changed something (a snapshot taken, not an existing one reused; a snapshot
    deleted; an object removed), not merely because it ran.
extends_documentation_fragment:
  - csis.infra.controller
  - csis.infra.aws.boto3
  - csis.infra.attributes.worker
options:
  root:
    description: The root (an entry of M(csis.infra.csis_render)'s C(roots)).
    type: dict
    required: true
  transition:
    description: One entry of the root's C(transitions_before) or C(transitions_after).
    type: dict
    required: true
attributes:
  check_mode:
    details:
      - Reads what the step would find (the archive snapshots, whether the bucket holds anything) and reports what it
        would do and whether that changes something; creates, deletes and waits for nothing.
"""

EXAMPLES = r"""
- name: Archive snapshot before the volume's whitelisted destroy
  csis.infra.csis_storage_transition:
    root: "{{ root }}"
    transition: {storage: mnt_data, action: snapshot, snapshot_name: csis-mnt_data-archive}
"""

RETURN = r"""
result:
  description:
    - What the step did (C(snapshot_id) and C(created); C(deleted) snapshots; C(removed) objects of C(bucket),
      C(absent) for a bucket already gone; C(noop) for a transition that only records); in check mode C(would) (what
      it would do) and the C(transition).
  returned: success
  type: dict
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.transitions import changed_by, probe_transition, run_transition
from ansible_collections.csis.infra.plugins.module_utils.csis.module import ModuleRun, reveal_of


def _transition(module, p):
    if module.check_mode:
        probe = probe_transition(p["root"], p["transition"], reveal_of(module))
        return dict(changed=probe["changed"], result={"would": probe["would"], "transition": p["transition"]})
    res = run_transition(p["root"], p["transition"], reveal_of(module))
    return dict(changed=changed_by(p["transition"].get("action"), res), result=res)


RUN = ModuleRun(
    _transition,
    dict(root=dict(type="dict", required=True), transition=dict(type="dict", required=True)),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
