#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_upgrade
short_description: Leave a pending replacement marker for a launched instance (upgrade instance)
version_added: 0.1.0
description:
  - Records C(pending_replacements.<instance>) in C(meta-state/pins.yaml). The next
    instance-image run treats the instance like a C(follow) target - it plans
    C(-replace=module.instance_<label>.aws_instance.this), whitelists the instance and its volume
    attachments, launches the next generation (C(<name>-NNN) advances) - and the record made
    after that apply moves the pin to what booted and clears the marker.
  - Only a launched, durable instance can be upgraded. Nothing is planned or applied here.
  - >-
    With O(to), the build is looked up on the instance's runtime first (C(DescribeImages)): an AMI that does not
    exist there (a typo), is not C(available), or is not a build of the instance's image (its name does not start
    with the image's C(name_pattern)) is refused and no marker is left. The replacement is delete-then-create: an
    apply onto an AMI that cannot boot would terminate the machine and never launch its successor.
  - >-
    When the machine runs the build the upgrade replaces it onto already (O(to), or without it the image's series
    head, read from the runtime), the marker is left and a warning says so: the replacement is a new machine on the
    same build (a re-provision).
extends_documentation_fragment:
  - csis.infra.controller.tree
  - csis.infra.aws.boto3
  - csis.infra.config.instance
  - csis.infra.attributes.worker
options:
  state:
    description:
      - V(present) leaves the marker. V(absent) removes it before a run applied it (a cancelled upgrade; the
        change log C(upgrades) records C(upgrade-cancelled)); no marker, no change.
    type: str
    choices: [present, absent]
    default: present
  to:
    description:
      - The build (AMI id) to move to; default the image's series head at the next run.
      - It must exist on the instance's runtime, be C(available) and be a build of the instance's image.
    type: str
  run_id:
    description: The run id recorded with the marker.
    type: str
    required: true
  requested_by:
    description:
      - Who asked (recorded with the marker and in the upgrade log).
      - Default the AWX user the run passed (C(awx_user_name), through C(CSIS_AWX_USER_NAME)), else the OS user, as the
        meta-state audit trail names them.
    type: str
attributes:
  check_mode:
    support: full
    details:
      - Reads meta-state (and looks O(to) up) and returns the marker it would leave (or remove); takes no lock and
        writes nothing.
      - C(playbooks/upgrade_instance.yml --check) hands that marker to the render (M(csis.infra.csis_render)'s
        O(csis.infra.csis_render#module:preview_upgrades)), so the instance-image lifecycle's check run shows
        the replacement.
"""

EXAMPLES = r"""
- name: Upgrade test2 at the next instance-image run
  csis.infra.csis_upgrade:
    config_root: "{{ csis_root }}"
    instance: test2
    run_id: "{{ csis_run_id }}"

- name: Cancel that upgrade before a run applied it
  csis.infra.csis_upgrade:
    config_root: "{{ csis_root }}"
    instance: test2
    state: absent
    run_id: "{{ csis_run_id }}"
"""

RETURN = r"""
pending:
  description:
    - The marker recorded (V(present)), or removed (V(absent); null when there was none).
    - In check mode, the marker a real run would record or remove.
  returned: success
  type: dict
  contains:
    to:
      description: The build asked for (null - the image's series head at the next run).
      type: str
    from:
      description: The build the instance was pinned to when the marker was left.
      type: str
    run:
      description: The run that left the marker.
      type: str
    at:
      description: When it was left (UTC, ISO 8601).
      type: str
    requested_by:
      description: Who asked.
      type: str
written:
  description: The meta-state files written (none in check mode, or when nothing changed).
  returned: success
  type: list
  elements: str
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, INSTANCE_ARGS, ModuleRun, argument_spec, reveal_of
from ansible_collections.csis.infra.plugins.module_utils.csis.render.series_heads import check_upgrade_target, onto_the_same_build
from ansible_collections.csis.infra.plugins.module_utils.csis.state.record import cancel_upgrade, mark_upgrade


def _mark(module, p):
    if p["to"] and not (p["to"].startswith("ami-") and p["to"][4:].isalnum()):
        module.fail_json(msg="to %r is not an AMI id" % p["to"])
    if p["state"] == "absent":
        out = cancel_upgrade(p["config_root"], p["instance"], p["run_id"], requested_by=p["requested_by"],
                             check=module.check_mode)
        return dict(changed=out["changed"], pending=out["pending"], written=out["written"])
    tree = load_tree(p["config_root"], overlays=p["overlays"] or ())
    if p["to"]:  # an UpgradeTargetError (a CsisError) fails the task before any marker
        check_upgrade_target(tree, p["instance"], p["to"], reveal=reveal_of(module))
    out = mark_upgrade(p["config_root"], p["instance"], p["run_id"], to=p["to"], requested_by=p["requested_by"],
                       check=module.check_mode)
    pending = out["pending"] or {}
    try:
        same = onto_the_same_build(tree, p["instance"], pending.get("from"), to=pending.get("to"),
                                   reveal=reveal_of(module))
    except Exception:  # noqa: BLE001 - the head unread: the next run's render reads it and says
        same = None
    if same:
        module.warn(same + (" (check mode: no marker was left)" if module.check_mode else ""))
    return dict(changed=out["changed"], pending=out["pending"], written=out["written"])


RUN = ModuleRun(
    _mark,
    argument_spec(CONFIG_ARGS, INSTANCE_ARGS, state=dict(type="str", default="present", choices=["present", "absent"]),
                  to=dict(type="str"),
                  run_id=dict(type="str", required=True), requested_by=dict(type="str")),
    requires=("PyYAML", "pydantic", "boto3"),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
