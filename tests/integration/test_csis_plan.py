# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""csis_plan (one terraform call) and the gate's trust in an empty plan, with real terraform.

No AWS: the root holds only ``terraform_data`` resources (built into terraform), local state.
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

from ansible_collections.csis.infra.plugins.module_utils.csis.apply import binding as b  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.gate import run_gate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.plan_verdict import plan_content_digest  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.tfplan import UpstreamNotApplied, make_plan  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import GateError, GateRefused  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import TerraformError, terraform_env  # noqa: E402

PLAYBOOK_BIN = os.path.join(_REPO, ".venv", "bin", "ansible-playbook")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("terraform") is None, reason="needs terraform on PATH")]

MAIN_TF = textwrap.dedent("""\
    variable "n" {
      type    = number
      default = 1
    }
    variable "label" {
      type    = string
      default = "a"
    }
    resource "terraform_data" "one" {
      input = "${var.label}-${var.n}"
    }
    """)


def tf(root, *args):
    return subprocess.run(["terraform"] + list(args), cwd=root, env=terraform_env(os.environ), capture_output=True,
                          text=True, check=True)


@pytest.fixture()
def root(tmp_path):
    d = tmp_path / "root"
    d.mkdir()
    (d / "main.tf").write_text(MAIN_TF)
    tf(str(d), "init", "-input=false", "-no-color")
    return str(d)


def apply(root):
    tf(root, "apply", "-input=false", "-no-color", "tfplan")


def apply_refused(root):
    """What terraform says when it refuses to apply the plan file (it must refuse it)."""
    proc = subprocess.run(["terraform", "apply", "-input=false", "-no-color", "tfplan"], cwd=root,
                          env=terraform_env(os.environ), capture_output=True, text=True, check=False)
    assert proc.returncode != 0, proc.stdout[-2000:]
    return proc.stderr


def play(tmp_path, tasks, root, *args):
    """One real ansible-playbook run of ``tasks`` (YAML, indented as a play's task list) on localhost."""
    pb = tmp_path / "pb.yml"
    pb.write_text("- hosts: localhost\n  gather_facts: false\n  connection: local\n  tasks:\n" + tasks)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(_REPO, "ansible.cfg"))
    return subprocess.run([PLAYBOOK_BIN, str(pb), *args, "-e", json.dumps({"root": root})], cwd=_REPO, env=env,
                          capture_output=True, text=True, check=False)


def test_changes_then_empty_plan_skips_show_and_gate_agrees(root):
    first = make_plan(root, variables={"n": 2, "label": "x"})
    assert first["changes"] is True and first["summary"].startswith("Plan: 1 to add")
    assert os.stat(first["plan_file"]).st_mode & 0o777 == 0o600  # it holds state and data sources' values
    assert "-var" in first["cmd"] and "n=2" in first["cmd"]
    gate = run_gate(root, "tfplan")
    assert gate["show_skipped"] is False and gate["adds"] == 1
    b.verify_binding(root, "tfplan")
    apply(root)

    second = make_plan(root, variables={"n": 2, "label": "x"})
    assert second["changes"] is False and second["summary"].startswith("No changes.")
    gate = run_gate(root, "tfplan")
    assert gate["show_skipped"] is True
    assert (gate["adds"], gate["changes"], gate["destroys"]) == (0, 0, 0)
    # the digest an empty plan gets without show -json is the one show -json gives it
    full = json.loads(tf(root, "show", "-json", "tfplan").stdout)
    assert gate["plan_digest"] == plan_content_digest(full)


def test_a_changed_plan_file_is_read_in_full_not_trusted_empty(root):
    make_plan(root)
    apply(root)
    make_plan(root)  # empty, recorded as such for these bytes
    other = os.path.join(os.path.dirname(root), "other")
    shutil.copytree(root, other)
    # a plan with a change, written over the empty one after the plan step
    with open(os.path.join(other, "main.tf"), "a", encoding="utf-8") as fh:
        fh.write('resource "terraform_data" "two" {\n  input = "b"\n}\n')
    tf(other, "plan", "-input=false", "-no-color", "-out=tfplan")
    shutil.copy(os.path.join(other, "tfplan"), os.path.join(root, "tfplan"))
    gate = run_gate(root, "tfplan")
    assert gate["show_skipped"] is False  # not the bytes terraform called empty: read in full


def test_replace_is_planned_and_the_gate_refuses_it(root):
    make_plan(root)
    apply(root)
    res = make_plan(root, replace=["terraform_data.one"])
    assert res["changes"] is True and "1 to add" in res["summary"] and "1 to destroy" in res["summary"]
    with pytest.raises(GateRefused) as exc:
        run_gate(root, "tfplan")
    assert any("DESTROY NOT WHITELISTED: terraform_data.one" in m for m in exc.value.messages)


def test_a_failing_plan_names_the_root_and_records_no_plan(root):
    with open(os.path.join(root, "main.tf"), "a", encoding="utf-8") as fh:
        fh.write('resource "terraform_data" "bad" {\n  input = var.missing\n}\n')
    with pytest.raises(TerraformError) as exc:
        make_plan(root)
    assert root in str(exc.value) and "exit 1" in str(exc.value)
    binding = b.read_binding(os.path.join(root, "tfplan"))
    assert binding is not None and "plan" not in binding
    with pytest.raises(GateRefused):
        run_gate(root, "tfplan")


def test_a_root_whose_upstream_was_never_applied_is_named_failed_or_left_unplanned(root, tmp_path):
    """A root that reads another's state (an EFS root the identity root's gids) cannot be planned
    before that root's first apply: terraform's "Unable to find remote state". The plan names the
    root it reads and the flag that applies it; for a root the run does not apply it plans nothing
    and says what it waits for; once the upstream applied, the root plans."""
    up = tmp_path / "up"
    up.mkdir()
    (up / "main.tf").write_text('output "group_gids" {\n  value = { coops = 2001 }\n}\n')
    with open(os.path.join(root, "main.tf"), "a", encoding="utf-8") as fh:
        fh.write(textwrap.dedent("""\
            data "terraform_remote_state" "posix_groups" {
              backend = "local"
              config = {
                path = "../up/terraform.tfstate"
              }
            }
            resource "terraform_data" "reads" {
              input = data.terraform_remote_state.posix_groups.outputs.group_gids["coops"]
            }
            """))
    reads = {"posix_groups": "identity-posix-groups"}
    with pytest.raises(UpstreamNotApplied) as exc:
        make_plan(root, reads=reads)
    assert exc.value.roots == ["identity-posix-groups"] and exc.value.labels == ["posix_groups"]
    msg = str(exc.value)
    assert msg.startswith(root + ": this root reads the state of identity-posix-groups "
                                 "(data.terraform_remote_state.posix_groups), and no state is stored for it")
    assert "config.apply_identity" in msg, msg
    binding = b.read_binding(os.path.join(root, "tfplan"))
    assert binding is not None and "plan" not in binding
    with pytest.raises(GateError, match="the plan is marked errored"):  # terraform saved an errored plan
        run_gate(root, "tfplan")

    unplanned = make_plan(root, reads=reads, skip_unapplied=True)
    assert unplanned["waiting_for"] == ["identity-posix-groups"] and unplanned["changes"] is None
    assert unplanned["summary"] == "not planned: it reads identity-posix-groups, never applied"
    assert unplanned["msg"] == msg
    assert "plan" not in b.read_binding(os.path.join(root, "tfplan"))

    tf(str(up), "init", "-input=false", "-no-color")
    tf(str(up), "apply", "-auto-approve", "-input=false", "-no-color")
    planned = make_plan(root, reads=reads, skip_unapplied=True)
    assert planned["changes"] is True and planned["waiting_for"] == [], planned
    assert planned["summary"].startswith("Plan: 2 to add")


def test_the_timeout_interrupts_terraform(root, tmp_path):
    slow = tmp_path / "slow-terraform"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    with pytest.raises(TerraformError) as exc:
        make_plan(root, binary_path=str(slow), timeout=1)
    assert "did not finish within 1 s" in str(exc.value)


def test_module_check_mode_writes_nothing(root, tmp_path):
    res = play(tmp_path, """\
    - csis.infra.csis_plan:
        project_path: "{{ root }}"
      register: planned
    - ansible.builtin.assert:
        that: planned.changes is none and not planned.changed
""", root, "--check")
    assert res.returncode == 0, res.stdout[-3000:]
    assert not os.path.exists(os.path.join(root, "tfplan"))
    assert not os.path.exists(os.path.join(root, "tfplan" + b.BINDING_SUFFIX))


def test_a_directory_where_the_plan_file_belongs_is_named(root):
    os.mkdir(os.path.join(root, "tfplan"))
    with pytest.raises(GateError) as exc:
        make_plan(root)
    assert str(exc.value) == ("%s: is a directory where the plan file or its binding belongs: remove it, then plan "
                              "again" % os.path.join(root, "tfplan"))


def test_a_state_another_run_changed_after_the_plan_is_refused_before_the_apply(root, tmp_path):
    """terraform refuses a saved plan whose state moved, but only at the apply; the role's steps
    before it (machines stopped, archive snapshots, bucket wipes) ran by then. The binding's state
    check refuses it first, by terraform's own rule (lineage, then serial)."""
    make_plan(root, variables={"n": 2})
    run_gate(root, "tfplan")
    # the first plan of a root (no state yet) applies to an empty state
    assert b.verify_binding(root, "tfplan", check_state=True)["state_check"] == \
        "the state is the one the plan was made against"
    apply(root)

    make_plan(root, variables={"n": 3})
    run_gate(root, "tfplan")
    assert b.verify_binding(root, "tfplan", check_state=True)["state_check"] == \
        "the state is the one the plan was made against"
    # another terraform run (outside csis) applies something after the plan and the gate
    tf(root, "apply", "-auto-approve", "-input=false", "-no-color", "-var", "n=4")
    assert b.verify_binding(root, "tfplan")["state_check"] == "not asked"   # the root's files did not change
    serial = json.loads(open(os.path.join(root, "terraform.tfstate"), encoding="utf-8").read())["serial"]
    assert serial > 1
    with pytest.raises(GateRefused) as exc:
        b.verify_binding(root, "tfplan", check_state=True)
    assert exc.value.messages == [
        "STALE PLANFILE: tfplan was planned against the root's state at serial 1 and the state is now at serial %d: "
        "another terraform operation changed it after the plan (terraform would refuse the plan file as stale); "
        "nothing was applied -- plan again" % serial]
    # the very rule terraform applies to the plan file
    assert "Saved plan is stale" in apply_refused(root)

    # the state replaced (another lineage) under a plan made from the old one
    make_plan(root, variables={"n": 5})
    run_gate(root, "tfplan")
    lineage = json.loads(open(os.path.join(root, "terraform.tfstate"), encoding="utf-8").read())["lineage"]
    os.remove(os.path.join(root, "terraform.tfstate"))
    with pytest.raises(GateRefused) as exc:
        b.verify_binding(root, "tfplan", check_state=True)
    assert exc.value.messages == [
        "STALE PLANFILE: tfplan was planned against state lineage %s and the root's state is now empty: the state was "
        "replaced after the plan; nothing was applied -- plan again" % lineage]
    tf(root, "apply", "-auto-approve", "-input=false", "-no-color")
    with pytest.raises(GateRefused) as exc:
        b.verify_binding(root, "tfplan", check_state=True)
    assert "the root's state is now lineage " in exc.value.messages[0]
    assert "Saved plan does not match the given state" in apply_refused(root)

    # through the module, as the role runs it: the task fails with the message, nothing else ran
    make_plan(root, variables={"n": 6})
    run_gate(root, "tfplan")
    tf(root, "apply", "-auto-approve", "-input=false", "-no-color", "-var", "n=7")
    res = play(tmp_path, """\
    - csis.infra.csis_plan_binding:
        project_path: "{{ root }}"
        state: verified
        check_state: true
    - ansible.builtin.file:
        path: "{{ root }}/must-not-exist"
        state: touch
""", root)
    assert res.returncode == 2, res.stdout[-3000:]
    assert "STALE PLANFILE: tfplan was planned against the root's state at serial" in res.stdout
    assert not os.path.exists(os.path.join(root, "must-not-exist"))


def test_the_state_check_reads_a_backends_state_object_directly(tmp_path):
    """With a backend block (the roots csis renders have one), the check reads the state object
    itself (tfstate.read_direct: here the local backend's file), not through `state pull`."""
    from ansible_collections.csis.infra.plugins.module_utils.csis import tfstate

    d = tmp_path / "backend"
    d.mkdir()
    (d / "main.tf").write_text(MAIN_TF + 'terraform {\n  backend "local" {\n    path = "state/main.tfstate"\n  }\n}\n')
    tf(str(d), "init", "-input=false", "-no-color")
    root = str(d)
    make_plan(root)
    run_gate(root, "tfplan")
    apply(root)
    make_plan(root, variables={"n": 2})
    run_gate(root, "tfplan")
    assert tfstate.read_direct(root)["serial"] == 1          # read without terraform
    assert b.verify_binding(root, "tfplan", check_state=True)["state_check"] == \
        "the state is the one the plan was made against"
    tf(root, "apply", "-auto-approve", "-input=false", "-no-color", "-var", "n=3")
    serial = tfstate.read_direct(root)["serial"]
    with pytest.raises(GateRefused) as exc:
        b.verify_binding(root, "tfplan", check_state=True)
    assert exc.value.messages[0].startswith(
        "STALE PLANFILE: tfplan was planned against the root's state at serial 1 and the state is now at serial %d: "
        % serial), exc.value.messages
