# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Meta-state: what applies did, as records in a store (:mod:`.backends`: ``local`` under
``<config root>/meta-state/`` by default, or ``s3`` in an S3 state backend's bucket).

This module is the one place meta-state is read and written (docs/meta-state.md).

* **Files and records.** Callers see *files* (:data:`FILES`: ``launch-params.yaml`` ->
  ``{"instances": {...}}``). The files keyed by instance, storage or root name (:data:`KEYED`)
  are kept as one object per record, ``<stem>/<name>.yaml`` (``launch-params/web.yaml``), each
  a whole file holding that one record; the others (pins, verifications, lineage, runs) stay
  whole files (and ``drift.yaml``, the last state query's HARD lines). :meth:`MetaState.load` assembles a file from its records; a file from before
  the per-record layout (``launch-params.yaml`` itself) is read as it is while it exists, and
  the first transaction that writes it migrates it (its records written, then it is removed).
* **Reads** (:meth:`MetaState.load`) take no lock. Every object is replaced atomically, so a
  reader sees an old or a new object, never half of one; and a reader that fell inside a commit
  reads again (:meth:`MetaState._stable`), so it never returns some of a commit's objects new
  and others old (unless that commit crashed). A record is parsed once per version
  (file identity/size/times, S3 ETag): readers keep what they parsed in memory and, from
  :data:`CACHE_MIN` records up, in a cache file (:func:`~.backends.cache_home`).
* **Writes** happen only inside :meth:`MetaState.transaction`, under the store's lock (local:
  an exclusive ``flock`` on ``meta-state/.lock`` that dies with its holder; S3: a lock object
  created with ``IfNoneMatch``, expiring unless renewed). A second writer waits up to
  ``lock_timeout`` (``CSIS_LOCK_TIMEOUT``, 600 s by default), then fails naming the holder.
  On a normal exit the transaction writes only the records (and whole files) whose content
  changed, each conditioned on the version read (``IfMatch``; a missing one: ``IfNoneMatch``),
  so a writer whose base moved is refused (:class:`~.backends.Conflict`) and never overwrites;
  then the next revision (``revision.yaml``) and one audit record (``audit/<revision>.yaml``:
  who, what, the records changed with a short diff, before and after). If the block raises,
  nothing is written. :func:`audit_trail` and :func:`record_at` read the trail.
* Every file and record is validated on load and on save against its known shape
  (:data:`FILES`); errors raise :class:`MetaStateError` naming the file or record object.
* A damaged object is refused, never read as "no records" nor overwritten: one that is empty
  or holds only comments, or one csis.infra wrote (:data:`HEADER`) that lacks its end line
  (:data:`FOOTER`: it was cut short). Records that contradict each other (:data:`INVARIANTS`:
  an open generation without a launch record, a pin of an instance that is not launched,
  ``storage-state.yaml`` and its read-model disagreeing) are refused by :meth:`MetaState.load`
  of the invariant's subject file and by any transaction that would write such a contradiction
  (the invariants relate records of one name, so a commit checks the names it changes). A
  lock-free reader that sees a contradiction looks again (under a shared lock, locally) before
  it refuses.
* :meth:`MetaState.check_writable` proves, before a run plans anything, that a transaction
  could write here (a probe and the lock; nothing stays but the local lock file).
* ``save`` refuses secret-shaped data (AWS access keys, session tokens, private keys,
  non-empty values under ``*secret*``/``*password*``/``*token*`` keys).
* Values are plain data: mappings with string keys, lists, strings, ints, floats,
  bools and null. Timestamps are strings (ISO 8601); ``datetime``/``date`` values
  given to ``save`` are converted with ``isoformat()``, and YAML timestamps are read
  back as strings, never as ``datetime`` objects.

A transaction writes its objects one after the other, so a crash in the middle of the
commit (power loss) can leave some records new and others old, each one whole, and the
revision and audit record not yet written.

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import json
import re
import os
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from ..config.names import NAME_RE, mount_point_ok
from ..errors import printable
from ..fsutil import write_atomic
from ..yamlio import VALUE_ERRORS, meta_dumper, meta_loader, shape_problem, yaml
from .backends import (ABSENT, LOCK_NAME, META_STATE_DIR, Conflict, FileLock, LocalObjects, MetaStateError, NotWritable,
                       default_what, holder_text, immutable, lock_timeout_default, now_iso, open_objects, who)

__all__ = [
    "FILES",
    "FOOTER",
    "HEADER",
    "LOCK_NAME",
    "META_STATE_DIR",
    "STORAGE_STATES",
    "KEYED",
    "MetaState",
    "MetaStateError",
    "NotWritable",
    "Transaction",
    "audit_trail",
    "record_at",
    "contradictions",
    "dumps",
    "empty",
    "find_secrets",
    "launched_instances",
    "partners",
    "validate",
]

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
    "image-tests.yaml": (("builds", dict),),
    "lineage.yaml": (("builds", list),),
    "runs.yaml": (("runs", list),),
    # plan receipts and approvals per root key (apply/approvals.py)
    "plan-receipts.yaml": (("roots", dict),),
    # the last state query's HARD drift lines, where every checkout's preflight reads them (drift.py)
    "drift.yaml": (("hard", list),),
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


def _entries(name: str, top: str, value: Dict[str, Any],
             names: bool = True) -> Iterator[Tuple[str, str, Dict[str, Any]]]:
    """Yield (entry name, location label, entry) for a name -> record mapping. With ``names`` (the
    records of instances and storages) every key must be a record name, as a write requires: a
    key that could leave a folder or break a line is refused where it is read, not at the first write."""
    for key, entry in value.items():
        if not isinstance(key, str):
            raise _fail(name, "", "key %r under '%s' must be a string, got %s" % (key, top, _kind(key)))
        if names and not NAME_RE.match(key):
            raise _fail(name, "'%s.%s'" % (top, key if key.isprintable() else repr(key)[1:-1]),
                        "is not a record name (letters, digits, '_', '.', '-', starting with a letter or digit, at "
                        "most 63 characters): no instance or storage has it; %s" % DAMAGED)
        where = "%s.%s" % (top, key)
        _expect_mapping(name, "'%s'" % where, entry)
        yield key, where, entry


def _expect_str(name: str, where: str, value: Any, pattern: Optional[Any] = None, what: str = "") -> None:
    """A string (and, with ``pattern``, one that matches it: ``what`` says what it must be)."""
    if not isinstance(value, str):
        raise _fail(name, where, "must be a string, got %s" % _kind(value))
    if pattern is not None and not pattern.match(value):
        raise _fail(name, where, "must be %s, got %r; %s" % (what, value, DAMAGED))


#: a recorded IPv4 or IPv6 address
ADDRESS_RE = re.compile(r"^(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3}|[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*)\Z")
#: an AMI id, as EC2 writes it
AMI_RE = re.compile(r"^ami-[0-9A-Za-z]{1,32}\Z")
#: a recorded hostname or alias (a host name in the inventory): a name's characters (a hostname is the
#: instance's name and its generation, ``<name>-001``: longer than a name may be)
HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}\Z")


#: the string fields of an open generation (null where unknown): what the recorder, the inventory and
#: the state query read from it and send to EC2
_CURRENT_STRINGS = ("instance_id", "ami_id", "availability_zone", "instance_type", "alias", "csis_config")


def _validate_instance_state(name: str, instances: Dict[str, Any]) -> None:
    for _key, where, entry in _entries(name, "instances", instances):
        gen = entry.get("generation")
        if "generation" in entry:
            _expect_mapping(name, "'%s.generation'" % where, gen)
            for kind in ("durable", "ephemeral"):
                if kind in gen:
                    _expect_int(name, "'%s.generation.%s'" % (where, kind), gen[kind])
        cur = entry.get("current")
        if cur is not None:
            _expect_mapping(name, "'%s.current'" % where, cur)
            _check_open_generation(name, where, cur, gen)
            for key in _CURRENT_STRINGS:
                if cur.get(key) is not None:
                    _expect_str(name, "'%s.current.%s'" % (where, key), cur[key])
            # the inventory's ansible_host (and the address an SSH unmount logs in to): an address, never
            # a word a connection plugin could take for an option
            for key in ("private_ip", "public_ip"):
                if cur.get(key) is not None:
                    _expect_str(name, "'%s.current.%s'" % (where, key), cur[key], ADDRESS_RE, "an IP address")
        if "history" in entry:
            _expect_list(name, "'%s.history'" % where, entry["history"])


def _check_open_generation(name: str, where: str, cur: Dict[str, Any], gen: Any) -> None:
    """An open generation: its kind, and a number its kind's counter has reached."""
    kind, number = cur.get("kind"), cur.get("number")
    if kind is not None and kind not in ("durable", "ephemeral"):
        raise _fail(name, "'%s.current.kind'" % where, "must be durable or ephemeral, got %r" % (kind,))
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise _fail(name, "'%s.current.number'" % where, "must be a generation number (1 or more), got %r" % (number,))
    counter = gen.get(kind) if isinstance(gen, dict) and kind else None
    if counter is not None and number > counter:
        raise _fail(name, "'%s.current.number'" % where, "is %d but 'generation.%s' has only reached %d: the "
                    "record contradicts itself; %s" % (number, kind, counter, DAMAGED))


#: the string fields of a launch record (null where unset)
_LAUNCH_STRINGS = ("build", "launched_run", "image", "group", "runtime", "builder", "machine_type", "region",
                   "session", "identity_type", "run", "user_data_sha256", "description")
#: the fields of a recorded mount and their checks (null where unset)
_MOUNT_STRINGS = ("type", "builder", "mount_point", "group", "share_mode", "device")


def _validate_launch_params(name: str, instances: Dict[str, Any]) -> None:
    for _key, where, entry in _entries(name, "instances", instances):
        for key in ("launched", "ephemeral"):
            if key in entry and not isinstance(entry[key], bool):
                raise _fail(name, "'%s.%s'" % (where, key), "must be true or false, got %s" % _kind(entry[key]))
        for key in _LAUNCH_STRINGS:
            if entry.get(key) is not None:
                _expect_str(name, "'%s.%s'" % (where, key), entry[key])
        for key in ("hostname", "alias"):
            if entry.get(key) is not None:
                _expect_str(name, "'%s.%s'" % (where, key), entry[key], HOST_RE, "a host name")
        if entry.get("tags") is not None:
            _expect_mapping(name, "'%s.tags'" % where, entry["tags"])
            for tag, value in entry["tags"].items():
                if not isinstance(tag, str) or not isinstance(value, str):
                    raise _fail(name, "'%s.tags'" % where, "must map strings to strings, got %r: %s" % (tag, _kind(value)))
        if entry.get("mounts") is not None:
            _expect_list(name, "'%s.mounts'" % where, entry["mounts"])
            for index, mount in enumerate(entry["mounts"]):
                at = "'%s.mounts[%d]" % (where, index)
                _expect_mapping(name, at + "'", mount)
                _expect_str(name, at + ".storage'", mount.get("storage"), NAME_RE, "a storage name")
                for key in _MOUNT_STRINGS:
                    if mount.get(key) is not None:
                        _expect_str(name, at + ".%s'" % key, mount[key])
                # it goes into the unmount's shell lines and /etc/fstab, as validation admits it from the tree
                if mount.get("mount_point") is not None and not mount_point_ok(mount["mount_point"]):
                    raise _fail(name, at + ".mount_point'", "must be an absolute path of plain names, got %r; %s"
                                % (mount["mount_point"], DAMAGED))
                if mount.get("public_read") is not None and not isinstance(mount["public_read"], bool):
                    raise _fail(name, at + ".public_read'", "must be true or false, got %s" % _kind(mount["public_read"]))


#: the string facts of a storage record (null where unknown): ids the state query sends to AWS, the
#: builder and type the validation resolves
_FACT_STRINGS = ("builder", "type", "volume_id", "file_system_id", "bucket_name", "archive", "availability_zone",
                 "csis_config")


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
            for key in _FACT_STRINGS:
                if entry["facts"].get(key) is not None:
                    _expect_str(name, "'%s.facts.%s'" % (where, key), entry["facts"][key])
        if "history" in entry:
            _expect_list(name, "'%s.history'" % where, entry["history"])


def _validate_pins(name: str, data: Dict[str, Any]) -> None:
    for key, build in data["instances"].items():
        if not isinstance(key, str):
            raise _fail(name, "'instances'", "must map instance names to AMI ids: the key %r is %s, not a name"
                        % (key, _kind(key)))
        if not isinstance(build, str):
            raise _fail(name, "'instances.%s'" % key, "must map an instance name to an AMI id "
                        "string, got %s" % _kind(build))
        if not NAME_RE.match(key):
            raise _fail(name, "'instances.%s'" % (key if key.isprintable() else repr(key)[1:-1]),
                        "is not a record name: no instance has it; %s" % DAMAGED)
        _expect_str(name, "'instances.%s'" % key, build, AMI_RE, "an AMI id (ami-<hex>)")
    for _entry in _entries(name, "pending_replacements", data["pending_replacements"]):
        pass


def _validate_image_tests(name: str, builds: Dict[str, Any]) -> None:
    for build, rec in builds.items():
        where = "builds.%s" % build
        if not isinstance(build, str) or not build:
            raise _fail(name, "builds", "keys must be build ids (non-empty strings), got %r" % (build,))
        _expect_mapping(name, where, rec)
        _expect_list(name, where + ".results", rec.get("results", []))
        for i, res in enumerate(rec.get("results") or []):
            _expect_mapping(name, "%s.results[%d]" % (where, i), res)


def _validate_receipts(name: str, roots: Dict[str, Any]) -> None:
    for _key, where, entry in _entries(name, "roots", roots, names=False):
        plans = entry.get("plans")
        if plans is not None:
            _expect_mapping(name, "%s.plans" % where, plans)
            for digest, receipt in plans.items():
                _expect_mapping(name, "%s.plans.%s" % (where, digest), receipt)
                if receipt.get("approvals") is not None:
                    _expect_list(name, "%s.plans.%s.approvals" % (where, digest), receipt["approvals"])
                    for i, approval in enumerate(receipt["approvals"]):
                        _expect_mapping(name, "%s.plans.%s.approvals[%d]" % (where, digest, i), approval)


#: the fields of a HARD drift line kept in ``drift.yaml`` (drift.py ``_line`` less ``hard``)
DRIFT_FIELDS = ("kind", "name", "drift", "detail")


def _validate_drift(name: str, data: Dict[str, Any]) -> None:
    for index, line in enumerate(data["hard"]):
        where = "'hard[%d]'" % index
        _expect_mapping(name, where, line)
        for field in DRIFT_FIELDS:
            if not isinstance(line.get(field), str) or not line[field]:
                raise _fail(name, "%s.%s" % (where, field), "must be a non-empty string, got %s" % _kind(line.get(field)))
    for key in ("run", "time"):
        if key in data and not isinstance(data[key], str):
            raise _fail(name, "top-level key '%s'" % key, "must be a string, got %s" % _kind(data[key]))


def _validate_storage_model(name: str, storages: Dict[str, Any]) -> None:
    """The storages' read-model: the attachments its readers and the recorder walk."""
    for _key, where, entry in _entries(name, "storages", storages):
        if entry.get("attachments") is not None:
            _expect_list(name, "'%s.attachments'" % where, entry["attachments"])
            for i, item in enumerate(entry["attachments"]):
                _expect_str(name, "'%s.attachments[%d]'" % (where, i), item)


def _validate_verifications(name: str, data: Dict[str, Any]) -> None:
    """Each verdict is a mapping whose ``ok`` is true or false (``"no"`` would not count as a failure)."""
    for index, verdict in enumerate(data["verifications"]):
        _expect_mapping(name, "'verifications[%d]'" % index, verdict)
        if not isinstance(verdict.get("ok"), bool):
            raise _fail(name, "'verifications[%d].ok'" % index, "must be true or false, got %s" % _kind(verdict.get("ok")))
        for key in ("instance", "build"):
            if verdict.get(key) is not None:
                _expect_str(name, "'verifications[%d].%s'" % (index, key), verdict[key])


_DEEP: Dict[str, Callable[[str, Dict[str, Any]], None]] = {
    "verifications.yaml": _validate_verifications,
    "launch-params.yaml": lambda n, d: _validate_launch_params(n, d["instances"]),
    "instance-state.yaml": lambda n, d: _validate_instance_state(n, d["instances"]),
    "pins.yaml": _validate_pins,
    "storage-state.yaml": lambda n, d: _validate_storage_state(n, d["storages"]),
    "storage.yaml": lambda n, d: _validate_storage_model(n, d["storages"]),
    "image-tests.yaml": lambda n, d: _validate_image_tests(n, d["builds"]),
    "plan-receipts.yaml": lambda n, d: _validate_receipts(n, d["roots"]),
    "drift.yaml": _validate_drift,
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


def not_plain(doc: Any) -> Optional[str]:
    """Why ``doc`` (a document the YAML loader built) is not plain data as csis.infra writes it -
    a value of another type (``!!binary``, ``!!set``) - or None. Iterative, and each node (an
    alias's too) is looked at once: no depth is too deep for it, and a YAML alias cycle, which
    :func:`~..yamlio.shape_problem` names, does not make it loop. (A key that is not a string is left
    to each file's validation, which names the record.)"""
    stack: List[Tuple[Tuple[Any, ...], Any]] = [((), doc)]
    seen: set = set()
    while stack:
        path, value = stack.pop()
        if value is None or type(value) in (str, int, float, bool):
            continue
        if type(value) not in (dict, list):
            where = "".join("[%d]" % p if isinstance(p, int) else (".%s" % p) for p in path).lstrip(".")
            shown = "'%s' " % where if where else ""
            return "%sholds a %s; meta-state holds only plain data" % (shown, type(value).__name__)
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            stack.extend((path + (key,), sub) for key, sub in value.items())
        else:
            stack.extend((path + (i,), sub) for i, sub in enumerate(value))
    return None


def _parse(name: str, text: str) -> Any:
    try:
        data = yaml.load(text, Loader=meta_loader())  # noqa: S506 - a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = (" at line %d, column %d" % (mark.line + 1, mark.column + 1)) if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise MetaStateError("%s: YAML syntax error%s: %s" % (_label(name), line, problem)) from exc
    except yaml.YAMLError as exc:
        raise MetaStateError("%s: YAML error: %s" % (_label(name), exc)) from exc
    except VALUE_ERRORS as exc:
        # PyYAML's constructors raise these on a tagged value they cannot build (`!!int x`)
        raise MetaStateError("%s: YAML value that cannot be read: %s; %s"
                             % (_label(name), str(exc) or type(exc).__name__, DAMAGED)) from exc
    shape = shape_problem(data, text) or not_plain(data)
    if shape:
        raise MetaStateError("%s: %s; %s" % (_label(name), shape, DAMAGED))
    return data


# ---------------------------------------------------------------------------
# layout: records, revisions, the audit trail
# ---------------------------------------------------------------------------

#: the files kept as one object per record (``<stem>/<key>.yaml``): file -> the key of its records
KEYED: Dict[str, str] = {
    "launch-params.yaml": "instances",
    "instance-state.yaml": "instances",
    "storage-state.yaml": "storages",
    "storage.yaml": "storages",
    "plan-receipts.yaml": "roots",
    # an instance's image pin is a record; the pending replacements and the upgrade log
    # (at most 200 entries) are the file's rest
    "pins.yaml": "instances",
}
#: in a record folder: the top-level keys of the file other than its records (pins' pending
#: replacements and upgrade log; any unknown key, forward compatible)
REST = "_rest.yaml"
#: the revision counter: ``{revision, time, what}`` of the last committed transaction
REVISION = "revision.yaml"
#: one audit record per committed revision: ``audit/<revision, 8 digits>.yaml``
AUDIT_DIR = "audit"
#: readers keep a copy of the records they parsed (keyed by version) from this many records up
CACHE_MIN = 256
_CACHE_FORMAT = 1
#: a short diff shows at most this many changed keys, each value cut at this many characters
DIFF_LINES, DIFF_WIDTH = 20, 80


def stem(name: str) -> str:
    """The record folder of a keyed file (``launch-params.yaml`` -> ``launch-params``)."""
    return name[:-len(".yaml")]


def record_object(name: str, key: str) -> str:
    """The object of record ``key`` of keyed file ``name``; refuses a key that is not a name
    (it could escape the folder)."""
    if name not in KEYED:
        raise MetaStateError("%s: is not kept per record (per-record files: %s)" % (_label(name), ", ".join(sorted(KEYED))))
    if not isinstance(key, str) or not NAME_RE.match(key):
        raise _fail(name, "'%s.%s'" % (KEYED[name], key), "is not a record name (letters, digits, '_', '.', '-', "
                    "starting with a letter or digit, at most 63 characters), so it cannot be stored")
    return "%s/%s.yaml" % (stem(name), key)


def rest_of(name: str, data: Mapping[str, Any]) -> Dict[str, Any]:
    """What keyed file ``name`` holds beside its records (its ``_rest.yaml``): every other
    top-level key, less the known ones that are empty."""
    known = dict(FILES[name])
    return {k: v for k, v in data.items()
            if k != KEYED[name] and not (k in known and isinstance(v, known[k]) and not v)}


def audit_object(revision: int) -> str:
    return "%s/%08d.yaml" % (AUDIT_DIR, revision)


def _committing(raw: Optional[bytes]) -> bool:
    """Whether a revision object is a commit's marker (``committing``: its records are being written)."""
    return raw is not None and b'"committing"' in raw


def _relabel(exc: MetaStateError, old: str, new: str) -> MetaStateError:
    text = str(exc)
    if old != new and text.startswith(old + ":"):
        text = new + text[len(old):]
    return MetaStateError(text)


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=True)


def _cut(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= DIFF_WIDTH else text[:DIFF_WIDTH - 3] + "..."


def short_diff(before: Any, after: Any, where: str = "") -> List[str]:
    """``path: old -> new`` lines for what differs (at most :data:`DIFF_LINES`)."""
    out: List[str] = []

    def walk(path: str, a: Any, b: Any) -> None:
        if len(out) > DIFF_LINES or a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b), key=str):
                walk("%s.%s" % (path, key) if path else str(key), a.get(key, _MISSING), b.get(key, _MISSING))
            return
        out.append("%s: %s -> %s" % (path or "<record>", "(none)" if a is _MISSING else _cut(a),
                                     "(none)" if b is _MISSING else _cut(b)))

    walk(where, before, after)
    if len(out) > DIFF_LINES:
        out = out[:DIFF_LINES] + ["..."]
    return out


class _Missing:
    def __repr__(self) -> str:
        return "(none)"


_MISSING = _Missing()

_held = threading.local()


def _held_set() -> set:
    held = getattr(_held, "dirs", None)
    if held is None:
        held = _held.dirs = set()
    return held


_Lock = FileLock
_immutable = immutable
_default_what = default_what


class _Read:
    """One read of a file: its data, whether it exists, and what a transaction needs to commit
    against it (the versions and texts of its records, or of the whole file)."""

    def __init__(self, data: Dict[str, Any], present: bool, raw: Optional[bytes] = None,
                 version: Optional[str] = None, legacy: bool = False,
                 versions: Optional[Dict[str, str]] = None, texts: Optional[Dict[str, str]] = None,
                 rest: Optional[Tuple[Optional[str], Dict[str, Any]]] = None) -> None:
        self.data = data
        self.present = present
        self.raw = raw
        self.version = version
        self.legacy = legacy
        self.versions = versions or {}
        self.texts = texts or {}
        self.rest = rest or (None, {})


class MetaState:
    """The meta-state of one configuration root, wherever it lives (:mod:`.backends`).

    >>> ms = MetaState("/path/to/config")
    >>> ms.load("launch-params.yaml")["instances"]          # no lock; the whole file's shape
    >>> with ms.transaction("csis.infra.site / record launch") as txn:
    ...     data = txn.load("launch-params.yaml")           # fresh read under the lock
    ...     data["instances"]["web"]["launched"] = True
    ...     txn.save("launch-params.yaml", data)             # only the changed records are written
    ...     rec = txn.load_record("instance-state.yaml", "web")  # one record: reads only it
    """

    def __init__(self, config_root: str, lock_timeout: Optional[float] = None, objects: Any = None,
                 migrate_local: bool = True) -> None:
        """``objects``: the backend (default: the one the tree at ``config_root`` declares);
        ``migrate_local=False``: an S3 store given without its tree, never read from (nor
        migrated from) ``<config_root>/meta-state/`` (:meth:`local_import`)."""
        self._migrate_local = migrate_local
        self.config_root = os.path.abspath(os.path.expanduser(str(config_root)))
        self.dir = os.path.join(self.config_root, META_STATE_DIR)
        self.lock_timeout = lock_timeout_default() if lock_timeout is None else float(lock_timeout)
        self._objects = objects
        # file -> record key -> (version, JSON text): a record is parsed once per version
        self._texts: Dict[str, Dict[str, Tuple[str, str]]] = {}
        self._disk_tried: set = set()
        #: file name -> whether record texts came from the parse cache on disk (checked once assembled)
        self._from_disk: Dict[str, bool] = {}

    # -- where -----------------------------------------------------------------
    @property
    def objects(self) -> Any:
        """The backend (read from the tree's ``meta_state`` setting on first use)."""
        if self._objects is None:
            self._objects = open_objects(self.config_root)
        return self._objects

    def open(self) -> Any:
        """The backend; raises :class:`MetaStateError` when the tree's ``meta_state`` setting is wrong."""
        return self.objects

    @property
    def backend(self) -> str:
        return self.objects.kind

    @property
    def where(self) -> str:
        return self.objects.where

    @property
    def notices(self) -> List[str]:
        """What happened on the way that a run should show (an expired lock broken)."""
        return self.objects.notices

    def path(self, name: str) -> str:
        """Absolute path of the whole file ``name`` in a local meta-state (for a keyed file: the
        pre-migration file, which is read instead of the records while it exists)."""
        _check_name(name)
        return os.path.join(self.dir, name)

    def record_path(self, name: str, key: str) -> str:
        """Absolute path of record ``key`` of keyed file ``name`` in a local meta-state."""
        return os.path.join(self.dir, *record_object(name, key).split("/"))

    def _label_of(self, rel: str) -> str:
        return self.objects.label(rel)

    # -- reading ---------------------------------------------------------------
    def _read_bytes(self, name: str) -> Optional[bytes]:
        return self.objects.get(name)[0]

    def _decode(self, name: str, raw: Optional[bytes], rel: Optional[str] = None) -> Dict[str, Any]:
        """The validated records of one object's bytes (None: a missing file, the empty shape);
        errors name the object (``rel``, default the file)."""
        try:
            return self._decode_named(name, raw)
        except MetaStateError as exc:
            new = self._label_of(rel or name)
            if new == _label(name):
                raise
            raise _relabel(exc, _label(name), new) from exc

    @staticmethod
    def _decode_named(name: str, raw: Optional[bytes]) -> Dict[str, Any]:
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

    def _decode_record(self, name: str, key: str, raw: bytes) -> Dict[str, Any]:
        rel = record_object(name, key)
        data = self._decode(name, raw, rel)
        top = KEYED[name]
        if list(data[top]) != [key] or rest_of(name, data):
            raise MetaStateError("%s: must hold exactly the record '%s.%s' and nothing else (it holds %s); %s"
                                 % (self._label_of(rel), top, key, ", ".join(
                                     ["%s.%s" % (top, k) for k in data[top]] + list(rest_of(name, data))) or "nothing",
                                    DAMAGED))
        return data[top][key]

    def _cached(self, name: str, count: int) -> Dict[str, Tuple[str, str]]:
        texts = self._texts.get(name)
        if texts is None:
            texts = self._texts[name] = {}
        if count >= CACHE_MIN and name not in self._disk_tried:
            self._disk_tried.add(name)
            try:
                with open(os.path.join(self.objects.cache_dir(), stem(name) + ".json"), "r", encoding="utf-8") as fh:
                    doc = json.load(fh)
                if doc.get("format") == _CACHE_FORMAT and isinstance(doc.get("records"), dict):
                    for key, (version, text) in doc["records"].items():
                        texts.setdefault(key, (version, text))
                    self._from_disk[name] = True
            except (OSError, ValueError, TypeError, AttributeError):
                pass
        return texts

    def _save_cache(self, name: str, texts: Dict[str, Tuple[str, str]]) -> None:
        """Best effort: a reader that cannot write its cache just parses again next time."""
        directory = self.objects.cache_dir()
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            write_atomic(os.path.join(directory, stem(name) + ".json"),
                         json.dumps({"format": _CACHE_FORMAT, "where": self.where,
                                     "records": {k: list(v) for k, v in texts.items()}}).encode("utf-8"), mode=0o600)
        except OSError:
            pass

    def _read_keyed(self, name: str) -> _Read:
        legacy_raw, legacy_version = self.objects.get(name)
        if legacy_raw is not None:
            # not migrated yet (or restored by hand): the whole file is what meta-state says
            data = self._decode(name, legacy_raw)
            return _Read(data, True, raw=legacy_raw, version=legacy_version, legacy=True)
        try:
            return self._read_records(name)
        except (ValueError, MetaStateError):
            if not self._from_disk.get(name):
                raise
            # the parse cache (derived data in the user's cache directory) was damaged: read every record again
            self._texts.pop(name, None)
            self._from_disk[name] = False
            return self._read_records(name)

    def _read_records(self, name: str) -> _Read:
        top = KEYED[name]
        listing = self.objects.listing(stem(name))
        known = self._cached(name, len(listing))
        texts: Dict[str, Tuple[str, str]] = {}
        rest: Tuple[Optional[str], Dict[str, Any]] = (None, {})
        parsed = 0
        for fname, version in listing.items():
            rel = "%s/%s" % (stem(name), fname)
            if fname == REST:
                raw, version = self.objects.get(rel)
                if raw is not None:
                    rest = (version, rest_of(name, self._decode(name, raw, rel)))
                continue
            key = fname[:-len(".yaml")]
            if not NAME_RE.match(key):
                raise MetaStateError("%s: is not a record file (a record is <name>.yaml, the name of an instance or "
                                     "storage); remove or rename it" % self._label_of(rel))
            hit = known.get(key)
            if hit is not None and hit[0] == version:
                texts[key] = hit
                continue
            raw, version = self.objects.get(rel)
            if raw is None:
                continue  # removed since the listing
            texts[key] = (version or "", _text(self._decode_record(name, key, raw)))
            parsed += 1
        self._texts[name] = texts
        if parsed and len(texts) >= CACHE_MIN:
            self._save_cache(name, texts)
        keys = sorted(texts)
        # one parse of every record's text (30,000 records: a third of the time of one parse each)
        data: Dict[str, Any] = {top: dict(zip(keys, json.loads("[%s]" % ",".join(texts[k][1] for k in keys))))}
        if self._from_disk.get(name):
            validate(name, data)  # texts from the parse cache on disk: checked as a parse would have
        data.update(copy.deepcopy(rest[1]))
        for other, kind in FILES[name]:
            data.setdefault(other, kind())
        return _Read(data, bool(texts) or rest[0] is not None,
                     versions={k: v for k, (v, _t) in texts.items()},
                     texts={k: t for k, (_v, t) in texts.items()}, rest=rest)

    def local_import(self) -> Optional["MetaState"]:
        """An S3 meta-state that has no revision yet, in a tree whose ``meta-state/`` holds files:
        the local meta-state it is read from until its first transaction imports it (None otherwise)."""
        if not self._migrate_local or self.objects.kind == "local" or self._revision()[0] > 0:
            return None
        local = MetaState(self.config_root, lock_timeout=self.lock_timeout, objects=LocalObjects(self.config_root))
        if local.objects.exists() and any(local.exists(name) for name in FILES):
            return local
        return None

    def _read_file(self, name: str, own: bool = False) -> _Read:
        if not own and self.objects.kind != "local":
            local = self.local_import()
            if local is not None:
                return local._read_file(name)
        if name in KEYED:
            return self._read_keyed(name)
        raw, version = self.objects.get(name)
        return _Read(self._decode(name, raw), raw is not None, raw=raw, version=version)

    def _contradiction(self, name: str, read: _Read) -> List[str]:
        summaries = {other: (_summary(name, read.data if read.present else None) if other == name
                             else self._summary_full(other))
                     for other in partners([name], subject_only=True)}
        return _contradictions(summaries, [name], subject_only=True)

    def _summary_full(self, name: str) -> Dict[str, Any]:
        read = self._read_file(name)
        return _summary(name, read.data if read.present else None)

    def _held(self) -> bool:
        return self.objects.where in _held_set()

    def _stable(self, read: Callable[[], Any]) -> Any:
        """``read()`` while no commit runs: the revision object is read before and after, and only
        a read between two identical revision objects that are not a commit's marker is returned
        (a commit replaces it by its marker before its first record and by the next revision after
        its last). Otherwise it waits for the writer and reads again: locally under a shared lock
        (no commit can run while it is held, so that read is whole), on S3 after a backoff. A
        marker left by a crashed commit is read through (its objects are each whole, some new, some
        old) once no lock is held *and* the marker is still there afterwards: a live writer that
        finished meanwhile has replaced it. A read that is still not whole after ``lock_timeout``
        (at most 60 s) is never returned: :class:`MetaStateError` says a commit is in progress."""
        if self._held():
            return read()
        started = time.monotonic()
        deadline = started + min(self.lock_timeout, 60.0)
        delay = 0.02
        local = self.objects.kind == "local"
        while True:
            before = self.objects.get(REVISION)[0]
            result = read()
            after = self.objects.get(REVISION)[0]
            if before == after:
                if not _committing(after):
                    return result
                # the lock first, then the marker again: a writer that ended between our last look
                # and the lock's release has already replaced its marker by the next revision
                if not self.objects.lock_held() and self.objects.get(REVISION)[0] == after:
                    return result
            if local:
                # a short wait, then an optimistic look again (between two commits the view is whole)
                with self.objects.read_barrier(min(1.0, max(0.0, deadline - time.monotonic())), False) as shared:
                    if shared:
                        return read()  # no commit runs while the shared lock is held
            if time.monotonic() >= deadline:
                raise MetaStateError(
                    "%s: a commit was in progress for all of the %.0f s this read waited (writer: %s), so no "
                    "whole view could be read and nothing half-written is returned; try again once it is done "
                    "(the lock of a killed writer frees itself)"
                    % (self._label_of(REVISION), time.monotonic() - started, self._writer()))
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _writer(self) -> str:
        """Who holds the transaction lock, as a message names it (best effort)."""
        try:
            raw = self.objects.get(LOCK_NAME)[0]
            return holder_text(json.loads(raw.decode("utf-8"))) if raw else "unknown"
        except (MetaStateError, ValueError, TypeError, AttributeError, UnicodeDecodeError):
            return "unknown"

    def _read_checked(self, name: str) -> _Read:
        read = self._stable(lambda: self._read_file(name))
        if self._contradiction(name, read):
            # a commit may have replaced one object and not yet the other: look again while none runs
            with self.objects.read_barrier(self.lock_timeout, self._held()):
                read = self._read_file(name)
                found = self._contradiction(name, read)
            if found:
                raise MetaStateError("%s; %s" % (found[0], CONTRADICT))
        return read

    def load_checked(self, name: str) -> Tuple[Dict[str, Any], Optional[bytes]]:
        """(the records of ``name``, the bytes of its whole file or None)."""
        _check_name(name)
        read = self._read_checked(name)
        return read.data, read.raw

    def load(self, name: str) -> Dict[str, Any]:
        """Read, validate and return file ``name`` (a fresh object; missing -> the empty shape),
        assembled from its records when it is kept per record.

        Raises :class:`MetaStateError` naming the file or record when it is not whole (empty, cut short,
        not YAML, the wrong shape) or contradicts the files it relates to (:data:`INVARIANTS`).
        """
        return self.load_checked(name)[0]

    def load_many(self, names: Iterable[str]) -> Dict[str, Dict[str, Any]]:
        """:meth:`load` of several files at once, each read once: ``{name: data}``. They are read
        between the same two looks at the revision (so they belong together), and the invariants
        of each are checked against the others' reads (a partner not among ``names`` is read for it)."""
        wanted = list(dict.fromkeys(names))
        for name in wanted:
            _check_name(name)

        def read_all() -> Dict[str, _Read]:
            return {name: self._read_file(name) for name in wanted}

        def found(reads: Mapping[str, _Read]) -> List[str]:
            summaries = {other: (_summary(other, reads[other].data if reads[other].present else None)
                                 if other in reads else self._summary_full(other))
                         for other in partners(wanted, subject_only=True)}
            return _contradictions(summaries, wanted, subject_only=True)

        reads = self._stable(read_all)
        if found(reads):
            # a commit may have replaced one object and not yet the other: look again while none runs
            with self.objects.read_barrier(self.lock_timeout, self._held()):
                reads = read_all()
                problems = found(reads)
            if problems:
                raise MetaStateError("%s; %s" % (problems[0], CONTRADICT))
        return {name: reads[name].data for name in wanted}

    def load_record(self, name: str, key: str) -> Optional[Dict[str, Any]]:
        """Record ``key`` of keyed file ``name`` (None when there is none), reading only it
        (the whole file while it is not migrated)."""
        rel = record_object(name, key)
        legacy = self.objects.get(name)[0]
        if legacy is not None:
            return self._decode(name, legacy)[KEYED[name]].get(key)
        raw = self.objects.get(rel)[0]
        return None if raw is None else self._decode_record(name, key, raw)

    def load_rest(self, name: str) -> Dict[str, Any]:
        """What keyed file ``name`` holds beside its records (``pins.yaml``: ``pending_replacements``
        and ``upgrades``), each known key present, reading only that object (the whole file while it
        is not migrated): a reader outside a transaction, as :meth:`Transaction.load_rest` is inside."""
        rel = "%s/%s" % (stem(name), REST)
        record_object(name, "rest")  # refuses a file that is not kept per record
        legacy = self.objects.get(name)[0]
        if legacy is not None:
            return _filled_rest(name, rest_of(name, self._decode(name, legacy)))
        raw = self.objects.get(rel)[0]
        return _filled_rest(name, {} if raw is None else rest_of(name, self._decode(name, raw, rel)))

    def exists(self, name: str) -> bool:
        _check_name(name)
        if self.objects.get(name)[0] is not None:
            return True
        return name in KEYED and bool(self.objects.listing(stem(name)))

    def revision(self) -> int:
        """The revision of the last committed transaction (0: none yet)."""
        return self._revision()[0]

    def _revision(self) -> Tuple[int, Optional[str]]:
        raw, version = self.objects.get(REVISION)
        if raw is None:
            return 0, None
        try:
            doc = json.loads(raw.decode("utf-8"))
            number = int(doc["revision"])
            if number < 0:
                raise ValueError(number)
            # a commit that crashed after its marker may have used the next number: never reuse it
            number = max(number, int(doc.get("committing") or 0))
        except (ValueError, KeyError, TypeError, OverflowError, UnicodeDecodeError) as exc:
            raise MetaStateError("%s: is not a revision record ({\"revision\": <number>, ...}); %s"
                                 % (self._label_of(REVISION), DAMAGED)) from exc
        return number, version

    # -- writing ---------------------------------------------------------------
    def check_writable(self, what: Optional[str] = None) -> Dict[str, Any]:
        """Prove that a transaction could write here, writing nothing that stays.

        Local: a probe file is created, fsynced and removed in ``meta-state/`` (in a temporary
        directory of the configuration root when it does not exist yet), no file or record folder
        is immutable (``chattr +i``/``+a``), the lock is taken and released. S3: the bucket
        answers and the lock object is created and removed. Raises :class:`NotWritable` naming
        the directory (:class:`MetaStateError` when the lock cannot be taken).
        Returns ``{path, exists}``.
        """
        names = sorted(FILES) + sorted(stem(n) for n in KEYED) + [AUDIT_DIR, REVISION]
        return self.objects.check_writable(self.lock_timeout, what or _default_what(), names)

    @contextlib.contextmanager
    def transaction(self, what: Optional[str] = None,
                    context: Optional[Mapping[str, Any]] = None) -> Iterator["Transaction"]:
        """Hold the meta-state lock; commit what was saved in it when the block exits normally.

        ``what`` describes the writer (playbook, module) for the lock-holder message and the
        audit record; ``context`` (lifecycle, root, plan digest...) goes into the audit record.
        Raises :class:`MetaStateError` if the lock is not obtained within ``lock_timeout``
        seconds, or on a nested transaction on the same meta-state in the same thread.
        """
        held = _held_set()
        where = self.objects.where
        if where in held:
            raise MetaStateError("%s: a transaction on this meta-state is already open in this "
                                 "thread; nest the work inside it instead" % self._label_of(LOCK_NAME))
        self.objects.ensure()
        lock = self.objects.lock(self.lock_timeout, what or _default_what())
        held.add(where)
        try:
            txn = Transaction(self, lock, what or _default_what(), context)
            yield txn
            txn._commit()
        finally:
            held.discard(where)
            lock.release()


class Transaction:
    """Reads and pending writes of one :meth:`MetaState.transaction`."""

    def __init__(self, ms: MetaState, lock: Any = None, what: str = "", context: Optional[Mapping[str, Any]] = None) -> None:
        self._ms = ms
        self._lock = lock
        self._what = what
        self._context = dict(context or {})
        self._pending: Dict[str, Dict[str, Any]] = {}
        self._records: Dict[Tuple[str, str], Optional[Dict[str, Any]]] = {}
        self._seen: Dict[str, _Read] = {}
        self._seen_records: Dict[Tuple[str, str], Tuple[Optional[str], Optional[str]]] = {}
        # the rest of a keyed file (:meth:`load_rest`): as read (version, data), and as staged
        self._rest_base: Dict[str, Tuple[Optional[str], Dict[str, Any]]] = {}
        self._rest_new: Dict[str, Dict[str, Any]] = {}
        self._open = True
        self._base_revision = ms._revision()
        self._import = ms.local_import()
        self.written: List[str] = []
        self.revision: Optional[int] = None
        self.changes: List[Dict[str, Any]] = []
        #: what happened without changing a record (a refused gate, a refused apply check):
        #: committed as an audit record of its own (:meth:`note`)
        self.events: List[Dict[str, Any]] = []

    def note(self, event: Mapping[str, Any]) -> None:
        """Audit ``event`` (plain data: ``kind``, ``root``, ``detail``...) with this transaction,
        even when it changes no record. Secret-shaped values are refused like any record's."""
        problems = find_secrets(event)
        if problems:
            raise MetaStateError("%s: refusing to audit secret-shaped data (%s)" % (self._ms._label_of(AUDIT_DIR), ", ".join(problems)))
        self.events.append(dict(event))

    @property
    def meta_state(self) -> MetaState:
        return self._ms

    # -- whole files -----------------------------------------------------------
    def load(self, name: str) -> Dict[str, Any]:
        """File ``name`` as saved earlier in this transaction, else freshly read."""
        _check_name(name)
        if name in self._pending:
            return copy.deepcopy(self._pending[name])
        read = self._ms._read_checked(name)
        self._seen[name] = read
        # the caller's copy: what was read stays the base that the commit compares with
        return self._staged_onto(name, json.loads(_text(read.data)))

    def _staged_onto(self, name: str, data: Dict[str, Any]) -> Dict[str, Any]:
        """``data`` (a whole file ``name``, changed in place) with the records and the rest staged
        one by one in this transaction (copies of them)."""
        if name not in KEYED:
            return data
        top = KEYED[name]
        for (file2, key), record in self._records.items():
            if file2 == name:
                if record is None:
                    data[top].pop(key, None)
                else:
                    data[top][key] = copy.deepcopy(record)
        if name in self._rest_new:
            data = {top: data[top], **_filled_rest(name, copy.deepcopy(self._rest_new[name]))}
        return data

    def _checked(self, name: str, data: Any) -> Dict[str, Any]:
        if not self._open:
            raise MetaStateError("%s: the transaction is closed" % _label(name))
        _check_name(name)
        plain = _plain(name, "", data)
        checked = validate(name, plain)
        secrets = find_secrets(checked)
        if secrets:
            raise MetaStateError("%s: refusing to write secret-shaped data (nothing secret is "
                                 "ever written in clear): %s" % (_label(name), "; ".join(secrets)))
        return checked

    def save(self, name: str, data: Mapping[str, Any]) -> None:
        """Validate, scan and stage ``data`` as the new content of ``name``.

        Raises :class:`MetaStateError` (and stages nothing) on a wrong shape, non-plain
        data, a record name that cannot be stored or secret-shaped values. What changed is
        written when the transaction exits.
        """
        checked = self._checked(name, data)
        if name in KEYED:
            for key in checked[KEYED[name]]:
                record_object(name, key)
        self._pending[name] = checked
        for file_key in [fk for fk in self._records if fk[0] == name]:
            del self._records[file_key]
        self._rest_new.pop(name, None)

    # -- one record --------------------------------------------------------------
    def load_record(self, name: str, key: str) -> Optional[Dict[str, Any]]:
        """Record ``key`` of keyed file ``name`` (None: none), reading only that record."""
        rel = record_object(name, key)
        if name in self._pending:
            return copy.deepcopy(self._pending[name][KEYED[name]].get(key))
        if (name, key) in self._records:
            return copy.deepcopy(self._records[(name, key)])
        if name in self._seen:
            return copy.deepcopy(self._seen[name].data[KEYED[name]].get(key))
        legacy, _version = self._ms.objects.get(name)
        if legacy is not None:
            self.load(name)
            return copy.deepcopy(self._seen[name].data[KEYED[name]].get(key))
        raw, version = self._ms.objects.get(rel)
        record = None if raw is None else self._ms._decode_record(name, key, raw)
        self._seen_records[(name, key)] = (version, None if record is None else _text(record))
        return record

    def save_record(self, name: str, key: str, record: Optional[Mapping[str, Any]]) -> None:
        """Stage ``record`` (None: remove it) as record ``key`` of keyed file ``name``; validated
        and scanned as :meth:`save` does. Only that record is written (and read) at commit."""
        record_object(name, key)
        top = KEYED[name]
        if record is None:
            checked = None
        else:
            checked = self._checked(name, {top: {key: record}})[top][key]
        if name in self._pending:
            if checked is None:
                self._pending[name][top].pop(key, None)
            else:
                self._pending[name][top][key] = checked
            return
        self._records[(name, key)] = checked

    # -- the rest of a keyed file ------------------------------------------------------
    def load_rest(self, name: str) -> Dict[str, Any]:
        """What keyed file ``name`` holds beside its records (``pins.yaml``: ``pending_replacements``
        and ``upgrades``), each known key present, reading only that object (the whole file while
        it is not migrated)."""
        record_object(name, "rest")  # refuses a file that is not kept per record
        top = KEYED[name]
        if name in self._pending:
            return copy.deepcopy({k: v for k, v in self._pending[name].items() if k != top})
        if name in self._rest_new:
            return _filled_rest(name, copy.deepcopy(self._rest_new[name]))
        if name not in self._seen and self._ms.objects.get(name)[0] is not None:
            self.load(name)  # not migrated yet: the whole file is read, and committed whole
        if name in self._seen:
            return _filled_rest(name, copy.deepcopy(rest_of(name, self._seen[name].data)))
        return _filled_rest(name, copy.deepcopy(self._read_rest(name)[1]))

    def _read_rest(self, name: str) -> Tuple[Optional[str], Dict[str, Any]]:
        if name not in self._rest_base:
            rel = "%s/%s" % (stem(name), REST)
            raw, version = self._ms.objects.get(rel)
            self._rest_base[name] = (version, {} if raw is None else rest_of(name, self._ms._decode(name, raw, rel)))
        return self._rest_base[name]

    def save_rest(self, name: str, rest: Mapping[str, Any]) -> None:
        """Stage ``rest`` as what keyed file ``name`` holds beside its records; validated and
        scanned as :meth:`save` does. Only that object is written at commit."""
        record_object(name, "rest")
        top = KEYED[name]
        if top in rest:
            raise MetaStateError("%s: '%s' holds the records, not the rest of the file" % (_label(name), top))
        checked = rest_of(name, self._checked(name, dict(rest, **{top: {}})))
        if name in self._pending:
            self._pending[name] = {top: self._pending[name][top], **_filled_rest(name, checked)}
            return
        self._rest_new[name] = checked

    def _whole(self, name: str) -> Dict[str, Any]:
        """Keyed file ``name`` whole, with what was staged record by record: what a file that is
        not migrated yet, or was loaded whole in this transaction, commits."""
        if name not in self._seen:
            return self.load(name)  # read now, with what was staged
        return self._staged_onto(name, copy.deepcopy(self._seen[name].data))

    # -- commit ------------------------------------------------------------------
    def _commit(self) -> List[str]:
        """Write every staged record or file that changed, the next revision and its audit record;
        return the names of the files written."""
        self._open = False
        ms, objects = self._ms, self._ms.objects
        ops: List[Tuple[str, str, Optional[bytes], Optional[str], str]] = []  # (put|delete, object, payload, expect, file)
        after: List[Tuple[str, Optional[str]]] = []  # legacy files removed once their records are written
        keys: set = set()
        full = False
        if self._import is not None:
            # the first transaction of an S3 meta-state imports the tree's local one, whole
            for name in sorted(FILES):
                if name not in self._pending:
                    self._pending[name] = self.load(name)
            self._records.clear()
            self._rest_new.clear()
        pending = dict(self._pending)
        for name in sorted({name for name, _key in self._records} | set(self._rest_new)):
            if name not in pending and (name in self._seen or objects.get(name)[0] is not None):
                # not migrated yet (or loaded whole in this transaction): commit the whole file
                pending[name] = self._whole(name)
        for (name, key), record in self._records.items():
            if name not in pending:
                self._plan_record(name, key, record, ops, keys)
        for name, rest in sorted(self._rest_new.items()):
            if name not in pending:
                base = self._read_rest(name)
                if self._plan_rest(name, rest, base, ops):
                    _changed_names(name, base[1], rest, keys)
        for name, data in pending.items():
            if name in KEYED:
                full = self._plan_keyed(name, data, ops, after, keys) or full
            else:
                self._plan_whole(name, data, ops, keys)
        self._check_invariants(pending, keys, full)
        if not ops and not after and not self.events:
            self.written = []
            return []
        number, version = self._base_revision
        self.revision = number + 1
        if objects.version(audit_object(self.revision)) is not None:
            # the audit record this commit would write is there: another run committed since this
            # transaction began, or the counter went back (revision.yaml restored from a backup).
            # Refused before anything is written: the records would be written, and then the audit
            # record refused, so the change would have no record.
            if objects.version(REVISION) != version:
                raise Conflict("%s: another run committed since this transaction began (its lock must have "
                               "expired and been broken), so nothing was written" % ms._label_of(REVISION))
            raise MetaStateError("%s: the audit record of revision %d is already there while %s says revision %d: "
                                 "the revision counter went back (restored from a backup?); nothing was written. "
                                 "Set its revision to the highest number under %s/"
                                 % (ms._label_of(audit_object(self.revision)), self.revision, ms._label_of(REVISION),
                                    number, AUDIT_DIR))
        # what each object holds before this commit, put back if the commit fails half-way (under the
        # lock: what the conditional writes below then find, unless the lock is lost, which they refuse)
        olds: Dict[str, Optional[bytes]] = {}
        for _op, rel, _payload, expect, _name in ops + [("delete", rel, None, expect, rel) for rel, expect in after]:
            if rel not in olds:
                olds[rel] = objects.get(rel)[0] if expect != ABSENT else None
        old_revision = objects.get(REVISION)[0] if version else None
        stamp = now_iso()
        audit = self._audit(stamp).encode("utf-8")  # built before anything is written
        if self._lock is not None:
            # the lock is still this run's (an S3 lock renewed now, conditionally): a writer whose lock
            # expired and was broken writes nothing, not even the marker
            self._lock.refresh(force=True)
        head = {"revision": number, "committing": self.revision, "time": stamp, "what": self._what}
        try:
            # the marker: readers wait for the commit; its condition is the base read at the start
            marker = objects.put(REVISION, _revision_body(head), version or ABSENT)
        except Conflict as exc:
            raise Conflict("%s: another run committed since this transaction began (its lock must have "
                           "expired and been broken), so nothing was written" % ms._label_of(REVISION)) from exc
        except OSError as exc:
            raise MetaStateError("%s: cannot write: %s (nothing was written)"
                                 % (ms._label_of(REVISION), exc.strerror or exc)) from exc
        if marker is None:
            marker = objects.version(REVISION)
        written: List[str] = []
        # (object, what this commit left there: its version, None when it removed it), to put back
        done: List[Tuple[str, Optional[str]]] = []

        def wrote(rel: str, new: Optional[str], deleted: bool = False) -> None:
            done.append((rel, None if deleted else (new or objects.version(rel))))

        try:
            for op, rel, payload, expect, name in ops:
                if self._lock is not None:
                    self._lock.refresh()
                try:
                    if op == "put":
                        wrote(rel, objects.put(rel, payload, expect))
                    else:
                        objects.delete(rel, expect)
                        wrote(rel, None, deleted=True)
                except OSError as exc:
                    raise MetaStateError("%s: cannot write: %s (written before it in this "
                                         "transaction: %s)" % (ms._label_of(rel), exc.strerror or exc,
                                                               ", ".join(written) or "none")) from exc
                except Conflict as exc:
                    raise Conflict("%s (written before it in this transaction: %s)"
                                   % (exc, ", ".join(written) or "none")) from exc
                if name not in written:
                    written.append(name)
            try:
                for rel, expect in after:
                    objects.delete(rel, expect)
                    wrote(rel, None, deleted=True)
                    if rel not in written:
                        written.append(rel)
                wrote(audit_object(self.revision), objects.put(audit_object(self.revision), audit, ABSENT))
                objects.put(REVISION, _revision_body({"revision": self.revision, "time": stamp, "what": self._what}), marker)
            except OSError as exc:
                raise MetaStateError("%s: cannot write: %s (the records were written: %s)"
                                     % (ms._label_of(REVISION), exc.strerror or exc, ", ".join(written))) from exc
        except MetaStateError as exc:
            # a failure the commit could see (a full disk, a refused write, the store not answering,
            # the lock lost): what it wrote is put back, so meta-state holds no change its audit
            # trail lacks; the marker goes last, back to the revision before
            raise type(exc)("%s; %s" % (exc, self._undo(done, olds, old_revision, marker))) from exc
        self.written = written
        return self.written

    def _undo(self, done: List[Tuple[str, Optional[str]]], olds: Mapping[str, Optional[bytes]],
              old_revision: Optional[bytes], marker: Optional[str]) -> str:
        """Put back what a failed commit wrote (each object conditionally on what the commit left
        there: another writer's later change is never overwritten), then its marker. Says how it went."""
        objects = self._ms.objects
        try:
            for rel, left in reversed(done):
                old = olds.get(rel)
                if old is None:
                    if left is not None:
                        objects.delete(rel, left)
                else:
                    objects.put(rel, old, left or ABSENT)
            if old_revision is None:
                objects.delete(REVISION, marker)
            else:
                objects.put(REVISION, old_revision, marker or ABSENT)
        except (MetaStateError, OSError) as exc:
            text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return ("putting back what this transaction had written failed too (%s): %s holds the marker of "
                    "revision %d, which no audit record describes; docs/meta-state.md, 'A commit that did not finish'"
                    % (text, self._ms._label_of(REVISION), self.revision))
        return "nothing of this transaction stays: what it had written was put back"

    def _audit(self, stamp: str) -> str:
        doc = {"revision": self.revision, "time": stamp, "who": who(), "what": self._what,
               "context": self._context, "changes": self.changes}
        if self.events:
            doc["events"] = self.events
        if find_secrets(doc):
            doc["what"] = "<redacted: secret-shaped>" if find_secrets(self._what) else self._what
            doc["context"] = {k: ("<redacted: secret-shaped>" if find_secrets(v) else v) for k, v in self._context.items()}
        return HEADER + yaml.dump(doc, Dumper=meta_dumper(), sort_keys=True, default_flow_style=False) + FOOTER

    def _plan_whole(self, name: str, data: Dict[str, Any], ops: List[Any], keys: set) -> None:
        """Stage whole file ``name`` when its content changed; the names of the records it changed
        in its name-keyed mappings go into ``keys`` (what the invariants then compare)."""
        ms = self._ms
        current, version = ms.objects.get(name)
        seen = None if self._import is not None else self._seen.get(name)
        if seen is None or seen.raw != current:
            old = ms._decode(name, current)  # a damaged file is never overwritten, even unread
        else:
            old = seen.data
        if seen is not None and seen.version != version:
            raise Conflict("%s: changed since this transaction read it, so it was not overwritten" % ms._label_of(name))
        if (current is not None and data == old) or (current is None and data == empty(name)):
            return
        ops.append(("put", name, dumps(data).encode("utf-8"), version or ABSENT, name))
        change = {"file": name, "action": "changed" if current is not None else "created", "diff": short_diff(old, data)}
        if name == "drift.yaml":  # small: kept whole, so the history of a storage or instance finds its lines
            change.update(before=old if current is not None else None, after=data)
        self.changes.append(change)
        _changed_names(name, old, data, keys)

    def _plan_keyed(self, name: str, data: Dict[str, Any], ops: List[Any], after: List[Any], keys: set) -> bool:
        ms, top = self._ms, KEYED[name]
        if self._import is not None:
            read = ms._read_file(name, own=True)
            if not read.present:
                for key in sorted(data[top]):
                    ops.append(("put", record_object(name, key), dumps({top: {key: data[top][key]}}).encode("utf-8"),
                                ABSENT, name))
                self._plan_rest(name, rest_of(name, data), (None, {}), ops)
                if data[top]:
                    self.changes.append({"file": name, "action": "imported", "records": len(data[top]),
                                         "from": self._import.dir})
                return True
        else:
            read = self._seen.get(name) or ms._read_file(name)  # unread: every record decoded (damage refused)
        rest = rest_of(name, data)
        if read.legacy:
            # migration: every record written, records left from before removed, then the whole file
            old = read.data
            existing = ms.objects.listing(stem(name))
            for key in sorted(data[top]):
                rel = record_object(name, key)
                ops.append(("put", rel, dumps({top: {key: data[top][key]}}).encode("utf-8"),
                            existing.pop(key + ".yaml", None) or ABSENT, name))
            for fname, version in sorted(existing.items()):
                if fname != REST:
                    ops.append(("delete", "%s/%s" % (stem(name), fname), None, version, name))
            self._plan_rest(name, rest, (existing.get(REST), {}), ops, force=True)
            after.append((name, read.version))
            self.changes.append({"file": name, "action": "migrated", "records": len(data[top]),
                                 "diff": short_diff(old, data)})
            return True
        changed = False
        for key in sorted(data[top]):
            record = data[top][key]
            text = _text(record)
            if read.texts.get(key) == text:
                continue
            rel = record_object(name, key)
            ops.append(("put", rel, dumps({top: {key: record}}).encode("utf-8"), read.versions.get(key) or ABSENT, name))
            before = json.loads(read.texts[key]) if key in read.texts else None
            self._change(name, key, before, record)
            keys.add(key)
            changed = True
        for key in sorted(set(read.texts) - set(data[top])):
            ops.append(("delete", record_object(name, key), None, read.versions[key], name))
            self._change(name, key, json.loads(read.texts[key]), None)
            keys.add(key)
            changed = True
        if self._plan_rest(name, rest, read.rest, ops):
            _changed_names(name, read.rest[1], rest, keys)  # pins' pending replacements
            changed = True
        return name == "storage.yaml" and changed and not read.present

    def _plan_rest(self, name: str, rest: Dict[str, Any], base: Tuple[Optional[str], Dict[str, Any]],
                   ops: List[Any], force: bool = False) -> bool:
        version, old = base
        rel = "%s/%s" % (stem(name), REST)
        if rest == old and not (force and rest):
            return False
        if rest:
            ops.append(("put", rel, dumps(rest).encode("utf-8"), version or ABSENT, name))
        elif version is not None:
            ops.append(("delete", rel, None, version, name))
        else:
            return False
        self.changes.append({"file": name, "key": None, "action": "changed", "diff": short_diff(old, rest)})
        return True

    def _change(self, name: str, key: str, before: Optional[Dict[str, Any]], record: Optional[Dict[str, Any]]) -> None:
        action = "created" if before is None else "deleted" if record is None else "changed"
        self.changes.append({"file": name, "key": key, "action": action,
                             "diff": short_diff(before if before is not None else _MISSING,
                                                record if record is not None else _MISSING),
                             "before": before, "after": record})

    def _plan_record(self, name: str, key: str, record: Optional[Dict[str, Any]], ops: List[Any], keys: set) -> None:
        ms, top = self._ms, KEYED[name]
        rel = record_object(name, key)
        if (name, key) in self._seen_records:
            version, text = self._seen_records[(name, key)]
        else:
            raw, version = ms.objects.get(rel)
            text = None if raw is None else _text(ms._decode_record(name, key, raw))  # damaged: refused
        new = None if record is None else _text(record)
        if new == text:
            return
        if record is None:
            ops.append(("delete", rel, None, version, name))
        else:
            ops.append(("put", rel, dumps({top: {key: record}}).encode("utf-8"), version or ABSENT, name))
        self._change(name, key, None if text is None else json.loads(text), record)
        keys.add(key)

    def _check_invariants(self, pending: Dict[str, Dict[str, Any]], keys: set, full: bool) -> None:
        """Refuse a commit that would make files contradict each other. Every invariant relates
        records of one name, so only the changed names are looked at (all of them when a file not
        yet migrated is involved, or the read-model is written for the first time)."""
        ms = self._ms
        involved = set(pending) | {name for name, _key in self._records} | set(self._rest_new)
        if not involved or not (keys or full):
            return
        names = partners(involved)
        view: Dict[str, Dict[str, Any]] = {}
        for name in names:
            if name in KEYED and not full and ms.objects.get(name)[0] is not None:
                full = True
        for name in names:
            if name in pending:
                data: Optional[Dict[str, Any]] = pending[name]
            elif full or name not in KEYED:
                read = ms._read_file(name)
                data = read.data if read.present else None
                if any(file2 == name for file2, _key in self._records) or name in self._rest_new:
                    # what the records staged one by one make of the file
                    data = self._staged_onto(name, copy.deepcopy(data) if data is not None else empty(name))
            else:
                top = KEYED[name]
                records = {}
                for key in sorted(keys):
                    if (name, key) in self._records:
                        if self._records[(name, key)] is not None:
                            records[key] = self._records[(name, key)]
                        continue
                    raw = ms.objects.get(record_object(name, key))[0]
                    if raw is not None:
                        records[key] = ms._decode_record(name, key, raw)
                present = bool(records) or bool(ms.objects.listing(stem(name))) if name == "storage.yaml" else True
                data = {top: records} if present else None
                if data is not None and any(kind is dict for other, kind in FILES[name] if other != top):
                    data.update(_filled_rest(name, self._rest_new[name] if name in self._rest_new
                                             else self._read_rest(name)[1]))
                if data is not None and name in KEYED and any(n == name for n, _k in self._records):
                    for (file2, key2), rec2 in self._records.items():
                        if file2 == name and rec2 is None:
                            data[top].pop(key2, None)
            if data is not None and not full:
                data = _restrict(name, data, keys)
            view[name] = _summary(name, data)
        found = _contradictions(view, involved)
        if found:
            raise MetaStateError("%s: the files would contradict each other after this change, so nothing "
                                 "was written" % found[0])


def _filled_rest(name: str, rest: Mapping[str, Any]) -> Dict[str, Any]:
    """``rest`` with every known top-level key of keyed file ``name`` but its records present."""
    out = {k: kind() for k, kind in FILES[name] if k != KEYED[name]}
    out.update(rest)
    return out


def _changed_names(name: str, old: Mapping[str, Any], new: Mapping[str, Any], keys: set) -> None:
    """Add to ``keys`` the names whose entries differ between ``old`` and ``new`` in the
    name-keyed mappings of file ``name`` (what the cross-file invariants compare), when an
    invariant relates the file."""
    if not any(name in files for files, _check in INVARIANTS):
        return
    for top, kind in FILES[name]:
        if kind is dict:
            before, after = old.get(top) or {}, new.get(top) or {}
            keys.update(k for k in set(before) | set(after) if before.get(k, _MISSING) != after.get(k, _MISSING))


def _revision_body(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(dict(doc), sort_keys=True) + "\n").encode("utf-8")


def _restrict(name: str, data: Mapping[str, Any], keys: set) -> Dict[str, Any]:
    """``data`` with only the records of ``keys`` (what the invariants compare name by name)."""
    out = dict(data)
    for top, kind in FILES[name]:
        if kind is dict:
            out[top] = {k: v for k, v in (data.get(top) or {}).items() if k in keys}
    return out


# ---------------------------------------------------------------------------
# history
# ---------------------------------------------------------------------------

def audit_trail(ms: MetaState, instance: Optional[str] = None, storage: Optional[str] = None,
                root: Optional[str] = None, since: int = 0, drift: bool = True,
                related: bool = False) -> List[Dict[str, Any]]:
    """The audit records (oldest first) of revisions after ``since``; with a filter, only those that
    changed instance ``instance`` / storage ``storage`` (a record of it, or a line of a whole file
    naming it; with ``drift``, also a HARD line of ``drift.yaml`` about it that came or went), or whose
    ``what`` or ``context`` names root ``root`` (their ``changes`` are kept whole). With ``related``
    (an instance or storage filter), also the records of the plans that changed it: an approval, a
    refused gate or apply check whose plan digest is that of a matched record's apply."""
    out: List[Dict[str, Any]] = []
    every: List[Dict[str, Any]] = []
    for fname in sorted(ms.objects.listing(AUDIT_DIR)):
        try:
            number = int(fname[:-len(".yaml")])
        except ValueError:
            continue
        if number <= since:
            continue
        rel = "%s/%s" % (AUDIT_DIR, fname)
        raw = ms.objects.get(rel)[0]
        if raw is None:
            continue
        doc = _audit_doc(ms, rel, raw)
        if _matches(doc, instance, storage, root, drift):
            out.append(doc)
        elif related and (instance or storage):
            every.append(doc)
    plans = {d for doc in out for d in _plan_digests(doc)}
    if not plans:
        return out
    more = [doc for doc in every if plans & _plan_digests(doc)]
    return sorted(out + more, key=lambda doc: int(doc.get("revision") or 0))


#: the digest of every plan without changes (apply/plan_verdict.py plan_content_digest of none):
#: shared by every root, so it ties no record to another
EMPTY_PLAN_DIGEST = hashlib.sha256(b"[]").hexdigest()


def _plan_digests(doc: Mapping[str, Any]) -> Set[str]:
    """The plan digests an audit record names (its context's, its events'), but an empty plan's."""
    found = {(doc.get("context") or {}).get("plan_digest")}
    found |= {e.get("plan_digest") for e in doc.get("events") or [] if isinstance(e, dict)}
    return {d for d in found if isinstance(d, str) and d and d != EMPTY_PLAN_DIGEST}


def _audit_doc(ms: MetaState, rel: str, raw: bytes) -> Dict[str, Any]:
    label = ms.objects.label(rel)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MetaStateError("%s: not UTF-8 text (byte %d)" % (label, exc.start)) from exc
    if not text.startswith(HEADER) or not text.endswith(FOOTER):
        raise MetaStateError("%s: is not a whole audit record (header or end line missing); %s" % (label, DAMAGED))
    try:
        doc = yaml.load(text, Loader=meta_loader())  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise MetaStateError("%s: YAML error: %s" % (label, exc)) from exc
    except VALUE_ERRORS as exc:
        raise MetaStateError("%s: YAML value that cannot be read: %s; %s"
                             % (label, str(exc) or type(exc).__name__, DAMAGED)) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("changes"), list):
        raise MetaStateError("%s: is not an audit record; %s" % (label, DAMAGED))
    problem = shape_problem(doc, text) or not_plain(doc)
    if problem:
        raise MetaStateError("%s: %s; %s" % (label, problem, DAMAGED))
    _audit_shape(label, doc)
    return doc


def _audit_shape(label: str, doc: Mapping[str, Any]) -> None:
    """The fields of an audit record its readers walk (history, ``as of`` a revision)."""
    def bad(where: str, what: str, value: Any) -> MetaStateError:
        return MetaStateError("%s: %s must be %s, got %s; %s" % (label, where, what, _kind(value), DAMAGED))

    revision = doc.get("revision")
    if not isinstance(revision, int) or isinstance(revision, bool):
        raise bad("'revision'", "a revision number", revision)
    for key in ("who", "context"):
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise bad("'%s'" % key, "a mapping", doc[key])
    for key in ("changes", "events"):
        for i, item in enumerate(doc.get(key) or []):
            if not isinstance(item, dict):
                raise bad("'%s[%d]'" % (key, i), "a mapping", item)
    for i, change in enumerate(doc["changes"]):
        for key in ("action", "file", "key"):
            if change.get(key) is not None and not isinstance(change[key], str):
                raise bad("'changes[%d].%s'" % (i, key), "a string", change[key])
        diff = change.get("diff")
        if diff is not None and not (isinstance(diff, list) and all(isinstance(d, str) for d in diff)):
            raise bad("'changes[%d].diff'" % i, "a list of strings", diff)


_INSTANCE_FILES = ("launch-params.yaml", "instance-state.yaml", "pins.yaml", "verifications.yaml")
_STORAGE_FILES = ("storage-state.yaml", "storage.yaml")


def _names(change: Mapping[str, Any], files: Tuple[str, ...], name: str, drift: bool = True) -> bool:
    if change.get("file") == "drift.yaml":  # the state query's HARD lines: one about ``name`` came or went
        if not drift:
            return False
        kind = "storage" if files == _STORAGE_FILES else "instance"
        return any(isinstance(line, dict) and line.get("kind") == kind and line.get("name") == name
                   for side in (change.get("before"), change.get("after")) if isinstance(side, dict)
                   for line in side.get("hard") or [])
    if change.get("file") not in files:
        return False
    if change.get("key") == name:
        return True
    if change.get("key") is None and change.get("action") != "migrated":
        return any(("." + name + ".") in ("." + line.split(":", 1)[0] + ".") for line in change.get("diff") or ())
    return False


#: the ``what`` of the day-2 transactions that are about one instance or storage, before its name:
#: an upgrade request or its cancel changes ``pins.yaml``'s pending replacements as a whole, and a
#: verification appends to ``verifications.yaml``'s list, so their diff lines need not name it
#: (the writers build their ``what`` from these: one text for the transaction and its filter)
WHAT_UPGRADE = "csis upgrade "
WHAT_UPGRADE_CANCELLED = "csis upgrade cancelled "
WHAT_VERIFICATION = "csis verification of "
WHAT_FORGET_INSTANCE = "csis_forget instance "
WHAT_FORGET_STORAGE = "csis_forget storage "
WHAT_IMPORT_STORAGE = "csis_state_import storage "
_WHAT_INSTANCE = (WHAT_UPGRADE, WHAT_UPGRADE_CANCELLED, WHAT_VERIFICATION, WHAT_FORGET_INSTANCE)
_WHAT_STORAGE = (WHAT_FORGET_STORAGE, WHAT_IMPORT_STORAGE)


def _what_names(doc: Mapping[str, Any], prefixes: Tuple[str, ...], name: str) -> bool:
    what = str(doc.get("what") or "")
    return any(what == prefix + name for prefix in prefixes)


def _event_names(doc: Mapping[str, Any], key: str, name: str) -> bool:
    """An event of a root that declares ``name`` (``audit_root_event``'s ``instances``/``storages``):
    its refusals and failures belong to each one's history."""
    return any(isinstance(e, dict) and isinstance(e.get(key), list) and name in e[key] for e in doc.get("events") or [])


def _matches(doc: Mapping[str, Any], instance: Optional[str], storage: Optional[str], root: Optional[str],
             drift: bool = True) -> bool:
    changes = doc.get("changes") or []
    if instance and not (_what_names(doc, _WHAT_INSTANCE, instance) or _event_names(doc, "instances", instance)
                         or any(_names(c, _INSTANCE_FILES, instance, drift) for c in changes)):
        return False
    if storage and not (_what_names(doc, _WHAT_STORAGE, storage) or _event_names(doc, "storages", storage)
                        or any(_names(c, _STORAGE_FILES, storage, drift) for c in changes)):
        return False
    if root:  # the root's own name, never a part of another's (aws-s3 is not aws-s3-logs)
        context = doc.get("context") or {}
        if (context.get("root") != root and root not in str(doc.get("what") or "").split()
                and not any(isinstance(e, dict) and e.get("root") == root for e in doc.get("events") or [])):
            return False
    return True


def audit_event(config_root: str, event: Mapping[str, Any], what: Optional[str] = None,
                context: Optional[Mapping[str, Any]] = None) -> int:
    """Commit an audit record for something that changed no record (a refused gate, a refused
    apply check, a failed step); returns its revision."""
    ms = MetaState(config_root)
    with ms.transaction(what or "csis %s" % event.get("kind", "event"), context=context) as txn:
        txn.note(event)
    return int(txn.revision or 0)


#: the longest ``detail`` an audit event of a root keeps (a gate's violations, a module's message)
AUDIT_DETAIL_MAX = 2000


def audit_root_event(config_root: str, kind: str, root: str, detail: str = "", step: Optional[str] = None,
                     run: Optional[str] = None, lifecycle: Optional[str] = None,
                     plan_digest: Optional[str] = None, instances: Sequence[str] = (),
                     storages: Sequence[str] = ()) -> int:
    """Commit the audit record of an event of one root (``csis_audit``'s: a refused gate, a failed
    step, a released state lock), as ``playbooks/history.yml`` filters them by root; its revision.
    ``instances``/``storages``: what the root declares, so each one's history shows the event too."""
    fields = (("kind", kind), ("root", root), ("step", step), ("lifecycle", lifecycle), ("plan_digest", plan_digest))
    event: Dict[str, Any] = {k: v for k, v in fields if v}
    for key, names in (("instances", instances), ("storages", storages)):
        if names:
            event[key] = sorted({str(n) for n in names})
    event["detail"] = (detail or "")[:AUDIT_DETAIL_MAX]
    context = {"root": root, "run": run, "lifecycle": lifecycle, "plan_digest": plan_digest}
    return audit_event(config_root, event, what="csis %s: %s" % (kind, root),
                       context={k: v for k, v in context.items() if v})


def record_at(ms: MetaState, name: str, key: str, revision: int) -> Optional[Dict[str, Any]]:
    """Record ``key`` of keyed file ``name`` as it was right after revision ``revision`` (None: it
    did not exist): the last change of it up to that revision, else (changed only later) what the
    first later change found, else (never changed since the trail began) the record as it is."""
    record_object(name, key)
    last: Any = _MISSING
    later: Any = _MISSING
    for doc in audit_trail(ms):
        for change in doc.get("changes") or []:
            if change.get("file") != name or change.get("key") != key or "after" not in change:
                continue
            if int(doc.get("revision") or 0) <= revision:
                last = change.get("after")
            elif later is _MISSING:
                later = change.get("before")
    if last is not _MISSING:
        return last
    if later is not _MISSING:
        return later
    return ms.load_record(name, key)


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
    files = ms.load_many(("launch-params.yaml", "instance-state.yaml"))
    params, states = files["launch-params.yaml"]["instances"], files["instance-state.yaml"]["instances"]
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


def _event_text(event: Mapping[str, Any]) -> str:
    """An audit event's line: its ``detail``, then its other fields (an approval's approver,
    requester, method, workflow and apply job), digests cut to 12 characters."""
    bits = [str(event["detail"])] if event.get("detail") else []
    for key, value in sorted(event.items()):
        # what the root declares ties the event to each one's history; the line names the root
        if key in ("kind", "root", "detail", "instances", "storages") or value in (None, "", [], {}):
            continue
        text = str(value)
        bits.append("%s %s" % (key, text[:12] if key.endswith("digest") else text))
    return ", ".join(bits)


def history_report(config_root: str, instance: Optional[str] = None, storage: Optional[str] = None,
                   root: Optional[str] = None, since: int = 0, revision: Optional[int] = None,
                   details: bool = False) -> Dict[str, Any]:
    """What ``csis_history`` returns: ``{where, revision, trail, as_of}``. ``trail``: the audit
    records after ``since`` filtered as :func:`audit_trail` does (without the records' ``before``
    and ``after`` unless ``details``); ``lines``: one line per change; ``as_of`` (with
    ``revision`` and an instance or storage): its records as they were right after that revision."""
    ms = MetaState(config_root)
    trail = audit_trail(ms, instance=instance, storage=storage, root=root, since=since, related=True)
    if not details:
        for doc in trail:
            for change in doc.get("changes") or []:
                change.pop("before", None)
                change.pop("after", None)
    lines = []
    for doc in trail:
        who_ = doc.get("who") or {}
        by = who_.get("awx_user_name") or who_.get("user") or "?"
        if who_.get("awx_job_id"):
            by += " (AWX job %s)" % who_["awx_job_id"]
        for event in doc.get("events") or []:
            fields = (doc.get("revision"), doc.get("time"), by, event.get("kind", "event"), event.get("root", ""),
                      doc.get("what", ""), _event_text(event))
            lines.append(printable("r%s %s %s: %s %s [%s] -- %s" % fields))
        context = doc.get("context") or {}
        # the plan this transaction records the apply of (csis_record's context), when it says
        plan = (" (plan %s)" % str(context["plan_digest"])[:12]) if context.get("plan_digest") else ""
        for change in doc.get("changes") or ([] if doc.get("events") else [{}]):
            head = "r%s %s %s: %s %s%s" % (doc.get("revision"), doc.get("time"), by, change.get("action", "-"),
                                           change.get("file", ""), "/" + change["key"] if change.get("key") else "")
            diff = "; ".join(change.get("diff") or [])
            # one line each, whatever an AWX user name or a run id holds (a newline, a terminal escape)
            lines.append(printable(head + (" [%s%s]" % (doc.get("what"), plan) if doc.get("what") else plan)
                                   + (" -- " + diff if diff else "")))
    out: Dict[str, Any] = {"where": ms.where, "revision": ms.revision(), "trail": trail, "lines": lines, "as_of": None}
    if revision is not None and not 0 <= revision <= out["revision"]:
        raise MetaStateError("revision %d: %s holds revisions 0 to %d (the last committed one)"
                             % (revision, ms.where, out["revision"]))
    if revision is not None and (instance or storage):
        files = ("launch-params.yaml", "instance-state.yaml") if instance else ("storage-state.yaml", "storage.yaml")
        records = {name: record_at(ms, name, instance or storage, revision) for name in files}
        out["as_of"] = {"revision": revision, "records": records}
    return out
