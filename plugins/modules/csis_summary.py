#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_summary
short_description: Summarize what a csis.infra tree's resources look like at the AWS endpoint
version_added: 0.1.0
description:
  - Reads back, through each runtime's endpoint, the instances and volumes tagged with the tree's
    C(csis_config) tag, the EFS filesystems with their access points and mount targets, and the buckets
    meta-state records as active with their lifecycle rules and tags.
  - Read-only. Credentials come from the environment (or the runtime's profile).
author:
  - csis.infra maintainers
extends_documentation_fragment:
  - csis.infra.config
options:
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: What exists now
  csis.infra.csis_summary:
    config_root: examples
  register: summary
"""

RETURN = r"""
summary:
  description: Instances, volumes, filesystems and buckets as the endpoint reports them.
  returned: success
  type: dict
lines:
  description: The same, one human line per resource.
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.csis.infra.plugins.module_utils.csis.config import read_meta
from ansible_collections.csis.infra.plugins.module_utils.csis.loader import ConfigError, load_tree
from ansible_collections.csis.infra.plugins.module_utils.csis.reality import summarize, summary_lines


def main():
    module = AnsibleModule(
        argument_spec=dict(config_root=dict(type="path", required=True),
                           overlays=dict(type="list", elements="path", default=[])),
        supports_check_mode=True,
    )
    try:
        tree = load_tree(module.params["config_root"], overlays=module.params["overlays"])
    except ConfigError as exc:
        module.fail_json(msg=str(exc), problems=[str(p) for p in exc.problems])
    meta, problems = read_meta(tree.root)
    if problems:
        module.fail_json(msg="\n".join(str(p) for p in problems))
    try:
        s = summarize(tree, meta)
    except Exception as exc:  # noqa: BLE001 - a transport or permission error, named
        module.fail_json(msg="could not read the endpoint: %s" % exc)
    module.exit_json(changed=False, summary=s, lines=summary_lines(s))


if __name__ == "__main__":
    main()
