#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r'''
---
module: csis_apply_check
short_description: Re-read the apply flags at execution time and refuse an apply they do not allow now
version_added: 0.1.0
description:
  - Run just before an apply. Reads C(cfg/_config.yml) and each overlay's C(config:) mapping as
    they are now (plain YAML, no model; overlays in order, later wins) and fails unless the
    lifecycle's apply flag allows the root.
  - Flags - V(storage) uses C(apply_storage); V(instance-image) (alias V(instances)) uses
    C(apply_instances); V(identity) uses C(apply_identity) when any file sets it to anything but
    null, else (unset, or null in the file that sets it last, as the render reads it) it is
    allowed when C(apply_storage) or C(apply_instances) allows the root.
  - A flag is V(true)/V(false) (null means false, but for C(apply_identity), where it means not
    set) or a list of builder/runtime names (the root or one of O(root_alias) must be listed). Anything else, such as the quoted string C("false"),
    is refused naming the file and key.
  - First, the run must still hold its tree - when the watcher of an S3 run lock (M(csis.infra.csis_run_lock))
    lost it (another run broke it after it expired unrenewed, or the store did not renew it within its life), the
    check refuses with C(this run's lock on the tree was lost at <time> (<why>)).
  - >-
    Refusals: C(apply-check: no cfg/_config.yml found from the working directory up; refusing to apply),
    C(apply-check: overlay <path> is gone; refusing to apply),
    C(apply_<lc> is <value> NOW in <file> for root '<B>' -- not applying.) where C(<file>) is the
    file the effective value came from (the overlay when an overlay set it).
extends_documentation_fragment:
  - csis.infra.controller.read_only
  - csis.infra.attributes.action_group
  - csis.infra.attributes.worker
options:
  lifecycle:
    description: The lifecycle whose apply flag decides (V(instances) is another name for V(instance-image)).
    type: str
    required: true
    choices: [identity, storage, instance-image, instances]
  config_root:
    description:
      - The configuration root (the directory holding C(cfg/_config.yml)). When omitted, the
        module walks up from O(search_from) looking for C(cfg/_config.yml).
    type: path
  search_from:
    description: Where the walk up starts when O(config_root) is omitted. Default the module's working directory.
    type: path
  root:
    description: The root's builder name. Without it a list flag allows nothing.
    type: str
  root_alias:
    description: Other names the root answers to in a list flag (its runtime name).
    type: list
    elements: str
    default: []
  overlays:
    description: Overlay files (relative to the configuration root unless absolute); each must still exist.
    type: list
    elements: path
    default: []
  apply_runtime:
    description:
      - Narrow the apply to the roots of this runtime (storage and instance-image only).
        It never widens - a flag that is off now stays off.
    type: str
notes:
  - No side effects; check mode runs the same check.
seealso:
  - module: csis.infra.csis_gate_plan
    description: Refuses unsanctioned destroys and stale plans.
  - module: csis.infra.csis_plan_binding
    description: Binds the plan file to the root's content.
attributes:
  check_mode:
    details: No side effects; check mode runs the same check.
'''

EXAMPLES = r'''
- name: Refuse the apply unless apply_instances allows this root now
  csis.infra.csis_apply_check:
    config_root: "{{ csis_config_root }}"
    lifecycle: instance-image
    root: aws-instances
    root_alias: [aws-eu]
    overlays: "{{ csis_overlays | default([]) }}"
    apply_runtime: "{{ csis_apply_runtime | default(omit) }}"
'''

RETURN = r'''
allowed:
  description: Always true when the module succeeds.
  returned: success
  type: bool
  sample: true
flag:
  description: The flag's value as read now (before any apply_runtime narrowing).
  returned: success
  type: raw
  sample: ["aws-eu"]
source:
  description: The file the effective value came from.
  returned: success
  type: str
  sample: /srv/cfg/cfg/_config.yml
key:
  description: The configuration key that decided.
  returned: success
  type: str
  sample: apply_instances
files_read:
  description: Every file read, in order.
  returned: success
  type: list
  elements: str
'''

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.applycheck import check_apply
from ansible_collections.csis.infra.plugins.module_utils.csis.module import ModuleRun
from ansible_collections.csis.infra.plugins.module_utils.csis.state.runlock import check_held


def _check(module, p):
    check_held()  # the run still holds its tree (an S3 run lock can be lost mid-run)
    return dict(check_apply(p['lifecycle'], root=p['root'], root_alias=p['root_alias'], overlays=p['overlays'],
                            apply_runtime=p['apply_runtime'], config_root=p['config_root'], search_from=p['search_from']),
                changed=False)


RUN = ModuleRun(_check, dict(
    lifecycle=dict(type='str', required=True, choices=['identity', 'storage', 'instance-image', 'instances']),
    config_root=dict(type='path'), search_from=dict(type='path'), root=dict(type='str'),
    root_alias=dict(type='list', elements='str', default=[]), overlays=dict(type='list', elements='path', default=[]),
    apply_runtime=dict(type='str'),
), requires=("PyYAML",), failure=dict(changed=False, allowed=False), options=dict(supports_check_mode=True))


def main():
    RUN.main()


if __name__ == '__main__':
    main()
