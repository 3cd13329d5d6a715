#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_verify_instance
short_description: Check on the machine that a launch completed (marker, mounts, group directories, image tests)
version_added: 0.1.0
author:
  - csis.infra maintainers (@csis-infra)
description:
  - Runs on the instance itself, through the connection Ansible uses for the host (SSM or
    SSH from the inventory), so the checks are real file-system and mount checks.
  - Checks the completion marker (C(/var/lib/csis/launch-applied), written last by the launch
    script), every declared mount present at its mount point, the group's directory with the
    expected gid and mode (the subtree C(<mount point>/<group>) on an EBS volume; for an EFS mount
    through its group's access point the mount point itself, the access point's root), and the
    image's post-bake test commands (run with C(/bin/sh -c); exit 0 passes).
  - Returns a structured verdict and does not fail when a check fails; the caller records it
    (M(csis.infra.csis_record_verification)) and decides. The booted AMI is checked on the
    controller from EC2 by M(csis.infra.csis_record_verification).
extends_documentation_fragment:
  - csis.infra.attributes
  - csis.infra.attributes.platform
options:
  fs_root:
    description:
      - The file-system root the checks look under. With V(/) mounts are real mount points
        (C(os.path.ismount), C(findmnt)).
      - With another directory (tests, an image inspected from outside) it stands in for
        C(/), and a mount counts as present when C(<fs_root>/proc/mounts) (the format of
        C(/proc/mounts)) lists its mount point as a target and C(<fs_root><mount point>) is a
        directory. Test commands run with that directory as their working directory and
        C(CSIS_FS_ROOT) set to it.
    type: path
    default: /
  marker:
    description: The completion marker.
    type: str
    default: /var/lib/csis/launch-applied
  mounts:
    description:
      - The declared mounts, as in the launch parameters (C(storage), C(type), C(mount_point),
        C(group), C(share_mode)) plus C(gid), the group's gid. C(s3) entries are skipped.
      - C(group_root) true - the group's directory is the mount point itself (an EFS mount through its
        group's access point), not C(<mount point>/<group>). An entry without C(group) gets no group check
        (an EFS mount through the public access point, whose root is the filesystem's). M(csis.infra.csis_render)
        returns each instance's mounts so in C(instances.<name>.verify.mounts).
    type: list
    elements: dict
    default: []
  tests:
    description: The image's post-bake test commands.
    type: list
    elements: str
    default: []
  test_timeout:
    description: Seconds each test command may run.
    type: int
    default: 300
attributes:
  check_mode:
    support: full
    details: Read-only except for the test commands, which run in check mode too (they must not change the machine).
  diff_mode:
    support: N/A
    details: This action does not modify state.
  platform:
    details: Runs on the launched machine being verified (the only csis.infra module that is not run on the controller).
"""

EXAMPLES = r"""
- name: Verify test2 where it runs
  csis.infra.csis_verify_instance:
    mounts:
      - {storage: mnt_data, type: ebs, mount_point: /mnt/data, group: coops, gid: 3000, share_mode: "2770"}
    tests: ["test -x /usr/bin/env"]
  delegate_to: test2
  register: verdict
"""

RETURN = r"""
ok:
  description: Whether every check passed.
  returned: always
  type: bool
checks:
  description: Every check as C({name, ok, detail}).
  returned: always
  type: list
  elements: dict
evidence:
  description: Mount targets seen (at most 20).
  returned: always
  type: list
  elements: str
fs_root:
  description: The file-system root the checks read (O(fs_root)).
  returned: always
  type: str
time:
  description: When the machine was checked (UTC, ISO 8601).
  returned: always
  type: str
  sample: "2026-12-04T20:16:04Z"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.csis.infra.plugins.module_utils.csis.state.verify import verify_on_machine


def main():
    module = AnsibleModule(
        argument_spec=dict(
            fs_root=dict(type="path", default="/"),
            marker=dict(type="str", default="/var/lib/csis/launch-applied"),
            mounts=dict(type="list", elements="dict", default=[]),
            tests=dict(type="list", elements="str", default=[]),
            test_timeout=dict(type="int", default=300),
        ),
        supports_check_mode=True,
    )
    p = module.params
    verdict = verify_on_machine(p["fs_root"], p["marker"], p["mounts"], p["tests"], p["test_timeout"])
    module.exit_json(changed=False, **verdict)


if __name__ == "__main__":
    main()
