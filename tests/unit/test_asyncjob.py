# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""module_utils/csis/apply/asyncjob.py: how csis_apply_wait tells a killed async job from a
running one. The processes here are real (a Python that sleeps, with an ``async_wrapper``-like
command line); tests/integration/test_apply_wait_dead_job.py kills real Ansible async jobs."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis import procs
from ansible_collections.csis.infra.plugins.module_utils.csis.apply import asyncjob

pytestmark = pytest.mark.skipif(not procs.available(), reason="needs /proc")


def _fake_wrapper(tag: str) -> subprocess.Popen:
    """A process whose command line reads as async_wrapper's of the job tagged ``tag``."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "/tmp/x/async_wrapper.py", tag,
                             "3600", "/tmp/x/AnsiballZ_command.py", "_"])


def _tag() -> str:
    return "j%d" % (uuid.uuid4().int % 10 ** 12)


def test_the_tag_is_the_job_id_before_its_pid():
    assert asyncjob.job_tag("j123456789012.4242") == "j123456789012"
    assert asyncjob.job_tag("123456789012.7") == "123456789012"  # older ansible-core: no "j"
    assert asyncjob.job_tag("j1") == "j1"


def test_a_job_process_is_an_async_wrapper_followed_by_the_tag():
    argv = ["/venv/bin/python", "/home/u/.ansible/tmp/ansible-tmp-1/async_wrapper.py", "j42", "100",
            "/home/u/.ansible/tmp/ansible-tmp-1/AnsiballZ_command.py", "_"]
    assert asyncjob.is_job_process(argv, "j42")
    assert not asyncjob.is_job_process(argv, "j4")                    # another job
    assert not asyncjob.is_job_process(["python", "other.py", "j42"], "j42")
    assert not asyncjob.is_job_process([], "j42")
    assert asyncjob.is_job_process(["python", "AnsiballZ_async_wrapper.py", "j42"], "j42")


def test_results_file(tmp_path):
    path = str(tmp_path / "j1.1")
    assert asyncjob.read_results(path) is None and not asyncjob.finished(None)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{"started": true, "fini')                          # never seen (renamed into place), still: not read
    assert asyncjob.read_results(path) is None
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"started": True, "finished": False, "ansible_job_id": "j1.1"}, fh)
    assert not asyncjob.finished(asyncjob.read_results(path))
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"rc": 0, "changed": True}, fh)
    assert asyncjob.finished(asyncjob.read_results(path))
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"msg": "Timeout exceeded", "failed": True, "child_pid": 7}, fh)  # async_wrapper's own end
    assert asyncjob.finished(asyncjob.read_results(path))


def test_a_watch_sees_the_job_then_its_death():
    tag = _tag()
    proc = _fake_wrapper(tag)
    try:
        watch = asyncjob.JobWatch("%s.%d" % (tag, proc.pid))
        deadline = time.monotonic() + 30
        while watch.alive() is not True and time.monotonic() < deadline:  # the exec may not have happened yet
            time.sleep(0.05)
        assert watch.pids == [proc.pid]
        assert watch.alive() is True
    finally:
        proc.kill()
    # killed, not yet reaped (a zombie, as async_wrapper's module child is until its supervisor
    # reaps it): already dead for the watch
    deadline = time.monotonic() + 30
    while watch.alive() is not False and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watch.alive() is False and watch.pids == []
    proc.wait()
    assert watch.alive() is False


def test_a_job_never_seen_is_not_called_gone():
    """No process of the job found at the first look (too late, or an async_wrapper whose command
    line reads otherwise): "cannot tell", never "gone"."""
    watch = asyncjob.JobWatch("%s.1" % _tag())
    assert watch.alive() is None and watch.alive() is None


def test_a_reused_pid_does_not_keep_a_dead_job_alive():
    tag = _tag()
    proc = _fake_wrapper(tag)
    watch = asyncjob.JobWatch("%s.1" % tag)
    deadline = time.monotonic() + 30
    while watch.alive() is not True and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch.pids = [other.pid]          # as if the kernel gave the dead job's pid to another command
        assert watch.alive() is False
    finally:
        other.kill()
        other.wait()


def test_the_message_names_the_job_its_file_and_the_log():
    msg = asyncjob.gone_message("storage-aws-ebs: apply", "j1.2", "/h/.ansible_async/j1.2", {"started": True},
                                "/t/root/.apply.log")
    assert msg.startswith("storage-aws-ebs: apply: the job j1.2 is gone: its results file /h/.ansible_async/j1.2 "
                          "still says it is running, but no process of the job (async_wrapper) is alive.")
    assert "Its output so far: /t/root/.apply.log." in msg
    assert "is missing or unreadable" in asyncjob.gone_message("x", "j1.2", "/f", None)


def test_a_job_whose_command_never_wrote_its_log_never_began(tmp_path):
    """async_wrapper writes "started", then starts the module (ansible-core issue 87387: under load
    its worker can die between the two): a log the command truncates when it starts that is
    missing, or older than the results file, says the command never ran."""
    import os

    results, log = tmp_path / "j1.2", tmp_path / ".apply.log"
    log.write_text("an earlier apply\n", encoding="utf-8")
    results.write_text('{"started": true}', encoding="utf-8")
    os.utime(str(log), ns=(1_000_000_000, 1_000_000_000))
    assert asyncjob.never_began(str(results), str(log)) is True          # the last apply's log
    os.utime(str(log), None)
    os.utime(str(results), ns=(1_000_000_000, 1_000_000_000))
    assert asyncjob.never_began(str(results), str(log)) is False         # written since: it began
    log.unlink()
    assert asyncjob.never_began(str(results), str(log)) is True          # no log at all
    assert asyncjob.never_began(str(results), "") is False               # no log named: cannot tell
    assert asyncjob.never_began(str(tmp_path / "missing"), str(log)) is False
    msg = asyncjob.gone_message("storage-aws-ebs: apply", "j1.2", str(results), {"started": True}, str(log), began=False)
    assert msg.startswith("storage-aws-ebs: apply: the job j1.2 is gone before its command started: its results file "
                          "%s says it started, but no process of the job (async_wrapper) is alive and %s was not "
                          "written since. Nothing was applied and nothing was recorded: run again." % (results, log))
    assert "ansible-core issue 87387" in msg


def test_a_job_never_seen_whose_command_never_began_is_lost_after_the_grace(tmp_path):
    """A wait whose first look came after every process of the job had gone (ansible-core issue
    87387 on a controller loaded to its limit) never sees one: the job is called lost once its
    command has still not written its log ``grace`` seconds after "started"; never sooner, never
    when the log was written since (a job whose command line reads otherwise, running), never
    without a log, and never once a process of the job was seen (then alive() decides)."""
    import os

    results, log = tmp_path / "j1.2", tmp_path / ".apply.log"
    results.write_text('{"started": true}', encoding="utf-8")
    started = os.stat(str(results)).st_mtime
    assert asyncjob.unseen_and_never_began(str(results), str(log), 30, now=started + 29) is False  # within the grace
    assert asyncjob.unseen_and_never_began(str(results), str(log), 30, now=started + 31) is True
    assert asyncjob.unseen_and_never_began(str(results), "", 30, now=started + 3600) is False      # no log named
    assert asyncjob.unseen_and_never_began(str(tmp_path / "gone"), str(log), 30, now=started + 3600) is False
    log.write_text("terraform apply ...\n", encoding="utf-8")
    os.utime(str(log), (started + 1, started + 1))
    assert asyncjob.unseen_and_never_began(str(results), str(log), 30, now=started + 3600) is False  # it began
    watch = asyncjob.JobWatch("%s.1" % _tag())
    assert watch.alive() is None and watch.unseen() is True
    watch.seen = True  # a process of the job was seen once: gone or not is alive()'s to say
    assert watch.unseen() is False
