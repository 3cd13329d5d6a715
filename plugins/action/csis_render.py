# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Action plugin of csis.infra.csis_render: before the module renders anything, the tree's
``!vault`` values are decrypted on the controller (plugins/plugin_utils/vault.py). One that does
not decrypt fails the task naming its file and key, and nothing is written (the module does not
run). No clear value leaves the controller: the rendered roots take them as variables, which
csis_plan and csis_apply_start set."""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.csis.infra.plugins.plugin_utils import vault


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # unused
        args = self._task.args
        failed = vault.tree_problems(self._loader, args.get("config_root"), args.get("overlays"))
        if failed:
            lines = ["%s: %s: %s" % (p["file"], p["key"], p["message"]) for p in failed]
            result.update(failed=True, changed=False, msg="\n".join(lines), problems=lines)
            return result
        result.update(self._execute_module(task_vars=task_vars))
        return result
