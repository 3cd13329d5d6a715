# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The run lock: one lifecycle run per configuration tree at a time, render to record.

Two runs on one tree at once collide long before meta-state does: the second run's render
rewrites the roots the first one planned, its plan binding deletes the first run's gated
plan file, and terraform's state lock refuses one of them with a raw 412. The meta-state
transaction lock (``meta-state/.lock``) only covers a commit. The run lock covers the run.

* It lives in the meta-state store, beside the transaction lock: ``meta-state/.run.lock``
  (local backend: an exclusive ``flock``) or ``<prefix>/meta-state/.run.lock`` in the S3
  bucket (an object created with ``If-None-Match: *`` that expires unless renewed,
  ``CSIS_RUN_LOCK_TTL``, 60 s by default), so AWX execution nodes that share only the
  cloud exclude each other too.
* Its holder is a small watcher process that :func:`acquire` forks (detached, in a
  session of its own, with no open file of the caller's): it takes the lock, reports back,
  and then holds it for as long as the ``ansible-playbook`` process that started the run
  lives. Whether that run ends normally, fails, or is killed (SIGKILL included), the watcher
  sees it gone within :data:`POLL` seconds and releases the lock. No step of the playbooks
  has to release it, and a killed run cannot leave it behind: a dead watcher's ``flock`` is
  dropped by the kernel, and its S3 object expires.
* Re-entrant per run: ``site.yml`` runs three lifecycles under one ``ansible-playbook``; the
  second and third find the lock held by their own controller and go on.
* A second run waits up to ``timeout`` (``csis_run_lock_timeout``, :data:`DEFAULT_TIMEOUT`)
  and then fails with one line naming the holder: its ``ansible-playbook`` pid and host,
  since when, the playbooks it runs, its user and AWX job.

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from .. import clock, fsutil, procs
from .backends import (FileLock, LocalObjects, LockBusy, LockLost, MetaStateError, S3Lock, holder_text, lock_body,
                       lock_expired, open_objects, require_tree)

RUN_LOCK_NAME = ".run.lock"
#: seconds a second run waits for the tree (``csis_run_lock_timeout``)
DEFAULT_TIMEOUT = 90.0
#: how long the S3 run lock lives unless renewed (the watcher renews it at half its life)
DEFAULT_TTL = 60.0
#: how often the watcher looks whether the run is still there, seconds
POLL = 0.5
BUSY = "another csis.infra run is working on this tree (render to record)"
SUBJECT = "this tree is held"
KNOB = "csis_run_lock_timeout"


class RunLockBusy(LockBusy):
    """Another run holds the tree (the message names it)."""


# --------------------------------------------------------------------------- the run's process
def _is_playbook(argv: List[str]) -> bool:
    return any(os.path.basename(a).startswith("ansible-playbook") for a in argv[:2])


def playbooks_of(argv: List[str]) -> List[str]:
    """The playbook arguments of an ``ansible-playbook`` command line (never its extra vars,
    which may hold secrets): the ``*.yml``/``*.yaml`` arguments that follow no option."""
    out: List[str] = []
    skip = False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            skip = "=" not in arg and arg not in ("--check", "-C", "--diff", "-D", "-v", "-vv", "-vvv", "-vvvv",
                                                  "--syntax-check", "--list-tasks", "--list-hosts", "--step",
                                                  "--flush-cache", "--force-handlers")
            continue
        if arg.endswith((".yml", ".yaml")):
            out.append(arg)
    return out


def controller(start: Optional[int] = None) -> Dict[str, Any]:
    """The process whose life bounds the run: walking up from ``start`` (default: our parent),
    the last ``ansible-playbook`` of the first row of them (Ansible's worker, forked from the
    controller, shows the controller's command line too). Without one among the ancestors
    (the module run by ``ansible`` ad hoc, or by a test): the parent itself.
    ``{pid, start, playbooks}`` (``start``: the kernel's start time, so a reused pid is told apart)."""
    pid = os.getppid() if start is None else start
    chain = []
    while pid > 1:
        fields = procs.stat_fields(pid)
        if fields is None:
            break
        argv = procs.argv_of(pid)
        chain.append((pid, fields[19], argv, _is_playbook(argv)))
        pid = int(fields[1])
    if not chain:
        raise MetaStateError("the run lock cannot find the process of this run (no /proc entry for pid %d)"
                             % (os.getppid() if start is None else start))
    pick = chain[0]
    seen = False
    for entry in chain:
        if entry[3]:
            pick, seen = entry, True
        elif seen:
            break
    return {"pid": pick[0], "start": pick[1], "playbooks": playbooks_of(pick[2]) if pick[3] else []}


def controller_info() -> Dict[str, Any]:
    """:func:`controller` as :func:`acquire` returns it."""
    return _public(controller())


def alive(pid: int, start: str) -> bool:
    fields = procs.stat_fields(pid)
    return fields is not None and fields[19] == start


# --------------------------------------------------------------------------- the lock
def _ttl() -> float:
    try:
        value = float(os.environ.get("CSIS_RUN_LOCK_TTL") or 0)
    except ValueError:
        value = 0.0
    return value if value > 0 else DEFAULT_TTL


def _lock(objects: Any, timeout: float, what: str, extra: Dict[str, Any]) -> Any:
    if isinstance(objects, LocalObjects):
        objects.ensure()
        return FileLock(objects.dir, timeout, what, poll=0.2, name=RUN_LOCK_NAME, extra=extra, busy=BUSY,
                        subject=SUBJECT)
    return S3Lock(objects, timeout, what, _ttl(), name=RUN_LOCK_NAME, extra=extra, busy=BUSY, subject=SUBJECT,
                  knob=KNOB)


def holder(objects: Any) -> Optional[Dict[str, Any]]:
    """The description of the run that holds the tree now, None when nobody does."""
    if isinstance(objects, LocalObjects):
        if not objects.lock_held(RUN_LOCK_NAME):
            return None
        return lock_body(objects.get(RUN_LOCK_NAME)[0] or b"")
    raw, _etag, age = objects.get_with_age(RUN_LOCK_NAME)
    if raw is None:
        return None
    info = lock_body(raw)
    if lock_expired(info, age):  # by the store's clock (what acquire then breaks)
        return None
    owner = info.get("owner")
    return dict(owner, since=info.get("created")) if isinstance(owner, dict) else {}


def _same_run(info: Optional[Dict[str, Any]], ctl: Dict[str, Any]) -> bool:
    import socket  # pylint: disable=import-outside-toplevel

    return bool(info) and str(info.get("pid")) == str(ctl["pid"]) and info.get("controller_start") == ctl["start"] \
        and info.get("host") == socket.gethostname()


def acquire(config_root: str, timeout: float = DEFAULT_TIMEOUT, what: str = "csis.infra run",
            csis_run_id: str = "", ctl: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Take the run lock of the tree at ``config_root`` for the run ``ctl`` (default:
    :func:`controller`), or find it already held by that run. Returns ``{where, reentered,
    holder, notices, controller, waited}`` (``waited``: seconds until it held the tree);
    raises :class:`RunLockBusy` naming the holder after ``timeout`` seconds,
    :class:`MetaStateError` when the store cannot be reached or written."""
    require_tree(config_root)
    objects = open_objects(config_root)
    ctl = ctl or controller()
    check_held(ctl)  # a run whose lock was lost takes the tree for no further lifecycle
    where = objects.label(RUN_LOCK_NAME)
    current = holder(objects)
    if _same_run(current, ctl):
        return {"where": where, "reentered": True, "holder": current, "notices": [], "controller": _public(ctl)}
    extra = {"pid": ctl["pid"], "controller_start": ctl["start"], "playbooks": ctl.get("playbooks") or [],
             "csis_run_id": csis_run_id}
    if extra["playbooks"]:
        what = "%s: %s" % (what, " ".join(extra["playbooks"]))
    started = time.monotonic()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the watcher's side (it reports through the pipe)
        _watch(objects, ctl, timeout, what, extra, read_end, write_end)
    os.close(write_end)
    os.waitpid(child, 0)
    chunks = []
    while True:
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    try:
        answer = json.loads(b"".join(chunks).decode("utf-8") or "{}")
    except (ValueError, UnicodeDecodeError):
        answer = {}
    if answer.get("busy"):
        raise RunLockBusy(answer["busy"])
    if answer.get("error"):
        raise MetaStateError(answer["error"])
    if not answer.get("ok"):
        raise MetaStateError("%s: the process that holds the run lock did not start" % where)
    notices = list(answer.get("notices") or [])
    waited = time.monotonic() - started
    if current is not None and waited >= 1.0:  # another run held the tree when this one asked
        notices.append("%s: waited %.0f s for the run that held this tree (%s) to end"
                       % (where, waited, holder_text(current, extra=False)))
    return {"where": where, "reentered": False, "holder": answer.get("holder") or {},
            "notices": notices, "controller": _public(ctl), "waited": round(waited, 1)}


def peek(config_root: str, timeout: float = DEFAULT_TIMEOUT, ctl: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """What :func:`acquire` would find, taking nothing (check mode): ``{where, holder, notices,
    controller}``; ``holder`` is another run's description or None (this run's own lock, from an
    earlier lifecycle of the same run, is none), and then ``notices`` says what a real run would do."""
    require_tree(config_root)
    objects = open_objects(config_root)
    ctl = ctl or controller()
    where = objects.label(RUN_LOCK_NAME)
    current = holder(objects)
    other = None if current is None or _same_run(current, ctl) else current
    notices = []
    if other is not None:
        notices.append("%s: check mode: %s by %s: a real run would wait up to %.0f s for it (%s), then fail naming it; "
                       "this run reads meta-state as that run leaves it now"
                       % (where, SUBJECT, holder_text(other), timeout, KNOB))
    return {"where": where, "holder": other, "notices": notices, "controller": _public(ctl)}


# --------------------------------------------------------------------------- a lock the run lost
def lost_marker(ctl: Dict[str, Any]) -> str:
    """Where the watcher leaves word that the run ``ctl`` lost its lock: a file on the controller's
    host (the watcher runs there), named by the run's ``ansible-playbook`` pid and start time, so no
    other run (a reused pid included) reads it."""
    return os.path.join(tempfile.gettempdir(), "csis-run-lock-lost-%s-%s.json" % (ctl["pid"], ctl["start"]))


def _mark_lost(ctl: Dict[str, Any], where: str, why: str) -> None:
    """The watcher's word that the run's lock is gone (never raises: the watcher has no one to tell)."""
    try:
        fsutil.write_atomic(lost_marker(ctl), json.dumps({"where": where, "at": clock.now(), "why": why}).encode("utf-8"),
                            mode=0o600)
    except (OSError, TypeError, ValueError):
        pass


def lost(ctl: Dict[str, Any]) -> Optional[str]:
    """What the run ``ctl`` must know when its watcher lost the run lock, else None.

    An S3 run lock that another run broke (it expired first), or that the store did not renew
    within its life, no longer keeps other runs off the tree, while this run goes on. The steps
    that act on the tree from then on (taking the lock for the next lifecycle, the apply check)
    refuse with this message; a record of what an apply already did still goes ahead (the
    meta-state transaction lock guards it, and it is true)."""
    try:
        with open(lost_marker(ctl), "r", encoding="utf-8") as fh:
            info = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict):
        info = {}
    return ("%s: this run's lock on the tree was lost at %s (%s): another run may be working on this tree now, "
            "so this run applies nothing more; what it applied is recorded. Look at what the other run did "
            "(playbooks/history.yml), then run again"
            % (info.get("where") or RUN_LOCK_NAME, info.get("at") or "an unknown time", info.get("why") or "no reason recorded"))


def _clear_lost_when_done(ctl: Dict[str, Any], living: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> None:
    """The watcher, after its run lost the lock: the marker stays while the run lives (its later
    steps read it), then goes, so no temporary directory fills with them. A watcher stopped
    meanwhile (SIGTERM) removes it only when the run has ended too."""
    try:
        while living():
            sleep(POLL)
    finally:
        if not living():
            try:
                os.unlink(lost_marker(ctl))
            except OSError:
                pass


def check_held(ctl: Optional[Dict[str, Any]] = None) -> None:
    """Raise :class:`~.backends.LockLost` (the message says when and why) when the run ``ctl``
    (default: this process's run) lost its run lock while it went on."""
    if ctl is None:
        try:
            ctl = controller()
        except MetaStateError:
            return  # no run to speak of (no /proc): nothing a watcher could have marked
    msg = lost(ctl)
    if msg:
        raise LockLost(msg)


def _public(ctl: Dict[str, Any]) -> Dict[str, Any]:
    """The run's process as the roles pass it on (``watch``: ``CSIS_TF_WATCH`` of csis-tf-supervise)."""
    return {"pid": ctl["pid"], "start": ctl["start"], "watch": "%s:%s" % (ctl["pid"], ctl["start"])}


def _close_fds(keep: int) -> None:
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _hold(lock: Any, living: Callable[[], bool], sleep: Callable[[float], None] = time.sleep,
          on_lost: Optional[Callable[[str], None]] = None) -> bool:
    """Hold ``lock`` while ``living()``, renewing it every :data:`POLL` seconds. True: the run
    ended and the lock is still held (release it); False: it was lost, nothing left to hold
    (``on_lost`` is told why first)."""
    while living():
        sleep(POLL)
        try:
            lock.refresh()
        except LockLost:
            if on_lost is not None:
                on_lost("another run broke it after it expired unrenewed")
            return False
        except MetaStateError as exc:
            # the store did not answer (a timeout, a 5xx): the object is still this run's until its
            # life runs out, so the next poll renews it; giving up here would free the tree mid-run
            if lock.expired():  # not renewed within its life: another run may have broken it
                if on_lost is not None:
                    on_lost("the store did not renew it within its life: %s" % str(exc)[:300])
                return False
    return True


def _exit_on_signal(_signum: int, _frame: Any) -> None:  # pragma: no cover - the watcher's SIGTERM
    raise SystemExit(0)


def _watch(objects: Any, ctl: Dict[str, Any], timeout: float, what: str, extra: Dict[str, Any],
           read_end: int, write_end: int) -> None:  # pragma: no cover - runs in the forked watcher
    """The watcher: detach, take the lock, report, hold it while the run lives, release it."""
    lock = None
    try:
        os.close(read_end)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)  # the first child ends at once: the caller reaps it, the watcher is nobody's child
        os.chdir("/")
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        _close_fds(write_end)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, _exit_on_signal)
        extra = dict(extra, watcher_pid=os.getpid())
        try:
            lock = _lock(objects, timeout, what, extra)
            lock.acquire()
            answer: Dict[str, Any] = {"ok": True, "holder": dict(extra, what=what),
                                      "notices": list(getattr(objects, "notices", []))}
        except LockBusy as exc:
            answer = {"busy": str(exc)}
            lock = None
        except MetaStateError as exc:
            answer = {"error": str(exc)}
            lock = None
        except Exception as exc:  # noqa: BLE001 - reported to the caller, never a traceback here
            answer = {"error": "%s: cannot take the run lock: %s" % (objects.label(RUN_LOCK_NAME), exc)}
            lock = None
        os.write(write_end, json.dumps(answer).encode("utf-8"))
        os.close(write_end)
        if lock is None:
            os._exit(0)
        where = objects.label(RUN_LOCK_NAME)

        def living() -> bool:
            return alive(ctl["pid"], ctl["start"])

        if not _hold(lock, living, on_lost=lambda why: _mark_lost(ctl, where, why)):
            lock = None  # broken by another run, or expired unrenewed: nothing left to hold
            _clear_lost_when_done(ctl, living)
    except BaseException:  # noqa: BLE001 - SystemExit from SIGTERM included: release, then end
        pass
    finally:
        if lock is not None:
            try:
                lock.release()
            except Exception:  # noqa: BLE001 - the S3 lock then expires by itself
                pass
        os._exit(0)
