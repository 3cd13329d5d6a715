# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Action plugin of csis.infra.csis_plan: the module runs in the controller's worker process
(plugins/plugin_utils/controller.py). The root's ``secrets`` (csis_render's ``roots[].secrets``:
vault ciphertext) are decrypted here first and given to the module as ``secret_env`` (a
``no_log`` argument, never written anywhere and removed from the result): terraform's plan gets
them as ``TF_VAR_`` environment."""
from __future__ import annotations

from ansible_collections.csis.infra.plugins.plugin_utils import vault
from ansible_collections.csis.infra.plugins.plugin_utils.controller import ControllerAction


class ActionModule(ControllerAction):
    MODULE = "csis_plan"
    AWS_SERVICES = ("s3",)

    def module_args(self, args):
        args["secret_env"] = vault.resolve(self._loader, args.pop("secrets", None) or {})
        return args
