# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Action plugin of csis.infra.csis_plan: the root's ``secrets`` (csis_render's
``roots[].secrets``: vault ciphertext) are decrypted on the controller and handed to the module
as ``secret_env`` (a ``no_log`` argument), on the module's standard input (pipelining: the
arguments are never written to a temporary file): terraform's plan gets them as ``TF_VAR_``
environment."""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.csis.infra.plugins.plugin_utils import vault


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # unused
        args = dict(self._task.args)
        args["secret_env"] = vault.resolve(self._loader, args.pop("secrets", None) or {})
        if args["secret_env"]:
            vault.pipeline(self._connection)
        result.update(self._execute_module(module_args=args, task_vars=task_vars))
        return result
