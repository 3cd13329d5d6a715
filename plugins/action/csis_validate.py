# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Action plugin of csis.infra.csis_validate: the module runs in the controller's worker process
(plugins/plugin_utils/controller.py). The tree's ``!vault`` values are decrypted here first
(plugins/plugin_utils/vault.py), and those that do not decrypt go to the module as
``vault_problems``, reported with every other problem. No clear value is returned."""
from __future__ import annotations

from ansible_collections.csis.infra.plugins.plugin_utils import vault
from ansible_collections.csis.infra.plugins.plugin_utils.controller import ControllerAction


class ActionModule(ControllerAction):
    MODULE = "csis_validate"

    def module_args(self, args):
        args["vault_problems"] = vault.tree_problems(self._loader, args.get("config_root"), args.get("overlays"))
        return args
