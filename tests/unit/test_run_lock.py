# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The run lock (state/runlock.py) on the local backend, with real processes standing in
for ansible-playbook runs: a watcher process holds the lock while its run lives and
releases it when the run ends, even by SIGKILL."""
from __future__ import annotations

import getpass
import io
import os
import subprocess
import threading
import time
from typing import Any, List

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.state import backends, runlock


def _run() -> Any:
    """A process standing for one ansible-playbook run, and its controller description."""
    proc = subprocess.Popen(["sleep", "120"])
    return proc, runlock.controller(start=proc.pid)


def _wait_free(root: str, seconds: float = 10.0) -> bool:
    objects = runlock.open_objects(root)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if runlock.holder(objects) is None:
            return True
        time.sleep(0.1)
    return False


def test_playbooks_of_names_the_playbooks_and_never_the_extra_vars() -> None:
    argv = ["/venv/bin/ansible-playbook", "-e", "secret=hunter2.yml", "-i", "inv.yml", "playbooks/storage.yml",
            "--extra-vars=@vars.yml", "-v", "site.yml"]
    assert runlock.playbooks_of(argv) == ["playbooks/storage.yml", "site.yml"]


def test_controller_without_ansible_playbook_is_the_process_itself() -> None:
    proc, ctl = _run()
    try:
        assert ctl["pid"] == proc.pid and ctl["playbooks"] == []
        assert runlock.alive(ctl["pid"], ctl["start"])
    finally:
        proc.kill()
        proc.wait()
    assert not runlock.alive(ctl["pid"], ctl["start"])


def test_one_run_at_a_time_and_the_lock_ends_with_its_run(tmp_path: Any) -> None:
    root = str(tmp_path)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "_config.yml").write_text("config: {}\n", encoding="utf-8")
    first, ctl1 = _run()
    second, ctl2 = _run()
    try:
        got = runlock.acquire(root, timeout=5, what="storage run", ctl=ctl1)
        assert got["reentered"] is False and got["where"] == "meta-state/.run.lock"
        held = runlock.holder(runlock.open_objects(root))
        assert held and held["pid"] == first.pid and held["watcher_pid"] != os.getpid()

        # the same run again (site.yml's next lifecycle): re-entered, nothing new
        assert runlock.acquire(root, timeout=0, ctl=ctl1)["reentered"] is True

        # check mode (peek): nothing taken, no wait; another run's lock is named with what a real run would do
        t0 = time.monotonic()
        seen = runlock.peek(root, timeout=90, ctl=ctl2)
        assert time.monotonic() - t0 < 5 and seen["holder"]["pid"] == first.pid
        (notice,) = seen["notices"]
        assert notice.startswith("meta-state/.run.lock: check mode: this tree is held by pid %d" % first.pid), notice
        assert "a real run would wait up to 90 s for it (csis_run_lock_timeout), then fail naming it" in notice
        assert runlock.peek(root, ctl=ctl1) == {"where": "meta-state/.run.lock", "holder": None, "notices": [],
                                                "controller": runlock._public(ctl1)}

        # another run: waits, then one line naming the holder
        t0 = time.monotonic()
        with pytest.raises(runlock.RunLockBusy) as err:
            runlock.acquire(root, timeout=0.5, what="instance-image run", ctl=ctl2)
        assert time.monotonic() - t0 >= 0.5
        msg = str(err.value)
        assert "meta-state/.run.lock: this tree is held by pid %d" % first.pid in msg
        assert "storage run" in msg and "\n" not in msg
        assert "[user %s" % getpass.getuser() in msg, msg  # who holds it, as docs/operations.md quotes it

        # the first run dies without any release step (SIGKILL): its watcher frees the tree
        first.kill()
        first.wait()
        got2 = runlock.acquire(root, timeout=10, what="instance-image run", ctl=ctl2)
        assert got2["reentered"] is False
        assert runlock.holder(runlock.open_objects(root))["pid"] == second.pid

        # a third run asks while the second holds it: it waits until the second ends, then
        # holds the tree, and says how long it waited and for whom
        third, ctl3 = _run()
        ender = threading.Timer(1.5, second.kill)
        ender.start()
        got3 = runlock.acquire(root, timeout=30, what="storage run", ctl=ctl3)
        ender.join()
        assert got3["waited"] >= 1.5 and runlock.holder(runlock.open_objects(root))["pid"] == third.pid
        assert [n for n in got3["notices"] if "waited" in n and "pid %d" % second.pid in n], got3["notices"]
        third.kill()
        third.wait()
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert _wait_free(root), "the watcher kept the lock after its run ended"


def test_an_unwritable_store_is_an_error_not_a_wait(tmp_path: Any) -> None:
    root = str(tmp_path)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "_config.yml").write_text("config: {}\n", encoding="utf-8")
    os.makedirs(os.path.join(root, "meta-state"))
    os.mkdir(os.path.join(root, "meta-state", runlock.RUN_LOCK_NAME))  # a directory where the lock file belongs
    proc, ctl = _run()
    try:
        with pytest.raises(runlock.MetaStateError) as err:
            runlock.acquire(root, timeout=30, ctl=ctl)
        assert not isinstance(err.value, runlock.RunLockBusy)
        assert "meta-state/.run.lock" in str(err.value)
    finally:
        proc.kill()
        proc.wait()


def test_a_root_that_is_no_tree_is_refused_before_meta_state_is_created(tmp_path: Any) -> None:
    missing = str(tmp_path / "missing")
    with pytest.raises(runlock.MetaStateError, match="does not exist or is not a directory"):
        runlock.acquire(missing, timeout=0)
    with pytest.raises(runlock.MetaStateError, match="not a configuration tree: it has no cfg/_config.yml"):
        runlock.acquire(str(tmp_path), timeout=0)
    assert os.listdir(str(tmp_path)) == []


# --------------------------------------------------------------------------- holding the S3 run lock
class _Refused(Exception):
    """A botocore error as S3Objects reads it: the code in ``response``."""

    def __init__(self, code: str) -> None:
        super().__init__("An error occurred (%s) when calling the PutObject operation" % code)
        self.response = {"Error": {"Code": code}}


class _TimedOut(Exception):
    """A transport error: no answer, no response."""


class _Bucket:
    """An S3 client holding the one lock object: conditional puts as S3 answers them, and the
    errors queued in ``failures`` raised by the next puts instead."""

    def __init__(self) -> None:
        self.etag: Any = None
        self.body = b""
        self.failures: list = []
        self.puts = 0
        self.lose_answer = False

    def put_object(self, **kw: Any) -> Any:
        if self.failures:
            raise self.failures.pop(0)
        if (kw.get("IfNoneMatch") == "*" and self.etag is not None) or kw.get("IfMatch", self.etag) != self.etag:
            raise _Refused("PreconditionFailed")
        self.puts += 1
        self.etag, self.body = '"%d"' % self.puts, kw["Body"]
        if self.lose_answer:  # the put landed; its answer never came back
            self.lose_answer = False
            raise _TimedOut("Read timeout on endpoint URL")
        return {"ETag": self.etag}

    def get_object(self, **kw: Any) -> Any:
        del kw
        if self.etag is None:
            raise _Refused("NoSuchKey")
        return {"Body": io.BytesIO(self.body), "ETag": self.etag}


class _Clock:
    """Monotonic and wall time that move only when the watcher sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1.7e9 + self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _held(monkeypatch: Any) -> Any:
    """An S3 run lock (60 s life) taken on a fake bucket, on a fake clock."""
    clock, bucket = _Clock(), _Bucket()
    monkeypatch.setattr(backends, "time", clock)
    monkeypatch.delenv("CSIS_RUN_LOCK_TTL", raising=False)
    objects = backends.S3Objects({}, "b", "p", client=bucket)
    lock = runlock._lock(objects, 0, "storage run", {})
    assert isinstance(lock, backends.S3Lock) and lock.ttl == runlock.DEFAULT_TTL
    lock.acquire()
    return clock, bucket, lock


@pytest.mark.parametrize("failure", [_Refused("ServiceUnavailable"), _TimedOut("Read timeout on endpoint URL")])
def test_a_store_that_does_not_answer_once_keeps_the_run_lock(monkeypatch: Any, failure: Exception) -> None:
    """One refused renewal (a 5xx, a timeout) is no lost lock: the watcher renews it at the next
    poll and still holds the tree when the run ends (it gave it up at once, and the run went on
    without it)."""
    clock, bucket, lock = _held(monkeypatch)
    start = clock.now
    bucket.failures.append(failure)
    assert runlock._hold(lock, lambda: clock.now < start + 45, sleep=clock.sleep) is True
    assert bucket.puts == 2 and lock.etag == bucket.etag  # renewed at the poll after the failure
    assert lock.renewed == start + runlock.DEFAULT_TTL / 2 + runlock.POLL


def test_a_renewal_that_landed_though_its_answer_was_lost_keeps_the_lock(monkeypatch: Any) -> None:
    """A renewal times out after the store took it: the next one, sent with the old ETag, is
    refused as a conflict, and the object read back still names this holder: renewed, not lost."""
    clock, bucket, lock = _held(monkeypatch)
    start = clock.now
    bucket.lose_answer = True
    assert runlock._hold(lock, lambda: clock.now < start + 45, sleep=clock.sleep) is True
    assert bucket.puts == 2 and lock.etag == bucket.etag  # no put refused as lost; the landed one counts


def test_a_run_lock_broken_by_another_run_is_lost_at_once(monkeypatch: Any) -> None:
    clock, bucket, lock = _held(monkeypatch)
    start = clock.now
    bucket.etag, bucket.body = '"taken by another run"', b'{"owner": {"pid": 1, "host": "elsewhere"}}'
    why: List[str] = []
    assert runlock._hold(lock, lambda: clock.now < start + 600, sleep=clock.sleep, on_lost=why.append) is False
    assert why == ["another run broke it after it expired unrenewed"]  # what the run is told (runlock.lost)
    assert clock.now == start + runlock.DEFAULT_TTL / 2  # at its first renewal
    with pytest.raises(backends.LockLost) as err:
        lock.refresh()
    assert str(err.value) == ("s3://b/p/meta-state/.run.lock: this run's lock was broken by another run (it expired), "
                              "so nothing more is written")
    assert issubclass(backends.LockLost, backends.MetaStateError)  # a transaction's lock ends its transaction


def test_a_store_that_does_not_answer_for_the_locks_life_loses_it(monkeypatch: Any) -> None:
    """The watcher keeps trying while the object may still be this run's, and gives it up once its
    life ran out unrenewed (another run may have broken it since)."""
    clock, bucket, lock = _held(monkeypatch)
    start = clock.now
    bucket.failures.extend([_Refused("InternalError")] * 1000)
    why: List[str] = []
    assert runlock._hold(lock, lambda: clock.now < start + 600, sleep=clock.sleep, on_lost=why.append) is False
    assert len(why) == 1 and why[0].startswith("the store did not renew it within its life: ")
    assert clock.now == start + runlock.DEFAULT_TTL
    tries = 1000 - len(bucket.failures)
    assert tries == runlock.DEFAULT_TTL / 2 / runlock.POLL + 1 and bucket.puts == 1


def test_the_lost_word_stays_while_the_run_lives_and_goes_with_it(monkeypatch: Any, tmp_path: Any) -> None:
    """The watcher outlives a lost lock to keep its marker for the run's later steps, and removes it
    once the run ended (no temporary directory fills with them)."""
    monkeypatch.setattr(runlock.tempfile, "tempdir", str(tmp_path))
    ctl = {"pid": 4242, "start": "777"}
    runlock._mark_lost(ctl, "s3://b/p/meta-state/.run.lock", "another run broke it after it expired unrenewed")
    marker = runlock.lost_marker(ctl)
    seen: List[bool] = []
    lives = iter([True, True, False, False])

    def living() -> bool:
        seen.append(os.path.exists(marker))
        return next(lives)

    runlock._clear_lost_when_done(ctl, living, sleep=lambda _s: None)
    assert seen == [True, True, True, True]  # there while the run lived, read by its later steps
    assert not os.path.exists(marker) and runlock.lost(ctl) is None

    # a watcher stopped (SIGTERM) while its run still lives leaves the word for the run
    runlock._mark_lost(ctl, "s3://b/p/meta-state/.run.lock", "another run broke it after it expired unrenewed")

    def stopped(_seconds: float) -> None:
        raise SystemExit(0)

    with pytest.raises(SystemExit):
        runlock._clear_lost_when_done(ctl, lambda: True, sleep=stopped)
    assert runlock.lost(ctl) is not None


def test_a_lock_expires_by_the_stores_clock_when_it_tells_one() -> None:
    """The object's age by the store's clock against the life its holder wrote; the holder's
    ``expires_epoch`` against this machine's clock only when either is missing."""
    import datetime as dt

    put = dt.datetime(2026, 12, 6, 12, 0, 0, tzinfo=dt.timezone.utc)
    answer = {"LastModified": put, "ResponseMetadata": {"HTTPHeaders": {"date": "Sun, 06 Dec 2026 12:00:45 GMT"}}}
    assert backends.object_age(answer) == 45.0
    assert backends.object_age({"LastModified": put}) is None and backends.object_age({}) is None
    now = 1.8e9
    behind = {"ttl": 60, "expires_epoch": now - 3600}  # a holder whose clock is an hour behind
    ahead = {"ttl": 60, "expires_epoch": now + 3600}  # ... an hour ahead
    assert not backends.lock_expired(behind, 45.0, now) and backends.lock_expired(ahead, 61.0, now)
    assert not backends.lock_expired(ahead, 60.5, now)  # within the store clock's grain: not yet
    # a lock an older csis.infra wrote (no ttl), or an answer without the store's time: the holder's epoch
    assert backends.lock_expired({"expires_epoch": now - 1}, 5.0, now)
    assert not backends.lock_expired({"ttl": 60, "expires_epoch": now + 1}, None, now)
    assert backends.lock_expired({}, 5.0, now) and backends.lock_expired({"ttl": True, "expires_epoch": "x"}, 5.0, now)
    # numbers no holder writes raise nothing: a life that is none falls back to the epoch, an epoch that is none expires
    assert not backends.lock_expired({"ttl": 10 ** 400, "expires_epoch": now + 5}, 5.0, now)
    assert backends.lock_expired({"ttl": float("inf"), "expires_epoch": float("nan")}, 5.0, now)
    assert backends.lock_expired({"expires_epoch": 10 ** 400}, None, now)
    assert backends.lock_left(ahead, 45.0, now) == (16.0, True)
    assert backends.lock_left({"expires_epoch": now + 30}, None, now) == (30.0, False)
