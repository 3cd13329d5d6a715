# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""An Ansible async job on this machine, as ``csis_apply_wait`` watches it: its results file and
whether any of its processes is still alive.

Ansible's ``async_wrapper`` writes ``{"started": ...}`` to the job's results file, runs the module
in a child of its own, writes the module's result over that file and exits; a supervising
``async_wrapper`` process waits beside it. Both show the job id's first part as an argument
(``async_wrapper.py j123456789012 <limit> <module> _``; the job id is ``j123456789012.<pid>``).
When the results file still says "started" and neither process lives, the job was killed
(``kill -9``, the kernel's OOM killer) before it could write a result: nothing will ever write
one, and waiting on is waiting for nothing.

A wait whose first look comes after the job's processes are already gone (ansible-core issue
87387: ``async_wrapper`` loses its worker within seconds on a controller loaded to its limit,
and on such a controller the wait's task may start later than that) never sees one of them:
:meth:`JobWatch.unseen` then says so, and :func:`unseen_and_never_began` calls the job lost
once its command has still not begun :data:`UNSEEN_GRACE` seconds after "started".

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional

from .. import procs

WRAPPER = "async_wrapper"
#: seconds after "started" that a job none of whose processes was ever seen may take to begin its
#: command (the supervisor's first write of its log) before it is called lost; a module starts in
#: a second or two, on a controller loaded to its limit in well under this
UNSEEN_GRACE = 30.0


def read_results(path: str) -> Optional[Dict[str, Any]]:
    """The job's results file, None while it holds nothing readable yet (or is missing).
    ``async_wrapper`` writes it whole and renames it into place: a reader never sees half."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def finished(data: Optional[Dict[str, Any]]) -> bool:
    """True when ``data`` (:func:`read_results`) is the job's result: the module's, or
    ``async_wrapper``'s own failure (its time limit, a module that could not start)."""
    return data is not None and "started" not in data


def job_tag(job_id: str) -> str:
    """The part of the job id ``async_wrapper``'s command line shows (before the last dot)."""
    return job_id.rsplit(".", 1)[0] if "." in job_id else job_id


def is_job_process(argv: List[str], tag: str) -> bool:
    """True when ``argv`` is an ``async_wrapper`` of the job tagged ``tag``."""
    for i, arg in enumerate(argv[:-1]):
        if WRAPPER in os.path.basename(arg) and argv[i + 1] == tag:
            return True
    return False


class JobWatch:
    """Whether the processes of one async job live. A look reads every process of the machine
    until it has found the job's; the next ones re-read only those (a pid reused since by another
    command no longer matches), and the whole machine again before calling the job gone.

    A job is called gone only after one of its processes was seen: where none ever shows (the
    first look comes too late, or an ``async_wrapper`` whose command line reads otherwise),
    :meth:`alive` says None, "cannot tell", and never False."""

    def __init__(self, job_id: str) -> None:
        self.tag = job_tag(job_id)
        self.pids: List[int] = []
        self.seen = False

    def _scan(self) -> List[int]:
        return [pid for pid in procs.pids() if is_job_process(procs.live_argv(pid), self.tag)]

    def alive(self) -> Optional[bool]:
        """True while a process of the job lives; False when none does any more; None when this
        cannot be told (no ``/proc``, or no process of the job ever seen)."""
        if not procs.available():
            return None
        self.pids = [pid for pid in self.pids if is_job_process(procs.live_argv(pid), self.tag)]
        if not self.pids:
            self.pids = self._scan()
        if self.pids:
            self.seen = True
            return True
        return False if self.seen else None

    def unseen(self) -> bool:
        """True when this machine's processes can be read and none of the job's was ever seen
        (every look found none): the job was gone before the first look, or its command line
        reads otherwise (then its command writes its log, and :func:`unseen_and_never_began`
        stays False)."""
        return procs.available() and not self.seen


def never_began(results_file: str, log: str) -> bool:
    """True when the job's command never wrote ``log`` (its own output file, which it truncates when
    it starts: csis-tf-supervise's ``.apply.log``) since ``async_wrapper`` wrote the results file's
    "started", just before it starts the module: the log is missing, or older than that file.
    False when that cannot be told (no log named, no results file)."""
    if not log:
        return False
    try:
        started = os.stat(results_file).st_mtime_ns
    except OSError:
        return False
    try:
        return os.stat(log).st_mtime_ns < started
    except FileNotFoundError:
        return True
    except OSError:
        return False


def unseen_and_never_began(results_file: str, log: str, grace: float = UNSEEN_GRACE,
                           now: Optional[float] = None) -> bool:
    """For a job none of whose processes a wait ever saw (:meth:`JobWatch.unseen`): True when
    its command has still not begun (:func:`never_began`: ``log`` not written since "started")
    ``grace`` seconds after ``async_wrapper`` wrote "started". Never True without a ``log``."""
    if not log or not never_began(results_file, log):
        return False
    try:
        started = os.stat(results_file).st_mtime
    except OSError:
        return False
    return (time.time() if now is None else now) - started >= grace


def gone_message(label: str, job_id: str, results_file: str, data: Optional[Dict[str, Any]],
                 log: str = "", began: bool = True) -> str:
    """What ``csis_apply_wait`` says of a job that no process of which lives any more. ``began``
    False (:func:`never_began`): the command never started, so nothing was done."""
    if not began:
        return ("%s: the job %s is gone before its command started: its results file %s says it started, but no "
                "process of the job (%s) is alive and %s was not written since. Nothing was applied and nothing was "
                "recorded: run again. Ansible's %s loses its worker this way when the job takes more than 2.5 s to "
                "start (a loaded controller; ansible-core issue 87387), or when it is killed before the module starts."
                % (label, job_id, results_file, WRAPPER, log, WRAPPER))
    said = "still says it is running" if data is not None else "is missing or unreadable"
    follow = " Its output so far: %s." % log if log else ""
    return ("%s: the job %s is gone: its results file %s %s, but no process of the job (%s) is alive. It was "
            "killed (kill -9, the kernel's OOM killer) before it could write a result, and nothing will write one "
            "now. Nothing was recorded. A terraform it started gets one SIGINT from its supervisor once the module above "
            "it or this run's ansible-playbook is gone (when this run ends, at the latest), and the next run checks the "
            "root's state lock before it plans.%s"
            % (label, job_id, results_file, said, WRAPPER, follow))
