# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What every csis.infra module shares: the common argument specs, the check that the
Python libraries a module needs are installed, and :func:`fail_from`, which turns any
library error (:class:`~.errors.CsisError`) into the module's failure.

A module stays thin: an argument spec and one call, declared once as its ``RUN``::

    def _run(module, p):
        return dict(changed=False, result=library_call(p["config_root"], p["name"]))

    RUN = ModuleRun(_run, argument_spec(CONFIG_ARGS, name=dict(type="str")),
                    requires=("PyYAML", "pydantic"), options=dict(supports_check_mode=True))

    def main():
        RUN.main()

(``RUN.main()`` is :func:`run_module`: it builds the module with :func:`csis_module`, exits with
what ``_run`` returns, and fails it through :func:`fail_from` on a :class:`~.errors.CsisError`.
The module's action plugin runs the same ``RUN`` in the controller's worker instead:
plugins/plugin_utils/controller.py.)

The only file of the library that imports Ansible.
"""
from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Mapping, NoReturn, Optional, Tuple, Union

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.common.warnings import get_warning_messages

from .aws import BOTO3_IMPORT_ERROR, HAS_BOTO3
from .config.secrets import Reveal, revealer
from .errors import CsisError, MissingDependency
from .notices import drain
from .yamlio import HAS_YAML, YAML_IMPORT_ERROR

#: the configuration root (the directory holding ``cfg/_config.yml``)
CONFIG_ROOT_ARGS: Dict[str, Any] = dict(
    config_root=dict(type="path", required=True),
)
#: a configuration tree: its root and its overlays (doc fragment ``csis.infra.config``)
CONFIG_ARGS: Dict[str, Any] = dict(
    CONFIG_ROOT_ARGS,
    overlays=dict(type="list", elements="path", default=[]),
)
#: the one launched instance a module acts on (doc fragment ``csis.infra.config.instance``)
INSTANCE_ARGS: Dict[str, Any] = dict(
    instance=dict(type="str", required=True),
)
#: instances and storages left out of the declaration for this run (``csis.infra.config.undeclare``)
UNDECLARE_ARGS: Dict[str, Any] = dict(
    undeclare=dict(type="list", elements="str", default=[]),
)
#: how boto3 reaches a runtime: the ``aws`` entry of a rendered root (no secrets)
AWS_ACCESS_ARGS: Dict[str, Any] = dict(
    aws=dict(type="dict", default={}, options=dict(
        region=dict(type="str"),
        profile=dict(type="str"),
        endpoints=dict(type="dict"),
        s3_use_path_style=dict(type="bool"),
        session_mechanism=dict(type="str"),
        ssh=dict(type="dict", options=dict(
            user=dict(type="str", required=True),
            private_key_file=dict(type="str", required=True, no_log=False),
            port=dict(type="int", default=22),
            address=dict(type="str", default="private_ip", choices=["private_ip", "public_ip"]),
            known_hosts_file=dict(type="str"),
            host_key_checking=dict(type="str", default="strict", choices=["strict", "accept-new"]),
            connect_timeout=dict(type="int", default=10),
            config_file=dict(type="str"),
        )),
    )),
    # the root's secrets (csis_render's roots[].secrets: ciphertext, not secret); its static keys
    # are revealed for boto3 by the controller's vault secrets (reveal_of)
    secrets=dict(type="dict", default={}, no_log=False),
)

#: pydantic is looked up, not imported: a module that needs no configuration model (the plan,
#: the gate, the record, the run summary...) does not pay its import (config/models.py imports it)
HAS_PYDANTIC = importlib.util.find_spec("pydantic") is not None
PYDANTIC_IMPORT_ERROR: Optional[str] = None if HAS_PYDANTIC else "No module named 'pydantic'"

#: library -> (installed, the import error's traceback)
LIBRARIES: Dict[str, Any] = {
    "PyYAML": (HAS_YAML, YAML_IMPORT_ERROR),
    "pydantic": (HAS_PYDANTIC, PYDANTIC_IMPORT_ERROR),
    "boto3": (HAS_BOTO3, BOTO3_IMPORT_ERROR),
}


def argument_spec(*common: Mapping[str, Any], **own: Any) -> Dict[str, Any]:
    """A module's argument spec: copies of the ``common`` specs, then its own options."""
    out: Dict[str, Any] = {}
    for part in common:
        out.update(copy.deepcopy(dict(part)))
    out.update(own)
    return out


def reveal_of(module: Any) -> Reveal:
    """How this run reveals the tree's ``!vault`` values (a runtime's static keys) for boto3:
    with the run's vault secrets, which the controller's worker holds (``module.decrypt``, set
    by plugins/plugin_utils/controller.py for every csis.infra module it runs). A module process
    has none: a ``!vault`` value then fails naming its file and key."""
    return revealer(getattr(module, "decrypt", None))


def missing_library(libraries: Iterable[str]) -> Optional[Dict[str, Any]]:
    """The failure (``msg``: Ansible's ``missing_required_lib``, ``exception``) for the first of
    ``libraries`` that is not installed, or None when all are."""
    for name in libraries:
        installed, error = LIBRARIES[name]
        if not installed:
            return {"msg": missing_required_lib(name), "exception": error}
    return None


def require_libraries(module: AnsibleModule, libraries: Iterable[str]) -> None:
    """Fail the module (``missing_required_lib``) when one of ``libraries`` is not installed."""
    missing = missing_library(libraries)
    if missing:
        module.fail_json(**missing)


def csis_module(argument_spec: Mapping[str, Any], requires: Iterable[str] = (), **kwargs: Any) -> AnsibleModule:
    """An :class:`AnsibleModule` whose required libraries are known to be installed."""
    module = AnsibleModule(argument_spec=dict(argument_spec), **kwargs)
    require_libraries(module, requires)
    return module


def problems_message(exc: Any, config_root: str, note: str = "") -> str:
    """``<n> problem(s) in <config root><note>:`` and the problems, one per line."""
    problems = [str(x) for x in getattr(exc, "problems", None) or []]
    return "%d problem(s) in %s%s:\n%s" % (len(problems), config_root, note, "\n".join(problems))


def fail_from(module: AnsibleModule, exc: BaseException, msg: Optional[str] = None, prefix: str = "",
              problems_key: Optional[str] = "problems", **result: Any) -> NoReturn:
    """Fail the module with what ``exc`` says.

    The message is ``msg`` (default ``str(exc)``) after ``prefix``; the problems the error
    carries (if any) are returned under ``problems_key``; ``result`` is returned as well.
    A missing library is reported the way Ansible reports one (``missing_required_lib``).
    """
    if isinstance(exc, MissingDependency):
        module.fail_json(msg=missing_required_lib(exc.library), exception=exc.error, **result)
    out = dict(result)
    problems = getattr(exc, "problems", None)
    if problems and problems_key:
        out.setdefault(problems_key, [str(p) for p in problems])
    module.fail_json(msg=prefix + (str(exc) if msg is None else msg), **out)
    raise AssertionError("fail_json returned")  # pragma: no cover - fail_json exits


Failure = Union[None, Mapping[str, Any], Callable[[Any], Mapping[str, Any]]]


def call_run(run: Callable[[Any, Dict[str, Any]], Mapping[str, Any]], module: Any, failure: Failure = None) -> Dict[str, Any]:
    """``run(module, module.params)`` as a dict; a :class:`~.errors.CsisError` it raises fails
    the module through :func:`fail_from` with the keyword arguments ``failure`` (or those
    ``failure(module)`` returns). ``module`` is an :class:`AnsibleModule`, or the controller's
    stand-in for one (plugins/plugin_utils/controller.py), whose ``fail_json`` raises."""
    drain()  # what an earlier task of this process left is not this task's
    try:
        out = dict(run(module, module.params))
    except CsisError as exc:
        _show_notices(module)
        fail_from(module, exc, **dict((failure(module) if callable(failure) else failure) or {}))
    _show_notices(module)
    return out


def _show_notices(module: Any) -> None:
    """The library's notices of this run (an expired lock broken) as the task's warnings, each
    once (a module that warned one itself is not told it twice)."""
    shown = getattr(module, "warnings", None)
    if shown is None:  # AnsibleModule: the process-wide list its warn() fills
        shown = get_warning_messages()
    for text in drain():
        if text not in shown:
            module.warn(text)


def run_module(run: Callable[[AnsibleModule, Dict[str, Any]], Mapping[str, Any]], argument_spec: Mapping[str, Any],
               requires: Iterable[str] = (), failure: Failure = None, **kwargs: Any) -> NoReturn:
    """A thin module's whole ``main()``.

    Builds the module (:func:`csis_module` with ``argument_spec``, ``requires`` and
    AnsibleModule's ``kwargs``), calls ``run(module, module.params)`` and exits with the result
    it returns (``run`` may exit or fail the module itself). A :class:`~.errors.CsisError` that
    ``run`` raises fails the module through :func:`fail_from`, with the keyword arguments
    ``failure`` (``prefix``, ``problems_key``, result keys such as ``changed=False``), or with
    those ``failure(module)`` returns.
    """
    module = csis_module(argument_spec, requires, **kwargs)
    module.exit_json(**call_run(run, module, failure))
    raise AssertionError("exit_json returned")  # pragma: no cover - exit_json exits


@dataclass(frozen=True)
class ModuleRun:
    """A thin module's run, declared once as the module's ``RUN``: its ``run(module, params)``,
    argument spec, required libraries, failure keywords (:func:`call_run`) and AnsibleModule's
    other keyword arguments (``supports_check_mode``, ``required_by``, ...).

    The module's ``main()`` is ``RUN.main()`` (:func:`run_module`). A module whose work is
    local files only (meta-state, plan files, the run summary) also has an action plugin that
    runs the same ``RUN`` in the controller's worker process instead
    (plugins/plugin_utils/controller.py): the task then pays no module process, which costs
    about half a second for every task (AnsiballZ compiles ``ansible.module_utils.basic``
    again in each one), and the same arguments are validated by the same spec.
    """
    run: Callable[[Any, Dict[str, Any]], Mapping[str, Any]]
    argument_spec: Mapping[str, Any]
    requires: Tuple[str, ...] = ()
    failure: Failure = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def main(self) -> NoReturn:
        run_module(self.run, self.argument_spec, self.requires, self.failure, **dict(self.options))
