# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Action plugin of csis.infra.csis_validate: the tree's ``!vault`` values are decrypted on the
controller (plugins/plugin_utils/vault.py) and those that do not decrypt go to the module as
``vault_problems``, reported with every other problem. No clear value leaves the controller."""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.csis.infra.plugins.plugin_utils import vault


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # unused
        args = dict(self._task.args)
        args["vault_problems"] = vault.tree_problems(self._loader, args.get("config_root"), args.get("overlays"))
        result.update(self._execute_module(module_args=args, task_vars=task_vars))
        return result
