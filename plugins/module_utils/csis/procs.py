# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The processes of this machine, read from ``/proc`` (Linux): the one reader the run lock, the
state lock's holder check and the async apply's wait share.

Plain Python: importable without Ansible. Where there is no ``/proc`` (a macOS controller),
:func:`available` is False and the callers say what they then cannot tell.
"""
from __future__ import annotations

import os
from typing import Iterator, List, Optional


def available() -> bool:
    """True where this machine's processes can be read (``/proc``)."""
    return os.path.isdir("/proc/self")


def stat_fields(pid: int) -> Optional[List[str]]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first, then the parent's
    pid), None when the process is gone or a zombie (dead, not yet reaped)."""
    try:
        with open("/proc/%d/stat" % pid, "r", encoding="utf-8", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if not fields or fields[0] in ("Z", "X") else fields


def argv_of(pid: int) -> List[str]:
    """The command line of ``pid`` ([] when it is gone, a zombie or not readable)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return [a.decode("utf-8", "replace") for a in handle.read().split(b"\0") if a]
    except OSError:
        return []


def pids() -> Iterator[int]:
    """Every process id of the machine (none where there is no ``/proc``), this process's too."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def live_argv(pid: int) -> List[str]:
    """The command line of ``pid`` when it is alive (not a zombie), else []."""
    argv = argv_of(pid)
    return argv if argv and stat_fields(pid) is not None else []
