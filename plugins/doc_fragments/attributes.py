# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

# The attributes' descriptions, each an entry of an ``attributes:`` mapping (indented two
# spaces, ending with a newline, so an entry can take more keys after it). The fragments
# below and the kinds of module in controller.py (csis.infra.controller...) are made of them.

CHECK_MODE_ATTRIBUTE = r"""
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
"""

DIFF_MODE_ATTRIBUTE = r"""
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in C(check_mode)), when in diff mode.
"""

# csis.infra modules run on the controller (delegated to localhost) unless their docs say otherwise
PLATFORM_ATTRIBUTE = r"""
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
    details:
      - Runs on the controller (run it on C(localhost) or delegate it there); it reaches AWS and terraform from there.
"""

# the modules of the csis.infra.csis action group (meta/runtime.yml): those taking config_root
ACTION_GROUP_ATTRIBUTE = r"""
  action_group:
    description:
      - Use C(group/csis.infra.csis) in C(module_defaults) to set defaults for this module,
        for example O(config_root) once for a play.
      - Every module of the group takes O(config_root); other options are not common to all of them.
    support: full
    membership:
      - csis.infra.csis
"""

# the modules whose action plugin runs them in the controller's worker (plugins/plugin_utils/controller.py)
WORKER_ATTRIBUTE = r"""
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
    support: full
    details:
      - The action plugin runs the module in the controller's worker process, with no module process
        of its own, whatever host the task targets.
"""


class ModuleDocFragment:
    """The descriptions of the attributes every csis.infra module declares.

    The kinds of module in controller.py bring these with the author, the requirements and
    the shared options; a module that is no such kind (csis_verify_instance) uses
    ``csis.infra.attributes`` (check mode, diff mode) and ``csis.infra.attributes.platform``
    (and a member of the ``csis`` action group ``csis.infra.attributes.action_group``).
    A module its action plugin runs in the controller's worker adds ``csis.infra.attributes.worker``.
    The module itself states ``support`` (and ``details``) for check mode and diff mode.
    """

    def __init__(self):
        # put together from the texts above (the yamllint sanity test reads literal class
        # attributes only, and Ansible's fragment loader reads an instance)
        self.DOCUMENTATION = "options: {}\nattributes:" + CHECK_MODE_ATTRIBUTE + DIFF_MODE_ATTRIBUTE
        self.PLATFORM = "options: {}\nattributes:" + PLATFORM_ATTRIBUTE
        self.ACTION_GROUP = "options: {}\nattributes:" + ACTION_GROUP_ATTRIBUTE
        self.WORKER = "options: {}\nattributes:" + WORKER_ATTRIBUTE
