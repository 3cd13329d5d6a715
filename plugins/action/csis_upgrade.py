# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Action plugin of csis.infra.csis_upgrade: the module runs in the controller's worker process,
with no module process of its own (plugins/plugin_utils/controller.py)."""
from __future__ import annotations

from ansible_collections.csis.infra.plugins.plugin_utils.controller import ControllerAction


class ActionModule(ControllerAction):
    MODULE = "csis_upgrade"
    AWS_SERVICES = ("ec2",)  # the build an upgrade asks for, looked up (render/series_heads.py)
