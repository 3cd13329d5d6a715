#!/usr/bin/env python
# -*- coding: utf-8 -*-
"""The CPU a command's processes used, by program: terraform's, the provider's, Ansible's, Python's.

Runs COMMAND under Linux process accounting (``acct(2)``): the kernel writes one record per
process that exits, with its command name (the first 15 characters), user and system CPU and
minor page faults. This script switches accounting on into a temporary file, runs COMMAND, switches
it off, and prints the records per command name: CPU (user + system), the system share, the number
of processes and their minor page faults; then the processes that used the most.

Every process of the machine that exits meanwhile is counted, not only COMMAND's: run it on a quiet
machine. Needs the privilege to switch accounting on (root, CAP_SYS_PACCT); the detached async
applies a playbook starts are counted (they exit before COMMAND does, or are waited for). A process
still running when COMMAND ends (a server it started and left) is not.

    .venv/bin/python benchmarks/cpu_by_process.py -- .venv/bin/ansible-playbook playbooks/site.yml -e ...
    .venv/bin/python benchmarks/cpu_by_process.py --top 5 -- .venv/bin/python -m pytest -q tests/integration/test_day2_storage.py

No thresholds. See benchmarks/README.md ("Session 31: the CPU by program").
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

#: struct acct_v3 (linux/acct.h): 64 bytes
RECORD = 64
HEAD = struct.Struct("<BBHIIIIIIf")        # flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime
TIMES = struct.Struct("<HHHHHHHH")         # utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t)


def comp(value: int) -> int:
    """A ``comp_t``: 13-bit mantissa, 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def records(data: bytes) -> List[Tuple[str, float, float, int, int, int, float]]:
    """(command, user s, system s, minor faults, pid, ppid, elapsed s) of every v3 record."""
    hz = float(os.sysconf("SC_CLK_TCK"))
    out = []
    for i in range(0, len(data) - RECORD + 1, RECORD):
        rec = data[i:i + RECORD]
        _flag, version, _tty, _code, _uid, _gid, pid, ppid, _btime, etime = HEAD.unpack_from(rec, 0)
        if version & 0x0F != 3:
            raise SystemExit("cpu_by_process: record %d is acct version %d, not 3" % (i // RECORD, version & 0x0F))
        utime, stime, _mem, _io, _rw, minflt, _majflt, _swaps = TIMES.unpack_from(rec, 32)
        comm = rec[48:64].split(b"\0", 1)[0].decode("utf-8", "replace")
        out.append((comm, comp(utime) / hz, comp(stime) / hz, comp(minflt), pid, ppid, etime / hz))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=10, help="list this many single processes, most CPU first")
    ap.add_argument("--json", help="also write the per-program table to this file")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command (benchmarks/cpu_by_process.py -- COMMAND ...)")
    libc = ctypes.CDLL(None, use_errno=True)
    fd, path = tempfile.mkstemp(prefix="csis-acct.")
    os.close(fd)
    try:
        if libc.acct(path.encode()) != 0:
            err = ctypes.get_errno()
            raise SystemExit("cpu_by_process: cannot switch process accounting on: %s (root or CAP_SYS_PACCT "
                             "is needed)" % os.strerror(err))
        try:
            rc = subprocess.call(command)
        finally:
            libc.acct(None)
        with open(path, "rb") as fh:
            recs = records(fh.read())
    finally:
        os.unlink(path)
    table: Dict[str, List[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0, 0])
    for comm, user, system, minflt, _pid, _ppid, _elapsed in recs:
        row = table[comm]
        row[0] += user
        row[1] += system
        row[2] += 1
        row[3] += minflt
    total = sum(r[0] + r[1] for r in table.values())
    print("== %d processes, %.1f s of CPU (user + system), by program (the first 15 characters of its name):"
          % (len(recs), total), file=sys.stderr)
    print("%-16s %9s %7s %6s %8s %12s" % ("program", "CPU (s)", "share", "sys", "procs", "minor faults"),
          file=sys.stderr)
    for comm, (user, system, count, minflt) in sorted(table.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        cpu = user + system
        if cpu < 0.005 and count < 5:
            continue
        share = 100.0 * cpu / total if total else 0.0
        sys_share = 100.0 * system / cpu if cpu else 0.0
        print("%-16s %9.2f %6.1f%% %5.0f%% %8d %12d" % (comm, cpu, share, sys_share, count, minflt), file=sys.stderr)
    if args.top:
        print("== the %d processes that used the most CPU:" % args.top, file=sys.stderr)
        for comm, user, system, minflt, pid, ppid, elapsed in sorted(recs, key=lambda r: -(r[1] + r[2]))[:args.top]:
            print("%-16s %7.2f s  pid %-7d ppid %-7d ran %.1f s, %d minor faults"
                  % (comm, user + system, pid, ppid, elapsed, minflt), file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({comm: {"user": r[0], "system": r[1], "processes": r[2], "minor_faults": r[3]}
                       for comm, r in table.items()}, fh, indent=1, sort_keys=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
