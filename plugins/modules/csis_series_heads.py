#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_series_heads
short_description: Resolve the series heads of the images that follow instances run
version_added: 0.1.0
description:
  - For every image a C(image_policy=follow) instance runs (and the images of O(instances),
    e.g. an explicit upgrade), the newest self-owned AMI whose name starts with the image's
    C(name_pattern) on the instance's runtime (instances with a pending upgrade marker are included) (boto3 C(describe_images), C(Owners=[self]),
    with the runtime's region, profile and endpoint).
  - A network call, so it is its own step of the C(csis.infra.render) role; the result is
    passed to M(csis.infra.csis_render) as C(series_heads). Validation never calls it.
  - Makes no call when no instance follows and O(instances) is empty.
  - >-
    A pending upgrade marker that names its build (C(upgrade_instance.yml -e to=<ami>)) has that build looked up
    again (C(describe_images) by id): one deregistered, no longer C(available), or not a build of the instance's
    image since the marker was left fails the task before the render. The replacement is delete-then-create:
    applied onto a build that cannot boot, it would terminate the machine and never launch its successor.
    A lookup that fails (no access, the endpoint down) fails the task too, saying so. The role skips this step
    with C(csis_resolve_series_heads=false), and the build is then not looked up either.
extends_documentation_fragment:
  - csis.infra.controller.tree_read_only
  - csis.infra.config.undeclare
  - csis.infra.aws.boto3
  - csis.infra.attributes.worker
options:
  instances:
    description: Also resolve the heads of these instances' images (whatever their policy).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Resolve the series heads
  csis.infra.csis_series_heads:
    config_root: "{{ csis_root }}"
    overlays: "{{ csis_overlays }}"
  register: heads
"""

RETURN = r"""
series_heads:
  description: C(<image>@<runtime>) to C({ami_id, name, creation_date}).
  returned: success
  type: dict
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError, CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, UNDECLARE_ARGS, ModuleRun, argument_spec, fail_from, reveal_of
from ansible_collections.csis.infra.plugins.module_utils.csis.render.series_heads import (
    UpgradeTargetError, check_upgrade_target, series_heads, wanted_series)
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState


def _run(module, p):
    try:
        tree = load_tree(p["config_root"], overlays=p["overlays"], undeclare=p["undeclare"])
        markers = MetaState(tree.root).load_rest("pins.yaml")["pending_replacements"]
        pending = sorted(markers)
    except ConfigError as exc:
        fail_from(module, exc, prefix="the configuration does not load (run playbooks/validate.yml):\n", problems_key=None)
    except CsisError as exc:
        fail_from(module, exc)
    # a pending upgrade's build was looked up when the marker was left (csis_upgrade); it may have been
    # deregistered since, and the replacement is delete-then-create: looked up again before the render
    for name in pending:
        marker = markers[name]
        to = marker.get("to") if isinstance(marker, dict) else None
        if to and name in tree.instances:
            try:
                check_upgrade_target(tree, name, to, reveal=reveal_of(module), outcome=(
                    "nothing rendered: cancel the upgrade (playbooks/upgrade_instance.yml -e instance=%s -e cancel=true) "
                    "or leave it again onto another build" % name), unchecked=(
                    "nothing rendered: the replacement is delete-then-create, so its build is looked up before each "
                    "render; fix the runtime's access and run again (-e csis_resolve_series_heads=false renders "
                    "without looking it or any series head up)"))
            except UpgradeTargetError as exc:
                module.fail_json(msg="the pending upgrade of %s: %s" % (name, exc))
    wanted = list(p["instances"]) + pending
    series = wanted_series(tree, wanted)
    if not series:
        return dict(changed=False, series_heads={})
    try:
        heads = series_heads(tree, wanted, reveal=reveal_of(module))
    except CsisError as exc:
        fail_from(module, exc)
    except Exception as exc:  # botocore: endpoint, credentials
        fail_from(module, exc, prefix="series heads: describe_images failed for %s (an instance follows the image's series or "
                                      "awaits an upgrade, so the render names its newest AMI; -e csis_resolve_series_heads=false "
                                      "renders without looking): " % ", ".join("image '%s' on runtime '%s'" % (img, rt)
                                                                               for img, rt, _pattern in series))
    return dict(changed=False, series_heads=heads)


RUN = ModuleRun(
    _run,
    argument_spec(CONFIG_ARGS, UNDECLARE_ARGS, instances=dict(type="list", elements="str", default=[])),
    requires=("PyYAML", "pydantic"),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
