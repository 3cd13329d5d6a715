#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_graph
short_description: Draw a csis.infra tree (accounts, environments, runtimes, builders, storages, instances) with graphviz
version_added: 0.2.0
description:
  - Loads the configuration tree, its meta-state and the HARD lines of the last state query (meta-state's
    C(drift.yaml) and this checkout's C(generated/state-report.json), both of which count), and
    draws accounts, environments, runtimes, builders (one terraform root each), groups, storages and instances.
  - Runs the validation rules, except the executables' versions (nothing runs terraform). A tree that loads but breaks
    a rule is drawn anyway, its problems returned (RV(problems)), warned and named in the picture's title, without
    the remote-state references. A tree or meta-state that does not load fails the module with every problem.
  - Each storage and instance shows its state (C(declared), C(active), C(launched), C(archived), C(destroyed),
    or C(drifted HARD) when the last state query found a HARD line for it); records of objects the tree no longer
    declares are drawn too.
  - Edges are containment, mounts (storage to instance, with the mount point) and the remote-state references
    between the roots a render would emit (the C(terraform_remote_state) blocks; none without state backends).
  - Writes C(<config_root>/generated/graph.dot) and, laid out by graphviz's C(dot) (run with a timeout),
    C(generated/graph.svg) and C(generated/graph.png) when dot supports PNG. Each file is replaced atomically,
    and only when its content differs.
  - Fails naming C(dot) when graphviz is not installed (C(scripts/bootstrap) installs it); it never skips the picture.
extends_documentation_fragment:
  - csis.infra.controller.tree
  - csis.infra.attributes.worker
options:
  dot:
    description: The graphviz C(dot) program (a name looked up on C(PATH), or a path).
    type: str
    default: dot
  timeout:
    description: Seconds one C(dot) run may take.
    type: int
    default: 120
attributes:
  check_mode:
    details: Builds the DOT text and runs C(dot), but writes nothing.
requirements:
  - graphviz (the C(dot) program)
"""

EXAMPLES = r"""
- name: Draw the tree
  csis.infra.csis_graph:
    config_root: "{{ csis_config_root }}"
    overlays: "{{ csis_overlays | default([]) }}"
  register: csis_picture
"""

RETURN = r"""
paths:
  description: The files written (or, in check mode, that would be), by format (C(dot), C(svg), C(png)).
  returned: success
  type: dict
  sample: {dot: /trees/t/generated/graph.dot, svg: /trees/t/generated/graph.svg, png: /trees/t/generated/graph.png}
formats:
  description: The formats produced (C(png) only when dot supports it).
  returned: success
  type: list
  elements: str
  sample: [dot, svg, png]
graph:
  description: The objects drawn (C(kind), C(name), C(state), C(declared)) and the edges (C(kind), C(from), C(to), C(label)).
  returned: success
  type: dict
problems:
  description: The validation problems of a tree drawn anyway (empty when it validates).
  returned: success
  type: list
  elements: str
hard:
  description: The objects drawn as drifted HARD, one line each.
  returned: success
  type: list
  elements: str
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, ModuleRun, argument_spec, problems_message
from ansible_collections.csis.infra.plugins.module_utils.csis.render.graph import picture


def _run(module, p):
    try:
        out = picture(p["config_root"], overlays=p["overlays"], dot=p["dot"], timeout=p["timeout"],
                      write=not module.check_mode)
    except ConfigError as exc:
        module.fail_json(msg=problems_message(exc, p["config_root"]), problems=[str(x) for x in exc.problems])
    for problem in out["problems"]:
        module.warn("not valid, drawn anyway: %s" % problem)
    return dict(changed=out["changed"], paths=out["paths"], formats=out["formats"], graph=out["graph"],
                hard=out["hard"], problems=out["problems"])


RUN = ModuleRun(
    _run,
    argument_spec(
        CONFIG_ARGS,
        dot=dict(type="str", default="dot"),
        timeout=dict(type="int", default=120),
    ),
    requires=("PyYAML", "pydantic"),
    failure={"changed": False},
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
