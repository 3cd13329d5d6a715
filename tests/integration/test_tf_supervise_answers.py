# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What csis-tf-supervise answers for terraform on the role's apply task
(``CSIS_TF_VALIDATED_BY_PLAN=1``): ``validate`` (the plan validated the same files) and
``workspace list`` while the root's workspace is ``default``; in any other workspace, and on
any other task, real terraform answers. community.general.terraform reads the answer as it
reads terraform's (its ``get_workspace_context``)."""
from __future__ import annotations

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


def test_version_and_output_are_terraform_s_own_with_no_supervisor(root):
    """The module's ``version -json`` and ``output -json`` read and hold no lock: the launcher runs
    terraform for them directly (no supervisor's Python to start); a plan still goes through it."""
    path, env = root
    no_python = dict(env, CSIS_TF_PYTHON=os.path.join(path, "no-such-python"))
    for args in (["version", "-json"], ["output", "-no-color", "-json"]):
        real = subprocess.run(["terraform", *args], cwd=path, env=env, capture_output=True, text=True, check=True)
        res = supervise(path, no_python, *args, CSIS_TF_VALIDATED_BY_PLAN="1")
        assert res.returncode == 0 and res.stdout == real.stdout, res.stderr
    res = supervise(path, no_python, "plan", "-input=false", "-no-color")
    assert res.returncode != 0 and "no-such-python" in res.stderr


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
