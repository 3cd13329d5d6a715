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
  - Read-only. A runtime with static keys (C(!vault) values) is reached with them, decrypted on the controller with
    the run's vault secrets; otherwise credentials come from the environment (or the runtime's profile).
extends_documentation_fragment:
  - csis.infra.controller.tree_read_only
  - csis.infra.aws.boto3
  - csis.infra.attributes.worker
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

from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree
from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import read_meta
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, ModuleRun, argument_spec, fail_from, reveal_of
from ansible_collections.csis.infra.plugins.module_utils.csis.state.readback import summarize, summary_lines


def _run(module, p):
    try:
        tree = load_tree(p["config_root"], overlays=p["overlays"])
    except CsisError as exc:
        fail_from(module, exc)
    meta, problems = read_meta(tree.root)
    if problems:
        module.fail_json(msg="\n".join(str(x) for x in problems))
    reveal = reveal_of(module)
    try:
        s = summarize(tree, meta, reveal)
    except CsisError as exc:  # static keys that do not decrypt, named by file and key
        fail_from(module, exc)
    except Exception as exc:  # noqa: BLE001 - a transport or permission error, named
        fail_from(module, exc, prefix="could not read the endpoint: ")
    return dict(changed=False, summary=s, lines=summary_lines(s))


RUN = ModuleRun(_run, argument_spec(CONFIG_ARGS), requires=("PyYAML", "pydantic", "boto3"),
                options=dict(supports_check_mode=True))


def main():
    RUN.main()


if __name__ == "__main__":
    main()
