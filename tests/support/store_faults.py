# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A meta-state commit held in the middle, for the tests of lock-free readers (local and S3)."""
from __future__ import annotations

import threading
from typing import Any, Dict, Tuple


def paused_commit(ms: Any, data: Dict[str, Any], after: int,
                  name: str = "launch-params.yaml") -> Tuple[threading.Thread, threading.Event]:
    """Start a thread whose transaction saves ``data`` as ``name`` and stops its commit after
    ``after`` record deletions, between the commit's marker and its next revision, until the
    returned event is set. Returns once it stopped: ``(thread, go)``."""
    mid, go = threading.Event(), threading.Event()
    real_delete, done = ms.objects.delete, []

    def delete(rel: str, expect: Any = None) -> None:
        real_delete(rel, expect)
        done.append(rel)
        if len(done) == after:
            mid.set()
            if not go.wait(60):
                raise RuntimeError("the paused commit was never let go")

    ms.objects.delete = delete

    def write() -> None:
        with ms.transaction("paused writer") as txn:
            txn.save(name, data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    if not mid.wait(60):
        go.set()
        raise RuntimeError("the commit never reached its %d-th deletion" % after)
    return thread, go


def ends_before_lock_check(reader: Any, thread: threading.Thread, go: threading.Event) -> list:
    """Make ``reader``'s first look at the lock let the paused commit (``thread``, ``go`` from
    :func:`paused_commit`) end first: the reader read inside the commit, and the writer has
    written its next revision and released its lock by the time the reader asks. Returns a list
    that holds one item once that happened (the reader did fall inside the commit)."""
    real_held, looked = reader.objects.lock_held, []

    def lock_held(*args: Any) -> bool:
        if not looked:
            looked.append(True)
            go.set()
            thread.join(60)
        return real_held(*args)

    reader.objects.lock_held = lock_held
    return looked
