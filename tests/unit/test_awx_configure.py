# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""``playbooks/awx_configure.yml`` (issue 11, item 4) checked by what is real, with no AWX server:

* ``ansible-playbook --syntax-check`` passes (the awx.awx modules resolve);
* every task of an ``awx.awx.*`` module is validated against THAT module's argument spec,
  taken from the installed awx.awx: the module's ``main()`` runs until it builds its
  ``AnsibleModule`` (``ansible.module_utils.basic.AnsibleModule.__init__`` is patched to
  capture the spec and stop there: nothing is contacted), and Ansible's own
  ``ArgumentSpecValidator`` checks the task's arguments: unknown names, missing required
  options, ``choices`` and types of literal values, the module's ``mutually_exclusive`` /
  ``required_*`` rules. A templated value (``{{ ... }}``) stands in as a value of the
  option's type. Options the spec leaves untyped but the module documents with
  ``suboptions`` (``workflow_job_template``'s ``workflow_nodes``) are checked against the
  documented suboptions. Synthetic tasks with a wrong option name, a missing required
  option, a value outside ``choices`` or a misspelt workflow-node key must fail;
* the objects are the ones docs/awx-setup.md describes (plan/apply templates with
  ``csis_phase``, a workflow plan -> approval (timeout) -> apply -> inventory sync -> verify,
  the drift-report schedule), secrets only in ``no_log`` tasks, no controller address or
  credential in the playbook, and every playbook and inventory file they name exists in the
  AWX project template (docs/awx-project/), whose wrappers pass ``--syntax-check`` outside
  the checkout with the collection as the only source of csis.infra.
"""
from __future__ import annotations

import copy
import importlib
import json
import os
import re
import shutil
import subprocess
from typing import Any, Dict, List, Tuple

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = os.path.join(REPO, "playbooks", "awx_configure.yml")
PROJECT_TEMPLATE = os.path.join(REPO, "docs", "awx-project")
VENV_BIN = os.path.join(REPO, ".venv", "bin")
PLAYBOOK_BIN = os.path.join(VENV_BIN, "ansible-playbook")
COLLECTIONS = os.path.join(REPO, ".venv", "collections")
LIFECYCLES = ("identity", "storage", "instance-image")

awx = pytest.importorskip("ansible_collections.awx.awx.plugins.module_utils.controller_api",
                          reason="needs the awx.awx collection (the ansible package ships it)")


# ------------------------------------------------------------------ loading
class _Loader(yaml.SafeLoader):
    """PyYAML with Ansible's tags: ``!unsafe`` (and ``!vault``) are strings here."""


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))
_Loader.add_constructor("!vault", lambda loader, node: loader.construct_scalar(node))


def _plays() -> List[Dict[str, Any]]:
    with open(PLAYBOOK, encoding="utf-8") as fh:
        return yaml.load(fh, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


def _tasks() -> List[Dict[str, Any]]:
    out = []
    for play in _plays():
        for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
            out += play.get(section) or []
    return out


def _module_of(task: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """(FQCN, arguments) of a task whose action is an awx.awx module, else ('', {})."""
    for key, value in task.items():
        if key.startswith("awx.awx."):
            return key, value or {}
    return "", {}


# ------------------------------------------------------------------ the modules' own argument specs
class _Captured(Exception):
    def __init__(self, spec: Dict[str, Any], kwargs: Dict[str, Any]):
        super().__init__("captured")
        self.spec, self.kwargs = spec, kwargs


_SPECS: Dict[str, Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]] = {}


def module_spec(fqcn: str) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
    """(argument_spec, AnsibleModule keyword arguments, documented options) of an installed
    awx.awx module, from running its ``main()`` up to ``AnsibleModule.__init__``."""
    if fqcn in _SPECS:
        return _SPECS[fqcn]
    from ansible.module_utils import basic

    name = fqcn.split(".")[-1]
    mod = importlib.import_module("ansible_collections.awx.awx.plugins.modules.%s" % name)
    original = basic.AnsibleModule.__init__

    def capture(self, argument_spec, **kwargs):
        raise _Captured(copy.deepcopy(argument_spec), kwargs)

    captured = None
    basic.AnsibleModule.__init__ = capture
    try:
        mod.main()
    except _Captured as got:
        captured = got
    finally:
        basic.AnsibleModule.__init__ = original
    assert captured is not None, "%s built no AnsibleModule" % fqcn
    docs = yaml.safe_load(mod.DOCUMENTATION)
    _SPECS[fqcn] = (captured.spec, captured.kwargs, docs.get("options") or {})
    return _SPECS[fqcn]


def _doc_to_spec(options: Dict[str, Any]) -> Dict[str, Any]:
    """Documented (sub)options as an argument spec (what the module says it reads)."""
    spec = {}
    for name, doc in options.items():
        entry: Dict[str, Any] = {"type": doc.get("type", "str")}
        for key in ("required", "choices", "elements", "aliases"):
            if key in doc:
                entry[key] = doc[key]
        if doc.get("suboptions"):
            entry["options"] = _doc_to_spec(doc["suboptions"])
        spec[name] = entry
    return spec


def _with_documented_suboptions(spec: Dict[str, Any], docs: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(spec)
    for name, entry in out.items():
        doc = docs.get(name) or {}
        if entry.get("type") in ("dict", "list") and "options" not in entry and doc.get("suboptions"):
            entry["options"] = _doc_to_spec(doc["suboptions"])
    return out


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


_PLACEHOLDER = {"bool": True, "int": 1, "float": 1.0, "list": [], "dict": {}, "raw": "x", "str": "x", "path": "/x"}


def _stand_in(value: Any, entry: Dict[str, Any]) -> Any:
    """The value with every template replaced by a value of the option's type (a choice if any)."""
    if _templated(value):
        if entry.get("choices"):
            return entry["choices"][0]
        return copy.deepcopy(_PLACEHOLDER.get(entry.get("type", "str"), "x"))
    sub = entry.get("options")
    if sub and isinstance(value, dict):
        return _stand_in_args(value, sub)
    if sub and isinstance(value, list):
        return [_stand_in_args(v, sub) if isinstance(v, dict) else v for v in value]
    if entry.get("type") == "list" and isinstance(value, list) and entry.get("elements"):
        return [_stand_in(v, {"type": entry["elements"]}) for v in value]
    return value


def _stand_in_args(args: Dict[str, Any], spec: Dict[str, Any]) -> Dict[str, Any]:
    by_alias = {}
    for name, entry in spec.items():
        by_alias[name] = entry
        for alias in entry.get("aliases") or ():
            by_alias[alias] = entry
    return {k: _stand_in(v, by_alias.get(k, {})) for k, v in args.items()}


def validate_task(fqcn: str, args: Dict[str, Any]) -> List[str]:
    """Every problem Ansible's argument-spec validation finds in the task's arguments."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    spec, kwargs, docs = module_spec(fqcn)
    spec = _with_documented_suboptions(spec, docs)
    names = ("mutually_exclusive", "required_together", "required_one_of", "required_if", "required_by")
    rules = {k: kwargs[k] for k in names if kwargs.get(k)}
    result = ArgumentSpecValidator(spec, **rules).validate(_stand_in_args(args, spec))
    return ["%s: %s" % (fqcn, e) for e in result.error_messages]


# ------------------------------------------------------------------ (a) syntax
def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"ANSIBLE_NOCOLOR": "1", "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", "")})
    env.update(extra)
    return env


@pytest.mark.skipif(not os.path.exists(PLAYBOOK_BIN), reason="needs the project venv")
def test_syntax_check() -> None:
    proc = subprocess.run([PLAYBOOK_BIN, "--syntax-check", PLAYBOOK], cwd=REPO,
                          env=_env(ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg")),
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------ (b) the arguments, against the modules' specs
def test_every_awx_task_matches_its_module_argument_spec() -> None:
    checked = set()
    problems: List[str] = []
    for task in _tasks():
        fqcn, args = _module_of(task)
        if not fqcn:
            continue
        assert isinstance(args, dict), "%s: pass arguments as a mapping" % task.get("name")
        problems += ["%s: %s" % (task.get("name"), p) for p in validate_task(fqcn, args)]
        checked.add(fqcn)
    assert not problems, "\n".join(problems)
    assert checked >= {"awx.awx.credential_type", "awx.awx.credential", "awx.awx.project", "awx.awx.inventory",
                       "awx.awx.inventory_source", "awx.awx.job_template", "awx.awx.workflow_job_template",
                       "awx.awx.schedule"}, checked


def test_the_spec_is_the_modules_own() -> None:
    """The captured spec is the installed module's (with the controller's auth options)."""
    spec, _kwargs, docs = module_spec("awx.awx.project")
    assert spec["name"]["required"] is True
    assert "git" in spec["scm_type"]["choices"]
    assert "controller_host" in spec and "controller_oauthtoken" in spec
    assert "scm_url" in docs and "scm_url" in spec
    spec, _kwargs, docs = module_spec("awx.awx.workflow_job_template")
    assert "options" not in spec["workflow_nodes"] and "suboptions" in docs["workflow_nodes"]


@pytest.mark.parametrize("fqcn, args, expect", [
    ("awx.awx.project", {"name": "p", "scm_type": "git", "scm_uri": "https://x"}, "scm_uri"),
    ("awx.awx.project", {"name": "p", "scm_type": "gitt"}, "scm_type"),
    ("awx.awx.project", {"scm_type": "git"}, "name"),
    ("awx.awx.job_template", {"name": "j", "playbook": "p.yml", "extra_vars": "{{ v }}", "ask_vars_on_launch": True},
     "ask_vars_on_launch"),
    ("awx.awx.job_template", {"name": "j", "verbosity": 7}, "verbosity"),
    ("awx.awx.inventory_source", {"name": "s", "inventory": "i", "source": "project"}, "source"),
    ("awx.awx.credential", {"name": "c", "inputs": {}}, "credential_type"),
    ("awx.awx.schedule", {"name": "s", "rrule": "x", "job_template": "t"}, "job_template"),
    ("awx.awx.workflow_job_template", {"name": "w", "workflow_nodes": [
        {"identifier": "a", "unified_job_templat": {"name": "t", "type": "job_template"}}]}, "unified_job_templat"),
    ("awx.awx.workflow_job_template", {"name": "w", "workflow_nodes": [
        {"unified_job_template": {"name": "t", "type": "job_template"}}]}, "identifier"),
    ("awx.awx.workflow_job_template", {"name": "w", "workflow_nodes": [
        {"identifier": "a", "related": {"success_node": [{"identifier": "b"}]}}]}, "success_node"),
])
def test_a_wrong_task_fails(fqcn: str, args: Dict[str, Any], expect: str) -> None:
    problems = validate_task(fqcn, args)
    assert problems and any(expect in p for p in problems), problems


def test_a_synthetic_playbook_task_with_a_wrong_option_fails() -> None:
    """The real playbook's project task with one option misspelt is refused (the whole path)."""
    task = next(t for t in _tasks() if _module_of(t)[0] == "awx.awx.project")
    fqcn, args = _module_of(copy.deepcopy(task))
    assert validate_task(fqcn, args) == []
    args["scm_branchh"] = args.pop("scm_branch")
    problems = validate_task(fqcn, args)
    assert any("scm_branchh" in p for p in problems), problems


# ------------------------------------------------------------------ what the objects are
def _by_module(fqcn: str) -> List[Dict[str, Any]]:
    return [t for t in _tasks() if _module_of(t)[0] == fqcn]


def test_secrets_and_controller() -> None:
    for task in _tasks():
        fqcn, args = _module_of(task)
        if not fqcn:
            continue
        # the controller and its credentials come from CONTROLLER_* (or tower_cli.cfg), never from the playbook
        assert not {k for k in args if k.startswith(("controller_", "tower_"))} & set(module_spec(fqcn)[0]), task["name"]
        spec = module_spec(fqcn)[0]
        secret = [k for k in args if spec.get(k, {}).get("no_log")]
        if secret:
            assert task.get("no_log") is True, "%s passes %s without no_log" % (task["name"], secret)
    play = _plays()[0]
    for name, value in play["vars"].items():
        if re.search(r"secret|token|password", name):
            assert value == "", "%s must have no default" % name
    cred = _by_module("awx.awx.credential")[0]
    assert cred["awx.awx.credential"]["inputs"]["secret_access_key"] == "{{ csis_awx_aws_secret_access_key }}"


def test_credential_type_injects_the_aws_environment() -> None:
    ct = _by_module("awx.awx.credential_type")[0]["awx.awx.credential_type"]
    env = ct["injectors"]["env"]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL"} <= set(env)
    fields = {f["id"]: f for f in ct["inputs"]["fields"]}
    for var, template in env.items():  # every injector names a field (AWX renders them, Ansible must not)
        assert re.fullmatch(r"\{\{ (\w+) \}\}", template) and template[3:-3] in fields, (var, template)
    assert fields["secret_access_key"].get("secret") and fields["session_token"].get("secret")
    with open(PLAYBOOK, encoding="utf-8") as fh:
        assert fh.read().count('!unsafe "{{ ') == len(env)


def test_plan_and_apply_templates_and_the_workflows() -> None:
    play = _plays()[0]
    lifecycles = play["vars"]["csis_awx_lifecycles"]
    assert tuple(lc["name"] for lc in lifecycles) == LIFECYCLES
    jts = _by_module("awx.awx.job_template")
    per_lifecycle = next(t for t in jts if "loop" in t)
    assert "product(['plan', 'apply'])" in per_lifecycle["loop"]
    jt = per_lifecycle["awx.awx.job_template"]
    assert "'csis_phase': item.1" in jt["extra_vars"] and "'csis_dry_run': false" in jt["extra_vars"]
    assert jt["playbook"] == "{{ item.0.playbook }}" and jt["allow_simultaneous"] is False
    assert jt["ask_variables_on_launch"] is False

    wf = _by_module("awx.awx.workflow_job_template")[0]
    assert wf["loop"] == "{{ csis_awx_lifecycles }}"
    args = wf["awx.awx.workflow_job_template"]
    assert "extra_vars" not in args and args["ask_variables_on_launch"] is False  # nothing overrides the artifact
    # but for the one survey answer: the ID of a state lock a job that is gone left (csis_force_unlock)
    assert args["survey_enabled"] is True
    assert [(q["variable"], q["required"]) for q in args["survey_spec"]["spec"]] == [("csis_force_unlock", False)]
    nodes = {n["identifier"]: n for n in args["workflow_nodes"]}
    chain, node = [], "plan"
    while node:
        chain.append(node)
        nxt = (nodes[node].get("related") or {}).get("success_nodes") or []
        node = nxt[0]["identifier"] if nxt else None
    assert chain == ["plan", "approve", "apply", "sync", "verify"]
    types = [nodes[n]["unified_job_template"]["type"] for n in chain]
    assert types == ["job_template", "workflow_approval", "job_template", "inventory_source", "job_template"]
    assert nodes["plan"]["unified_job_template"]["name"].endswith("{{ item.name }} plan")
    assert nodes["apply"]["unified_job_template"]["name"].endswith("{{ item.name }} apply")
    assert "csis_awx_approval_timeout" in nodes["approve"]["unified_job_template"]["timeout"]
    assert play["vars"]["csis_awx_approval_timeout"] > 0

    sched = _by_module("awx.awx.schedule")[0]["awx.awx.schedule"]
    assert sched["unified_job_template"] == "{{ csis_awx_drift_name }}" and "RRULE:" in play["vars"]["csis_awx_drift_rrule"]
    assert play["vars"]["csis_awx_drift_playbook"] == "playbooks/state_query.yml"
    drift_job = [t["awx.awx.job_template"] for t in _by_module("awx.awx.job_template")
                 if t["awx.awx.job_template"]["name"] == "{{ csis_awx_drift_name }}"][0]
    for var in ("csis_state_fail_on_hard", "csis_state_fail_on_unavailable"):  # a drift job that cannot look is red
        assert "'%s'" % var in drift_job["extra_vars"]
    assert play["vars"]["csis_awx_drift_fail_on_hard"] is True and play["vars"]["csis_awx_drift_fail_on_unavailable"] is True

    src = _by_module("awx.awx.inventory_source")[0]["awx.awx.inventory_source"]
    assert src["source"] == "scm" and src["source_project"] == "{{ csis_awx_project_name }}"


def _surveys() -> List[Tuple[str, Dict[str, Any]]]:
    out = []
    for fqcn in ("awx.awx.job_template", "awx.awx.workflow_job_template"):
        for task in _by_module(fqcn):
            if task[fqcn].get("survey_spec"):
                out.append((task[fqcn]["name"], task[fqcn]["survey_spec"]))
    return out


def test_every_survey_keeps_awxs_rules() -> None:
    """What AWX's survey validation asks of a spec (awx/main/models/mixins.py, read for 24.6.1): a
    name, a description and a list of questions, each with a known type, integer bounds, a string
    default within them, a multiple choice's default among its (newline-separated) choices."""
    surveys = _surveys()
    assert len(surveys) == 3, [n for n, _s in surveys]  # the workflows' (one task, looped), state import, forget
    for name, survey in surveys:
        assert set(survey) == {"name", "description", "spec"} and survey["spec"], name
        seen = set()
        for q in survey["spec"]:
            where = "%s: %s" % (name, q.get("variable"))
            assert q["type"] in ("text", "multiplechoice"), where
            assert q["variable"] not in seen and re.match(r"^[a-z_][a-z0-9_]*$", q["variable"]), where
            seen.add(q["variable"])
            assert q["question_name"] and isinstance(q["required"], bool), where
            if q["type"] == "text":
                assert isinstance(q["min"], int) and isinstance(q["max"], int) and q["min"] <= q["max"], where
                assert q["required"] == (q["min"] > 0), where  # an optional answer may be empty
                assert isinstance(q.get("default", ""), str) and len(q.get("default", "")) <= q["max"], where
            else:
                choices = q["choices"].split("\n")
                assert all(c.strip() for c in choices) and q["default"] in choices, where


@pytest.mark.skipif(not os.path.exists(PLAYBOOK_BIN), reason="needs the project venv")
@pytest.mark.parametrize("answers,refused", [
    ({"forget_storage": "p1", "forget_instance": "test"}, True),      # both names
    ({"forget_storage": None, "forget_instance": " "}, True),          # neither (null, blank)
    ({"forget_storage": "p1", "forget_instance": None}, False),        # one: on to the tree (none here)
])
def test_the_forget_job_templates_answers(tmp_path, answers, refused) -> None:
    """forget.yml as the 'csis forget' survey answers it: exactly one name, a blank or null one not given."""
    xv = dict(answers, csis_config_root=str(tmp_path / "no-tree"), force="true")
    proc = subprocess.run([PLAYBOOK_BIN, os.path.join(REPO, "playbooks", "forget.yml"), "-e", json.dumps(xv)], cwd=REPO,
                          env=_env(ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg")),
                          capture_output=True, text=True, check=False, timeout=300)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, out  # no tree: the third stops at the tree, after the check
    assert ("pass exactly one of -e forget_instance=<name> and -e forget_storage=<name>" in out) == refused, out
    assert refused or "does not exist" in out, out  # one name: past the check, stopped by the missing tree


def test_the_corrections_a_hard_line_asks_for_are_job_templates_with_surveys() -> None:
    """state_import.yml and forget.yml, which clear a HARD line of the drift report, run from AWX:
    each its job template, its answers from a survey (no variables prompted), one job at a time."""
    play_vars = _plays()[0]["vars"]
    jts = {t["awx.awx.job_template"]["name"]: t["awx.awx.job_template"] for t in _by_module("awx.awx.job_template")}
    questions = {}
    for name, playbook in (("{{ csis_awx_import_name }}", "playbooks/state_import.yml"),
                           ("{{ csis_awx_forget_name }}", "playbooks/forget.yml")):
        jt = jts[name]
        assert jt["playbook"] in ("{{ csis_awx_import_playbook }}", "{{ csis_awx_forget_playbook }}")
        assert play_vars[jt["playbook"][3:-3]] == playbook
        assert jt["survey_enabled"] is True and jt["ask_variables_on_launch"] is False and jt["allow_simultaneous"] is False
        assert jt["extra_vars"] == "{{ csis_awx_common_vars | combine(csis_awx_extra_vars) }}"
        questions[playbook] = [(q["variable"], q["required"]) for q in jt["survey_spec"]["spec"]]
    wanted = [("import_storage", True), ("storage_id", True), ("csis_force_unlock", False)]
    assert questions["playbooks/state_import.yml"] == wanted
    # exactly one of the two names (the playbook reads an empty or null answer as not given); no confirm
    assert questions["playbooks/forget.yml"] == [("forget_storage", False), ("forget_instance", False), ("force", True)]
    force = jts["{{ csis_awx_forget_name }}"]["survey_spec"]["spec"][2]
    assert force["type"] == "multiplechoice" and force["choices"].split("\n") == ["false", "true"] and force["default"] == "false"


def test_the_project_template_has_what_the_objects_name() -> None:
    play_vars = _plays()[0]["vars"]
    wanted = [lc["playbook"] for lc in play_vars["csis_awx_lifecycles"]]
    wanted += [play_vars["csis_awx_verify_playbook"], play_vars["csis_awx_drift_playbook"],
               play_vars["csis_awx_import_playbook"], play_vars["csis_awx_forget_playbook"]]
    for rel in wanted:
        assert os.path.isfile(os.path.join(PROJECT_TEMPLATE, rel)), rel
        collection_playbook = os.path.join(REPO, rel)
        assert os.path.isfile(collection_playbook), rel  # the wrapper's import target ships in the collection
        with open(os.path.join(PROJECT_TEMPLATE, rel), encoding="utf-8") as fh:
            plays = yaml.safe_load(fh)
        assert plays == [{"name": plays[0]["name"],
                          "ansible.builtin.import_playbook": "csis.infra.%s" % os.path.basename(rel)[:-4]}], rel
    with open(os.path.join(PROJECT_TEMPLATE, play_vars["csis_awx_inventory_source_path"]), encoding="utf-8") as fh:
        source = yaml.safe_load(fh)
    assert source["plugin"] == "csis.infra.meta_state" and source["config_root"] == ".."
    assert play_vars["csis_awx_inventory_source_path"].endswith((".csis.yml", ".csis.yaml"))

    # collections/requirements.yml: csis.infra (admitting this version) and galaxy.yml's dependencies
    with open(os.path.join(REPO, "galaxy.yml"), encoding="utf-8") as fh:
        galaxy = yaml.safe_load(fh)
    with open(os.path.join(PROJECT_TEMPLATE, "collections", "requirements.yml"), encoding="utf-8") as fh:
        reqs = {c["name"]: c.get("version", "*") for c in yaml.safe_load(fh)["collections"]}
    assert set(reqs) == {"csis.infra"} | set(galaxy["dependencies"]), reqs
    for name, spec in galaxy["dependencies"].items():
        assert reqs[name] == spec, name
    from ansible.galaxy.dependency_resolution.versioning import meets_requirements
    assert meets_requirements(galaxy["version"], reqs["csis.infra"]), reqs["csis.infra"]


@pytest.mark.skipif(not os.path.isdir(COLLECTIONS) or not os.path.exists(PLAYBOOK_BIN),
                    reason="needs the bootstrapped venv (scripts/bootstrap)")
def test_the_wrappers_and_the_collection_playbooks_pass_syntax_check(tmp_path) -> None:
    """From a copy of the project template outside the checkout (no ansible.cfg): the wrappers,
    and the collection playbooks by FQCN, resolve through the collections path alone."""
    project = str(tmp_path / "project")
    shutil.copytree(PROJECT_TEMPLATE, project)
    env = _env(ANSIBLE_COLLECTIONS_PATH=COLLECTIONS)
    wrappers = sorted(os.path.join("playbooks", n) for n in os.listdir(os.path.join(project, "playbooks")))
    fqcns = ["csis.infra.%s" % n[len("playbooks/"):-4] for n in wrappers] + ["csis.infra.awx_configure"]
    proc = subprocess.run([PLAYBOOK_BIN, "--syntax-check"] + wrappers + fqcns, cwd=project, env=env,
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for p in wrappers:
        assert "playbook: %s" % p in proc.stdout, proc.stdout
