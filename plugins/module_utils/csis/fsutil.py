# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Atomic file writes: the one implementation every writer of csis.infra uses
(meta-state, plan bindings, unmount receipts, the state report, rendered roots).

A write goes to a temporary file in the same directory, is flushed and fsynced, keeps
the mode of the file it replaces, is renamed over the target, and the directory is
fsynced: a reader sees the old file or the new one, never half of one, and a crash
leaves the old file.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Optional


def fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process umask, read without changing it when the OS allows (Linux /proc)."""
    try:
        with open("/proc/self/status", "r", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o022)  # fallback: briefly set, then restore
    os.umask(current)
    return current


def write_atomic(path: str, payload: bytes, mode: Optional[int] = None) -> None:
    """Replace ``path`` with ``payload`` atomically (see the module docstring)."""
    directory = os.path.dirname(path) or "."
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def user_cache(*parts: str) -> str:
    """``$XDG_CACHE_HOME/csis.infra/<parts>`` (``~/.cache`` without it): where readers keep
    derived data (meta-state's reader cache, the configuration parse cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "csis.infra", *parts)


def read_json(path: str) -> Any:
    """The JSON document at ``path``, or None when there is no such file. Other read errors
    (``OSError``) and bad JSON (``ValueError``) are the caller's to name."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def write_json_atomic(path: str, data: Any) -> None:
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))
