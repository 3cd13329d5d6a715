# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Meta-state: the YAML records under ``<config root>/meta-state/``.

This module is the one place meta-state is read and written.

* **Reads** (:meth:`MetaState.load`) take no lock. Every write replaces a file by an
  atomic rename, so a reader sees either the old or the new file, never half of one.
  Nothing is cached between calls: every ``load`` reads the file again.
* **Writes** happen only inside :meth:`MetaState.transaction`. The transaction holds an
  exclusive ``fcntl.flock`` on ``<meta-state>/.lock`` for its whole duration, so two
  csis.infra runs cannot interleave their read-modify-write cycles. The kernel drops
  the lock when the holder's process dies, so a killed run never blocks the next one.
  Files saved in a transaction are written when the ``with`` block exits normally
  (temporary file in the same directory, flush, fsync, ``os.replace``, fsync of the
  directory), and only if their serialized bytes changed. If the block raises,
  nothing is written.
* Every file is validated on load and on save against its known shape
  (:data:`FILES`); errors raise :class:`MetaStateError` naming the file.
* A damaged file is refused, never read as "no records" nor overwritten: an existing file
  that is empty or holds only comments, or one csis.infra wrote (:data:`HEADER`) that lacks
  its end line (:data:`FOOTER`: it was cut short). Files whose records contradict each
  other (:data:`INVARIANTS`: an open generation without a launch record, a pin of an
  instance that is not launched, ``storage-state.yaml`` and its read-model disagreeing) are
  refused by :meth:`MetaState.load` of the invariant's subject file and by any transaction
  that would write such a contradiction. A lock-free reader that sees a contradiction looks
  again under a shared lock (a commit replaces its files one after the other) before it
  refuses.
* :meth:`MetaState.check_writable` proves, before a run plans anything, that a transaction
  could write here (a probe file and the lock; nothing stays but the lock file).
* ``save`` refuses secret-shaped data (AWS access keys, session tokens, private keys,
  non-empty values under ``*secret*``/``*password*``/``*token*`` keys).
* Values are plain data: mappings with string keys, lists, strings, ints, floats,
  bools and null. Timestamps are strings (ISO 8601); ``datetime``/``date`` values
  given to ``save`` are converted with ``isoformat()``, and YAML timestamps are read
  back as strings, never as ``datetime`` objects.

Each file is written atomically; a transaction that saves several files writes
them one after the other, so a crash in the middle of the commit (power loss) can
leave some files new and others old, each one whole.

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import errno
import fcntl
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from ..errors import CsisError
from ..fsutil import fsync_dir, write_atomic
from ..yamlio import meta_dumper, meta_loader, yaml

__all__ = [
    "FILES",
    "FOOTER",
    "HEADER",
    "LOCK_NAME",
    "META_STATE_DIR",
    "STORAGE_STATES",
    "MetaState",
    "MetaStateError",
    "NotWritable",
    "Transaction",
    "contradictions",
    "dumps",
    "empty",
    "find_secrets",
    "launched_instances",
    "partners",
    "validate",
]

META_STATE_DIR = "meta-state"
LOCK_NAME = ".lock"
HEADER = ("# csis.infra meta-state: written by csis.infra, whole files only (the last line marks the end); "
          "do not edit by hand (use the forget/state import playbooks)\n")
#: the last line of every file csis.infra writes: a file with :data:`HEADER` and without it was cut short
FOOTER = "# end of csis.infra meta-state\n"
#: the first line of files written before the end line existed (read without one)
LEGACY_HEADER = ("# csis.infra meta-state: written by csis.infra; do not edit by hand "
                 "(use the forget/state import playbooks)\n")
#: what every refusal of a damaged or contradictory file adds: nothing is guessed or rebuilt
DAMAGED = ("nothing is read from it or written to it until it is restored (from a backup or version "
           "control) or corrected by hand")
STORAGE_STATES = ("active", "archived", "destroyed")


class MetaStateError(CsisError):
    """Meta-state cannot be read, validated, locked or written.

    The message always names the file (``meta-state/<file>``) it is about.
    """


class NotWritable(MetaStateError):
    """The meta-state directory (or a file in it) cannot be written (:meth:`MetaState.check_writable`)."""


# ---------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------

# file name -> ordered (top-level key, kind) pairs; kind is dict or list
FILES: Dict[str, Tuple[Tuple[str, type], ...]] = {
    "launch-params.yaml": (("instances", dict),),
    "instance-state.yaml": (("instances", dict),),
    "pins.yaml": (("instances", dict), ("pending_replacements", dict), ("upgrades", list)),
    "storage-state.yaml": (("storages", dict),),
    "storage.yaml": (("storages", dict),),
    "verifications.yaml": (("verifications", list),),
    "lineage.yaml": (("builds", list),),
    "runs.yaml": (("runs", list),),
}

_KIND_NAMES = {dict: "mapping", list: "list", str: "string", int: "integer",
               float: "number", bool: "boolean", type(None): "null"}


def _kind(value: Any) -> str:
    for typ, label in _KIND_NAMES.items():
        if isinstance(value, typ) and not (typ is int and isinstance(value, bool)):  # exact: bool is not an int here
            return label
    return type(value).__name__


def _label(name: str) -> str:
    return "%s/%s" % (META_STATE_DIR, name)


def _check_name(name: str) -> None:
    if name not in FILES:
        raise MetaStateError("%s: not a known meta-state file (known: %s)"
                             % (_label(name), ", ".join(sorted(FILES))))


def empty(name: str) -> Dict[str, Any]:
    """The empty shape of a known file (what a missing or empty file reads as)."""
    _check_name(name)
    return {key: kind() for key, kind in FILES[name]}


def _fail(name: str, where: str, msg: str) -> MetaStateError:
    return MetaStateError("%s: %s%s" % (_label(name), ("%s " % where) if where else "", msg))


def _expect_mapping(name: str, where: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise _fail(name, where, "must be a mapping, got %s" % _kind(value))


def _expect_list(name: str, where: str, value: Any) -> None:
    if not isinstance(value, list):
        raise _fail(name, where, "must be a list, got %s" % _kind(value))


def _expect_int(name: str, where: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(name, where, "must be an integer, got %s" % _kind(value))


def _entries(name: str, top: str, value: Dict[str, Any]) -> Iterator[Tuple[str, str, Dict[str, Any]]]:
    """Yield (entry name, location label, entry) for a name -> record mapping."""
    for key, entry in value.items():
        where = "%s.%s" % (top, key)
        if not isinstance(key, str):
            raise _fail(name, "", "key %r under '%s' must be a string, got %s" % (key, top, _kind(key)))
        _expect_mapping(name, "'%s'" % where, entry)
        yield key, where, entry


def _validate_instance_state(name: str, instances: Dict[str, Any]) -> None:
    for _key, where, entry in _entries(name, "instances", instances):
        gen = entry.get("generation")
        if gen is not None:
            _expect_mapping(name, "'%s.generation'" % where, gen)
            for kind in ("durable", "ephemeral"):
                if kind in gen:
                    _expect_int(name, "'%s.generation.%s'" % (where, kind), gen[kind])
        cur = entry.get("current")
        if cur is not None:
            _expect_mapping(name, "'%s.current'" % where, cur)
            _check_open_generation(name, where, cur, gen)
        if "history" in entry:
            _expect_list(name, "'%s.history'" % where, entry["history"])


def _check_open_generation(name: str, where: str, cur: Dict[str, Any], gen: Any) -> None:
    """An open generation: its kind, and a number its kind's counter has reached."""
    kind, number = cur.get("kind"), cur.get("number")
    if kind is not None and kind not in ("durable", "ephemeral"):
        raise _fail(name, "'%s.current.kind'" % where, "must be durable or ephemeral, got %r" % (kind,))
    if number is None:
        return
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise _fail(name, "'%s.current.number'" % where, "must be a generation number (1 or more), got %r" % (number,))
    counter = gen.get(kind) if isinstance(gen, dict) and kind else None
    if counter is not None and number > counter:
        raise _fail(name, "'%s.current.number'" % where, "is %d but 'generation.%s' has only reached %d: the "
                    "record contradicts itself; %s" % (number, kind, counter, DAMAGED))


def _validate_launch_params(name: str, instances: Dict[str, Any]) -> None:
    for _key, where, entry in _entries(name, "instances", instances):
        if "launched" in entry and not isinstance(entry["launched"], bool):
            raise _fail(name, "'%s.launched'" % where, "must be true or false, got %s" % _kind(entry["launched"]))
        for key in ("hostname", "build", "launched_run"):
            if entry.get(key) is not None and not isinstance(entry[key], str):
                raise _fail(name, "'%s.%s'" % (where, key), "must be a string, got %s" % _kind(entry[key]))
        if entry.get("mounts") is not None:
            _expect_list(name, "'%s.mounts'" % where, entry["mounts"])
            for index, mount in enumerate(entry["mounts"]):
                _expect_mapping(name, "'%s.mounts[%d]'" % (where, index), mount)


def _validate_storage_state(name: str, storages: Dict[str, Any]) -> None:
    for _key, where, entry in _entries(name, "storages", storages):
        state = entry.get("state")
        if state not in STORAGE_STATES:
            raise _fail(name, "'%s.state'" % where, "must be one of %s, got %r"
                        % ("|".join(STORAGE_STATES), state))
        if "generation" in entry:
            _expect_int(name, "'%s.generation'" % where, entry["generation"])
            if entry["generation"] < 1:
                raise _fail(name, "'%s.generation'" % where, "must be 1 or more, got %d" % entry["generation"])
        if "facts" in entry:
            _expect_mapping(name, "'%s.facts'" % where, entry["facts"])
        if "history" in entry:
            _expect_list(name, "'%s.history'" % where, entry["history"])


def _validate_pins(name: str, data: Dict[str, Any]) -> None:
    for key, build in data["instances"].items():
        if not isinstance(key, str) or not isinstance(build, str):
            raise _fail(name, "'instances.%s'" % key, "must map an instance name to an AMI id "
                        "string, got %s" % _kind(build))
    for _entry in _entries(name, "pending_replacements", data["pending_replacements"]):
        pass


def _validate_name_map(name: str, top: str, value: Dict[str, Any]) -> None:
    for _entry in _entries(name, top, value):
        pass


_DEEP: Dict[str, Callable[[str, Dict[str, Any]], None]] = {
    "launch-params.yaml": lambda n, d: _validate_launch_params(n, d["instances"]),
    "instance-state.yaml": lambda n, d: _validate_instance_state(n, d["instances"]),
    "pins.yaml": _validate_pins,
    "storage-state.yaml": lambda n, d: _validate_storage_state(n, d["storages"]),
    "storage.yaml": lambda n, d: _validate_name_map(n, "storages", d["storages"]),
}


def validate(name: str, data: Any) -> Dict[str, Any]:
    """Check ``data`` against the shape of file ``name``; return it with missing keys filled.

    ``None`` (an empty document) is the empty shape. Unknown extra top-level keys are
    kept as they are (forward compatible). Raises :class:`MetaStateError`.
    """
    _check_name(name)
    if data is None:
        return empty(name)
    if not isinstance(data, dict):
        raise _fail(name, "", "the document must be a mapping, got %s" % _kind(data))
    out = dict(data)
    for key, kind in FILES[name]:
        value = out.get(key)
        if value is None:
            out[key] = kind()
        elif not isinstance(value, kind):
            raise _fail(name, "top-level key '%s'" % key,
                        "must be a %s, got %s" % (_KIND_NAMES[kind], _kind(value)))
    deep = _DEEP.get(name)
    if deep is not None:
        deep(name, out)
    return out


# ---------------------------------------------------------------------------
# cross-file invariants
# ---------------------------------------------------------------------------

#: what every refusal of files that contradict each other adds
CONTRADICT = ("the files contradict each other (one was cut short, replaced by an older copy or edited); "
              "nothing is read from them or written to them until they are restored from the same backup "
              "(or version control) or corrected by hand")


def _summary(name: str, data: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """What the cross-file invariants need of a file (``data`` None: the file does not exist)."""
    if data is None:
        return {"present": False}
    out: Dict[str, Any] = {"present": True}
    if name == "launch-params.yaml":
        out["records"] = set(data["instances"])
        out["launched"] = {n for n, r in data["instances"].items() if r.get("launched") is True}
    elif name == "instance-state.yaml":
        out["open"] = {n: (e["current"].get("number"), e["current"].get("instance_id"))
                       for n, e in data["instances"].items() if e.get("current")}
    elif name == "pins.yaml":
        out["pinned"] = set(data["instances"])
        out["pending"] = set(data["pending_replacements"])
    elif name == "storage-state.yaml":
        out["states"] = {n: r.get("state") for n, r in data["storages"].items()}
    elif name == "storage.yaml":
        out["states"] = {n: r.get("current_state") for n, r in data["storages"].items()}
    return out


def _open_generations_are_launched(s: Mapping[str, Dict[str, Any]]) -> List[str]:
    lp, ist = s["launch-params.yaml"], s["instance-state.yaml"]
    out = []
    for inst, (number, iid) in sorted((ist.get("open") or {}).items()):
        if inst in (lp.get("launched") or ()):
            continue
        what = ("records '%s' as not launched" % inst if inst in (lp.get("records") or ())
                else "has no launch record of '%s'" % inst)
        out.append("%s: 'instances.%s.current' is an open generation (number %s, instance %s) but %s %s"
                   % (_label("instance-state.yaml"), inst, number, iid or "unknown",
                      _label("launch-params.yaml"), what))
    return out


def _pins_are_launched(s: Mapping[str, Dict[str, Any]]) -> List[str]:
    lp, pins = s["launch-params.yaml"], s["pins.yaml"]
    out = ["%s: 'instances.%s' pins an image but %s has no launch record of '%s'"
           % (_label("pins.yaml"), inst, _label("launch-params.yaml"), inst)
           for inst in sorted((pins.get("pinned") or set()) - (lp.get("records") or set()))]
    out += ["%s: 'pending_replacements.%s' asks to replace an instance %s does not record as launched"
            % (_label("pins.yaml"), inst, _label("launch-params.yaml"))
            for inst in sorted((pins.get("pending") or set()) - (lp.get("launched") or set()))]
    return out


def _read_model_matches(s: Mapping[str, Dict[str, Any]]) -> List[str]:
    records, model = s["storage-state.yaml"], s["storage.yaml"]
    if not model.get("present"):
        return []  # never written yet: nothing to compare
    states, listed = records.get("states") or {}, model.get("states") or {}
    out = []
    for st, cur in sorted(listed.items()):
        if st not in states:
            out.append("%s: has no record of storage '%s', but its read-model %s lists it (%s)"
                       % (_label("storage-state.yaml"), st, _label("storage.yaml"), cur))
        elif states[st] != cur:
            out.append("%s: 'storages.%s.state' is %r but its read-model %s says %r"
                       % (_label("storage-state.yaml"), st, states[st], _label("storage.yaml"), cur))
    out += ["%s: 'storages.%s' is recorded but missing from its read-model %s"
            % (_label("storage-state.yaml"), st, _label("storage.yaml"))
            for st in sorted(set(states) - set(listed))]
    return out


#: (the files an invariant relates, the subject first, the check returning one message per
#: contradiction, each naming the subject first): :meth:`MetaState.load` of the subject runs it
INVARIANTS: Tuple[Tuple[Tuple[str, ...], Callable[[Mapping[str, Dict[str, Any]]], List[str]]], ...] = (
    (("instance-state.yaml", "launch-params.yaml"), _open_generations_are_launched),
    (("pins.yaml", "launch-params.yaml"), _pins_are_launched),
    (("storage-state.yaml", "storage.yaml"), _read_model_matches),
)


def _related(files: Tuple[str, ...], wanted: Iterable[str], subject_only: bool) -> bool:
    return bool(set(wanted) & ({files[0]} if subject_only else set(files)))


def partners(names: Iterable[str], subject_only: bool = False) -> List[str]:
    """The files the invariants relate to any of ``names`` (``names`` included), sorted;
    ``subject_only``: only the invariants whose subject is one of ``names``."""
    out = set(names)
    for files, _check in INVARIANTS:
        if _related(files, names, subject_only):
            out.update(files)
    return sorted(out)


def _contradictions(summaries: Mapping[str, Dict[str, Any]], involving: Iterable[str],
                    subject_only: bool = False) -> List[str]:
    wanted = list(involving)
    out: List[str] = []
    for files, check in INVARIANTS:
        if _related(files, wanted, subject_only):
            out += check(summaries)
    return out


def contradictions(files: Mapping[str, Optional[Mapping[str, Any]]]) -> List[str]:
    """The contradictions between meta-state files given as ``{name: validated data or None (missing)}``
    (a related file not given counts as missing, see :func:`partners`); one message each."""
    summaries = {name: _summary(name, files.get(name)) for name in partners(files)}
    return _contradictions(summaries, files)


# ---------------------------------------------------------------------------
# secrets
# ---------------------------------------------------------------------------

_SECRET_VALUE_PATTERNS = (
    ("an AWS access key id", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])")),
    ("a private key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----")),
    ("an AWS session token", re.compile(r"(?:FwoGZXIvYXdz|IQoJb3JpZ2luX2Vj)[A-Za-z0-9/+=]{20,}")),
)
# a 40-character base64 word with upper, lower case and a digit: the shape of an AWS
# secret access key (hex digests are lower case, so git/sha ids do not match)
_AWS_SECRET_RE = re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_SECRET_KEY_RE = re.compile(r"secret|password|passwd|token", re.IGNORECASE)


def _looks_like_aws_secret(text: str) -> bool:
    for match in _AWS_SECRET_RE.finditer(text):
        word = match.group(0)
        if (any(c.isupper() for c in word) and any(c.islower() for c in word)
                and any(c.isdigit() for c in word)):
            return True
    return False


def find_secrets(data: Any, path: str = "") -> List[str]:
    """Return ``"<path>: <what>"`` for every secret-shaped value in ``data`` (values never echoed)."""
    found: List[str] = []

    def scan_text(where: str, text: str) -> None:
        for what, rx in _SECRET_VALUE_PATTERNS:
            if rx.search(text):
                found.append("%s: looks like %s" % (where or "<document>", what))
                return
        if _looks_like_aws_secret(text):
            found.append("%s: looks like an AWS secret access key" % (where or "<document>"))

    def walk(where: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                sub_where = "%s.%s" % (where, key) if where else str(key)
                if isinstance(key, str):
                    scan_text(sub_where + " (key)", key)
                    if _SECRET_KEY_RE.search(key) and isinstance(sub, str) and sub.strip():
                        found.append("%s: a non-empty value under a secret-named key" % sub_where)
                        continue
                walk(sub_where, sub)
        elif isinstance(value, list):
            for index, sub in enumerate(value):
                walk("%s[%d]" % (where, index), sub)
        elif isinstance(value, str):
            scan_text(where, value)

    walk(path, data)
    return found


# ---------------------------------------------------------------------------
# serialization
# ---------------------------------------------------------------------------

def _plain(name: str, where: str, value: Any) -> Any:
    """Deep copy ``value`` as plain data; datetimes become ISO strings, tuples lists."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, Mapping):
        out = {}
        for key, sub in value.items():
            if not isinstance(key, str):
                raise _fail(name, "'%s'" % where if where else "",
                            "has a non-string key %r (%s)" % (key, _kind(key)))
            out[key] = _plain(name, "%s.%s" % (where, key) if where else key, sub)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(name, "%s[%d]" % (where, i), sub) for i, sub in enumerate(value)]
    if isinstance(value, str):  # str subclasses (e.g. tagged strings)
        return str(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    raise _fail(name, "'%s'" % where if where else "",
                "holds a %s; meta-state holds only plain data" % type(value).__name__)


def dumps(data: Mapping[str, Any]) -> str:
    """The deterministic text of a meta-state file (header line + sorted YAML + end line; the same
    options as ``yaml.safe_dump(data, sort_keys=True, default_flow_style=False)``)."""
    return HEADER + yaml.dump(data, Dumper=meta_dumper(), sort_keys=True, default_flow_style=False) + FOOTER


def _whole(name: str, text: str, size: int) -> None:
    """Refuse a file csis.infra wrote (:data:`HEADER`) that lacks its end line, or has two."""
    if not text.startswith(HEADER):
        return  # written before the end line existed (LEGACY_HEADER), or by hand: parsed as it is
    if not text.endswith(FOOTER):
        raise MetaStateError("%s: is incomplete: it stops at byte %d without its end line %r, so it was cut "
                             "short (a crash, a full disk, a partial copy); %s"
                             % (_label(name), size, FOOTER.strip(), DAMAGED))
    if text.count(FOOTER) != 1 or text.count(HEADER) != 1:
        raise MetaStateError("%s: holds more than one file's text (%d header and %d end lines); %s"
                             % (_label(name), text.count(HEADER), text.count(FOOTER), DAMAGED))


def _parse(name: str, text: str) -> Any:
    try:
        return yaml.load(text, Loader=meta_loader())  # noqa: S506 - a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = (" at line %d, column %d" % (mark.line + 1, mark.column + 1)) if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise MetaStateError("%s: YAML syntax error%s: %s" % (_label(name), line, problem)) from exc
    except yaml.YAMLError as exc:
        raise MetaStateError("%s: YAML error: %s" % (_label(name), exc)) from exc
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # PyYAML's constructors raise these on a tagged value they cannot build (`!!int x`)
        raise MetaStateError("%s: YAML value that cannot be read: %s; %s"
                             % (_label(name), str(exc) or type(exc).__name__, DAMAGED)) from exc


# ---------------------------------------------------------------------------
# locking
# ---------------------------------------------------------------------------

_held = threading.local()


def _held_set() -> set:
    held = getattr(_held, "dirs", None)
    if held is None:
        held = _held.dirs = set()
    return held


def _default_what() -> str:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return argv0 or "python"


#: Linux FS_IOC_GETFLAGS (_IOR('f', 1, long)) and the flags that stop a rename over a file
_FS_IOC_GETFLAGS = 0x80086601 if sys.maxsize > 2 ** 32 else 0x80046601
_FS_IMMUTABLE_OR_APPEND = 0x00000010 | 0x00000020


def _immutable(path: str) -> bool:
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


class _Lock:
    """Exclusive ``flock`` on ``<dir>/.lock``; the holder describes itself in the file."""

    def __init__(self, directory: str, timeout: float, what: str, poll: float = 0.05) -> None:
        self.path = os.path.join(directory, LOCK_NAME)
        self.timeout = timeout
        self.what = what
        self.poll = poll
        self.fd: Optional[int] = None

    def _holder(self) -> str:
        try:
            with open(self.path, "r", encoding="utf-8") as handle:
                info = json.loads(handle.read() or "{}")
        except (OSError, ValueError):
            info = {}
        return "pid %s on host %s since %s (%s)" % (
            info.get("pid", "?"), info.get("host", "?"), info.get("since", "?"),
            info.get("what", "unknown"))

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise MetaStateError("%s: cannot open the lock file: %s"
                                 % (_label(LOCK_NAME), exc.strerror or exc)) from exc
        deadline = time.monotonic() + max(0.0, self.timeout)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        raise MetaStateError("%s: cannot lock: %s" % (_label(LOCK_NAME), exc)) from exc
                if time.monotonic() >= deadline:
                    raise MetaStateError(
                        "%s: meta-state is locked by %s; another csis.infra run is writing "
                        "this tree. Wait for it, or if that process is gone the lock frees "
                        "itself" % (_label(LOCK_NAME), self._holder()))
                time.sleep(self.poll)
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "what": self.what,
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info, sort_keys=True) + "\n").encode("utf-8"), 0)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

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


# ---------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------

def _signature(st: os.stat_result) -> Tuple[int, int, int, int, int]:
    """What changes whenever a file is replaced (atomic rename: a new inode) or rewritten."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_fsync_dir = fsync_dir
_write_atomic = write_atomic


class MetaState:
    """The meta-state tree of one configuration root.

    >>> ms = MetaState("/path/to/config")
    >>> ms.load("launch-params.yaml")["instances"]          # no lock, whole files only
    >>> with ms.transaction("csis.infra.site / record launch") as txn:
    ...     data = txn.load("launch-params.yaml")           # fresh read under the lock
    ...     data["instances"]["web"]["launched"] = True
    ...     txn.save("launch-params.yaml", data)             # written on normal exit
    """

    def __init__(self, config_root: str, lock_timeout: float = 120.0) -> None:
        self.config_root = os.path.abspath(os.path.expanduser(str(config_root)))
        self.dir = os.path.join(self.config_root, META_STATE_DIR)
        self.lock_timeout = float(lock_timeout)
        # name -> (file signature, what the invariants need of it): a file is parsed once per
        # object as long as it is not replaced; the records returned are always read afresh
        self._summaries: Dict[str, Tuple[Any, Dict[str, Any]]] = {}

    def path(self, name: str) -> str:
        """Absolute path of meta-state file ``name`` (which must be a known file)."""
        _check_name(name)
        return os.path.join(self.dir, name)

    def _read_bytes(self, name: str) -> Optional[bytes]:
        return self._read(name)[0]

    def _read(self, name: str) -> Tuple[Optional[bytes], Any]:
        """(the bytes of file ``name`` or None when it does not exist, its signature)."""
        try:
            with open(self.path(name), "rb") as handle:
                raw = handle.read()
                return raw, _signature(os.fstat(handle.fileno()))
        except FileNotFoundError:
            return None, None
        except IsADirectoryError as exc:
            raise MetaStateError("%s: is a directory, not a file" % _label(name)) from exc
        except OSError as exc:
            raise MetaStateError("%s: cannot read: %s" % (_label(name), exc.strerror or exc)) from exc

    def _decode(self, name: str, raw: Optional[bytes]) -> Dict[str, Any]:
        """The validated records of one file's bytes (None: a missing file, the empty shape)."""
        if raw is None:
            return empty(name)
        if not raw.strip():
            raise MetaStateError("%s: is empty (%d bytes), but csis.infra never writes an empty meta-state "
                                 "file: it was truncated or emptied; %s (or removed, if this tree really "
                                 "has no such records)" % (_label(name), len(raw), DAMAGED))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MetaStateError("%s: not UTF-8 text (byte %d)" % (_label(name), exc.start)) from exc
        _whole(name, text, len(raw))
        doc = _parse(name, text)
        if doc is None:
            raise MetaStateError("%s: holds no records, only comments, but csis.infra never writes such a "
                                 "file: it was truncated or emptied; %s (or removed, if this tree really "
                                 "has no such records)" % (_label(name), DAMAGED))
        return validate(name, doc)

    def _load_one(self, name: str) -> Tuple[Dict[str, Any], Optional[bytes]]:
        raw, sig = self._read(name)
        data = self._decode(name, raw)
        self._summaries[name] = (sig, _summary(name, data if raw is not None else None))
        return data, raw

    def _summary_of(self, name: str, fresh: bool = False) -> Dict[str, Any]:
        if not fresh:
            try:
                sig = _signature(os.stat(self.path(name)))
            except FileNotFoundError:
                sig = None
            except OSError:
                sig = False  # unknown: read it (and report why it cannot be read)
            cached = self._summaries.get(name)
            if cached is not None and sig is not False and cached[0] == sig:
                return cached[1]
        self._load_one(name)
        return self._summaries[name][1]

    def _contradiction(self, name: str, fresh: bool = False) -> List[str]:
        summaries = {other: (self._summaries[name][1] if other == name else self._summary_of(other, fresh))
                     for other in partners([name], subject_only=True)}
        return _contradictions(summaries, [name], subject_only=True)

    @contextlib.contextmanager
    def _readers_lock(self) -> Iterator[None]:
        """A shared ``flock`` on the lock file: no transaction commits while it is held (a
        lock-free read can fall between two files of one commit). Best effort: a tree whose
        lock file cannot be opened or locked (read-only, another thread's transaction) is
        read as it is."""
        fd: Optional[int] = None
        if self.dir not in _held_set():
            try:
                fd = os.open(os.path.join(self.dir, LOCK_NAME), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                fd = None
        try:
            if fd is not None:
                deadline = time.monotonic() + min(self.lock_timeout, 30.0)
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                        break
                    except OSError as exc:
                        if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK) \
                                or time.monotonic() >= deadline:
                            break
                    time.sleep(0.05)
            yield
        finally:
            if fd is not None:
                os.close(fd)

    def load_checked(self, name: str) -> Tuple[Dict[str, Any], Optional[bytes]]:
        """(the records of ``name``, the bytes they were read from): :meth:`load` for the transaction."""
        data, raw = self._load_one(name)
        if self._contradiction(name):
            # a commit may have replaced one file and not yet the other: look again while none runs
            with self._readers_lock():
                data, raw = self._load_one(name)
                found = self._contradiction(name, fresh=True)
            if found:
                raise MetaStateError("%s; %s" % (found[0], CONTRADICT))
        return data, raw

    def load(self, name: str) -> Dict[str, Any]:
        """Read, validate and return file ``name`` (a fresh object; a missing file -> empty shape).

        Raises :class:`MetaStateError` naming the file when it is not whole (empty, cut short,
        not YAML, the wrong shape) or contradicts the files it relates to (:data:`INVARIANTS`).
        """
        return self.load_checked(name)[0]

    def exists(self, name: str) -> bool:
        return os.path.isfile(self.path(name))

    def check_writable(self, what: Optional[str] = None) -> Dict[str, Any]:
        """Prove that a transaction could write here, writing nothing that stays.

        An existing meta-state directory: a probe file is created, fsynced and removed in it,
        the store's lock is taken and released (``lock_timeout``; the lock file is the store's
        own, kept as after any transaction) and no existing file is immutable (Linux
        ``chattr +i``/``+a``: an atomic replace could not rename over it). A missing one: the
        same probe in a temporary directory made and removed in the configuration root (where
        the first transaction creates it). Raises :class:`NotWritable` naming the directory
        (:class:`MetaStateError` when the lock cannot be taken).
        Returns ``{path, exists}``.
        """
        exists = os.path.isdir(self.dir)
        if not exists and os.path.lexists(self.dir):
            raise NotWritable("%s: %s is not a directory, so nothing can be recorded there"
                              % (META_STATE_DIR, self.dir))
        try:
            if exists:
                self._probe(self.dir)
            else:
                probe_dir = tempfile.mkdtemp(prefix=".%s-probe." % META_STATE_DIR, dir=self.config_root)
                try:
                    self._probe(probe_dir)
                finally:
                    os.rmdir(probe_dir)
        except OSError as exc:
            where = self.dir if exists else "%s (it does not exist yet and cannot be created in %s)" % (
                self.dir, self.config_root)
            raise NotWritable("%s: the directory %s cannot be written: %s"
                              % (META_STATE_DIR, where, exc.strerror or exc)) from exc
        if exists:
            for name in sorted(FILES):
                path = self.path(name)
                if os.path.isfile(path) and _immutable(path):
                    raise NotWritable("%s: %s is immutable or append-only (chattr), so it cannot be replaced"
                                      % (_label(name), path))
            lock = _Lock(self.dir, self.lock_timeout, what or _default_what())
            lock.acquire()
            lock.release()
        return {"path": self.dir, "exists": exists}

    @staticmethod
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

    @contextlib.contextmanager
    def transaction(self, what: Optional[str] = None) -> Iterator["Transaction"]:
        """Hold the meta-state lock; write the files saved in it when the block exits normally.

        ``what`` describes the writer (playbook, module) for the lock-holder message.
        Raises :class:`MetaStateError` if the lock is not obtained within ``lock_timeout``
        seconds, or on a nested transaction on the same tree in the same thread.
        """
        held = _held_set()
        if self.dir in held:
            raise MetaStateError("%s: a transaction on this meta-state is already open in this "
                                 "thread; nest the work inside it instead" % _label(LOCK_NAME))
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as exc:
            raise MetaStateError("%s: cannot create the directory: %s"
                                 % (META_STATE_DIR, exc.strerror or exc)) from exc
        lock = _Lock(self.dir, self.lock_timeout, what or _default_what())
        lock.acquire()
        held.add(self.dir)
        try:
            txn = Transaction(self)
            yield txn
            txn._commit()
        finally:
            held.discard(self.dir)
            lock.release()


class Transaction:
    """Reads and pending writes of one :meth:`MetaState.transaction`."""

    def __init__(self, ms: MetaState) -> None:
        self._ms = ms
        self._pending: Dict[str, Tuple[Dict[str, Any], bytes]] = {}
        self._seen: Dict[str, Optional[bytes]] = {}
        self._open = True
        self.written: List[str] = []

    @property
    def meta_state(self) -> MetaState:
        return self._ms

    def load(self, name: str) -> Dict[str, Any]:
        """File ``name`` as saved earlier in this transaction, else freshly read from disk."""
        _check_name(name)
        if name in self._pending:
            return copy.deepcopy(self._pending[name][0])
        data, raw = self._ms.load_checked(name)
        self._seen[name] = raw
        return data

    def save(self, name: str, data: Mapping[str, Any]) -> None:
        """Validate, scan and stage ``data`` as the new content of ``name``.

        Raises :class:`MetaStateError` (and stages nothing) on a wrong shape, non-plain
        data or secret-shaped values. The file is written when the transaction exits.
        """
        if not self._open:
            raise MetaStateError("%s: the transaction is closed" % _label(name))
        _check_name(name)
        plain = _plain(name, "", data)
        checked = validate(name, plain)
        secrets = find_secrets(checked)
        if secrets:
            raise MetaStateError("%s: refusing to write secret-shaped data (nothing secret is "
                                 "ever written in clear): %s" % (_label(name), "; ".join(secrets)))
        self._pending[name] = (checked, dumps(checked).encode("utf-8"))

    def _commit(self) -> List[str]:
        """Write every staged file whose bytes changed; return the names written."""
        self._open = False
        written: List[str] = []
        currents: Dict[str, Optional[bytes]] = {}
        for name in self._pending:
            # a file replaced here must be whole now: a damaged file is never overwritten silently
            current = currents[name] = self._ms._read_bytes(name)
            if name not in self._seen or self._seen[name] != current:
                self._ms._decode(name, current)
        # under the lock: a file read in this transaction (same signature) is not parsed again
        view = {name: (_summary(name, self._pending[name][0]) if name in self._pending
                       else self._ms._summary_of(name))
                for name in partners(self._pending)}
        found = _contradictions(view, self._pending)
        if found:
            raise MetaStateError("%s: the files would contradict each other after this change, so nothing "
                                 "was written" % found[0])
        for name, (data, payload) in self._pending.items():
            current = currents[name]
            if current == payload:
                continue
            if current is None and data == empty(name):
                continue  # a missing file already reads as the empty shape
            try:
                _write_atomic(self._ms.path(name), payload)
            except OSError as exc:
                raise MetaStateError("%s: cannot write: %s (written before it in this "
                                     "transaction: %s)" % (_label(name), exc.strerror or exc,
                                                           ", ".join(written) or "none")) from exc
            written.append(name)
        self.written = written
        return written


# ---------------------------------------------------------------------------
# helpers for other code
# ---------------------------------------------------------------------------

def launched_instances(ms: MetaState) -> Dict[str, Dict[str, Any]]:
    """The launched instances: ``launch-params.yaml`` records with ``launched: true``.

    Each value is a copy of the launch-params record with three more keys:

    * ``name``: the declared instance name (the key);
    * ``current``: the open generation from ``instance-state.yaml``
      (``{number, kind, instance_id, private_ip, ami_id, availability_zone, ...}``)
      or ``None`` when no generation is recorded yet;
    * ``generation``: the generation counters ``{durable, ephemeral}`` (zeros if unknown).

    Ordered by name.
    """
    params = ms.load("launch-params.yaml")["instances"]
    states = ms.load("instance-state.yaml")["instances"]
    out: Dict[str, Dict[str, Any]] = {}
    for name in sorted(params):
        record = params[name]
        if record.get("launched") is not True:
            continue
        state = states.get(name) or {}
        joined = dict(record)
        joined["name"] = name
        joined["current"] = state.get("current")
        gen = state.get("generation") or {}
        joined["generation"] = {"durable": gen.get("durable", 0), "ephemeral": gen.get("ephemeral", 0)}
        out[name] = joined
    return out
