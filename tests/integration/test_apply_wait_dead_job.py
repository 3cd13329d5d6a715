# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""csis_apply_wait on real Ansible async jobs (``async``, ``poll: 0``, the local connection, as
the tofu_root role starts its apply), in one real ``ansible-playbook`` run:

* a job that runs a few seconds and ends is waited for and returns its result (several looks at
  its processes on the way: none of them calls it gone);
* a job whose every process is killed with SIGKILL (``kill -9`` of the lot) fails the wait
  within seconds, naming the job, although the wait's timeout is an hour;
* a job whose ``async_wrapper`` running the module is killed alone (what the kernel's OOM
  killer does: one process), while the module's own child lives on, fails the same way: no
  process is left that could write its result;
* a job none of whose processes the wait ever sees (all gone before its first look, as on a
  controller loaded to its limit) and whose command never wrote its log is called lost, with
  ``never_began``, once ``unseen_grace`` has passed.

The results files go to the test's own ``ANSIBLE_ASYNC_DIR`` (the wait removes them), and the
jobs' payloads to its own ``ANSIBLE_REMOTE_TMP``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc"),
              pytest.mark.skipif(not os.path.exists(e2e.PLAYBOOK_BIN), reason="needs the project venv")]

PLAY = """\
- name: csis_apply_wait on real async jobs
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    sleeper: "import sys, time; time.sleep(float(sys.argv[1]))"
  tasks:
    - name: A job that ends by itself
      ansible.builtin.command:
        argv: ["{{ ansible_playbook_python }}", "-c", "{{ sleeper }}", "5", "{{ marker }}-ends"]
      async: 3600
      poll: 0
      register: ends_job

    - name: Wait for it
      csis.infra.csis_apply_wait:
        job: "{{ ends_job }}"
        interval: 1
        timeout: 3600
        label: "ends: apply"
      register: ends

    - name: A job that is killed whole
      ansible.builtin.command:
        argv: ["{{ ansible_playbook_python }}", "-c", "{{ sleeper }}", "3000", "{{ marker }}-whole"]
      async: 3600
      poll: 0
      register: whole_job

    - name: Wait for it
      csis.infra.csis_apply_wait:
        job: "{{ whole_job }}"
        interval: 1
        timeout: 3600
        label: "whole: apply"
      register: whole
      ignore_errors: true

    - name: A job whose async_wrapper is killed alone
      ansible.builtin.command:
        argv: ["{{ ansible_playbook_python }}", "-c", "{{ sleeper }}", "3000", "{{ marker }}-wrapper"]
      async: 3600
      poll: 0
      register: wrapper_job

    - name: Wait for it
      csis.infra.csis_apply_wait:
        job: "{{ wrapper_job }}"
        interval: 1
        timeout: 3600
        label: "wrapper: apply"
      register: wrapper
      ignore_errors: true

    - name: Wait for a job that was gone before the wait's first look (never seen, its log never written)
      csis.infra.csis_apply_wait:
        job: {ansible_job_id: "{{ lost_id }}", results_file: "{{ lost_results }}"}
        log: "{{ lost_log }}"
        interval: 1
        timeout: 3600
        unseen_grace: 2
        label: "lost: apply"
      register: lost
      ignore_errors: true

    - name: Keep the results for the test
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ {'ends_job': ends_job, 'ends': ends, 'whole_job': whole_job, 'whole': whole,
                      'wrapper_job': wrapper_job, 'wrapper': wrapper, 'lost': lost} | to_json }}"
        mode: "0600"
"""


def _job_of(marker: str):
    """(the sleeper's pid, the pids of its async_wrapper ancestors) once the sleeper runs."""
    table = e2e.processes(lambda p: True)
    by_pid = {p["pid"]: p for p in table}
    for p in table:
        if p["argv"] and p["argv"][-1] == marker:
            chain, pid = [], p["ppid"]
            while pid in by_pid:
                if any("async_wrapper" in os.path.basename(a) for a in by_pid[pid]["argv"]):
                    chain.append(pid)
                pid = by_pid[pid]["ppid"]
            return p["pid"], chain
    return None, []


def _kill(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_a_killed_job_fails_the_wait_naming_it_and_a_live_one_is_waited_for(tmp_path):
    marker = "csis-test-%s" % uuid.uuid4().hex[:12]
    playbook, out = tmp_path / "play.yml", tmp_path / "out.json"
    playbook.write_text(PLAY, encoding="utf-8")
    dirs = e2e.ansible_dirs_in(str(tmp_path))  # a killed job's payload stays here, not in ~/.ansible
    async_dir = dirs["ANSIBLE_ASYNC_DIR"]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(e2e.REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1", **dirs)
    log = open(str(tmp_path / "run.log"), "wb")
    # a job whose processes were all gone before the wait's first look (ansible-core issue 87387 on
    # a loaded controller): only its results file, saying "started", and no log of its command
    lost_id = "j%012d.1" % (uuid.uuid4().int % 10 ** 12)
    lost = dict(lost_id=lost_id, lost_results=os.path.join(async_dir, lost_id), lost_log=str(tmp_path / "lost.apply.log"))
    os.makedirs(async_dir, exist_ok=True)
    with open(lost["lost_results"], "w", encoding="utf-8") as fh:
        json.dump({"started": True, "finished": False, "ansible_job_id": lost_id}, fh)
    proc = subprocess.Popen([e2e.PLAYBOOK_BIN, str(playbook), "-e", json.dumps(dict(lost, marker=marker, out=str(out)))],
                            cwd=str(tmp_path), env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    left = []
    try:
        killed = set()
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            for case in ("whole", "wrapper"):
                if case in killed:
                    continue
                sleeper, wrappers = _job_of("%s-%s" % (marker, case))
                if sleeper is None or len(wrappers) < 2:  # the module's wrapper and its supervisor
                    continue
                if case == "whole":  # the wrappers first: none is left to write the sleeper's end
                    _kill(wrappers + [sleeper])
                else:
                    _kill(wrappers[:1])  # the wrapper that runs the module: its child lives on
                    left.append(sleeper)
                killed.add(case)
            time.sleep(0.2)
        rc = proc.poll()  # None: still running at the deadline (a wait that never ends), killed below
    finally:
        if proc.poll() is None:
            e2e.kill_tree(proc.pid)
            proc.wait()
        _kill(left)
        log.close()
    text = (tmp_path / "run.log").read_text(encoding="utf-8")
    assert rc == 0, text[-4000:]
    assert killed == {"whole", "wrapper"}, text[-4000:]
    res = json.loads(out.read_text(encoding="utf-8"))

    assert res["ends"].get("failed") is not True and res["ends"]["rc"] == 0, res["ends"]
    assert res["ends"]["seconds"] >= 4                                # it waited for the job, through many looks
    for case in ("whole", "wrapper"):
        job, waited = res["%s_job" % case], res[case]
        assert waited["failed"] is True
        assert waited["msg"].startswith("%s: apply: the job %s is gone: its results file %s still says it is running, "
                                        "but no process of the job (async_wrapper) is alive."
                                        % (case, job["ansible_job_id"], job["results_file"])), waited["msg"]
        assert not os.path.exists(job["results_file"])                  # nothing left in the async dir
    # never seen, never begun: called lost once unseen_grace passed (not after the hour's timeout)
    assert res["lost"]["failed"] is True and res["lost"]["never_began"] is True, res["lost"]
    assert "lost: apply: the job %s is gone before its command started" % lost["lost_id"] in res["lost"]["msg"], res["lost"]
    assert os.listdir(async_dir) == []


def test_a_run_past_its_timeout_is_killed_with_everything_it_forked(tmp_path):
    """The suite's own harness (tests/support/e2e.py, ``run_to_end``): a run that outlives its
    timeout is killed whole, the processes it forked too (an ansible-playbook worker left
    waiting would otherwise sleep on after the test), and its output so far is kept."""
    marker = "csis-test-%s" % uuid.uuid4().hex[:12]
    script = "import os, sys, time\nprint('started', flush=True)\nif os.fork() == 0:\n    time.sleep(600)\ntime.sleep(600)\n"
    log = str(tmp_path / "run.log")
    with pytest.raises(subprocess.TimeoutExpired):
        e2e.run_to_end([sys.executable, "-c", script, marker], dict(os.environ), timeout=3, log=log)
    with open(log, encoding="utf-8") as fh:
        assert fh.read() == "started\n"
    deadline = time.monotonic() + 30
    while e2e.processes(lambda p: marker in p["argv"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not e2e.processes(lambda p: marker in p["argv"])
