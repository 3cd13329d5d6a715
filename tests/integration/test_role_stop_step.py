# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The tofu_root role's stop step: when it runs, and the failed root's message naming the machines it left stopped.

The stop step (``csis.infra.csis_stop_instances``, roles/tofu_root/tasks/apply.yml) stops a
machine right before an apply that terminates it with its EBS volumes attached. When that apply
then fails, or never runs (a later step, or another root, failed first), the machine stays
stopped: the failure message says which, and how to bring it back if the change is given up.

The message and its variables are read from the role's own ``tasks/main.yml`` (the rescue's
``Fail as the root's chain failed`` task), the step's condition from ``tasks/apply.yml``
(``csis_stop_before_detach: false`` switches it off), and both are templated by one real
``ansible-playbook`` run with the variables each case would have; the cases are its hosts.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK_BIN = os.path.join(REPO, ".venv", "bin", "ansible-playbook")
STOPPED = {"stopped": [{"name": "web", "instance_id": "i-0web", "state": "stopped"},
                       {"name": "db", "instance_id": "i-0db", "state": "stopped"}]}

# host -> the variables at the rescue: the failed task, this pass's apply result, the stop's result
CASES = {
    "apply_failed": dict(failed_task="Wait for the apply", failed_msg="Error: timeout while waiting",
                         stopped=False, apply={"failed": True, "changed": True}, machines=STOPPED),
    "before_apply": dict(failed_task="Verify the plan file again right before the apply", failed_msg="plan file changed",
                         stopped=False, apply={"changed": False, "skipped": True}, machines=STOPPED),
    # the first start lost before terraform began (never_began: not failed), the second start failed
    "first_start_lost": dict(failed_task="Start the apply of exactly that plan file again", failed_msg="lost again",
                             stopped=False, apply={"failed": False, "never_began": True, "changed": False},
                             machines=STOPPED),
    "sibling_failed": dict(failed_task="Wait for the apply", failed_msg="x", stopped=True,
                           apply={"changed": False, "skipped": True}, machines=STOPPED),
    "applied_then_record_failed": dict(failed_task="Record what the apply did", failed_msg="meta-state locked",
                                       stopped=False, apply={"changed": True}, machines=STOPPED),
    "nothing_stopped": dict(failed_task="Gate the plan", failed_msg="refused", stopped=False,
                            apply={"changed": False, "skipped": True}, machines={}),
    "stop_step_skipped": dict(failed_task="Wait for the apply", failed_msg="boom", stopped=False,
                              apply={"failed": True}, machines={"skipped": True, "changed": False}),
}


# host -> the stop step's inputs: csis_stop_before_detach, the gate's addresses (its condition is the role's)
ATT = "module.instance_web.aws_volume_attachment.this[\"data\"]"
STOP_CASES = {
    "decommission": dict(switch=True, addresses={"delete": ["module.instance_web.aws_instance.this", ATT]}),
    "replacement": dict(switch=True, addresses={"replace": ["module.instance_web.aws_instance.this", ATT]}),
    "switched_off": dict(switch=False, addresses={"delete": ["module.instance_web.aws_instance.this", ATT]}),
    "switched_off_as_text": dict(switch="false", addresses={"delete": ["module.instance_web.aws_instance.this", ATT]}),
    "no_attachment": dict(switch=True, addresses={"delete": ["module.instance_web.aws_instance.this"]}),
    "detach_only": dict(switch=True, addresses={"delete": [ATT]}),
}


def _role_task(tasks_file, name):
    with open(os.path.join(REPO, "roles", "tofu_root", "tasks", tasks_file), encoding="utf-8") as fh:
        tasks = yaml.safe_load(fh)

    def walk(items):
        for t in items or []:
            if t.get("name", "").startswith(name):
                return t
            for key in ("block", "rescue", "always"):
                found = walk(t.get(key))
                if found:
                    return found
        return None
    task = walk(tasks)
    assert task is not None, "roles/tofu_root/tasks/%s has no task '%s'" % (tasks_file, name)
    return task


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    """{host: what the role's expressions give}: the failure message (``failure`` hosts) and the
    stop step's condition (``stop`` hosts), with each task's own ``vars``."""
    fail = _role_task("main.yml", "Fail as the root's chain failed")
    stop = _role_task("apply.yml", "Stop the machines whose volumes the apply detaches")
    d = tmp_path_factory.mktemp("failmsg")
    inventory = {"all": {"vars": {"ansible_connection": "local"}, "children": {
        "failure": {"hosts": {host: {
            "csis_root_item": {"key": "instance-image/" + host},
            "ansible_failed_task": {"name": c["failed_task"]},
            "ansible_failed_result": {"msg": c["failed_msg"], "failed": True},
            "tofu_root_stopped": c["stopped"],
            "tofu_root_apply": c["apply"],
            "tofu_root_machines_stopped": c["machines"],
        } for host, c in CASES.items()}},
        "stop": {"hosts": {host: {"csis_stop_before_detach": c["switch"], "tofu_root_gate": {"addresses": c["addresses"]}}
                           for host, c in STOP_CASES.items()}}}}}
    (d / "inventory.yml").write_text(yaml.safe_dump(inventory), encoding="utf-8")
    play = [{"name": "The role's failure message", "hosts": "failure", "gather_facts": False,
             "tasks": [{"name": "Template it", "ansible.builtin.set_fact": {"shown": fail["ansible.builtin.fail"]["msg"]},
                        "vars": fail.get("vars") or {}},
                       {"name": "Show it", "ansible.builtin.debug": {"var": "shown"}}]},
            {"name": "The stop step's condition", "hosts": "stop", "gather_facts": False,
             "tasks": [{"name": "Template it", "ansible.builtin.set_fact": {"shown": "{{ %s }}" % stop["when"].strip()},
                        "vars": stop.get("vars") or {}},
                       {"name": "Show it", "ansible.builtin.debug": {"var": "shown"}}]}]
    (d / "play.yml").write_text(yaml.safe_dump(play, width=1000), encoding="utf-8")
    # the json callback, and no other (the project's ansible.cfg adds profile_tasks' lines): what
    # each host templated, no module process (set_fact and debug run on the controller)
    (d / "ansible.cfg").write_text("[defaults]\nstdout_callback = ansible.posix.json\n", encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=str(d / "ansible.cfg"))
    proc = subprocess.run([PLAYBOOK_BIN, "-i", str(d / "inventory.yml"), str(d / "play.yml")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = {}
    for play_out in json.loads(proc.stdout)["plays"]:
        for host, res in play_out["tasks"][-1]["hosts"].items():
            out[host] = res["shown"]
    return out


@pytest.fixture(scope="module")
def messages(templated):
    return {host: templated[host] for host in CASES}


def test_an_apply_that_failed_after_the_stop_names_the_machines_left_stopped(messages):
    m = messages["apply_failed"]
    assert m.startswith("instance-image/apply_failed: Wait for the apply failed: Error: timeout while waiting"
                        " - stopped before the apply, and still stopped unless the apply terminated them: "
                        "web (i-0web), db (i-0db); the next run applies the same change; if it is given up, "
                        "start them again (aws ec2 start-instances)"), m


@pytest.mark.parametrize("host, said", [("before_apply", "plan file changed"), ("first_start_lost", "lost again")])
def test_a_failure_between_the_stop_and_the_apply_names_them_too(messages, host, said):
    assert said + " - stopped before the apply, and still stopped" in messages[host]
    assert "web (i-0web), db (i-0db)" in messages[host]


def test_a_root_stopped_by_another_roots_failure_names_them(messages):
    m = messages["sibling_failed"]
    assert m.startswith("instance-image/sibling_failed: stopped: another root of the lifecycle failed (see its failure "
                        "above) - stopped before the apply, and still stopped"), m


@pytest.mark.parametrize("host", ["applied_then_record_failed", "nothing_stopped", "stop_step_skipped"])
def test_no_machine_is_named_when_the_apply_ran_or_nothing_was_stopped(messages, host):
    # an apply that succeeded terminated them (the record failed after it); no stop, nothing to name
    assert "still stopped" not in messages[host] and messages[host].startswith("instance-image/" + host + ": "), \
        json.dumps(messages[host])


@pytest.mark.parametrize("host, runs", [("decommission", True), ("replacement", True), ("switched_off", False),
                                        ("switched_off_as_text", False), ("no_attachment", False), ("detach_only", False)])
def test_the_stop_step_runs_for_a_machine_destroyed_with_its_attachments_unless_switched_off(templated, host, runs):
    # csis_stop_before_detach: false (an -e or an AWX extra var gives the text "false") skips the step
    assert templated[host] is runs
