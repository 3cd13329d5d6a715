# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Where meta-state lives: the two object stores behind :class:`~.store.MetaState`.

Meta-state is a set of small objects named by relative paths (``pins.yaml``,
``launch-params/web.yaml``, ``audit/00000012.yaml``, ...). A backend stores them and
nothing else; what they mean (records, revisions, the audit trail) is :mod:`.store`'s.

* :class:`LocalObjects` (the default): files under ``<config root>/meta-state/``; the
  transaction lock is an exclusive ``flock`` on ``meta-state/.lock`` (the kernel drops it
  when its holder dies); writes are atomic renames (:func:`~..fsutil.write_atomic`).
* :class:`S3Objects`: objects under ``s3://<bucket>/<prefix>/meta-state/`` of an S3 state
  backend declared in the tree (``cfg/_config.yml`` ``meta_state: {backend: s3,
  state_backend: <name>, prefix: <optional>}``), reached with that backend's region,
  profile and endpoint (:func:`~..aws.state_backend_access`; credentials from the
  environment, never stored). The lock is the object ``meta-state/.lock``, created with
  ``PutObject(IfNoneMatch="*")``; it names its holder and expires (``CSIS_META_STATE_LOCK_TTL``,
  120 s by default; its holder renews it while it commits). An expired lock is broken with
  a notice (``DeleteObject(IfMatch=<its ETag>)``). Whether it expired is read by the store's
  own clock (:func:`lock_expired`: the object's age, its ``Date`` less its ``Last-Modified``,
  against the life its holder wrote), so a machine whose clock is off breaks no live lock.

Both give every object a *version* (the local file's identity and size/times, the S3 ETag):
:meth:`put` and :meth:`delete` take the version the writer read (``expect``) and raise
:class:`Conflict` instead of overwriting anything that changed since (``IfMatch``; ``ABSENT``:
``IfNoneMatch="*"``). :func:`open_objects` reads the tree's ``meta_state`` setting (only
``cfg/_config.yml`` and ``cfg/state-backends*.yml``, never the whole tree).

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import email.utils
import errno
import fcntl
import getpass
import glob
import json
import math
import os
import socket
import stat
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from .. import aws
from ..errors import CsisError
from ..notices import notice
from ..fsutil import fsync_dir, user_cache, write_atomic
from ..yamlio import VALUE_ERRORS, meta_loader, yaml


def life_clock() -> float:
    """Seconds for an S3 lock's life as its holder counts them: a clock that runs on while the
    machine is suspended (Linux ``CLOCK_BOOTTIME``; ``time.monotonic`` stops then), so a holder
    woken from a suspend does not take a lock that expired at the store for still its own."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        try:
            return time.clock_gettime(boottime)
        except OSError:  # pragma: no cover - a kernel without it
            pass
    return time.monotonic()


META_STATE_DIR = "meta-state"
LOCK_NAME = ".lock"
CONFIG_REL = "cfg/_config.yml"
#: the default of ``lock_timeout`` (the Ansible variable ``csis_lock_timeout``), seconds
DEFAULT_LOCK_TIMEOUT = 600.0
#: how long an S3 lock lives unless its holder renews it, seconds
DEFAULT_LOCK_TTL = 120.0
#: ``expect`` of a write that requires the object not to exist
ABSENT = "<absent>"
#: one id per process: the run that holds a lock
RUN_ID = uuid.uuid4().hex[:12]


class MetaStateError(CsisError):
    """Meta-state cannot be read, validated, locked or written.

    The message always names the file or object (``meta-state/<file>``) it is about.
    """


class NotWritable(MetaStateError):
    """The meta-state directory (or a file in it) cannot be written (:meth:`~.store.MetaState.check_writable`)."""


class LockBusy(MetaStateError):
    """Another holder kept the lock past the timeout (the message names it)."""


class LockLost(MetaStateError):
    """The lock was broken by another run after it expired: its holder holds nothing any more."""


class Conflict(MetaStateError):
    """An object changed since the transaction read it: the write was refused, nothing overwritten."""


#: the store's clock counts whole seconds (``Last-Modified``, ``Date``): a lock counts as expired
#: one second after its life by that clock, so the rounding never breaks a lock early
STORE_CLOCK_GRAIN = 1.0


def object_age(resp: Mapping[str, Any]) -> Optional[float]:
    """Seconds since the object of a ``GetObject`` answer was last written, by the store's clock
    alone (its ``Date`` header less its ``LastModified``); None when the answer has either not."""
    try:
        date = email.utils.parsedate_to_datetime(resp["ResponseMetadata"]["HTTPHeaders"]["date"])
        return (date - resp["LastModified"]).total_seconds()
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None


def _finite(value: Any) -> Optional[float]:
    """``value`` as a finite number, None when it is none (a bool, a string, NaN, infinite, too large)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def lock_left(info: Mapping[str, Any], age: Optional[float], now: Optional[float] = None) -> Tuple[float, bool]:
    """How many seconds of life a lock object (``info``: its body) has left unless renewed (0 or
    less: it expired), and whether that was read by the store's clock.

    By the store's clock when the answer told the object's ``age`` (:func:`object_age`) and the
    holder wrote its lock's life (``ttl``): neither the holder's clock nor this machine's counts, so
    a node whose clock is off (an AWX execution node, a paused virtual machine) breaks no live lock.
    Otherwise (a lock an older csis.infra wrote, a store that tells no time) by the holder's
    ``expires_epoch`` against this machine's clock (``now``). A body with neither is not a lock
    csis.infra wrote: expired."""
    ttl = _finite(info.get("ttl"))
    if age is not None and ttl is not None and ttl > 0:
        return ttl + STORE_CLOCK_GRAIN - age, True
    expires = _finite(info.get("expires_epoch"))
    if expires is None:
        return 0.0, False
    return expires - (time.time() if now is None else now), False


def lock_expired(info: Mapping[str, Any], age: Optional[float], now: Optional[float] = None) -> bool:
    """Whether the life of a lock object ran out unrenewed (:func:`lock_left`)."""
    return lock_left(info, age, now)[0] <= 0


def _life_text(info: Mapping[str, Any], age: Optional[float]) -> str:
    """What a message says of a lock's life: by the store's clock when it was read so, else by the
    time its holder wrote."""
    left, by_store = lock_left(info, age)
    if by_store:
        return ("%.0f s more unless renewed, by the store's clock" % left if left > 0
                else "it was not renewed within its %.0f s life, by the store's clock" % _finite(info.get("ttl")))
    return "until %s unless renewed" % info.get("expires", "?") if left > 0 else "it expired at %s" % info.get("expires", "?")


def lock_body(raw: bytes) -> Dict[str, Any]:
    """A lock object's body as csis.infra writes it; {} when it is not one."""
    try:
        info = json.loads(raw.decode("utf-8"))
    except (ValueError, AttributeError, UnicodeDecodeError):
        return {}
    return info if isinstance(info, dict) else {}


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


#: the environment that says a run is an AWX job (the playbooks set the first from ``awx_job_id``).
#: :func:`who` also reads ``JOB_ID`` for attribution; whatever decides that a run is an AWX job
#: must not: other schedulers set it too
AWX_JOB_ID_VARIABLES = ("CSIS_AWX_JOB_ID", "AWX_JOB_ID")


def first_set(names: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> str:
    """The value of the first environment variable of ``names`` set to more than blanks, stripped;
    ``''`` when none is."""
    env = os.environ if environ is None else environ
    return next((v for v in ((env.get(name) or "").strip() for name in names) if v), "")


def who(environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """Who writes: the OS user and host, and AWX's user, job and workflow job when the run
    passed them (``CSIS_AWX_USER_NAME``/``AWX_USER_NAME``, ``CSIS_AWX_JOB_ID``/``AWX_JOB_ID``/``JOB_ID``,
    ``CSIS_AWX_WORKFLOW_JOB_ID``/``AWX_WORKFLOW_JOB_ID``)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    out: Dict[str, Any] = {"user": user, "host": socket.gethostname(), "pid": os.getpid(), "run_id": RUN_ID}
    for key, names in (("awx_user_name", ("CSIS_AWX_USER_NAME", "AWX_USER_NAME")),
                       ("awx_job_id", AWX_JOB_ID_VARIABLES + ("JOB_ID",)),
                       ("awx_workflow_job_id", ("CSIS_AWX_WORKFLOW_JOB_ID", "AWX_WORKFLOW_JOB_ID"))):
        value = first_set(names, environ)
        if value:
            out[key] = value
    return out


def requester(environ: Optional[Mapping[str, str]] = None) -> str:
    """Who asks, by name: the AWX user the run passed, else the OS user (as :func:`who` finds them)."""
    w = who(environ)
    return str(w.get("awx_user_name") or w["user"])


def default_what() -> str:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return argv0 or "python"


def lock_timeout_default(environ: Optional[Mapping[str, str]] = None) -> float:
    """``CSIS_LOCK_TIMEOUT`` (seconds) when set and positive, else :data:`DEFAULT_LOCK_TIMEOUT`."""
    env = os.environ if environ is None else environ
    try:
        value = float((env.get("CSIS_LOCK_TIMEOUT") or "").strip() or DEFAULT_LOCK_TIMEOUT)
    except ValueError:
        value = DEFAULT_LOCK_TIMEOUT
    return value if value >= 0 else DEFAULT_LOCK_TIMEOUT


def holder_text(info: Mapping[str, Any], extra: bool = True) -> str:
    """A lock holder as a message names it (``extra``: with its user, run and AWX job)."""
    owner = info.get("owner") if isinstance(info.get("owner"), dict) else info
    since = info.get("since") or info.get("created") or "?"
    what = owner.get("what") or info.get("what") or "unknown"
    text = "pid %s on host %s since %s (%s)" % (owner.get("pid", "?"), owner.get("host", "?"), since, what)
    more = ["%s %s" % (k, owner[k]) for k in ("user", "csis_run_id", "run_id", "awx_job_id", "awx_user_name")
            if owner.get(k)]
    return text + (" [%s]" % ", ".join(more) if more and extra else "")


# --------------------------------------------------------------------------- local
#: Linux FS_IOC_GETFLAGS (_IOR('f', 1, long)) and the flags that stop a rename over a file
_FS_IOC_GETFLAGS = 0x80086601 if sys.maxsize > 2 ** 32 else 0x80046601
_FS_IMMUTABLE_OR_APPEND = 0x00000010 | 0x00000020


def immutable(path: str) -> bool:
    """Whether ``path`` carries the immutable or append-only attribute (False when unknown)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        flags = fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(8))
    except OSError:
        return False  # a file system without attributes
    finally:
        os.close(fd)
    return bool(int.from_bytes(flags[:4], sys.byteorder) & _FS_IMMUTABLE_OR_APPEND)


def signature(st: os.stat_result) -> str:
    """What changes whenever a file is replaced (atomic rename: a new inode) or rewritten."""
    return "%d:%d:%d:%d:%d" % (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileLock:
    """Exclusive ``flock`` on ``<dir>/.lock``; the holder describes itself in the file."""

    def __init__(self, directory: str, timeout: float, what: str, poll: float = 0.05,
                 name: str = LOCK_NAME, extra: Optional[Mapping[str, Any]] = None,
                 busy: str = "another csis.infra run is writing this tree",
                 subject: str = "meta-state is locked") -> None:
        self.name = name
        self.path = os.path.join(directory, name)
        self.timeout = timeout
        self.what = what
        self.poll = poll
        self.extra = dict(extra or {})
        self.busy = busy
        self.subject = subject
        self.fd: Optional[int] = None

    def _holder(self) -> str:
        try:
            with open(self.path, "r", encoding="utf-8") as handle:
                info = json.loads(handle.read() or "{}")
        except (OSError, ValueError, RecursionError):
            info = {}
        return holder_text(info)

    def acquire(self) -> None:
        label = "%s/%s" % (META_STATE_DIR, self.name)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise MetaStateError("%s: cannot open the lock file: %s" % (label, exc.strerror or exc)) from exc
        deadline = time.monotonic() + max(0.0, self.timeout)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        raise MetaStateError("%s: cannot lock: %s" % (label, exc)) from exc
                if time.monotonic() >= deadline:
                    raise LockBusy(
                        "%s: %s by %s; %s. Wait for it, or if that process is "
                        "gone the lock frees itself" % (label, self.subject, self._holder(), self.busy))
                time.sleep(self.poll)
            info = dict(who(), since=now_iso(), what=self.what, **self.extra)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(info, sort_keys=True) + "\n").encode("utf-8"), 0)
            except OSError as exc:  # a full or failing filesystem: no raw traceback, nothing written
                raise MetaStateError("%s: cannot write: %s (nothing was written)"
                                     % (label, exc.strerror or exc)) from exc
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def refresh(self, force: bool = False) -> None:
        """Nothing to renew: the kernel holds the lock as long as the process lives."""

    def expired(self) -> bool:
        """Never: a ``flock`` has no lifetime of its own."""
        return False

    def release(self) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.ftruncate(fd, 0)  # no stale description once nobody holds it
        except OSError:
            pass
        finally:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


class LocalObjects:
    """Meta-state objects as files under ``<config root>/meta-state/``."""

    kind = "local"

    def __init__(self, config_root: str) -> None:
        self.config_root = config_root
        self.dir = os.path.join(config_root, META_STATE_DIR)
        self.where = self.dir
        self.notices: List[str] = []

    def label(self, rel: str) -> str:
        return "%s/%s" % (META_STATE_DIR, rel)

    def path(self, rel: str) -> str:
        return os.path.join(self.dir, *rel.split("/"))

    def exists(self) -> bool:
        return os.path.isdir(self.dir)

    def get(self, rel: str) -> Tuple[Optional[bytes], Optional[str]]:
        """(the bytes of object ``rel`` or None when it does not exist, its version)."""
        try:
            # O_NONBLOCK: a FIFO put in the folder must not hang the reader (regular files ignore the flag)
            fd = os.open(self.path(rel), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            with os.fdopen(fd, "rb") as handle:
                st = os.fstat(handle.fileno())
                if stat.S_ISDIR(st.st_mode):
                    raise IsADirectoryError(errno.EISDIR, "Is a directory")
                if not stat.S_ISREG(st.st_mode):
                    raise MetaStateError("%s: is not a regular file (a FIFO, a device or a socket): meta-state "
                                         "holds only files csis.infra wrote; remove it" % self.label(rel))
                return handle.read(), signature(st)
        except FileNotFoundError:
            return None, None
        except NotADirectoryError:
            return None, None
        except IsADirectoryError as exc:
            raise MetaStateError("%s: is a directory, not a file" % self.label(rel)) from exc
        except OSError as exc:
            raise MetaStateError("%s: cannot read: %s" % (self.label(rel), exc.strerror or exc)) from exc

    def version(self, rel: str) -> Optional[str]:
        try:
            return signature(os.stat(self.path(rel)))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise MetaStateError("%s: cannot read: %s" % (self.label(rel), exc.strerror or exc)) from exc

    def listing(self, folder: str) -> Dict[str, str]:
        """{file name: version} of the ``*.yaml`` objects directly in ``folder`` (none: {})."""
        out: Dict[str, str] = {}
        try:
            with os.scandir(self.path(folder)) as entries:
                for entry in entries:
                    if entry.name.endswith(".yaml") and not entry.name.startswith("."):
                        try:
                            out[entry.name] = signature(entry.stat(follow_symlinks=False))
                        except FileNotFoundError:
                            continue
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except OSError as exc:
            raise MetaStateError("%s/: cannot list: %s" % (self.label(folder), exc.strerror or exc)) from exc
        return out

    def _check(self, rel: str, expect: Optional[str]) -> None:
        if expect is None:
            return
        current = self.version(rel)
        if current != (None if expect == ABSENT else expect):
            raise Conflict("%s: changed since this transaction read it (%s), so it was not overwritten"
                           % (self.label(rel), "it was created meanwhile" if expect == ABSENT else
                              "removed meanwhile" if current is None else "replaced meanwhile"))

    def put(self, rel: str, payload: bytes, expect: Optional[str] = None) -> None:
        """Write ``payload`` atomically (under the transaction lock; ``expect``: the version read)."""
        self._check(rel, expect)
        path = self.path(rel)
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            os.makedirs(folder, exist_ok=True)
            fsync_dir(os.path.dirname(folder))  # the new folder's entry survives a power loss too
        write_atomic(path, payload)

    def delete(self, rel: str, expect: Optional[str] = None) -> None:
        self._check(rel, expect)
        try:
            os.unlink(self.path(rel))
        except FileNotFoundError:
            return
        fsync_dir(os.path.dirname(self.path(rel)))  # a removed record does not come back after a power loss

    def ensure(self) -> None:
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as exc:
            raise MetaStateError("%s: cannot create the directory: %s"
                                 % (META_STATE_DIR, exc.strerror or exc)) from exc

    def lock(self, timeout: float, what: str) -> FileLock:
        lock = FileLock(self.dir, timeout, what)
        lock.acquire()
        return lock

    @contextlib.contextmanager
    def read_barrier(self, timeout: float, held: bool) -> Iterator[bool]:
        """A shared ``flock`` on the lock file: no transaction commits while it is held (a
        lock-free read can fall between two objects of one commit). Yields whether it is held.
        Best effort: a tree whose lock file cannot be opened or locked within ``timeout`` (at
        most 30 s; read-only, this thread's own transaction) is read as it is."""
        fd: Optional[int] = None
        shared = False
        if not held:
            try:
                fd = os.open(os.path.join(self.dir, LOCK_NAME), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                fd = None
        try:
            if fd is not None:
                deadline = time.monotonic() + min(timeout, 30.0)
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                        shared = True
                        break
                    except OSError as exc:
                        if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK) \
                                or time.monotonic() >= deadline:
                            break
                    time.sleep(0.05)
            yield shared
        finally:
            if fd is not None:
                os.close(fd)

    @property
    def identity(self) -> str:
        """Which store this is (its directory): what a cache of its records is kept under."""
        return self.dir

    def cache_dir(self) -> str:
        return os.path.join(cache_home(), "local", _digest(self.identity))

    def lock_held(self, name: str = LOCK_NAME) -> bool:
        """Whether someone holds the lock ``name`` now (a shared ``flock`` cannot be had)."""
        try:
            fd = os.open(os.path.join(self.dir, name), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except OSError:
            return True
        finally:
            os.close(fd)

    def check_writable(self, timeout: float, what: str, names: List[str]) -> Dict[str, Any]:
        """A probe file created, fsynced and removed; no existing file immutable; the lock taken
        and released. A missing directory: the same probe in a temporary directory made and
        removed in the configuration root (where the first transaction creates it)."""
        exists = os.path.isdir(self.dir)
        if not exists and os.path.lexists(self.dir):
            raise NotWritable("%s: %s is not a directory, so nothing can be recorded there"
                              % (META_STATE_DIR, self.dir))
        try:
            if exists:
                _probe(self.dir)
            else:
                probe_dir = tempfile.mkdtemp(prefix=".%s-probe." % META_STATE_DIR, dir=self.config_root)
                try:
                    _probe(probe_dir)
                finally:
                    os.rmdir(probe_dir)
        except OSError as exc:
            where = self.dir if exists else "%s (it does not exist yet and cannot be created in %s)" % (
                self.dir, self.config_root)
            raise NotWritable("%s: the directory %s cannot be written: %s"
                              % (META_STATE_DIR, where, exc.strerror or exc)) from exc
        if exists:
            for rel in names:
                path = self.path(rel)
                if os.path.exists(path) and immutable(path):
                    raise NotWritable("%s: %s is immutable or append-only (chattr), so it cannot be replaced"
                                      % (self.label(rel), path))
            self.lock(timeout, what).release()
        return {"path": self.dir, "exists": exists}


def _probe(directory: str) -> None:
    """Create, write, fsync and remove a file in ``directory`` (OSError when it cannot)."""
    fd, tmp = tempfile.mkstemp(prefix=".probe.", suffix=".tmp", dir=directory)
    try:
        os.write(fd, b"csis.infra write probe\n")
        os.fsync(fd)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
        os.unlink(tmp)


def cache_home() -> str:
    """Where readers keep their copy of what they parsed (``$CSIS_META_STATE_CACHE`` or
    ``$XDG_CACHE_HOME/csis.infra/meta-state``): derived data, safe to delete."""
    return os.environ.get("CSIS_META_STATE_CACHE") or user_cache("meta-state")


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


# --------------------------------------------------------------------------- s3
def _s3_error(label: str, action: str, exc: BaseException) -> MetaStateError:
    return MetaStateError("%s: cannot %s: %s" % (label, action, aws.error_text(exc)))


class S3Lock:
    """The lock object ``<prefix>/meta-state/.lock`` (see the module docstring)."""

    def __init__(self, objects: "S3Objects", timeout: float, what: str, ttl: float,
                 sleep: Callable[[float], None] = time.sleep, name: str = LOCK_NAME,
                 extra: Optional[Mapping[str, Any]] = None,
                 busy: str = "another csis.infra run is writing this tree",
                 subject: str = "meta-state is locked", knob: str = "lock_timeout / csis_lock_timeout") -> None:
        self.objects = objects
        self.name = name
        self.extra = dict(extra or {})
        self.busy = busy
        self.subject = subject
        self.knob = knob
        self.timeout = timeout
        self.what = what
        self.ttl = ttl
        self.sleep = sleep
        self.etag: Optional[str] = None
        self.renewed = 0.0
        # this lock's own mark: two locks of one process (threads) with the same what are two holders
        self.nonce = uuid.uuid4().hex[:12]

    def _owner(self) -> Dict[str, Any]:
        """Who holds the lock, as its object names the holder."""
        return dict(who(), what=self.what, lock=self.nonce, **self.extra)

    def _body(self) -> bytes:
        created = time.time()
        info = {"owner": self._owner(), "created": now_iso(),
                "expires": _dt.datetime.fromtimestamp(created + self.ttl, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "expires_epoch": created + self.ttl, "ttl": self.ttl}
        return (json.dumps(info, sort_keys=True) + "\n").encode("utf-8")

    def acquire(self) -> None:
        label = self.objects.label(self.name)
        deadline = time.monotonic() + max(0.0, self.timeout)
        delay = 0.1
        while True:
            try:
                start = life_clock()  # the object's life counts from its body, not from the answer
                self.etag = self.objects.put(self.name, self._body(), ABSENT)
                self.renewed = start
                return
            except Conflict:
                pass
            raw, etag, age = self.objects.get_with_age(self.name)
            if raw is None:
                continue  # released meanwhile: try again at once
            info = lock_body(raw)  # {} (expired) when it is not a lock csis.infra wrote
            if info.get("owner") == self._owner():
                # this very lock's put, whose answer was lost (the SDK's retry then found it there): ours
                self.etag, self.renewed = etag, start
                return
            if lock_expired(info, age):
                try:
                    self.objects.delete(self.name, etag)
                    text = ("%s: broke the expired lock of %s (%s: its holder is gone)"
                            % (label, holder_text(info), _life_text(info, age)))
                    self.objects.notices.append(text)
                    notice(text)  # shown by the task whatever writer took the lock (module.call_run)
                except Conflict:
                    pass  # someone else broke or renewed it
                continue
            if time.monotonic() >= deadline:
                raise LockBusy(
                    "%s: %s by %s (%s); %s. Waited %.0f s (%s)"
                    % (label, self.subject, holder_text(info), _life_text(info, age), self.busy, self.timeout,
                       self.knob))
            self.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 5.0)

    def refresh(self, force: bool = False) -> None:
        """Renew the lock when half its life is gone (the holder commits for a long time), or now
        (``force``: before a commit writes anything, which proves the lock still this holder's)."""
        if self.etag is None or (not force and life_clock() - self.renewed < self.ttl / 2):
            return
        try:
            start = life_clock()
            self.etag = self.objects.put(self.name, self._body(), self.etag)
            self.renewed = start
        except Conflict as exc:
            if self._landed(start):
                return
            raise LockLost("%s: this run's lock was broken by another run (it expired), so nothing more "
                           "is written" % self.objects.label(self.name)) from exc

    def _landed(self, start: float) -> bool:
        """A renewal refused as a conflict may be this very holder's: an earlier put whose answer was
        lost (a timeout, then the SDK's retry with the old ETag) did land. The object then still names
        this holder as its owner: take its ETag and count the renewal. A store that does not answer
        the read raises (not a lost lock: the caller tries again)."""
        raw, etag = self.objects.get(self.name)
        if raw is None or etag is None or lock_body(raw).get("owner") != self._owner():
            return False
        self.etag, self.renewed = etag, start
        return True

    def expired(self) -> bool:
        """Whether the lock's life ran out since it was last renewed: another run may have broken
        it since, though no renewal was refused (the store did not answer meanwhile)."""
        return life_clock() - self.renewed >= self.ttl

    def release(self) -> None:
        if self.etag is None:
            return
        etag, self.etag = self.etag, None
        try:
            self.objects.delete(self.name, etag)
        except MetaStateError:
            pass  # broken meanwhile, or the endpoint is gone: it expires by itself


class S3Objects:
    """Meta-state objects under ``s3://<bucket>/<prefix>/meta-state/``."""

    kind = "s3"

    def __init__(self, access: Mapping[str, Any], bucket: str, prefix: str = "",
                 client: Any = None, lock_ttl: Optional[float] = None) -> None:
        self.access = dict(access)
        self.bucket = bucket
        self.base = "%s%s/" % ((prefix.strip("/") + "/") if prefix.strip("/") else "", META_STATE_DIR)
        self.where = "s3://%s/%s" % (bucket, self.base.rstrip("/"))
        self._client = client
        self.notices: List[str] = []
        try:
            env_ttl = float(os.environ.get("CSIS_META_STATE_LOCK_TTL") or 0)
        except ValueError:
            env_ttl = 0.0
        self.lock_ttl = float(lock_ttl or env_ttl or DEFAULT_LOCK_TTL)

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = aws.client("s3", self.access)
        return self._client

    def label(self, rel: str) -> str:
        return "s3://%s/%s%s" % (self.bucket, self.base, rel)

    def exists(self) -> bool:
        try:
            return bool(self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.base, MaxKeys=1).get("KeyCount"))
        except Exception as exc:  # noqa: BLE001 - every botocore error is reported
            raise _s3_error(self.where, "list", exc) from exc

    def get(self, rel: str) -> Tuple[Optional[bytes], Optional[str]]:
        return self.get_with_age(rel)[:2]

    def get_with_age(self, rel: str) -> Tuple[Optional[bytes], Optional[str], Optional[float]]:
        """The object, its ETag and its age by the store's clock (:func:`object_age`; None when
        the answer tells none); ``(None, None, None)`` when there is none."""
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self.base + rel)
            return resp["Body"].read(), resp.get("ETag"), object_age(resp)
        except Exception as exc:  # noqa: BLE001
            if aws.error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None, None, None
            raise _s3_error(self.label(rel), "read", exc) from exc

    def version(self, rel: str) -> Optional[str]:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.base + rel).get("ETag")
        except Exception as exc:  # noqa: BLE001
            if aws.error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise _s3_error(self.label(rel), "read", exc) from exc

    def listing(self, folder: str) -> Dict[str, str]:
        prefix = self.base + folder.strip("/") + "/"
        out: Dict[str, str] = {}
        token: Optional[str] = None
        while True:
            kw: Dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/"}
            if token:
                kw["ContinuationToken"] = token
            try:
                resp = self.client.list_objects_v2(**kw)
            except Exception as exc:  # noqa: BLE001
                raise _s3_error(self.label(folder) + "/", "list", exc) from exc
            for obj in resp.get("Contents") or ():
                name = obj["Key"][len(prefix):]
                if name.endswith(".yaml") and not name.startswith("."):
                    out[name] = obj.get("ETag")
            if not resp.get("IsTruncated"):
                return out
            token = resp.get("NextContinuationToken")

    def put(self, rel: str, payload: bytes, expect: Optional[str] = None) -> Optional[str]:
        kw: Dict[str, Any] = {"Bucket": self.bucket, "Key": self.base + rel, "Body": payload,
                              "ContentType": "application/yaml" if rel.endswith(".yaml") else "application/json"}
        if expect == ABSENT:
            kw["IfNoneMatch"] = "*"
        elif expect is not None:
            kw["IfMatch"] = expect
        try:
            return self.client.put_object(**kw).get("ETag")
        except Exception as exc:  # noqa: BLE001
            code = aws.error_code(exc)
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409") or (
                    expect not in (None, ABSENT) and code in ("NoSuchKey", "404", "NotFound")):
                # a conditional write of an object removed meanwhile (S3 answers NoSuchKey): a conflict
                # too, so a lock another run broke reads as lost, not as a store that did not answer
                raise Conflict("%s: changed since this transaction read it (%s), so it was not overwritten"
                               % (self.label(rel), "it was created meanwhile" if expect == ABSENT
                                  else "removed meanwhile" if code in ("NoSuchKey", "404", "NotFound")
                                  else "its ETag is no longer %s" % expect)) from exc
            raise _s3_error(self.label(rel), "write", exc) from exc

    def delete(self, rel: str, expect: Optional[str] = None) -> None:
        kw: Dict[str, Any] = {"Bucket": self.bucket, "Key": self.base + rel}
        if expect not in (None, ABSENT):
            kw["IfMatch"] = expect
        try:
            self.client.delete_object(**kw)
        except Exception as exc:  # noqa: BLE001
            code = aws.error_code(exc)
            if code in ("NoSuchKey", "404", "NotFound"):
                return
            if code in ("PreconditionFailed", "412"):
                raise Conflict("%s: changed since this transaction read it, so it was not removed"
                               % self.label(rel)) from exc
            raise _s3_error(self.label(rel), "remove", exc) from exc

    def ensure(self) -> None:
        """Nothing to create: the bucket is the state backend's."""

    def lock(self, timeout: float, what: str) -> S3Lock:
        lock = S3Lock(self, timeout, what, self.lock_ttl)
        lock.acquire()
        return lock

    @contextlib.contextmanager
    def read_barrier(self, timeout: float, held: bool) -> Iterator[bool]:
        """No shared lock in S3: the second look is simply a fresh read (yields False: not held)."""
        yield False

    def lock_held(self) -> bool:
        """Whether a lock object exists that has not expired."""
        raw, _etag, age = self.get_with_age(LOCK_NAME)
        return raw is not None and not lock_expired(lock_body(raw), age)

    @property
    def identity(self) -> str:
        """Which store this is: the endpoint that reaches it (empty: AWS's own), the bucket and the
        prefix; what a cache of its records is kept under (never credentials)."""
        return "%s|%s|%s" % ((self.access.get("endpoints") or {}).get("s3") or "", self.bucket, self.base)

    def cache_dir(self) -> str:
        return os.path.join(cache_home(), "s3", _digest(self.identity))

    def check_writable(self, timeout: float, what: str, names: List[str]) -> Dict[str, Any]:
        """The bucket answers and the lock can be taken and released."""
        exists = self.exists()
        self.lock(timeout, what).release()
        return {"path": self.where, "exists": exists}


# --------------------------------------------------------------------------- the setting
def _read_yaml(path: str, shown: str) -> Any:
    try:
        with open(path, "rb") as handle:
            return yaml.load(handle.read().decode("utf-8"), Loader=meta_loader())  # noqa: S506 - a SafeLoader
    except (OSError, yaml.YAMLError) + VALUE_ERRORS as exc:
        raise MetaStateError("%s: cannot read the meta_state setting: %s" % (shown, exc)) from exc


def read_setting(config_root: str) -> Optional[Any]:
    """The tree's ``meta_state`` setting (a :class:`~..config.models.MetaStateSetting`), None when
    ``cfg/_config.yml`` is missing or does not set it. Raises :class:`MetaStateError` naming the key."""
    path = os.path.join(config_root, *CONFIG_REL.split("/"))
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as handle:
        if b"meta_state" not in handle.read():
            return None  # the common case, without parsing anything
    raw = _read_yaml(path, CONFIG_REL)
    value = raw.get("meta_state") if isinstance(raw, dict) else None
    if value is None:
        return None
    from ..config import models as m  # only a tree that sets meta_state pays for the models

    try:
        return m.MetaStateSetting.model_validate(value)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError, or pydantic missing
        raise MetaStateError("%s: 'meta_state' is not valid: %s" % (CONFIG_REL, _short(exc))) from exc


def _short(exc: BaseException) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            return "; ".join("%s: %s" % (".".join(str(p) for p in e.get("loc", ())) or "meta_state", e.get("msg"))
                             for e in errors(include_url=False))
        except TypeError:
            pass
    return str(exc)


def find_state_backend(config_root: str, name: str) -> Tuple[Optional[Any], str, List[str]]:
    """(the state backend ``name`` declared in ``cfg/state-backends*.yml`` or None, the file it is in,
    every declared name)."""
    names: List[str] = []
    for path in sorted(glob.glob(os.path.join(config_root, "cfg", "state-backends*.yml"))):
        shown = os.path.relpath(path, config_root)
        raw = _read_yaml(path, shown)
        for entry in (raw or {}).get("state_backends") or [] if isinstance(raw, dict) else []:
            if not isinstance(entry, dict):
                continue
            names.append(str(entry.get("name")))
            if entry.get("name") == name:
                from ..config import models as m

                try:
                    return m.StateBackend.model_validate(entry), shown, names
                except Exception as exc:  # noqa: BLE001
                    raise MetaStateError("%s: state backend '%s' is not valid: %s" % (shown, name, _short(exc))) from exc
    return None, "cfg/state-backends*.yml", names


def require_tree(config_root: str) -> None:
    """Refuse a configuration root that is no configuration tree (a missing directory, a file, a
    directory without ``cfg/_config.yml``: a mistyped or empty ``csis_config_root``, which Ansible's
    ``realpath`` turns into the current directory) before anything is written there: the steps
    that lock and write meta-state would otherwise create ``meta-state/`` in it."""
    if not os.path.isdir(config_root):
        raise MetaStateError("%s: the configuration root does not exist or is not a directory (check csis_config_root); "
                             "nothing was written" % config_root)
    if not os.path.isfile(os.path.join(config_root, CONFIG_REL)):
        raise MetaStateError("%s: not a configuration tree: it has no %s (check csis_config_root); nothing was written"
                             % (config_root, CONFIG_REL))


def open_objects(config_root: str) -> Any:
    """The backend the tree at ``config_root`` declares (:class:`LocalObjects` by default)."""
    setting = read_setting(config_root)
    if setting is None or setting.backend == "local":
        return LocalObjects(config_root)
    backend, shown, names = find_state_backend(config_root, setting.state_backend)
    if backend is None:
        raise MetaStateError("%s: 'meta_state.state_backend' names '%s', which is not a state backend declared in %s "
                             "(declared: %s)" % (CONFIG_REL, setting.state_backend, shown, ", ".join(names) or "none"))
    if backend.type != "s3":
        raise MetaStateError("%s: 'meta_state.state_backend' names '%s', a %s state backend (%s); the s3 meta-state "
                             "needs an s3 one" % (CONFIG_REL, setting.state_backend, backend.type, shown))
    return S3Objects(aws.state_backend_access(backend), backend.bucket, setting.prefix or "")
