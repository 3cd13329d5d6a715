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

from ansible.module_utils.parsing.convert_bool import boolean

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

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        # A real run plans each root as a host of its own (the render role's add_host): Ansible
        # runs at most `forks` of them at once, so more roots than forks wait for a free one.
        forks = (task_vars or {}).get("ansible_forks")
        roots = result.get("roots") or []
        if not result.get("failed") and not boolean(self._task.args.get("dry_run", True), strict=False) \
                and isinstance(forks, int) and 0 < forks < len(roots):
            result.setdefault("warnings", []).append(
                "%d roots, and Ansible runs %d forks: the roots are planned and applied %d at a time. Raise forks "
                "(ansible.cfg [defaults] forks, ANSIBLE_FORKS, -f, or the AWX job template's Forks) to at least %d "
                "to run them all at once, memory allowing (about 1 GB per terraform plan with the AWS provider)"
                % (len(roots), forks, forks, len(roots)))
        return result
