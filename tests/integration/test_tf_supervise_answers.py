# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What csis-tf-supervise answers for terraform on the role's apply task
(``CSIS_TF_VALIDATED_BY_PLAN=1``): ``validate`` (the plan validated the same files) and
``workspace list`` while the root's workspace is ``default``; in any other workspace, and on
any other task, real terraform answers. ``output -json`` is terraform's, each sensitive value
masked. community.general.terraform reads the answer as it
reads terraform's (its ``get_workspace_context``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(REPO, "roles", "tofu_root", "files", "csis-tf-supervise")


def current_workspace(out: str) -> str:
    """community.general.terraform's reading of ``workspace list``."""
    found = "default"
    for item in out.split("\n"):
        if item.strip().startswith("* "):
            found = item.strip().replace("* ", "")
    return found


@pytest.fixture()
def root(tmp_path, tf_env):
    (tmp_path / "main.tf").write_text('resource "terraform_data" "x" {\n  input = 1\n}\n')
    env = dict(tf_env, CSIS_TF_BINARY="terraform", CSIS_TF_PYTHON=sys.executable)
    env.pop("TF_WORKSPACE", None)
    subprocess.run(["terraform", "init", "-input=false", "-no-color"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    return str(tmp_path), env


def supervise(root, env, *args, **extra):
    return subprocess.run([LAUNCHER, *args], cwd=root, env=dict(env, **extra), capture_output=True, text=True,
                          timeout=300, check=False)


def test_workspace_list_answered_in_the_default_workspace(root):
    path, env = root
    real = subprocess.run(["terraform", "workspace", "list", "-no-color"], cwd=path, env=env, capture_output=True,
                          text=True, check=True)
    answered = supervise(path, env, "workspace", "list", "-no-color", CSIS_TF_VALIDATED_BY_PLAN="1")
    assert answered.returncode == 0 and answered.stdout == "* default\n\n"
    assert current_workspace(answered.stdout) == current_workspace(real.stdout) == "default"


def test_terraform_answers_in_another_workspace_and_on_other_tasks(root):
    path, env = root
    subprocess.run(["terraform", "workspace", "new", "-no-color", "blue"], cwd=path, env=env, check=True,
                   capture_output=True)
    res = supervise(path, env, "workspace", "list", "-no-color", CSIS_TF_VALIDATED_BY_PLAN="1")
    assert res.returncode == 0 and current_workspace(res.stdout) == "blue" and "default" in res.stdout
    res = supervise(path, env, "workspace", "list", "-no-color", CSIS_TF_VALIDATED_BY_PLAN="1", TF_WORKSPACE="default")
    assert res.returncode == 0 and res.stdout == "* default\n\n"        # TF_WORKSPACE wins, as in terraform
    subprocess.run(["terraform", "workspace", "select", "-no-color", "default"], cwd=path, env=env, check=True,
                   capture_output=True)
    res = supervise(path, env, "workspace", "list", "-no-color")         # not the apply task: terraform
    assert res.returncode == 0 and "blue" in res.stdout and current_workspace(res.stdout) == "default"


def test_validate_answered_only_on_the_apply_task(root):
    path, env = root
    res = supervise(path, env, "validate", "-no-color", CSIS_TF_VALIDATED_BY_PLAN="1")
    assert res.returncode == 0 and "validated by the plan this apply runs" in res.stdout
    res = supervise(path, env, "validate", "-no-color")
    assert res.returncode == 0 and "Success! The configuration is valid." in res.stdout
    assert "validated by the plan" not in res.stdout


def test_version_is_terraform_s_own_with_no_supervisor(root):
    """The module's ``version -json`` reads and holds no lock: the launcher runs terraform for it
    directly (no supervisor's Python to start); a plan still goes through the supervisor."""
    path, env = root
    no_python = dict(env, CSIS_TF_PYTHON=os.path.join(path, "no-such-python"))
    real = subprocess.run(["terraform", "version", "-json"], cwd=path, env=env, capture_output=True, text=True, check=True)
    res = supervise(path, no_python, "version", "-json", CSIS_TF_VALIDATED_BY_PLAN="1")
    assert res.returncode == 0 and res.stdout == real.stdout, res.stderr
    res = supervise(path, no_python, "plan", "-input=false", "-no-color")
    assert res.returncode != 0 and "no-such-python" in res.stderr


def test_output_json_masks_every_sensitive_value(root):
    """``output -json`` (community.general.terraform's, after the role's apply) is terraform's own
    answer with each sensitive output's value masked: the module's result, which Ansible writes to
    the job's async results file, never holds it. Anything else passes through as terraform printed it."""
    path, env = root
    with open(os.path.join(path, "outputs.tf"), "w", encoding="utf-8") as fh:
        fh.write('output "plain" {\n  value = "in-the-clear"\n}\n\n'
                 'output "token" {\n  value     = "s3cr3t-%s"\n  sensitive = true\n}\n\n'
                 'output "nested" {\n  value     = { key = "s3cr3t-nested" }\n  sensitive = true\n}\n' % os.getpid())
    subprocess.run(["terraform", "apply", "-auto-approve", "-input=false", "-no-color"], cwd=path, env=env, check=True,
                   capture_output=True)
    real = json.loads(subprocess.run(["terraform", "output", "-no-color", "-json"], cwd=path, env=env,
                                     capture_output=True, text=True, check=True).stdout)
    assert real["token"]["value"].startswith("s3cr3t-")  # terraform's own answer holds it in clear
    res = supervise(path, env, "output", "-no-color", "-json", CSIS_TF_VALIDATED_BY_PLAN="1")
    assert res.returncode == 0, res.stderr
    assert "s3cr3t" not in res.stdout + res.stderr
    got = json.loads(res.stdout)
    assert got == dict(real, token=dict(real["token"], value="(sensitive value)"),
                       nested=dict(real["nested"], value="(sensitive value)"))
    assert got["plain"] == {"sensitive": False, "type": "string", "value": "in-the-clear"}
    # what the module does not ask: terraform's answer unchanged (one named output, no -json, a failure)
    for args in (["output", "-no-color", "-raw", "plain"], ["output", "-no-color"], ["output", "-no-color", "-json", "none"]):
        want = subprocess.run(["terraform", *args], cwd=path, env=env, capture_output=True, text=True, check=False)
        res = supervise(path, env, *args)
        assert (res.returncode, res.stdout, res.stderr) == (want.returncode, want.stdout, want.stderr), args


def test_an_empty_workspace_file_is_default_as_for_terraform(root):
    """An empty ``.terraform/environment`` is the ``default`` workspace for terraform too: the
    launcher's answer is then terraform's. (A named workspace: the test above.)"""
    path, env = root
    data = os.path.join(path, ".terraform")
    os.makedirs(data, exist_ok=True)
    with open(os.path.join(data, "environment"), "w", encoding="utf-8") as fh:
        fh.write("")
    real = subprocess.run(["terraform", "workspace", "list", "-no-color"], cwd=path, env=env, capture_output=True,
                          text=True, check=True)
    res = supervise(path, env, "workspace", "list", "-no-color", CSIS_TF_VALIDATED_BY_PLAN="1")
    assert res.returncode == 0 and res.stdout == "* default\n\n"
    assert current_workspace(res.stdout) == current_workspace(real.stdout) == "default"
