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

GATE_PLAYBOOK = textwrap.dedent("""\
    - hosts: localhost
      gather_facts: false
      connection: local
      tasks:
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
          ansible.builtin.shell: "{{ meddle_after_plan }}"
          args:
            chdir: "{{ root }}"
          when: meddle_after_plan | length > 0
        - name: gate
          csis.infra.csis_gate_plan:
            project_path: "{{ root }}"
            plan_file: tfplan
            allow_destroy: "{{ allow_destroy }}"
          register: gate
          ignore_errors: true
        - name: meddle between gate and apply
          ansible.builtin.shell: "{{ meddle_after_gate }}"
          args:
            chdir: "{{ root }}"
          when: gate is succeeded and meddle_after_gate | length > 0
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
        - name: results
          ansible.builtin.copy:
            dest: "{{ results }}"
            content: "{{ {'gate': gate, 'verified': verified, 'applied': applied} | to_json }}"
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


def _gate_run(base, root, name, allow=(), after_plan="", after_gate=""):
    return _run_playbook(base, name, GATE_PLAYBOOK, {
        "root": str(root), "tf_env": env_overrides(), "allow_destroy": list(allow),
        "meddle_after_plan": after_plan, "meddle_after_gate": after_gate})


def test_gate_flow_with_real_terraform(tf_root):
    base, root = tf_root
    # 1. first apply: creates only
    res, proc = _gate_run(base, root, "first")
    assert not res["gate"].get("failed"), proc.stdout
    assert res["gate"]["summary"] == "Plan: 3 to add, 0 to change, 0 to destroy"
    assert res["verified"]["plan_sha256"] == res["gate"]["plan_sha256"]
    assert res["applied"]["rc"] == 0, proc.stdout

    # 2. a changed input replaces terraform_data.x: refused without a whitelist
    (root / "gen.auto.tfvars").write_text('gen = "2"\n')
    res, proc = _gate_run(base, root, "replace_refused")
    assert res["gate"]["failed"] is True
    assert res["gate"]["msg"] == "DESTROY NOT WHITELISTED: terraform_data.x"
    assert res["gate"]["violations"] == ["DESTROY NOT WHITELISTED: terraform_data.x"]
    assert res["gate"]["addresses"]["replace"] == ["terraform_data.x"]
    assert res["verified"].get("skipped") and res["applied"].get("skipped")
    assert "DESTROY NOT WHITELISTED: terraform_data.x" in proc.stdout

    # 3. the same plan with the whitelist: admitted, verified, applied
    res, proc = _gate_run(base, root, "replace_admitted", allow=["terraform_data.x"])
    assert not res["gate"].get("failed"), proc.stdout
    assert res["gate"]["summary"] == ("Plan: 1 to add, 0 to change, 1 to destroy (1 replacement); "
                                      "1 destroy whitelisted by terraform_data.x")
    assert res["gate"]["whitelisted"] == [{"address": "terraform_data.x", "entry": "terraform_data.x",
                                           "kind": "replace"}]
    assert res["applied"]["rc"] == 0, proc.stdout

    # 4. a module file (outside the root) edited between plan and gate: stale, nothing applied
    (root / "gen.auto.tfvars").write_text('gen = "3"\n')
    res, proc = _gate_run(base, root, "stale_module", allow=["terraform_data.x"],
                          after_plan="echo '# edited' >> ../modsrc/m/main.tf")
    assert res["gate"]["failed"] is True
    assert res["gate"]["msg"].startswith("STALE PLANFILE: tfplan is older than the root: ")
    assert "module ../modsrc/m/main.tf (modified)" in res["gate"]["msg"]
    assert res["applied"].get("skipped")

    # 5. a .tfvars edited after the gate: refused at verified
    res, proc = _gate_run(base, root, "stale_after_gate", allow=["terraform_data.x"],
                          after_gate="echo 'gen = \"4\"' > gen.auto.tfvars")
    assert not res["gate"].get("failed"), proc.stdout
    assert res["verified"]["failed"] is True
    assert "gen.auto.tfvars (modified)" in res["verified"]["msg"]
    assert res["applied"].get("skipped")

    # 6. plan bytes tampered after the gate: refused at verified
    res, proc = _gate_run(base, root, "tampered", allow=["terraform_data.x"],
                          after_gate="printf 'x' >> tfplan")
    assert not res["gate"].get("failed"), proc.stdout
    assert res["verified"]["failed"] is True
    assert res["verified"]["msg"].startswith("STALE PLANFILE: tfplan changed after the gate passed it")
    assert res["applied"].get("skipped")

    # 7. the plan step produced nothing (plan file removed): the gate says so
    res, proc = _gate_run(base, root, "missing", allow=["terraform_data.x"], after_plan="rm -f tfplan")
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
""")


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
    res, proc = _run_playbook(tmp_path, "apply_check", APPLY_CHECK_PLAYBOOK, {"cases": cases})
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
