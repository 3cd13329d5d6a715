# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The gate on plan shapes a root's plain create/update/destroy does not show, made by real
terraform (``terraform_data``: no provider to start), planned as csis_plan plans
(:func:`tfplan.make_plan`) and gated as csis_gate_plan gates (:func:`gate.run_gate`):

- a ``moved`` block that carries an object into a whitelisted address, where it is destroyed: the
  whitelist must cover where it was, too (it was the way to destroy anything unwhitelisted);
- a plan that only moves an object, only imports one, or only changes a root output: terraform
  has something to apply (its exit code 2), so the gate counts it, the role applies it, and its
  digest differs from an empty plan's (an AWX approval binds to it);
- a tainted object's replacement: refused, saying why (tainted);
- a failing ``check`` block: shown to the approver (terraform applies in spite of it).
"""
from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.gate import EMPTY_PLAN, run_gate
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.plan_verdict import plan_content_digest
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.tfplan import make_plan
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import GateRefused
from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import terraform_env

pytestmark = pytest.mark.integration


def write(root, text, files=None):
    with open(os.path.join(root, "main.tf"), "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(text))
    for name, body in (files or {}).items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(textwrap.dedent(body))


def tf(root, *args):
    proc = subprocess.run(["terraform", *args, "-no-color"], cwd=root, env=terraform_env(root=root), capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def root_with(tmp_path, name, text, files=None):
    root = str(tmp_path / name)
    os.makedirs(root)
    write(root, text, files)
    tf(root, "init", "-input=false")
    tf(root, "apply", "-auto-approve", "-input=false")
    return root


def gate(root, allow=()):
    make_plan(root, "tfplan", "terraform")
    return run_gate(root, "tfplan", allow_destroy=list(allow))


MODULE = {"m/main.tf": 'resource "terraform_data" "x" {\n  input = "i"\n}\n'}


def test_a_moved_object_is_destroyed_only_when_the_whitelist_covers_where_it_was(tmp_path):
    root = root_with(tmp_path, "moved", '''
        resource "terraform_data" "precious" { input = "data" }
        module "instance_test" { source = "./m" }
    ''', MODULE)
    # the module is decommissioned (whitelisted), and a moved block carries the precious object into it
    write(root, '''
        moved {
          from = terraform_data.precious
          to   = module.instance_test.terraform_data.precious
        }
    ''', MODULE)
    with pytest.raises(GateRefused) as err:
        gate(root, allow=["module.instance_test"])
    assert "DESTROY NOT WHITELISTED: module.instance_test.terraform_data.precious (moved from terraform_data.precious)" \
        in " ".join(err.value.messages), err.value.messages
    res = gate(root, allow=["module.instance_test", "terraform_data.precious"])
    assert "module.instance_test.terraform_data.precious (moved from terraform_data.precious)" in res["addresses"]["delete"]


def test_a_plan_that_only_moves_imports_or_changes_an_output_has_something_to_apply(tmp_path):
    root = root_with(tmp_path, "shapes", '''
        resource "terraform_data" "a" { input = "a" }
        output "o" { value = "one" }
    ''')
    empty = plan_content_digest(EMPTY_PLAN)
    write(root, '''
        resource "terraform_data" "b" { input = "a" }
        moved {
          from = terraform_data.a
          to   = terraform_data.b
        }
        output "o" { value = "one" }
    ''')
    res = gate(root)
    assert res["moves"] == 1 and res["adds"] == res["changes"] == res["destroys"] == 0, res["summary"]
    assert res["addresses"]["move"] == ["terraform_data.b (moved from terraform_data.a)"]
    assert "1 to move" in res["summary"] and res["plan_digest"] != empty
    assert "> terraform_data.b (moved from terraform_data.a): move (the same object under a new address)" in res["change_lines"]
    # only an output changes (a module's new output a later root reads through remote state)
    tf(root, "apply", "-auto-approve", "-input=false")
    write(root, '''
        resource "terraform_data" "b" { input = "a" }
        output "o" { value = "two" }
    ''')
    res = gate(root)
    assert res["outputs"] == ["o"] and "output changed: o" in res["summary"] and res["plan_digest"] != empty
    assert "~ output.o: changes" in res["change_lines"]
    # the output removed: listed as such, not as "changes"
    tf(root, "apply", "-auto-approve", "-input=false")
    write(root, '''
        resource "terraform_data" "b" { input = "a" }
    ''')
    res = gate(root)
    assert res["outputs"] == ["o"] and "- output.o: removed" in res["change_lines"], res["change_lines"]
    # only an import (the object exists: terraform_data imports any id)
    tf(root, "apply", "-auto-approve", "-input=false")
    write(root, '''
        resource "terraform_data" "b" { input = "a" }
        resource "terraform_data" "c" {}
        import {
          to = terraform_data.c
          id = "an-existing-object"
        }
        output "o" { value = "two" }
    ''')
    res = gate(root)
    assert res["imports"] == 1 and "1 to import" in res["summary"] and res["plan_digest"] != empty, res["summary"]


def test_a_tainted_replacement_is_refused_saying_why_and_a_failing_check_is_shown(tmp_path):
    root = root_with(tmp_path, "taint", '''
        resource "terraform_data" "x" { input = "x" }
        check "c" {
          assert {
            condition     = terraform_data.x.input == "y"
            error_message = "x is not y"
          }
        }
    ''')
    tf(root, "taint", "terraform_data.x")
    with pytest.raises(GateRefused) as err:
        gate(root)
    assert err.value.messages == ["DESTROY NOT WHITELISTED: terraform_data.x (tainted)"]
    res = gate(root, allow=["terraform_data.x"])
    assert any(line.startswith("-/+ terraform_data.x: replace") and line.endswith("; because tainted")
               for line in res["change_lines"]), res["change_lines"]
    assert "1 check failing: check.c" in res["summary"], res["summary"]
    assert "! check.c: check failing (terraform applies in spite of it)" in res["change_lines"]
