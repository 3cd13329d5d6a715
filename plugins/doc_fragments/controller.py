# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

from .attributes import ACTION_GROUP_ATTRIBUTE, CHECK_MODE_ATTRIBUTE, DIFF_MODE_ATTRIBUTE, PLATFORM_ATTRIBUTE
from .aws import AWS_OPTION, BOTO3_REQUIREMENT
from .config import CONFIG_ROOT_OPTION, INSTANCE_OPTION, OVERLAYS_OPTION

AUTHOR = r"""
author:
  - csis.infra maintainers (@csis-infra)
"""

PYDANTIC_REQUIREMENT = r"""
requirements:
  - pydantic >= 2.7 (the configuration models)
"""

# keys added to the check_mode and diff_mode entries (after their descriptions)
CHECK_FULL = "    support: full\n"
DIFF_NONE = "    support: none\n"
READ_ONLY_CHECK = CHECK_FULL + "    details: Read-only.\n"
READ_ONLY_DIFF = "    support: N/A\n    details: This action does not modify state.\n"


def _kind(read_only=False, action_group=False, options=" {}\n", requirements=""):
    """A kind's documentation: the author, the attributes (check mode, diff mode, the controller
    platform, the action group when ``action_group``), the ``options`` entries and the ``requirements``."""
    return (AUTHOR
            + "attributes:"
            + CHECK_MODE_ATTRIBUTE + (READ_ONLY_CHECK if read_only else CHECK_FULL)
            + DIFF_MODE_ATTRIBUTE + (READ_ONLY_DIFF if read_only else DIFF_NONE)
            + PLATFORM_ATTRIBUTE
            + (ACTION_GROUP_ATTRIBUTE if action_group else "")
            + "options:" + options
            + requirements)


class ModuleDocFragment:
    """The kinds of csis.infra module that run on the controller: each brings the author, the
    attributes, the requirements and the shared options at once.

    ``csis.infra.controller``: a module working on a terraform root (or nothing shared);
    ``csis.infra.controller.config_root``: a module of the ``csis`` action group that takes
    O(config_root) (``CONFIG_ROOT_ARGS``) and reads or writes meta-state;
    ``csis.infra.controller.instance``: one of those acting on one launched instance through
    its runtime (O(instance), O(aws): ``INSTANCE_ARGS``, ``AWS_ACCESS_ARGS``; boto3);
    ``csis.infra.controller.tree``: one that loads the configuration tree (O(config_root),
    O(overlays): ``CONFIG_ARGS``; pydantic). The ``read_only`` variants document a module
    that changes nothing (check mode V(full), "Read-only."; diff mode V(N/A)).

    Check mode is V(full) and diff mode V(none) unless the module says otherwise (it states
    check mode's ``details``; validate-modules refuses a check mode ``support`` that
    ``supports_check_mode`` contradicts). A module calling AWS itself adds ``csis.infra.aws``
    (the O(aws) option and boto3) or ``csis.infra.aws.boto3`` (boto3 alone).
    """

    def __init__(self):
        # put together from the texts above (the yamllint sanity test reads literal class
        # attributes only, and Ansible's fragment loader reads an instance)
        self.DOCUMENTATION = _kind()
        self.READ_ONLY = _kind(read_only=True)
        self.CONFIG_ROOT = _kind(action_group=True, options=CONFIG_ROOT_OPTION)
        self.INSTANCE = _kind(action_group=True, options=CONFIG_ROOT_OPTION + INSTANCE_OPTION + AWS_OPTION,
                              requirements=BOTO3_REQUIREMENT)
        self.TREE = _kind(action_group=True, options=CONFIG_ROOT_OPTION + OVERLAYS_OPTION, requirements=PYDANTIC_REQUIREMENT)
        self.TREE_READ_ONLY = _kind(read_only=True, action_group=True, options=CONFIG_ROOT_OPTION + OVERLAYS_OPTION,
                                    requirements=PYDANTIC_REQUIREMENT)
