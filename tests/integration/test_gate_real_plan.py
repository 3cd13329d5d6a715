# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The gate, the plan binding and apply-check through real terraform and real ansible-playbook.

No AWS: the root holds only ``terraform_data`` resources (built into terraform) and a
local module outside the root, with the local backend.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

_REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
_COLL = os.path.join(_REPO, ".venv", "collections")
if _COLL not in [os.path.normpath(p) for p in sys.path]:
    sys.path.insert(0, _COLL)

import pytest  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import env_overrides, terraform_env  # noqa: E402

PLAYBOOK_BIN = os.path.join(_REPO, ".venv", "bin", "ansible-playbook")

pytestmark = pytest.mark.skipif(shutil.which("terraform") is None or not os.path.exists(PLAYBOOK_BIN),
                                reason="needs terraform on PATH and the project venv")

# One ansible-playbook run for all gate cases (each run costs seconds of CPU): the play
# loops over GATE_CASE_TASKS, one case after the other, in the order the cases build on
# each other (the module file edited by stale_module stays edited for the later cases).
# Each case first sets gen.auto.tfvars when it names ``gen`` (what the test wrote between
# runs before), prints a "GATE CASE <name>" marker (the test cuts the run's output at
# these markers to check one case's printed output) and collects its registered
# results under its name; the registered gate/verified/applied of a case are its own:
# every task that registers runs or is skipped (which registers too) in every case.
GATE_CASE_TASKS = textwrap.dedent("""\
    - name: case marker
      ansible.builtin.debug:
        msg: "GATE CASE {{ case.name }}"
    - name: the case's input
      ansible.builtin.copy:
        dest: "{{ root }}/gen.auto.tfvars"
        content: "gen = \\"{{ case.gen }}\\"\\n"
      when: case.gen is defined
    - name: open the binding
      csis.infra.csis_plan_binding:
        project_path: "{{ root }}"
        state: opened
    - name: plan
      ansible.builtin.command:
        cmd: terraform plan -input=false -no-color -out=tfplan
        chdir: "{{ root }}"
      environment: "{{ tf_env }}"
    - name: meddle between plan and gate
      ansible.builtin.shell: "{{ case.after_plan }}"
      args:
        chdir: "{{ root }}"
      when: case.after_plan | default('') | length > 0
    - name: gate
      csis.infra.csis_gate_plan:
        project_path: "{{ root }}"
        plan_file: tfplan
        allow_destroy: "{{ case.allow | default([]) }}"
      register: gate
      ignore_errors: true
    - name: meddle between gate and apply
      ansible.builtin.shell: "{{ case.after_gate }}"
      args:
        chdir: "{{ root }}"
      when: gate is succeeded and case.after_gate | default('') | length > 0
    - name: verify the binding
      csis.infra.csis_plan_binding:
        project_path: "{{ root }}"
        state: verified
      register: verified
      ignore_errors: true
      when: gate is succeeded
    - name: apply exactly the gated plan
      ansible.builtin.command:
        cmd: terraform apply -input=false -no-color tfplan
        chdir: "{{ root }}"
      environment: "{{ tf_env }}"
      register: applied
      when: gate is succeeded and verified is succeeded
    - name: collect the case's results
      ansible.builtin.set_fact:
        gate_results: "{{ gate_results | default({}) | combine({case.name: {'gate': gate, 'verified': verified, 'applied': applied}}) }}"
""")

GATE_PLAYBOOK = textwrap.dedent("""\
    - hosts: localhost
      gather_facts: false
      connection: local
      tasks:
        - name: the gate cases
          ansible.builtin.include_tasks: "{{ case_tasks }}"
          loop: "{{ cases }}"
          loop_control:
            loop_var: case
            label: "{{ case.name }}"
        - name: results
          ansible.builtin.copy:
            dest: "{{ results }}"
            content: "{{ gate_results | to_json }}"
""")


def _run_playbook(tmp_path, name, text, extra):
    pb = tmp_path / ("%s.yml" % name)
    pb.write_text(text)
    results = tmp_path / ("%s.results.json" % name)
    if results.exists():
        results.unlink()
    ev = tmp_path / ("%s.vars.json" % name)
    extra = dict(extra, results=str(results),
                 ansible_python_interpreter=os.path.join(_REPO, ".venv", "bin", "python"))
    ev.write_text(json.dumps(extra))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(_REPO, "ansible.cfg"),
               ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([PLAYBOOK_BIN, "-i", "localhost,", str(pb), "-e", "@%s" % ev],
                          cwd=_REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600, check=False)
    assert results.exists(), proc.stdout
    return json.loads(results.read_text()), proc


@pytest.fixture(scope="module")
def tf_root(tmp_path_factory):
    base = tmp_path_factory.mktemp("gate_real")
    mod = base / "modsrc" / "m"
    mod.mkdir(parents=True)
    (mod / "main.tf").write_text(textwrap.dedent("""\
        variable "value" { type = string }
        resource "terraform_data" "y" { input = var.value }
        """))
    root = base / "root"
    root.mkdir()
    (root / "main.tf").write_text(textwrap.dedent("""\
        terraform {
          backend "local" {}
        }
        variable "gen" { type = string }
        resource "terraform_data" "x" {
          triggers_replace = var.gen
        }
        resource "terraform_data" "keep" {
          input = "constant"
        }
        module "m" {
          source = "../modsrc/m"
          value  = "static"
        }
        """))
    (root / "gen.auto.tfvars").write_text('gen = "1"\n')
    proc = subprocess.run(["terraform", "init", "-input=false", "-no-color"], cwd=str(root), env=terraform_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 0, proc.stdout
    assert (root / ".terraform" / "modules" / "modules.json").exists()
    return base, root


GATE_CASES = [
    # 1. first apply: creates only
    {"name": "first"},
    # 2. a changed input replaces terraform_data.x: refused without a whitelist
    {"name": "replace_refused", "gen": "2"},
    # 3. the same plan with the whitelist: admitted, verified, applied
    {"name": "replace_admitted", "allow": ["terraform_data.x"]},
    # 4. a module file (outside the root) edited between plan and gate: stale, nothing applied
    {"name": "stale_module", "gen": "3", "allow": ["terraform_data.x"], "after_plan": "echo '# edited' >> ../modsrc/m/main.tf"},
    # 5. a .tfvars edited after the gate: refused at verified
    {"name": "stale_after_gate", "allow": ["terraform_data.x"], "after_gate": "echo 'gen = \"4\"' > gen.auto.tfvars"},
    # 6. plan bytes tampered after the gate: refused at verified
    {"name": "tampered", "allow": ["terraform_data.x"], "after_gate": "printf 'x' >> tfplan"},
    # 7. the plan step produced nothing (plan file removed): the gate says so
    {"name": "missing", "allow": ["terraform_data.x"], "after_plan": "rm -f tfplan"},
]


def _case_outputs(stdout, names):
    """The run's printed output cut at the "GATE CASE <name>" markers: {name: that case's output}."""
    marks = [re.search(r"GATE CASE %s\b" % re.escape(n), stdout).start() for n in names]
    return {n: stdout[m:e] for n, m, e in zip(names, marks, marks[1:] + [len(stdout)])}


def test_gate_flow_with_real_terraform(tf_root):
    """The seven gate cases, in order, through one ansible-playbook run (see GATE_CASE_TASKS)."""
    base, root = tf_root
    tasks = base / "gate_case.yml"
    tasks.write_text(GATE_CASE_TASKS)
    results, proc = _run_playbook(base, "gate", GATE_PLAYBOOK, {
        "root": str(root), "tf_env": env_overrides(), "cases": GATE_CASES, "case_tasks": str(tasks)})
    names = [c["name"] for c in GATE_CASES]
    assert sorted(results) == sorted(names), proc.stdout
    out = _case_outputs(proc.stdout, names)

    # 1. first apply: creates only
    res = results["first"]
    assert not res["gate"].get("failed"), out["first"]
    assert res["gate"]["summary"] == "Plan: 3 to add, 0 to change, 0 to destroy"
    assert res["verified"]["plan_sha256"] == res["gate"]["plan_sha256"]
    assert res["applied"]["rc"] == 0, out["first"]

    # 2. a changed input replaces terraform_data.x: refused without a whitelist
    res = results["replace_refused"]
    assert res["gate"]["failed"] is True
    assert res["gate"]["msg"] == "DESTROY NOT WHITELISTED: terraform_data.x"
    assert res["gate"]["violations"] == ["DESTROY NOT WHITELISTED: terraform_data.x"]
    assert res["gate"]["addresses"]["replace"] == ["terraform_data.x"]
    assert res["verified"].get("skipped") and res["applied"].get("skipped")
    assert "DESTROY NOT WHITELISTED: terraform_data.x" in out["replace_refused"]

    # 3. the same plan with the whitelist: admitted, verified, applied
    res = results["replace_admitted"]
    assert not res["gate"].get("failed"), out["replace_admitted"]
    assert res["gate"]["summary"] == ("Plan: 1 to add, 0 to change, 1 to destroy (1 replacement); "
                                      "1 destroy whitelisted by terraform_data.x")
    assert res["gate"]["whitelisted"] == [{"address": "terraform_data.x", "entry": "terraform_data.x",
                                           "kind": "replace"}]
    assert res["applied"]["rc"] == 0, out["replace_admitted"]

    # 4. a module file (outside the root) edited between plan and gate: stale, nothing applied
    res = results["stale_module"]
    assert res["gate"]["failed"] is True
    assert res["gate"]["msg"].startswith("STALE PLANFILE: tfplan is older than the root: ")
    assert "module ../modsrc/m/main.tf (modified)" in res["gate"]["msg"]
    assert res["applied"].get("skipped")

    # 5. a .tfvars edited after the gate: refused at verified
    res = results["stale_after_gate"]
    assert not res["gate"].get("failed"), out["stale_after_gate"]
    assert res["verified"]["failed"] is True
    assert "gen.auto.tfvars (modified)" in res["verified"]["msg"]
    assert res["applied"].get("skipped")

    # 6. plan bytes tampered after the gate: refused at verified
    res = results["tampered"]
    assert not res["gate"].get("failed"), out["tampered"]
    assert res["verified"]["failed"] is True
    assert res["verified"]["msg"].startswith("STALE PLANFILE: tfplan changed after the gate passed it")
    assert res["applied"].get("skipped")

    # 7. the plan step produced nothing (plan file removed): the gate says so
    res = results["missing"]
    assert res["gate"]["msg"] == "STALE PLANFILE: tfplan does not exist — the plan step did not produce it"


APPLY_CHECK_PLAYBOOK = textwrap.dedent("""\
    - hosts: localhost
      gather_facts: false
      connection: local
      tasks:
        - name: apply-check cases
          csis.infra.csis_apply_check:
            lifecycle: "{{ item.lifecycle | default('instance-image') }}"
            config_root: "{{ item.config_root | default(omit) }}"
            search_from: "{{ item.search_from | default(omit) }}"
            root: aws-instances
            root_alias: [rt-eu]
            overlays: "{{ item.overlays | default([]) }}"
            apply_runtime: "{{ item.apply_runtime | default(omit) }}"
          loop: "{{ cases }}"
          loop_control:
            label: "{{ item.name }}"
          register: checks
          ignore_errors: true
        - name: results
          ansible.builtin.copy:
            dest: "{{ results }}"
            content: "{{ dict(cases | map(attribute='name') | zip(checks.results)) | to_json }}"
        - name: the run's S3 run lock is lost (the marker its watcher writes for this ansible-playbook)
          ansible.builtin.command:
            argv: ["{{ ansible_python_interpreter }}", "-c", "{{ mark_lost }}"]
          register: marked
          changed_when: false
        - name: the apply check of a case that passed above, after it
          csis.infra.csis_apply_check:
            lifecycle: instance-image
            config_root: "{{ (cases | selectattr('name', 'equalto', 'true') | first).config_root }}"
            root: aws-instances
            root_alias: [rt-eu]
          register: after_lost
          ignore_errors: true
        - name: lost results
          ansible.builtin.copy:
            dest: "{{ results }}.lost"
            content: "{{ {'marker': marked.stdout, 'check': after_lost} | to_json }}"
""")

#: what the run lock's watcher does when the run's S3 run lock is lost (runlock._mark_lost), for the
#: ansible-playbook that runs it; prints the marker's path
MARK_LOST = ("import sys; sys.path.insert(0, %r); "
             "from ansible_collections.csis.infra.plugins.module_utils.csis.state import runlock as r; "
             "c = r.controller(); "
             "r._mark_lost(c, 's3://b/p/meta-state/.run.lock', 'another run broke it after it expired unrenewed'); "
             "print(r.lost_marker(c))" % os.path.join(_REPO, ".venv", "collections"))


def _cfg(base, name, text, overlays=None):
    d = base / name
    (d / "cfg").mkdir(parents=True)
    (d / "cfg" / "_config.yml").write_text(text)
    for fname, body in (overlays or {}).items():
        (d / fname).write_text(body)
    return str(d)


def test_apply_check_through_ansible(tmp_path):
    off = _cfg(tmp_path, "off", "config:\n  apply_instances: false\n")
    on = _cfg(tmp_path, "on", "config:\n  apply_instances: true\n",
              {"off.yml": "config:\n  apply_instances: false\n"})
    quoted = _cfg(tmp_path, "quoted", 'config:\n  apply_instances: "false"\n')
    by_root = _cfg(tmp_path, "by_root", "config:\n  apply_instances: [aws-instances]\n")
    by_rt = _cfg(tmp_path, "by_rt", "config:\n  apply_instances: [rt-eu]\n")
    other = _cfg(tmp_path, "other", "config:\n  apply_instances: [someone-else]\n")
    nowhere = tmp_path / "nowhere" / "deep"
    nowhere.mkdir(parents=True)
    below = os.path.join(on, "generated", "instance-image")
    os.makedirs(below)
    cases = [
        {"name": "false", "config_root": off},
        {"name": "overlay_gone", "config_root": on, "overlays": ["gone.yml"]},
        {"name": "overlay_off", "config_root": on, "overlays": ["off.yml"]},
        {"name": "no_config", "search_from": str(nowhere)},
        {"name": "string_false", "config_root": quoted},
        {"name": "true", "config_root": on},
        {"name": "walk_up", "search_from": below},
        {"name": "lists_root", "config_root": by_root},
        {"name": "lists_runtime", "config_root": by_rt},
        {"name": "lists_other", "config_root": other},
        {"name": "runtime_cannot_enable", "config_root": off, "apply_runtime": "rt-eu"},
        {"name": "runtime_narrows", "config_root": on, "apply_runtime": "rt-us"},
        {"name": "runtime_same", "config_root": on, "apply_runtime": "rt-eu"},
        {"name": "storage_unset", "config_root": on, "lifecycle": "storage"},
    ]
    res, proc = _run_playbook(tmp_path, "apply_check", APPLY_CHECK_PLAYBOOK, {"cases": cases, "mark_lost": MARK_LOST})
    lost = json.loads((tmp_path / "apply_check.results.json.lost").read_text())
    if lost["marker"] and os.path.exists(lost["marker"]):
        os.unlink(lost["marker"])  # no watcher outlives this run to remove it
    # a run whose S3 run lock was lost applies nothing more: the apply check refuses what it passed before
    assert lost["check"].get("failed") is True, proc.stdout
    assert lost["check"]["msg"].startswith("s3://b/p/meta-state/.run.lock: this run's lock on the tree was lost at ")
    assert "(another run broke it after it expired unrenewed): another run may be working on this tree now" in \
        lost["check"]["msg"]
    failed = {k: v.get("msg") for k, v in res.items() if v.get("failed")}
    passed = {k for k, v in res.items() if not v.get("failed")}
    assert passed == {"true", "walk_up", "lists_root", "lists_runtime", "runtime_same"}, proc.stdout
    assert failed["false"] == ("apply_instances is false NOW in %s/cfg/_config.yml for root 'aws-instances' "
                               "-- not applying." % off)
    assert failed["overlay_gone"] == "apply-check: overlay %s/gone.yml is gone; refusing to apply" % on
    assert failed["overlay_off"] == ("apply_instances is false NOW in %s/off.yml for root 'aws-instances' "
                                     "-- not applying." % on)
    assert failed["no_config"] == ("apply-check: no cfg/_config.yml found from the working directory up; "
                                   "refusing to apply")
    assert "%s/cfg/_config.yml: config.apply_instances" % quoted in failed["string_false"]
    assert "'false'" in failed["string_false"]
    assert failed["lists_other"].startswith('apply_instances is ["someone-else"] NOW in')
    assert failed["runtime_cannot_enable"].startswith("apply_instances is false NOW in %s/cfg/_config.yml" % off)
    assert "narrowed by apply_runtime 'rt-us'" in failed["runtime_narrows"]
    assert failed["storage_unset"].startswith("apply_storage is false (not set) NOW in")
    assert res["true"]["source"] == "%s/cfg/_config.yml" % on and res["true"]["flag"] is True
    assert res["lists_runtime"]["flag"] == ["rt-eu"]
