# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Stale S3 state locks (``use_lockfile``) left by a killed run.

A terraform process killed during a plan or an apply leaves ``<key>.tflock`` in the
state bucket; every later run then fails with "Error acquiring the state lock". The lock
names its holder (``Who`` = ``user@host``, ``ID``, ``Operation``, ``Created``) but not a
process, so only a holder on THIS machine can be proven dead:

* no lock object: nothing to do;
* held by ``user@host`` of this machine and no terraform/tofu process on this machine
  works on a root with the same backend bucket and key in a command that can lock it (not a
  ``validate``, ``show``, ``output``, ``state pull``, nor any ``-lock=false``): the holder is dead. The lock is
  released with ``<binary> force-unlock -force <ID>`` (terraform refuses if the lock
  changed meanwhile) and reported;
* held by a live local process, or by another machine: refused with the lock's details
  and the documented procedure (docs/operations.md, "State is locked").

Plain Python: importable without Ansible (boto3 is needed only when a lock must be read).
"""
from __future__ import annotations

import getpass
import json
import os
import socket
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import aws, clock, procs, terraform
from ..tfstate import backend_of, s3_state_key
from ..errors import CsisError, printable
from ..state.backends import AWX_JOB_ID_VARIABLES, first_set, object_age
from .errored import check_errored_state

__all__ = ["StateLockError", "backend_of", "lock_key", "read_lock", "live_holders", "may_hold_lock",
           "check_and_release", "local_who"]

TERRAFORM_NAMES = ("terraform", "tofu")


class StateLockError(CsisError):
    """A lock this run may not plan under. ``releasable``: one a run with ``release`` would have
    released; ``lock``: then, the lock and why it would be released (for check mode's report);
    ``content``: then, the lock object's content (what ``check_and_release`` returns as ``lock``)."""

    def __init__(self, msg: str, releasable: bool = False, lock: Optional[str] = None,
                 content: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(msg)
        self.releasable = releasable
        self.lock = lock
        self.content = dict(content) if content is not None else None


def local_who() -> str:
    """terraform's ``Who`` for a lock taken on this machine by this user."""
    try:
        user = getpass.getuser()
    except Exception:  # pragma: no cover - no user name
        user = ""
    return "%s@%s" % (user, socket.gethostname())


def lock_key(backend: Mapping[str, Any]) -> Optional[Tuple[str, str]]:
    """(bucket, key of the lock object) for an S3 backend with ``use_lockfile``, else None."""
    cfg = backend.get("config") or {}
    if backend.get("type") != "s3" or not cfg.get("use_lockfile"):
        return None
    return cfg["bucket"], s3_state_key(cfg, backend.get("workspace") or "default") + ".tflock"


def read_lock(backend: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The lock object's JSON, or None when the state is not locked. Beside terraform's fields:
    ``lock_object`` (where it is) and, when the store's answer tells it, ``lock_age`` (seconds since
    the object was written, by the store's own clock: ``Created`` is the holder's)."""
    where = lock_key(backend)
    if where is None:
        return None
    bucket, key = where
    try:
        client = aws.client("s3", aws.backend_access(backend["config"]))
        resp = client.get_object(Bucket=bucket, Key=key)
        body = resp["Body"].read()
    except Exception as exc:  # NoSuchKey, or a botocore ClientError 404 on some endpoints; a missing profile
        if aws.error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise StateLockError("cannot read the state lock s3://%s/%s: %s" % (bucket, key, exc))
    try:
        info = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        info = None
    if not isinstance(info, dict):  # not a lock terraform wrote: shown as it is, never read as one
        info = {"raw": body.decode("utf-8", "replace")}
    info["lock_object"] = "s3://%s/%s" % (bucket, key)
    info.pop("lock_age", None)  # ours alone: a number the object carries is not the store's clock
    age = object_age(resp)
    if age is not None:
        info["lock_age"] = age
    return info


def _s3_endpoint(config: Mapping[str, Any]) -> Optional[str]:
    """The S3 endpoint a backend configuration names (``endpoints.s3``, or the older ``endpoint``),
    None when it names none (AWS's, or one from the environment: not told apart here)."""
    endpoints = config.get("endpoints")
    url = (endpoints.get("s3") if isinstance(endpoints, Mapping) else None) or config.get("endpoint")
    return str(url).rstrip("/") if url else None


def _same_state(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two backends hold one state: the same bucket, key and workspace, and not two S3
    endpoints that both name themselves and differ (a local endpoint's bucket of the same name is
    another state; when either names none, they may be the same, which is what counts)."""
    ca, cb = a.get("config") or {}, b.get("config") or {}
    ea, eb = _s3_endpoint(ca), _s3_endpoint(cb)
    return (a.get("type") == b.get("type") and ca.get("bucket") == cb.get("bucket")
            and ca.get("key") == cb.get("key") and a.get("workspace") == b.get("workspace")
            and (ea is None or eb is None or ea == eb))


#: subcommands that never take the state lock (``state``/``workspace``: with these second words)
NEVER_LOCKS = frozenset(("version", "fmt", "validate", "show", "output", "providers", "graph", "get", "login",
                         "logout", "metadata", "modules", "force-unlock"))
NEVER_LOCKS_UNDER = {"state": frozenset(("list", "show", "pull")), "workspace": frozenset(("list", "show", "select"))}


def may_hold_lock(argv: List[str]) -> bool:
    """Whether a terraform/tofu command line can hold its state's lock: every subcommand can
    (``plan``, ``apply``, ``import``, ``state rm``, ``init`` while it migrates state, ...), except
    those of :data:`NEVER_LOCKS`, any run with ``-lock=false`` and a bare ``-version``/``-help``.
    terraform's options are single words (``-chdir=DIR``, ``-out=FILE``), so the words without a
    leading dash are the subcommand and its arguments; an unknown subcommand counts as a holder."""
    if "-lock=false" in argv[1:]:
        return False
    words = [w for w in argv[1:] if not w.startswith("-")]
    if not words:
        return not any(w in ("-version", "-v", "-help", "-h") for w in argv[1:])
    if words[0] in NEVER_LOCKS:
        return False
    return len(words) < 2 or words[1] not in NEVER_LOCKS_UNDER.get(words[0], frozenset())


def live_holders(backend: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """terraform/tofu processes on this machine working on a root with the same state, in a
    command that can hold its lock (:func:`may_hold_lock`: a ``validate`` or ``show`` of a root on
    the same state is no holder), read from ``/proc``; without it, whether a holder lives cannot be
    told, and this refuses to say "none"."""
    if not procs.available():
        raise StateLockError("this machine's processes cannot be read (no /proc): whether a terraform process "
                             "here still holds the state lock cannot be told")
    found = []
    for pid in procs.pids():
        if pid == os.getpid():
            continue
        argv = procs.argv_of(pid)
        if not argv or os.path.basename(argv[0]) not in TERRAFORM_NAMES or procs.stat_fields(pid) is None:
            continue
        if not may_hold_lock(argv):
            continue
        try:
            cwd = os.readlink("/proc/%s/cwd" % pid)
        except OSError:
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as fh:
                envs = dict(e.split(b"=", 1) for e in fh.read().split(b"\0") if b"=" in e)
            data_dir = envs.get(b"TF_DATA_DIR", b"").decode("utf-8", "replace") or None
        except OSError:
            # another user's process: we cannot tell which state it uses, so it may hold the lock
            found.append({"pid": int(pid), "argv": argv, "cwd": cwd})
            continue
        other = backend_of(cwd, data_dir)
        # no initialised backend there: that process cannot be holding an S3 state lock
        if other is not None and _same_state(backend, other):
            found.append({"pid": int(pid), "argv": argv, "cwd": cwd})
    return found


def _describe(info: Mapping[str, Any]) -> str:
    age = info.get("lock_age")
    written = ", written %s ago by the store's clock" % clock.age_text(age) if age is not None else ""  # read_lock's alone
    return ("%s is locked by %s since %s (operation %s, lock ID %s%s)"
            % (info.get("Path") or info.get("lock_object"), info.get("Who") or "?", info.get("Created") or "?",
               info.get("Operation") or "?", info.get("ID") or "?", written))


#: how a refusal tells the operator to name a lock (``{id}``): the run variable the tofu_root role passes
CONFIRM_BY_RUN_VARIABLE = ("run again with -e csis_force_unlock={id} (from AWX: the workflow's survey question "
                           "'Release a state lock')")

#: the same for ``playbooks/state_import.yml`` (it passes ``csis_force_unlock`` to csis_state_import)
CONFIRM_BY_STATE_IMPORT = ("run the state import again with -e csis_force_unlock={id} (from AWX: the 'csis state import' "
                           "job template's survey question 'Release a state lock')")


def check_and_release(root: str, binary: str = "terraform", release: bool = True,
                      env: Optional[Mapping[str, str]] = None, confirmed_gone: Optional[Sequence[str]] = (),
                      confirm_with: Optional[str] = CONFIRM_BY_RUN_VARIABLE) -> Dict[str, Any]:
    """Release a lock whose holder is provably dead; refuse on any other lock. See module doc.

    ``confirmed_gone``: lock IDs the operator names as left by runs that are gone (the run
    variable ``csis_force_unlock``, from a refusal's message; None, as AWX passes a blank survey
    answer, names none): such a lock is released whoever
    took it, but for one a live process of this machine holds (where its processes can be read:
    elsewhere the operator's word is taken). An ID that is not the lock's releases nothing (a lock
    taken since is another run's). ``confirm_with``: how a refusal says to name the lock (``{id}``),
    None where the caller takes no IDs.

    A root holding terraform's ``errored.tfstate`` (an apply whose state never reached the
    backend) is refused first: :func:`.errored.check_errored_state`."""
    check_errored_state(root, binary)
    backend = backend_of(root)
    result: Dict[str, Any] = {"changed": False, "locked": False, "released": False, "lock": None}
    if backend is None or lock_key(backend) is None:
        result["msg"] = "no S3 lockfile backend: nothing to check"
        return result
    info = read_lock(backend)
    if info is None:
        result["msg"] = "the state is not locked"
        return result
    result.update(locked=True, lock=info)
    what = _describe(info)
    lock_id = str(info.get("ID") or "")
    named = confirm_with.format(id=lock_id) + ", or " if confirm_with and lock_id else ""
    procedure = ("if that run is really gone, release the lock: %s%s -chdir=%s force-unlock %s "
                 "(docs/operations.md, 'State is locked')" % (named, binary, root, lock_id or "<ID>"))
    if str(info.get("Operation") or "") == "OperationTypeApply":
        # a killed apply may have changed reality without saving its state: the state behind the lock
        # is then older than reality, and the next plan would create again what it created
        procedure += ("; an apply held it: what it changed may be missing from the state, so run "
                      "playbooks/state_query.yml before the next plan (what it created shows as foreign; adopt it "
                      "with playbooks/state_import.yml)")
    if lock_id and lock_id in {str(i).strip() for i in confirmed_gone or ()}:  # None: an unset run variable
        # the operator's word, but for a live process of this machine (another user's too) working on this state
        _refuse_live_holders(backend, what)
        return _release_confirmed(root, binary, env, release, result, what, lock_id)
    if info.get("Who") != local_who():
        raise StateLockError("STATE LOCKED: %s, a run on another machine (or user). It may still be "
                             "running: wait for it; %s" % (what, procedure))
    awx_job = first_set(AWX_JOB_ID_VARIABLES)
    if awx_job:
        # an AWX job's container sees its own processes, not its execution node's: another job's
        # container can share the host name (host networking) while its terraform is invisible here
        raise StateLockError("STATE LOCKED: %s; this run is AWX job %s, whose container cannot see the processes of "
                             "other jobs on its node, so whether the holder is gone cannot be told from here: %s"
                             % (what, printable(awx_job)[:40], procedure))
    if not procs.available():
        raise StateLockError("STATE LOCKED: %s; this machine's processes cannot be read (no /proc), so whether its "
                             "holder is gone cannot be told: %s" % (what, procedure))
    _refuse_live_holders(backend, what)
    if not release or not info.get("ID"):
        raise StateLockError("STATE LOCKED: %s; its holder on this machine is gone (no terraform process "
                             "uses this state): %s" % (what, procedure), releasable=bool(info.get("ID")),
                             lock="%s; its holder on this machine is gone" % what, content=info)
    rc, output = terraform.force_unlock(root, binary, str(info["ID"]), env)
    if rc != 0:
        raise StateLockError("STATE LOCKED: %s; its holder is gone but force-unlock failed (rc %d): %s"
                             % (what, rc, output))
    result.update(changed=True, released=True,
                  msg="released a stale state lock: %s; its holder on this machine is gone "
                      "(no terraform process uses this state)" % what)
    return result


def _release_confirmed(root: str, binary: str, env: Optional[Mapping[str, str]], release: bool,
                       result: Dict[str, Any], what: str, lock_id: str) -> Dict[str, Any]:
    """Release the lock the operator named (``csis_force_unlock``); terraform refuses if it changed."""
    said = "its ID was given in csis_force_unlock: the operator found its run gone"
    if not release:
        raise StateLockError("STATE LOCKED: %s; %s: not released (release is off)" % (what, said), releasable=True,
                             lock="%s; %s" % (what, said), content=result["lock"])
    rc, output = terraform.force_unlock(root, binary, lock_id, env)
    if rc != 0:
        raise StateLockError("STATE LOCKED: %s; %s, but force-unlock failed (rc %d): %s" % (what, said, rc, output))
    result.update(changed=True, released=True, msg="released the state lock: %s; %s" % (what, said))
    return result


def _refuse_live_holders(backend: Mapping[str, Any], what: str) -> None:
    """Refuse while a process of this machine works on this state (where its processes can be read)."""
    holders = live_holders(backend) if procs.available() else []
    if holders:
        pids = ", ".join("%d (%s in %s)" % (h["pid"], " ".join(h["argv"][:2]), h["cwd"]) for h in holders)
        raise StateLockError("STATE LOCKED: %s, held by a live process on this machine: %s. "
                             "Wait for that run to finish." % (what, pids))
