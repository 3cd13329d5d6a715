#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_stop_instances
short_description: Stop the machines whose EBS volumes a gated plan detaches as it destroys them
version_added: 0.2.0
description:
  - terraform destroys an instance's C(aws_volume_attachment) resources before its C(aws_instance), that is a
    DetachVolume on a running machine whose filesystems are mounted. On AWS the volume can stay busy (the
    attachment's delete timeout then fails the apply halfway) or, forced, lose unflushed writes.
  - This module stops (EC2 StopInstances, no force) every machine whose C(<module>.aws_instance.this) the gated plan
    destroys or replaces and whose C(aws_volume_attachment) resources the plan destroys or replaces too (a
    decommission, a replacement by C(csis_upgrade) or C(follow), an ephemeral teardown), then waits until each is
    C(stopped). The machine's OS unmounted its filesystems as it stopped; terraform then detaches and terminates.
  - Each machine's instance id is the one the root's terraform state records, never one found by tags.
  - A machine already C(stopped), C(shutting-down) or C(terminated), or one EC2 does not know, is skipped (the result
    says why); one already C(stopping) is waited for; one still launching (C(pending), which StopInstances refuses) is
    waited for until it runs, then stopped. A machine whose attachments the plan keeps (no EBS volume) is not stopped.
  - A StopInstances error, or a machine not C(stopped) within O(timeout), fails the task naming the instance;
    nothing is applied then.
  - The C(csis.infra.tofu_root) role runs it after the gate, the approval, M(csis.infra.csis_apply_check) and the
    plan-binding check, right before the apply (for the ephemeral teardown pass too), unless its variable
    C(csis_stop_before_detach) is V(false). A machine it stopped stays stopped when the apply then fails; the role's
    failure message names it.
  - Uses boto3 with the root's runtime (region, profile, endpoints). A runtime with static keys is reached with them
    (the root's C(secrets), decrypted on the controller with the run's vault secrets), never with the environment's
    credentials; otherwise credentials come from the environment.
extends_documentation_fragment:
  - csis.infra.controller
  - csis.infra.aws.boto3
  - csis.infra.attributes.worker
options:
  root:
    description:
      - The root (an entry of M(csis.infra.csis_render)'s C(roots)); its C(directory), C(binary_path), C(aws),
        C(secrets), C(instances) and C(key) are read.
    type: dict
    required: true
  addresses:
    description:
      - The gated plan's addresses by kind (M(csis.infra.csis_gate_plan)'s C(addresses)); its C(delete) and
        C(replace) lists are read.
    type: dict
    required: true
  timeout:
    description: Seconds to wait, in all, for the stopped machines to reach C(stopped) after StopInstances.
    type: int
    default: 600
attributes:
  check_mode:
    details:
      - Reads the root's state and each machine's EC2 state and reports what it would stop (C(would_stop)) and skip;
        stops nothing.
"""

EXAMPLES = r"""
- name: Stop the machines whose volumes the apply detaches as it destroys them
  csis.infra.csis_stop_instances:
    root: "{{ root }}"
    addresses: "{{ gate.addresses }}"
    timeout: 600
"""

RETURN = r"""
machines:
  description:
    - The machines the plan destroys or replaces together with their volume attachments, each with C(address) (the
      instance module's), C(name) (the instance's), C(instance_id) (from the root's state) and C(attachments).
  returned: success
  type: list
  elements: dict
stopped:
  description: The machines stopped and found C(stopped), each a C(machines) entry with its C(state).
  returned: success
  type: list
  elements: dict
skipped:
  description:
    - The machines not stopped, each a C(machines) entry with its C(state) (EC2's; null when not found) and C(reason)
      (already stopped, shutting down or terminated, not found, no id in the state).
  returned: success
  type: list
  elements: dict
would_stop:
  description: In check mode, the machines that would be stopped; empty otherwise.
  returned: success
  type: list
  elements: dict
msg:
  description: One line naming what was stopped and skipped.
  returned: success
  type: str
  sample: "stopped web (i-0123456789abcdef0) before the apply detaches its volumes"
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.stopbeforedetach import stop_before_detach
from ansible_collections.csis.infra.plugins.module_utils.csis.module import ModuleRun, reveal_of


def _names(entries):
    return ", ".join("%s (%s)" % (m["name"], m.get("instance_id") or "no id") for m in entries)


def _message(res, check):
    parts = []
    if res["would_stop"]:
        parts.append("would stop %s" % _names(res["would_stop"]))
    if res["stopped"]:
        parts.append("stopped %s" % _names(res["stopped"]))
    for m in res["skipped"]:
        parts.append("skipped %s: %s" % (_names([m]), m.get("reason")))
    if not parts:
        return "nothing to stop: the plan destroys no machine together with its volume attachments"
    return "; ".join(parts) + (" (check mode: nothing stopped)" if check else " before the apply detaches their volumes")


def _stop(module, p):
    res = stop_before_detach(p["root"], p["addresses"], reveal_of(module), timeout=p["timeout"], check=module.check_mode)
    changed = bool(res["stopped"]) or (module.check_mode and bool(res["would_stop"]))
    return dict(changed=changed, msg=_message(res, module.check_mode), **res)


RUN = ModuleRun(
    _stop,
    dict(root=dict(type="dict", required=True), addresses=dict(type="dict", required=True),
         timeout=dict(type="int", default=600)),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
