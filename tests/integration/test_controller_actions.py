# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The modules run in the controller's worker (plugins/plugin_utils/controller.py).

Their action plugins run the module's ``RUN`` without a module process. A real
``ansible-playbook`` run on a copy of ``examples/`` shows that what a module process gave them
still holds: the module's own argument spec refuses an unknown option and a missing
``required_by`` in the module's words, check mode writes nothing, and the play's
``environment:`` (the AWX user the audit trail names) reaches the library. And the module file
run as a module process (``python <module> <args.json>``, how AnsiballZ ends) returns what the
worker returned.
"""
from __future__ import annotations

import glob
import importlib
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from trees import EXAMPLES, copy_as_shipped

from ansible_collections.csis.infra.plugins.module_utils.csis.module import ModuleRun
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import history_report
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import call_run
from ansible_collections.csis.infra.plugins.plugin_utils.controller import ControllerAction, Done, WorkerModule

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.join(REPO, ".venv")
PLAYBOOK_BIN = os.path.join(VENV, "bin", "ansible-playbook")
DIGEST = "ab" * 32

PLAY = """\
- name: csis.infra modules run in the controller's worker
  hosts: localhost
  connection: local
  gather_facts: false
  environment:
    CSIS_AWX_USER_NAME: alice-from-the-play
  tasks:
    - name: An option the module does not have
      csis.infra.csis_run_summary:
        config_root: "{{ tree }}"
        bogus: 1
      register: unknown
      ignore_errors: true

    - name: An entry without its run id
      csis.infra.csis_run_summary:
        config_root: "{{ tree }}"
        entry: {key: storage-aws-ebs}
      register: required_by
      ignore_errors: true

    - name: A write in check mode
      csis.infra.csis_run_summary:
        config_root: "{{ tree }}"
        run_id: r1
        entry: {key: storage-aws-ebs, status: ok}
      check_mode: true
      register: checked

    - name: A receipt in check mode (a real run writes one)
      csis.infra.csis_approval: &receipt_args
        config_root: "{{ tree }}"
        root: storage-aws-ebs
        plan_digest: "{{ digest }}"
        state: requested
        summary: "Plan: 1 to add, 0 to change, 0 to destroy."
      check_mode: true
      register: checked_receipt

    - name: An audit record in check mode (a real run writes one)
      csis.infra.csis_audit:
        config_root: "{{ tree }}"
        kind: refused
        root: storage-aws-ebs
      check_mode: true
      register: checked_audit

    - name: A receipt, written by the play's AWX user (the same arguments, not in check mode)
      csis.infra.csis_approval: *receipt_args
      register: receipt

    - name: A refusal in check mode, as a real run refuses (csis_upgrade of an instance not launched)
      csis.infra.csis_upgrade:
        config_root: "{{ tree }}"
        instance: no-such-instance
        run_id: r1
      check_mode: true
      register: check_refusal
      ignore_errors: true

    - name: A library refusal
      csis.infra.csis_approval:
        config_root: "{{ tree }}"
        root: storage-aws-ebs
        plan_digest: "{{ '0' * 64 }}"
        state: approved
        method: awx
        pinned: "{{ digest }}"
      register: refused
      ignore_errors: true

    - name: The read of the run summary
      csis.infra.csis_run_summary:
        config_root: "{{ tree }}"
      register: summary
"""


PREFLIGHT_PLAY = """\
- name: The preflight of a dry run and of a real run on a damaged drift record
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: A dry run's preflight warns and goes on
      csis.infra.csis_preflight:
        config_root: "{{ preflight_tree }}"
        write: false
        refuse: false
      register: preflight_warned

    - name: A real run's preflight refuses
      csis.infra.csis_preflight:
        config_root: "{{ preflight_tree }}"
      register: preflight_refused
      ignore_errors: true
"""

#: the last play of the run: one copy (a module process, the run's dearest task) keeps what
#: both plays registered (a host's registered results outlive their play)
KEEP_PLAY = """\
- name: Keep the results for the tests
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Keep the results for the tests
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ {'unknown': unknown, 'required_by': required_by, 'checked': checked, 'receipt': receipt,
                      'refused': refused, 'summary': summary, 'check_refusal': check_refusal,
                      'checked_receipt': checked_receipt, 'checked_audit': checked_audit,
                      'preflight': {'warned': preflight_warned, 'refused': preflight_refused}} | to_json }}"
        mode: "0600"
"""


def _env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """ONE ansible-playbook run (each costs seconds of CPU) for the tests that read a real run:
    PLAY on a copy of examples/, then PREFLIGHT_PLAY, a second play without PLAY's
    ``environment:``, on another copy whose meta-state/drift.yaml is damaged, then KEEP_PLAY."""
    base = tmp_path_factory.mktemp("controller_actions")
    tree = copy_as_shipped(EXAMPLES, str(base / "tree"))
    preflight_tree = copy_as_shipped(EXAMPLES, str(base / "preflight_tree"))
    os.makedirs(os.path.join(preflight_tree, "meta-state"), exist_ok=True)
    with open(os.path.join(preflight_tree, "meta-state", "drift.yaml"), "w", encoding="utf-8") as fh:
        fh.write("hard: [unclosed\n")
    preflight_before = sorted(os.listdir(os.path.join(preflight_tree, "meta-state")))
    out = base / "results.json"
    playbook = base / "play.yml"
    playbook.write_text(PLAY + "\n" + PREFLIGHT_PLAY + "\n" + KEEP_PLAY, encoding="utf-8")
    extra = {"tree": tree, "out": str(out), "digest": DIGEST, "preflight_tree": preflight_tree}
    res = subprocess.run([PLAYBOOK_BIN, str(playbook), "-e", json.dumps(extra)],
                         cwd=str(base), env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    return SimpleNamespace(tree=tree, got=json.loads(out.read_text(encoding="utf-8")), res=res,
                           preflight_tree=preflight_tree, preflight_before=preflight_before)


#: the modules that keep a module process: the async apply outlives the task, and
#: csis_verify_instance runs on the launched instance itself
OWN_PROCESS = {"csis_apply_start", "csis_apply_wait", "csis_verify_instance"}


def test_every_other_module_runs_its_own_run_in_the_worker_and_its_docs_say_so():
    modules = sorted(os.path.splitext(os.path.basename(path))[0]
                     for path in glob.glob(os.path.join(REPO, "plugins", "modules", "csis_*.py")))
    found = []
    for name in modules:
        if not os.path.exists(os.path.join(REPO, "plugins", "action", name + ".py")):
            continue
        action = importlib.import_module("ansible_collections.csis.infra.plugins.action." + name).ActionModule
        if not issubclass(action, ControllerAction):
            continue
        found.append(name)
        assert action.MODULE == name, name
        module = importlib.import_module("ansible_collections.csis.infra.plugins.modules." + name)
        assert isinstance(module.RUN, ModuleRun), name
        # every one runs in check mode (the worker would skip one that did not, as Ansible does)
        assert module.RUN.options.get("supports_check_mode") is True, name
    assert found == [m for m in modules if m not in OWN_PROCESS]

    def docs(name):
        with open(os.path.join(REPO, "plugins", "modules", name + ".py"), encoding="utf-8") as handle:
            return handle.read()

    documented = [m for m in modules if "- csis.infra.attributes.worker\n" in docs(m)]
    assert documented == found, "the action attribute (csis.infra.attributes.worker) and the ControllerAction plugins differ"


def test_a_modules_own_except_exception_never_swallows_its_exit_or_failure():
    def run(module, params):
        try:
            module.fail_json(msg="refused %s" % params["x"], changed=False)
        except Exception:  # noqa: BLE001 - what a module may do around its work
            return dict(changed=True)
        return dict(changed=True)

    module = WorkerModule({"x": "it"}, check_mode=False, diff=False)
    with pytest.raises(Done) as done:
        call_run(run, module)
    assert done.value.result == {"failed": True, "changed": False, "msg": "refused it"}

    def raises(module, params):
        raise CsisError("library says no")

    with pytest.raises(Done) as done:
        call_run(raises, WorkerModule({}, check_mode=True, diff=False), failure={"prefix": "x: ", "changed": False})
    assert done.value.result == {"failed": True, "changed": False, "msg": "x: library says no"}


def test_the_worker_checks_arguments_check_mode_and_environment_as_a_module_process(played):
    tree, got = played.tree, played.got

    assert got["unknown"]["failed"] is True
    assert got["unknown"]["msg"] == ("Unsupported parameters for (csis.infra.csis_run_summary) module: bogus. "
                                     "Supported parameters include: config_root, entry, run_id.")
    assert got["required_by"]["failed"] is True
    assert got["required_by"]["msg"] == "missing parameter(s) required by 'entry': run_id"

    assert got["checked"]["changed"] is False and not got["checked"].get("failed")
    assert got["summary"]["summary"] is None, "check mode wrote the run summary"
    assert not os.path.exists(os.path.join(tree, "generated", "run-summary.json"))

    assert got["receipt"]["changed"] is True
    assert got["receipt"]["receipt"]["summary"] == "Plan: 1 to add, 0 to change, 0 to destroy."
    trail = history_report(tree, root="storage-aws-ebs")["trail"]
    assert [doc["who"].get("awx_user_name") for doc in trail] == ["alice-from-the-play"]  # check mode wrote nothing
    # check mode says what a real run would do: both would write
    assert got["checked_receipt"]["changed"] is True and got["checked_audit"]["changed"] is True
    assert got["checked_audit"]["revision"] == 0

    assert got["check_refusal"]["failed"] is True and got["check_refusal"]["changed"] is False
    assert "instance 'no-such-instance' is not launched" in got["check_refusal"]["msg"]

    assert got["refused"]["failed"] is True and got["refused"]["changed"] is False
    assert "storage-aws-ebs" in got["refused"]["msg"]


def test_the_module_process_returns_what_the_worker_returns(played, tmp_path):
    """The module file run as a module process on the shared run's tree returns what the worker
    returned for the same read there (PLAY's last csis_run_summary task: nothing has written to
    the tree since)."""
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"config_root": played.tree}}), encoding="utf-8")
    module = os.path.join(REPO, "plugins", "modules", "csis_run_summary.py")
    env = dict(_env(), PYTHONPATH=os.path.join(VENV, "collections"))
    proc = subprocess.run([sys.executable, module, str(args)], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_process = json.loads(proc.stdout)

    by_worker = played.got["summary"]
    for key in ("changed", "path", "summary", "lines"):
        assert by_worker[key] == by_process[key], key


def test_a_missing_library_fails_the_task_the_ansible_way_before_the_tree_is_read(tmp_path):
    """A controller without pydantic: csis_validate's action plugin reads the tree (for its
    ``!vault`` values) before the module runs, with the configuration models that need pydantic.
    The task fails with Ansible's "missing required library" message, not an AttributeError
    from inside the loader. pydantic is hidden from the real ``ansible-playbook``'s Python the way
    an uninstalled package is (``sys.modules['pydantic'] = None``: ``find_spec`` says None,
    ``import`` fails), through a ``sitecustomize`` on ``PYTHONPATH``."""
    tree = copy_as_shipped(EXAMPLES, str(tmp_path / "tree"))
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['pydantic'] = None\n", encoding="utf-8")
    env = dict(_env(), PYTHONPATH=str(hide))
    res = subprocess.run([PLAYBOOK_BIN, os.path.join(REPO, "playbooks", "validate.yml"), "-e", "csis_config_root=" + tree],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "Failed to import the required Python library (pydantic)" in out, out
    assert "AttributeError" not in out and "model_fields" not in out, out
    assert not os.path.exists(os.path.join(tree, "generated")), "a failed validation wrote into the tree"


def test_a_dry_runs_preflight_warns_of_what_a_real_run_refuses(played):
    """A damaged drift.yaml: the real run's preflight fails naming it, the dry run's says the same
    as a warning and succeeds, and neither writes anything (PREFLIGHT_PLAY, the shared run's
    second play, on its own tree)."""
    tree, res, before = played.preflight_tree, played.res, played.preflight_before
    refused, warned = played.got["preflight"]["refused"], played.got["preflight"]["warned"]
    assert refused["failed"] and refused["msg"].startswith("meta-state/drift.yaml: "), refused["msg"]
    assert not warned.get("failed") and warned["problems"] == refused["problems"], (warned, refused)
    assert warned["warnings"] == ["a real run would refuse to start: " + line for line in refused["problems"]]
    assert "a real run would refuse to start: meta-state/drift.yaml: " in " ".join(res.stderr.split())
    # nothing written but the store's lock file (the real run's write probe took the lock)
    assert sorted(set(os.listdir(os.path.join(tree, "meta-state"))) - {".lock"}) == before
