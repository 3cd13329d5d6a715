# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations


class ModuleDocFragment:
    """The descriptions of the attributes every csis.infra module declares.

    Every module uses ``csis.infra.attributes`` (check mode, diff mode) and
    ``csis.infra.attributes.platform``; the members of the ``csis`` action group
    (meta/runtime.yml) also use ``csis.infra.attributes.action_group``. The module itself
    states ``support`` (and ``details``) for check mode and diff mode.
    """

    # check_mode and diff_mode: the module sets support (full, partial, none, N/A) and details
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in C(check_mode)), when in diff mode.
"""

    # csis.infra modules run on the controller (delegated to localhost) unless their docs say otherwise
    PLATFORM = r"""
options: {}
attributes:
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
    details:
      - Runs on the controller (run it on C(localhost) or delegate it there); it reaches AWS and terraform from there.
"""

    # the modules of the csis.infra.csis action group (meta/runtime.yml): those taking config_root
    ACTION_GROUP = r"""
options: {}
attributes:
  action_group:
    description:
      - Use C(group/csis.infra.csis) in C(module_defaults) to set defaults for this module,
        for example O(config_root) once for a play.
      - Every module of the group takes O(config_root); other options are not common to all of them.
    support: full
    membership:
      - csis.infra.csis
"""
