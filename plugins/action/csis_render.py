# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Action plugin of csis.infra.csis_render: the module runs in the controller's worker process
(plugins/plugin_utils/controller.py). Before it renders anything, the tree's ``!vault`` values
are decrypted here (plugins/plugin_utils/vault.py). One that does not decrypt fails the task
naming its file and key, and nothing is written (the render does not run). No clear value is
written or returned: the rendered roots take them as variables, which csis_plan and
csis_apply_start set."""
from __future__ import annotations

from ansible_collections.csis.infra.plugins.plugin_utils import vault
from ansible_collections.csis.infra.plugins.plugin_utils.controller import ControllerAction, Done


class ActionModule(ControllerAction):
    MODULE = "csis_render"

    def module_args(self, args):
        failed = vault.tree_problems(self._loader, args.get("config_root"), args.get("overlays"))
        if failed:
            lines = ["%s: %s: %s" % (p["file"], p["key"], p["message"]) for p in failed]
            raise Done(dict(failed=True, changed=False, msg="\n".join(lines), problems=lines))
        return args
