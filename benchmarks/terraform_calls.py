#!/usr/bin/env python
# -*- coding: utf-8 -*-
"""Every terraform command a run starts, and its CPU: how much of a run is terraform's own.

Runs COMMAND with a ``terraform`` of this script's own first on ``PATH`` (in a temporary
directory), which runs the real one (the first ``terraform`` on ``PATH`` before it), passes
stdin, stdout, stderr, the exit code and SIGINT/SIGTERM/SIGHUP through (csis-tf-supervise's
one SIGINT must reach terraform), and records each command's subcommand, wall time and CPU
(user and system, terraform's and its providers': ``wait4`` of the real terraform). Then it
prints, per subcommand: calls, CPU, CPU per call, and the share of COMMAND's whole CPU (all its
processes that were waited for: the detached async applies are counted by the wrapper, not in
COMMAND's total, so the share can pass 100 % on a run made of applies).

The wrapper is a Python start per terraform command (about 30 ms of CPU, not counted in the
table). COMMAND runs as given: a test file, the suite, a playbook, ``scripts/demo``:

    .venv/bin/python benchmarks/terraform_calls.py -- .venv/bin/python -m pytest -q tests/integration/test_lifecycle_ebs_e2e.py
    .venv/bin/python benchmarks/terraform_calls.py --log /tmp/calls.jsonl -- scripts/demo

No thresholds. See benchmarks/README.md ("The suite's terraform, command by command").
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

# The wrapper: a file of its own, run with this Python. It appends one JSON line per command
# (O_APPEND: a line this short is written whole even when commands run at once).
WRAPPER = r'''#!%(python)s
import json, os, signal, subprocess, sys, time
real, log = os.environ["CSIS_BENCH_REAL_TERRAFORM"], os.environ["CSIS_BENCH_TERRAFORM_LOG"]
t0 = time.monotonic()
proc = subprocess.Popen([real] + sys.argv[1:])
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
while True:
    try:
        _pid, status, usage = os.wait4(proc.pid, 0)
        break
    except InterruptedError:
        continue
rc = os.waitstatus_to_exitcode(status)
sub = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
line = json.dumps({"sub": sub, "wall": time.monotonic() - t0, "user": usage.ru_utime, "sys": usage.ru_stime,
                   "minflt": usage.ru_minflt, "rc": rc, "cwd": os.getcwd(),
                   # the options by name only and no name=value argument (``-var x=y``: a value could be a
                   # secret), the other arguments (the subcommand, a plan file) as given
                   "args": [a.split("=", 1)[0] if a.startswith("-") else "<value>" if "=" in a else a
                            for a in sys.argv[1:]]}) + "\n"
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
try:
    os.write(fd, line.encode())
finally:
    os.close(fd)
sys.exit(rc if rc >= 0 else 128 - rc)
'''


def table(calls: List[Dict], total_cpu: float) -> str:
    by: Dict[str, Dict[str, float]] = {}
    for c in calls:
        e = by.setdefault(c["sub"] or "(none)", {"calls": 0, "cpu": 0.0, "sys": 0.0})
        e["calls"] += 1
        e["cpu"] += c["user"] + c["sys"]
        e["sys"] += c["sys"]
    tf_cpu = sum(e["cpu"] for e in by.values())
    lines = ["| terraform command | calls | CPU (s) | of which system | CPU per call | share of the run's CPU |",
             "|---|---:|---:|---:|---:|---:|"]
    for sub, e in sorted(by.items(), key=lambda kv: -kv[1]["cpu"]):
        lines.append("| `%s` | %d | %.1f | %.1f | %.2f | %.0f %% |" % (
            sub, e["calls"], e["cpu"], e["sys"], e["cpu"] / e["calls"], 100.0 * e["cpu"] / total_cpu if total_cpu else 0))
    lines.append("| all | %d | %.1f | %.1f | | %.0f %% |" % (
        len(calls), tf_cpu, sum(e["sys"] for e in by.values()), 100.0 * tf_cpu / total_cpu if total_cpu else 0))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--log", help="keep the per-command JSON lines in this file (default: a temporary one)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no COMMAND given (put it after --)")
    real = shutil.which("terraform")
    if not real:
        ap.error("no terraform on PATH")
    work = tempfile.mkdtemp(prefix="csis-tf-calls.")
    try:
        wrapper = os.path.join(work, "terraform")
        with open(wrapper, "w", encoding="utf-8") as fh:
            fh.write(WRAPPER % {"python": sys.executable})
        os.chmod(wrapper, stat.S_IRWXU)
        log = os.path.abspath(args.log) if args.log else os.path.join(work, "calls.jsonl")
        if os.path.exists(log):
            os.unlink(log)
        env = dict(os.environ, PATH=work + os.pathsep + os.environ.get("PATH", ""),
                   CSIS_BENCH_REAL_TERRAFORM=os.path.realpath(real), CSIS_BENCH_TERRAFORM_LOG=log)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        rc = subprocess.call(command, env=env)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        calls = []
        if os.path.exists(log):
            with open(log, encoding="utf-8") as fh:
                calls = [json.loads(line) for line in fh if line.strip()]
        print()
        print("COMMAND: exit %d, %.0f s of wall, %.0f s of CPU (its processes that were waited for)" % (rc, wall, total))
        if calls:
            print(table(calls, total))
        else:
            print("no terraform command ran")
        if args.log:
            print("per command: %s" % log)
        return rc
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
