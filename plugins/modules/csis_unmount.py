#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_unmount
short_description: Unmount a detached storage from a launched instance and write the unmount receipt
version_added: 0.1.0
description:
  - Runs the unmount of O(mount_point) on the machine over the runtime's session mechanism
    (O(aws.session_mechanism)), addressing the machine by what C(meta-state/instance-state.yaml)
    records of it, never by a C(Name) tag.
  - C(ssm) runs SSM C(AWS-RunShellScript) through boto3 on the recorded instance id, with the
    runtime's region, profile and endpoint, and its static keys when it has some (O(secrets)).
  - >-
    C(ssh) runs the system OpenSSH client (C(ssh)) to the recorded C(private_ip) or C(public_ip)
    (O(aws.ssh.address)) as O(aws.ssh.user) with O(aws.ssh.private_key_file) (C(IdentitiesOnly=yes)),
    in batch mode, checking the host key against O(aws.ssh.known_hosts_file) (C(StrictHostKeyChecking=yes),
    or C(accept-new) when O(aws.ssh.host_key_checking) says so), with C(ConnectTimeout) O(aws.ssh.connect_timeout);
    the script goes on its standard input to C(sudo -n sh -s) (C(sh -s) when the user is C(root)).
    The whole session is bounded by O(timeout): then ssh is killed and the unmount fails.
  - C(none) is refused; unmount by hand and record it with O(confirm).
  - The unmount is not forceful unless O(force) is set; a busy mount fails with the processes
    holding it, and nothing is applied.
  - >-
    Writes C(<receipts_dir>/<instance>__<storage>.json) atomically with C(instance), C(storage),
    C(ok), C(time), C(mount_point), C(method), C(runtime), C(exit_status), C(output) (its last
    2000 characters), and C(session) (C(ssm) with C(instance_id) and C(command_id); C(ssh) with
    C(host), C(user), C(port) and the recorded C(instance_id); never the key).
    A failed unmount writes C(ok=false) and fails.
    M(csis.infra.csis_gate_plan) admits the attachment's destroy only with C(ok=true) and a
    C(time) after the plan binding was opened.
  - With O(confirm) the operator's word is recorded (C(method=operator-confirmation)) without
    any remote call, for a machine that is gone or a storage that was never mounted.
extends_documentation_fragment:
  - csis.infra.controller.instance
  - csis.infra.attributes.worker
requirements:
  - the OpenSSH client (C(ssh)) on the controller, for O(aws.session_mechanism=ssh)
options:
  storage:
    description: The storage name.
    type: str
    required: true
  mount_point:
    description: The mount point recorded in the launch parameters.
    type: str
    required: true
  receipts_dir:
    description: "Where the receipt is written (the root's C(unmount-receipts/))."
    type: path
    required: true
  runtime:
    description: The runtime's name, recorded in the receipt.
    type: str
  confirm:
    description: Record the operator's confirmation instead of unmounting.
    type: bool
    default: false
  confirmed_by:
    description: Who confirms (default C($USER)).
    type: str
  force:
    description: Kill the processes holding the mount (C(fuser -km)) before unmounting.
    type: bool
    default: false
  timeout:
    description: Seconds the session command may run (over SSH, the whole C(ssh) process).
    type: int
    default: 300
  run_id:
    description: The run id, recorded in the receipt.
    type: str
attributes:
  check_mode:
    details: Reports what it would do; runs nothing remotely and writes no receipt.
notes:
  - The local AWS endpoint (moto) answers C(send_command) with C(Success) without running
    anything; tests prove the receipt path with it and with O(confirm).
  - The SSH path is tested with the real OpenSSH client against an SSH server on 127.0.0.1
    that records what it receives and runs nothing.
  - The SSH settings are the runtime's C(ssh) block in C(cfg/runtime-builders.yml); relative
    paths in them are relative to O(config_root).
"""

EXAMPLES = r"""
- name: Unmount mnt_data from test2 before its attachment is destroyed
  csis.infra.csis_unmount:
    config_root: "{{ csis_root }}"
    instance: test2
    storage: mnt_data
    mount_point: /mnt/data
    receipts_dir: "{{ root.directory }}/unmount-receipts"
    aws: "{{ root.aws }}"
    runtime: "{{ root.runtime }}"

- name: The machines are gone; record the operator's word for each detached storage
  csis.infra.csis_unmount:
    config_root: "{{ csis_root }}"
    instance: "{{ item.instance }}"
    storage: "{{ item.storage }}"
    mount_point: "{{ item.mount_point }}"
    receipts_dir: "{{ root.directory }}/unmount-receipts"
    confirm: true
    confirmed_by: "{{ operator }}"
  loop: "{{ detached }}"
"""

RETURN = r"""
receipt:
  description:
    - The receipt written (with its C(path)).
    - In check mode (nothing is written or run), C(path) (where the receipt would go) and C(would) (V(confirm), the
      operator's word, or V(session), the unmount over SSM or SSH).
  returned: success
  type: dict
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.unmount import unmount, unmount_receipt_path
from ansible_collections.csis.infra.plugins.module_utils.csis.aws import root_access
from ansible_collections.csis.infra.plugins.module_utils.csis.module import (
    AWS_ACCESS_ARGS, CONFIG_ROOT_ARGS, INSTANCE_ARGS, ModuleRun, argument_spec, reveal_of)


def _unmount(module, p):
    if module.check_mode:
        path = unmount_receipt_path(p["receipts_dir"], p["instance"], p["storage"])
        return dict(changed=True, receipt={"path": path, "would": "confirm" if p["confirm"] else "session"})
    receipt = unmount(p["config_root"], p["instance"], p["storage"], p["mount_point"], p["receipts_dir"],
                      access=root_access(p["aws"], p["secrets"], reveal_of(module), "instance '%s'" % p["instance"]),
                      runtime=p["runtime"], confirm=p["confirm"], confirmed_by=p["confirmed_by"],
                      force=p["force"], timeout=p["timeout"], run_id=p["run_id"])
    return dict(changed=True, receipt=receipt)


RUN = ModuleRun(
    _unmount,
    argument_spec(
        CONFIG_ROOT_ARGS, AWS_ACCESS_ARGS, INSTANCE_ARGS, storage=dict(type="str", required=True),
        mount_point=dict(type="str", required=True), receipts_dir=dict(type="path", required=True), runtime=dict(type="str"),
        confirm=dict(type="bool", default=False), confirmed_by=dict(type="str"), force=dict(type="bool", default=False),
        timeout=dict(type="int", default=300), run_id=dict(type="str"),
    ),
    requires=("PyYAML",),
    failure=lambda module: dict(prefix="" if module.check_mode else "unmount: "),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
