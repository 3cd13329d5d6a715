# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Action plugin of csis.infra.csis_apply_start (documentation: plugins/modules/csis_apply_start.py).

Runs ``community.general.terraform`` with the task's arguments (``terraform``), as an async job
when the task says ``async`` (the ``csis.infra.tofu_root`` apply), with the root's ``secrets``
decrypted on the controller and put in this worker's environment, which the module (and the
terraform under it) inherits through the local connection. They are never in an ``environment:``
keyword (Ansible prints it with the command line at ``-vvv``) nor in the module's arguments
(``community.general.terraform`` has no environment option, and echoes ``-var`` values). The
worker is this task's own process; the values are taken out of its environment again at once."""
from __future__ import annotations

import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.csis.infra.plugins.plugin_utils import vault

MODULE = "community.general.terraform"


def _private_dir(path):
    """Make Ansible's async directory this user's only before the job writes its results file
    there: community.general.terraform's result holds ``terraform output -json``, sensitive outputs
    in clear, and async_wrapper writes it under a 022 umask. A directory of another owner is left
    as it is (csis_apply_wait removes the file once read)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError:
        pass  # async_wrapper names a directory it cannot use


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = True
    _VALID_ARGS = frozenset(("terraform", "secrets"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # unused
        args = self._task.args
        tf_args = args.get("terraform")
        if not isinstance(tf_args, dict) or not tf_args:
            raise AnsibleActionFail("terraform must be the arguments of community.general.terraform (a mapping)")
        env = vault.resolve(self._loader, args.get("secrets") or {})
        if env and self._connection.transport not in ("local", "ansible.builtin.local"):
            raise AnsibleActionFail("csis_apply_start hands terraform the root's secrets through the controller's "
                                    "environment: the host must use the local connection (connection: %s)"
                                    % self._connection.transport)
        wrap_async = bool(self._task.async_val) and not self._connection.has_native_async
        if wrap_async:
            _private_dir(os.path.expanduser(self.get_shell_option("async_dir", default="~/.ansible_async")))
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        # never in diff mode: community.general.terraform's diff is the plan's every before and after
        # value (terraform show -json: sensitive ones in clear), which --diff (or AWX's "Show Changes")
        # would print; the gate has shown the plan's changes, masked, before the approval
        diff, self._task.diff = self._task.diff, False
        try:
            result.update(self._execute_module(module_name=MODULE, module_args=dict(tf_args), task_vars=task_vars,
                                               wrap_async=wrap_async))
        finally:
            self._task.diff = diff
            for k, old in saved.items():
                if old is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = old
        if not wrap_async:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
