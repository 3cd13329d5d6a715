# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A csis.infra module run in the controller's worker process instead of a module process.

The csis.infra modules run on the controller (their docs' ``platform`` attribute). A module
process costs about half a second of CPU before the module's first line: AnsiballZ runs it from
a zip of its ``module_utils``, from which Python keeps no bytecode, so ``ansible.module_utils.basic``
is compiled again at each task (benchmarks/README.md, "What one task costs"). So a module's
action plugin is a :class:`ControllerAction` naming it, which runs the module's ``RUN``
(:class:`~ansible_collections.csis.infra.plugins.module_utils.csis.module.ModuleRun`) in the
worker Ansible forked for this task, whatever host the task targets.

What a module process would have, the worker gets the same way:

- the arguments are checked against the module's own argument spec (``validate_argument_spec``:
  the same types, defaults, choices and ``required_by``), and are plain data (as JSON would make them);
- check mode and diff mode are the task's;
- the task's ``environment:`` (the play's ``CSIS_AWX_*``, ``CSIS_LOCK_TIMEOUT``) is in
  ``os.environ`` while the module runs, and restored after it;
- the module's warnings are the result's ``warnings``; its failure (``fail_json``) is the task's,
  and so is an unexpected exception (its traceback as the result's ``exception``, which Ansible
  shows at ``-vvv``), as a module process's traceback fails its task;
- no value of a ``no_log`` option is in the result, the message and traceback included (as
  AnsibleModule's exit removes them);
- and one thing a module process cannot have: the run's vault secrets, as ``module.decrypt``, so
  a module reaching AWS signs with a runtime's ``!vault`` static keys (``module.reveal_of``),
  which stay in this process's memory and are in no argument or result.

The apply, started as an async job that outlives the task, keeps its module process, and so does
``csis_verify_instance``, which runs on the launched instance. ``csis_run_lock`` forks its
watcher (detached) from the worker as it did from its module process.
"""
from __future__ import annotations

import gc
import importlib
import json
import os
import traceback
from typing import Any, Dict, List, Tuple

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.errors import UnsupportedError
from ansible.plugins.action import ActionBase

from ansible_collections.csis.infra.plugins.module_utils.csis import aws
from ansible_collections.csis.infra.plugins.module_utils.csis.module import call_run, missing_library
from ansible_collections.csis.infra.plugins.plugin_utils import vault

MODULES = "ansible_collections.csis.infra.plugins.modules."
#: the validator's keyword arguments among a ModuleRun's options (the others are AnsibleModule's own)
VALIDATOR_OPTIONS = ("mutually_exclusive", "required_together", "required_one_of", "required_if", "required_by")


class Done(BaseException):
    """The module's exit (``exit_json``) or failure (``fail_json``), with its result. Like the
    SystemExit those raise in a module process, no ``except Exception`` of the module catches it."""

    def __init__(self, result: Dict[str, Any]) -> None:
        super().__init__(result.get("msg", ""))
        self.result = result


class WorkerModule:
    """What a csis.infra module's run uses of AnsibleModule: its parameters, check mode and diff
    mode, warnings, and an exit or failure (which raise :class:`Done`)."""

    def __init__(self, params: Dict[str, Any], check_mode: bool, diff: bool, decrypt: Any = None) -> None:
        self.params = params
        self.check_mode = check_mode
        self._diff = diff
        self.warnings: List[str] = []
        #: the run's vault decryption (plugin_utils/vault.py ``decrypter``): the module's
        #: ``module.reveal_of`` turns a runtime's ``!vault`` static keys into what boto3 signs with
        self.decrypt = decrypt

    def warn(self, warning: str) -> None:
        self.warnings.append(str(warning))

    def exit_json(self, **result: Any) -> None:
        raise Done(result)

    def fail_json(self, msg: str, **result: Any) -> None:
        result.pop("exception", None)  # a traceback of the controller's import: the message says it
        raise Done(dict(result, failed=True, msg=msg))


def plain(value: Any) -> Any:
    """``value`` as JSON data: what a module process would receive (no tagged strings)."""
    return json.loads(json.dumps(value))


class ControllerAction(ActionBase):
    """The action plugin of a module run in the worker: ``MODULE`` names it (``csis_approval``)."""

    MODULE = ""
    #: the AWS services the module builds clients of: boto3 and their models are read in the
    #: controller too (:func:`~ansible_collections.csis.infra.plugins.module_utils.csis.aws.preload`)
    AWS_SERVICES: Tuple[str, ...] = ()
    _supports_check_mode = True
    _supports_async = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Import the module (and the library it uses) where its action plugin is defined.

        Ansible's strategy loads a task's action plugin class in the controller before it forks
        the task's worker (``action_loader.get(..., class_only=True)``), so every later worker
        inherits these imports instead of importing the library again (the configuration
        models: about half a second of CPU per task), and for a module that reaches AWS
        (:attr:`AWS_SERVICES`) boto3 and the services' models (about 0.3 s per task). An import
        that fails here is left to :meth:`run`, which fails the task with the error.

        Then ``gc.freeze()``: the objects the controller holds at that point (above all, the
        modules just imported) move to the collector's permanent generation, as CPython's documentation
        advises for a process that forks workers. The cyclic collector no longer walks them at
        each full collection, in the controller or in a worker (where walking them also copies
        the pages the worker shares with the controller); refcounting still frees them. A
        no-op dry run of ``site.yml`` took about 15 % less CPU (benchmarks/README.md, "The
        collector and the workers")."""
        super().__init_subclass__(**kwargs)
        if cls.MODULE:
            try:
                importlib.import_module(MODULES + cls.MODULE)
                aws.preload(cls.AWS_SERVICES)
            except Exception:  # pylint: disable=broad-exception-caught
                pass
            # what the controller holds now (Ansible, the library, boto3's models) is left out of
            # the cyclic collector from here on, in the controller and in every worker it forks:
            # a full collection no longer walks that heap (nor, in a worker, copies its pages)
            gc.freeze()

    def module_args(self, args: Dict[str, Any]) -> Dict[str, Any]:
        """The module's arguments from the task's (plain data): a plugin that decrypts the tree's
        ``!vault`` values on the controller does it here, and may end the task (raise :class:`Done`)."""
        return args

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # unused
        spec = importlib.import_module(MODULES + self.MODULE).RUN
        options = dict(spec.options)
        try:
            args = plain(dict(self._task.args))
        except (TypeError, ValueError) as exc:
            raise AnsibleActionFail("%s: the arguments are not plain data: %s" % (self.MODULE, exc)) from exc
        # before module_args: a plugin that decrypts the tree's values loads it with the
        # configuration models, which need pydantic (Ansible's "missing required library", not
        # an AttributeError from deep inside the loader)
        missing = missing_library(spec.requires)
        if missing:
            result.update(failed=True, changed=False, **missing)
            return result
        try:
            args = self.module_args(args)
        except Done as done:
            result.update(done.result)
            return result
        checked = ArgumentSpecValidator(dict(spec.argument_spec), **{k: options[k] for k in VALIDATOR_OPTIONS if k in options}
                                        ).validate(args)
        if checked.error_messages:  # as ActionBase.validate_argument_spec says it, on the plain arguments
            msg = checked.errors.msg
            if isinstance(checked.errors.errors[0], UnsupportedError):
                msg = "Unsupported parameters for (%s) module: %s" % (self._task.resolved_action or self._task.action, msg)
            raise AnsibleActionFail(msg)
        params = dict(args, **checked.validated_parameters)
        if self._task.check_mode and not options.get("supports_check_mode"):
            result.update(skipped=True, changed=False, msg="%s does not support check mode" % self.MODULE)
            return result
        environment: Dict[str, Any] = {}
        self._compute_environment_string(environment)
        module = WorkerModule(params, check_mode=bool(self._task.check_mode), diff=bool(self._task.diff),
                              decrypt=vault.decrypter(self._loader))
        saved = dict(os.environ)
        os.environ.update({str(k): str(v) for k, v in environment.items()})
        try:
            out = call_run(spec.run, module, spec.failure)
        except Done as done:
            out = done.result
        # a bug in the module's run: its traceback, scrubbed below, as a module process's would fail the task
        except Exception as exc:  # pylint: disable=broad-exception-caught
            out = dict(failed=True, changed=False, msg="%s: unexpected error: %s: %s" % (self.MODULE, type(exc).__name__, exc),
                       exception=traceback.format_exc())
        finally:
            os.environ.clear()
            os.environ.update(saved)
        # as AnsibleModule's exit: no value of a no_log option is returned (a secret terraform echoed)
        out = plain(remove_values(out, checked._no_log_values))
        if module.warnings:
            out["warnings"] = list(out.get("warnings") or []) + module.warnings
        out.setdefault("changed", False)
        result.update(out)
        return result
