# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

# Entries of an ``options:`` mapping (indented two spaces), matching CONFIG_ROOT_ARGS,
# CONFIG_ARGS and UNDECLARE_ARGS in plugins/module_utils/csis/module.py. The kinds of
# module in controller.py (csis.infra.controller.config_root, ...tree) are made of them.

CONFIG_ROOT_OPTION = r"""
  config_root:
    description: The configuration root (the directory holding C(cfg/_config.yml)).
    type: path
    required: true
"""

OVERLAYS_OPTION = r"""
  overlays:
    description:
      - Overlay files applied in order (later wins). Relative paths are relative to I(config_root).
      - C(config:) keys replace the file's; C(runtime_builders:) and C(state_backends:) entries
        are deep-merged by name onto the declared entries.
    type: list
    elements: path
    default: []
"""

INSTANCE_OPTION = r"""
  instance:
    description: The instance's name, as the tree declares it (meta-state records it under that name).
    type: str
    required: true
"""

UNDECLARE_OPTION = r"""
  undeclare:
    description: Instance names treated as removed from the YAML for this run (a decommission).
    type: list
    elements: str
    default: []
"""


class ModuleDocFragment:
    """The options of the modules that load a configuration tree.

    ``csis.infra.config``: O(config_root) and O(overlays) (``CONFIG_ARGS``);
    ``csis.infra.config.instance``: O(instance), the one launched instance the module acts on (``INSTANCE_ARGS``);
    ``csis.infra.config.undeclare``: O(undeclare) (``UNDECLARE_ARGS``).
    """

    def __init__(self):
        # put together from the texts above (the yamllint sanity test reads literal class
        # attributes only, and Ansible's fragment loader reads an instance)
        self.DOCUMENTATION = "options:" + CONFIG_ROOT_OPTION + OVERLAYS_OPTION
        self.INSTANCE = "options:" + INSTANCE_OPTION
        self.UNDECLARE = "options:" + UNDECLARE_OPTION
