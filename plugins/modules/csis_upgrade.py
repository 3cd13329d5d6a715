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
author:
  - csis.infra maintainers (@csis-infra)
description:
  - Records C(pending_replacements.<instance>) in C(meta-state/pins.yaml). The next
    instance-image run treats the instance like a C(follow) target - it plans
    C(-replace=module.instance_<label>.aws_instance.this), whitelists the instance and its volume
    attachments, launches the next generation (C(<name>-NNN) advances) - and the record made
    after that apply moves the pin to what booted and clears the marker.
  - Only a launched, durable instance can be upgraded. Nothing is planned or applied here.
extends_documentation_fragment:
  - csis.infra.attributes
  - csis.infra.attributes.platform
  - csis.infra.attributes.action_group
options:
  config_root:
    description: The configuration root.
    type: path
    required: true
  instance:
    description: The instance name.
    type: str
    required: true
  to:
    description: The build (AMI id) to move to; default the image's series head at the next run.
    type: str
  run_id:
    description: The run id recorded with the marker.
    type: str
    required: true
  requested_by:
    description: Who asked (recorded).
    type: str
attributes:
  check_mode:
    support: none
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Upgrade test2 at the next instance-image run
  csis.infra.csis_upgrade:
    config_root: "{{ csis_root }}"
    instance: test2
    run_id: "{{ csis_run_id }}"
"""

RETURN = r"""
pending:
  description: The marker recorded.
  returned: success
  type: dict
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ROOT_ARGS, argument_spec, csis_module, fail_from
from ansible_collections.csis.infra.plugins.module_utils.csis.state.record import mark_upgrade


def main():
    module = csis_module(
        argument_spec=argument_spec(
            CONFIG_ROOT_ARGS,
            instance=dict(type="str", required=True),
            to=dict(type="str"),
            run_id=dict(type="str", required=True),
            requested_by=dict(type="str"),
        ),
        requires=("PyYAML",),
        supports_check_mode=False,
    )
    p = module.params
    if p["to"] and not (p["to"].startswith("ami-") and p["to"][4:].isalnum()):
        module.fail_json(msg="to %r is not an AMI id" % p["to"])
    try:
        out = mark_upgrade(p["config_root"], p["instance"], p["run_id"], to=p["to"], requested_by=p["requested_by"])
    except CsisError as exc:
        fail_from(module, exc)
    module.exit_json(changed=out["changed"], pending=out["pending"], written=out["written"])


if __name__ == "__main__":
    main()
