# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Action plugin of csis.infra.csis_plan_binding: the module runs in the controller's worker process,
with no module process of its own (plugins/plugin_utils/controller.py)."""
from __future__ import annotations

from ansible_collections.csis.infra.plugins.plugin_utils.controller import ControllerAction


class ActionModule(ControllerAction):
    MODULE = "csis_plan_binding"
    AWS_SERVICES = ("s3",)  # check_state: the root's state object, read from an S3 backend (module_utils/csis/tfstate.py)
