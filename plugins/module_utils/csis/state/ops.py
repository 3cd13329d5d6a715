# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Correct meta-state records: forget an instance or a storage, import a storage.

These are the operator's answers to a HARD line of the state query (a record of
something that no longer exists) and to a foreign resource that should be managed.
Every change goes through a :meth:`MetaState.transaction` (lock, atomic replace).

* :func:`forget_instance` drops a launched instance's records (launch-params, its pin and
  pending replacement; its open generation is closed into the history with
  ``why: forgotten``). It refuses while the recorded machine still exists at the endpoint
  (or when that cannot be checked) unless ``confirm`` is true.
* :func:`forget_storage` drops a storage's ``storage-state.yaml`` record, with the same
  refusal for a storage whose resource still exists.
* Forgetting again what was forgotten last (the instance's last generation closed ``why:
  forgotten``; the storage's last audit record a forget of it) changes nothing and says so
  (``already_forgotten``); so does forgetting an instance whose last machine went through its
  lifecycle (decommissioned, torn down: ``closed_as``); a name nothing ever recorded is refused,
  as a typo should be.

Destroy before delete: a record is deleted once what it records is destroyed. A storage
recorded ``destroyed`` is forgotten as it is (no lookup). A record that still says the
thing exists (a launched instance, a storage recorded ``active`` or ``archived``) is
forgotten only on the operator's word: ``force`` when the endpoint shows it gone (the
record of a thing destroyed behind the system's back), ``confirm`` when it still exists or
cannot be checked (it becomes foreign). :func:`not_destroyed` words the refusal.
* :func:`import_storage` records a declared storage as ``active`` with the facts of an
  existing resource (volume, filesystem, bucket), after checking the id at the endpoint.

Neither touches terraform state: see docs/drift.md.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import terraform, tfstate
from ..apply.statelock import CONFIRM_BY_STATE_IMPORT, StateLockError, check_and_release
from ..aws import ClientFactory, Endpoint, error_text, tree_access
from ..clock import now
from ..config.loader import load_tree
from ..config.names import archive_snapshot_name, label
from ..config.models import bucket_for
from ..config.secrets import Reveal, tf_secret_env
from ..config.validate import read_meta
from ..errors import CsisError
from ..render.plan import root_dir
from ..render.writer import UNCHANGED, prepared_for_a_real_run
from .drift import run_id
from .expectations import expectations
from .lookups import lookup_bucket, lookup_filesystem, lookup_instance, lookup_storage, lookup_volume
from .record import add_history, attaches, close_instance_records, mounted_storages, refresh_storage_model
from .store import WHAT_FORGET_INSTANCE, WHAT_FORGET_STORAGE, WHAT_IMPORT_STORAGE, MetaState, audit_root_event, audit_trail


class StateOpError(CsisError):
    pass


_ID_RE = {"ebs": re.compile(r"^vol-[0-9a-f]{8,32}$"), "efs": re.compile(r"^fs-[0-9a-f]{8,32}$"),
          "s3": re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")}
_ID_SHAPE = {"ebs": "a volume id (vol-...)", "efs": "a filesystem id (fs-...)", "s3": "a bucket name"}


def _load(config_root: str, overlays: Any) -> Any:
    tree = load_tree(config_root, overlays=overlays or ())
    meta, problems = read_meta(tree.root, ("storage-state.yaml", "launch-params.yaml", "instance-state.yaml",
                                           "pins.yaml"))
    if problems:
        raise StateOpError("\n".join(str(p) for p in problems))
    return tree, meta


#: what a forget's ``checked`` starts with when nothing looked the resource up
NOT_LOOKED_UP = "not looked up"


def not_looked_up(what: str, recorded: str, checked: str) -> StateOpError:
    """The refusal to forget, with ``force``, a record that is not destroyed and whose resource nothing
    looked up: ``force`` is for what the endpoint shows gone, and nothing showed it."""
    return StateOpError("%s is recorded %s, not destroyed, and its resource was %s: whether it is gone cannot be told, "
                        "so force does not apply. Destroy it through its lifecycle, or pass confirm=true to forget "
                        "the record anyway" % (what, recorded, checked))


def not_destroyed(what: str, recorded: str, checked: str) -> StateOpError:
    """The refusal to forget a record that is not destroyed (destroy before delete)."""
    return StateOpError("%s is recorded %s, not destroyed (at the endpoint: %s). Destroy before delete: a record is "
                        "deleted once what it records is destroyed (through its lifecycle, or "
                        "playbooks/destroy_environment.yml); if it is gone for good, pass force=true to forget the "
                        "record of a thing that is gone" % (what, recorded, checked))


def _endpoint(tree: Any, runtime: Optional[str], factory: Optional[ClientFactory], reveal: Optional[Reveal]) -> Endpoint:
    """The runtime's endpoint, reached with its static keys revealed by ``reveal`` (``aws.tree_access``)."""
    if runtime is None or runtime not in tree.runtimes:
        raise StateOpError("runtime %r is not declared: cannot reach its endpoint" % (runtime,))
    return Endpoint(tree_access(tree, runtime, reveal), factory)


# --------------------------------------------------------------------------- forget
def _already(what: str, name: str, when: str) -> Dict[str, Any]:
    """The result of forgetting again what was forgotten last: nothing written."""
    return {what: name, "already_forgotten": True, "checked": "already forgotten (%s); nothing to do" % when,
            "written": []}


def forget_instance(config_root: str, name: str, overlays: Any = (), confirm: bool = False, run: Optional[str] = None,
                    check: bool = False, factory: Optional[ClientFactory] = None, force: bool = False,
                    reveal: Optional[Reveal] = None) -> Dict[str, Any]:
    tree, meta = _load(config_root, overlays)
    lps = meta["launch-params.yaml"]["instances"]
    iss = meta["instance-state.yaml"]["instances"]
    pins = meta["pins.yaml"]
    recorded = name in lps or (iss.get(name) or {}).get("current") or name in pins["instances"] \
        or name in pins["pending_replacements"]
    last = ((iss.get(name) or {}).get("history") or [None])[-1]
    if not recorded and isinstance(last, dict) and last.get("why") == "forgotten":
        return dict(_already("instance", name, "run %s, %s" % (last.get("closed_run"), last.get("closed_at"))),
                    instance_id=last.get("instance_id"))
    if not recorded and isinstance(last, dict) and last.get("why"):
        # its machine went through a lifecycle (decommissioned, torn down, gone): no record says
        # it stands; instance-state.yaml keeps its generation history, which a forget never deletes
        return {"instance": name, "instance_id": last.get("instance_id"), "closed_as": last["why"], "written": [],
                "checked": "its last machine (%s) was closed as %s in run %s, %s: nothing records it as standing, "
                           "so there is nothing to forget (its generation history stays in instance-state.yaml)"
                           % (last.get("instance_id") or "no id recorded", last["why"], last.get("closed_run"),
                              last.get("closed_at"))}
    if not recorded:
        raise StateOpError("instance '%s': nothing is recorded for it (recorded instances: %s)"
                           % (name, ", ".join(sorted(lps)) or "none"))
    exp = expectations(tree, meta)["instances"].get(name) or {}
    iid = ((iss.get(name) or {}).get("current") or {}).get("instance_id")
    checked = NOT_LOOKED_UP + " (no instance id of it is recorded)"
    if iid:
        rt = exp.get("runtime") or (lps.get(name) or {}).get("runtime")
        try:
            obs = lookup_instance(_endpoint(tree, rt, factory, reveal), iid)
        except StateOpError as exc:
            obs = {"error": str(exc)}
        if "error" in obs:
            if not confirm:
                raise StateOpError("instance '%s': cannot tell whether %s still exists (%s); pass confirm=true to "
                                   "forget it anyway" % (name, iid, obs["error"]))
            checked = "unknown: %s" % obs["error"]
        elif obs.get("present"):
            if not confirm:
                raise StateOpError("instance '%s': the machine %s still exists (%s); forgetting it leaves it running "
                                   "unmanaged (it becomes foreign). Pass confirm=true to forget it anyway"
                                   % (name, iid, obs.get("state")))
            checked = "%s still exists (%s); forgotten on confirm" % (iid, obs.get("state"))
        else:
            checked = "%s is gone%s" % (iid, " (%s)" % obs["state"] if obs.get("state") else "")
    live = bool((lps.get(name) or {}).get("launched")) or bool((iss.get(name) or {}).get("current"))
    if live and not iid and not confirm:
        raise not_looked_up("instance '%s'" % name, "launched", checked)
    if live and not (force or confirm):
        raise not_destroyed("instance '%s'" % name, "launched", checked)
    run = run or run_id()
    result = {"instance": name, "instance_id": iid, "checked": checked, "written": []}
    if check:
        return result
    with MetaState(tree.root).transaction(WHAT_FORGET_INSTANCE + name) as txn:
        pins = txn.load_rest("pins.yaml")
        launch = close_instance_records(txn, pins, name, "forgotten", run, op="forget")
        txn.save_rest("pins.yaml", pins)
        refresh_storage_model(txn, mounted_storages(launch), {name: None})
    result["written"] = list(txn.written)
    return result


def forget_storage(config_root: str, name: str, overlays: Any = (), confirm: bool = False, run: Optional[str] = None,
                   check: bool = False, factory: Optional[ClientFactory] = None, force: bool = False,
                   reveal: Optional[Reveal] = None) -> Dict[str, Any]:
    tree, meta = _load(config_root, overlays)
    recs = meta["storage-state.yaml"]["storages"]
    if name not in recs:
        # the last change of its records (not a drift line: forget.yml's state query right after
        # the forget drops the storage's HARD line, and that is no change of the storage's record)
        trail = audit_trail(MetaState(tree.root), storage=name, drift=False)
        if trail and trail[-1].get("what") == "csis_forget storage %s" % name:
            return _already("storage", name, "revision %s, %s" % (trail[-1].get("revision"), trail[-1].get("time")))
        raise StateOpError("storage '%s': nothing is recorded for it (recorded storages: %s)"
                           % (name, ", ".join(sorted(recs)) or "none"))
    declared = tree.storages.get(name)
    if declared is not None and declared.state != "active":
        # forgotten, it is a storage never applied, which must start active (validate refuses it
        # otherwise, and every run with it)
        raise StateOpError("storage '%s' is still declared with state: %s; once forgotten it would be a new storage, "
                           "which must start active, and the tree would no longer validate. Remove its declaration "
                           "from storages/ first (or declare it active to have it created anew), then forget it"
                           % (name, declared.state))
    exp = expectations(tree, meta)["storages"].get(name)
    checked = NOT_LOOKED_UP + (" (recorded destroyed)" if recs[name].get("state") == "destroyed"
                               else " (a storage of its type has no lookup)" if exp is None
                               else " (no id of it is recorded)")
    looked = False  # whether the endpoint was asked (an error answer included)
    if exp is not None and recs[name].get("state") != "destroyed":
        try:
            obs = lookup_storage(_endpoint(tree, exp.get("runtime"), factory, reveal), exp)
        except StateOpError as exc:
            obs = {"error": str(exc)}
        looked = bool(obs)
        if "error" in obs:
            if not confirm:
                raise StateOpError("storage '%s': cannot tell whether its %s still exists (%s); pass confirm=true to "
                                   "forget it anyway" % (name, obs.get("what") or "resource", obs["error"]))
            checked = "unknown: %s" % obs["error"]
        elif obs.get("present"):
            if not confirm:
                raise StateOpError("storage '%s': its %s %s still exists; forgetting it leaves it unmanaged (it "
                                   "becomes foreign). Pass confirm=true to forget it anyway"
                                   % (name, obs.get("what"), obs.get("id")))
            checked = "%s %s still exists; forgotten on confirm" % (obs.get("what"), obs.get("id"))
        elif obs:
            checked = "%s %s is gone" % (obs.get("what"), obs.get("id"))
    if recs[name].get("state") != "destroyed" and not looked and not confirm:
        raise not_looked_up("storage '%s'" % name, recs[name].get("state"), checked)
    if recs[name].get("state") != "destroyed" and not (force or confirm):
        raise not_destroyed("storage '%s'" % name, recs[name].get("state"), checked)
    mounted = sorted(n for n, r in meta["launch-params.yaml"]["instances"].items() if attaches(name, r))
    run = run or run_id()
    result = {"storage": name, "was": recs[name].get("state"), "checked": checked, "mounted_by": mounted,
              "written": []}
    if check:
        return result
    with MetaState(tree.root).transaction(WHAT_FORGET_STORAGE + name) as txn:
        txn.save_record("storage-state.yaml", name, None)
        refresh_storage_model(txn, [name])
    result["written"] = list(txn.written)
    return result


# --------------------------------------------------------------------------- import
_TF_RESOURCE = {"ebs": "aws_ebs_volume.this", "efs": "aws_efs_file_system.this", "s3": "aws_s3_bucket.this"}


def _terraform_adoption(tree: Any, builder: Any, name: str, stype: str, storage_id: str, check: bool,
                        gone: Any = None, force_unlock: Optional[Sequence[str]] = (), run: Optional[str] = None,
                        reveal: Optional[Reveal] = None, overlays: Any = (), render_root: bool = False) -> Tuple[bool, str]:
    """Make the storage root's terraform state hold ``storage_id`` at the storage's address, so the
    next storage run manages the imported resource instead of planning its create (which the gate
    refuses for a recorded storage). A root that is not initialised against its backend (never
    rendered, rendered only by a dry run, or in a checkout that keeps no ``generated/``: every AWX
    job's), or whose files do not declare the storage yet, is rendered and initialised first with
    ``render_root`` (what csis_state_import asks), as a storage run's render does it (only that
    root: ``render(..., only_roots=[...])``; check mode says it would); without it, such a root is
    left to the storage run (and the result says so). A module call rendered since the root's last
    ``init`` (a dry run after the storage was declared) is installed first (``terraform get``).

    A state that holds another id there is refused, unless ``gone(id)`` says every id it holds
    is gone from the endpoint (a volume deleted out of band, the drift report's ``missing``): that
    entry is then removed from the state (``state rm``) before the import.

    The root's S3 state lock is checked before anything is done to the root: a lock whose holder
    on this machine is gone, or whose ID the operator gives in ``force_unlock`` (the run variable
    ``csis_force_unlock``), is released and the release is put in the audit trail; any other lock
    refuses the import (check mode says what a real run would release, or refuses the same way).

    ``terraform import`` reads the root's configuration, so it runs with the root's variables the
    lifecycles give it from the environment: the builder runtime's static keys
    (``TF_VAR_csis_aws_*``, revealed by ``reveal``), as csis_plan's action plugin gives them.

    Returns (whether the state was changed, or in check mode would be; what was done, for the
    operator)."""
    directory = os.path.join(tree.root, root_dir("storage", builder.name))
    call = "storage_%s" % label(name)
    address = "module.%s.%s" % (call, _TF_RESOURCE[stype])
    data_dir = os.environ.get("TF_DATA_DIR")
    rendered, render_changed = "", False
    has_backend = tfstate.backend_of(directory, data_dir) is not None
    # init recorded a backend, or a real run's render prepared a root with no backend block (its local state)
    initialised = has_backend or prepared_for_a_real_run(directory)
    declares = _declares_module(directory, call)
    if not initialised and not render_root:
        return False, "terraform state not touched: %s is not rendered and initialised yet" % directory
    if not declares and not render_root:
        return False, ("terraform state not touched: %s was rendered before storage '%s' was declared (a storage run "
                       "renders it and stops at the gate; then state import again)" % (directory, name))
    if not initialised or not declares:
        why = ("not initialised for a real run" if not initialised
               else "rendered before storage '%s' was declared" % name)
        if check:
            # the state lock as a real run would find it, where the root can be read already
            lock = _release_state_lock(tree, builder, directory, _binary_of(tree, builder), True, force_unlock, run) \
                if has_backend else ""
            return True, ("would render and initialise %s (%s), then import %s into its terraform state as %s%s"
                          % (directory, why, storage_id, address, " (%s)" % lock if lock else ""))
        render_changed = _render_root(tree, builder, overlays)
        rendered = " (after rendering and initialising the root: it was %s)" % why
    binary = _binary_of(tree, builder)
    # rendered again since its last init (a dry run after the storage was declared): the module
    # call is in the files but not installed, and terraform would refuse the import ("Module not
    # installed"). `terraform get` installs the collection's local module; no backend, no provider.
    install = call not in _installed_modules(directory, data_dir)
    try:
        state = tfstate.read(directory, binary)
    except terraform.TerraformError as exc:
        raise StateOpError("storage '%s': cannot read the terraform state of %s: %s" % (name, directory, exc)) from exc
    held = [i.get("attributes", {}).get("id") for r in state.get("resources") or []
            if r.get("mode") == "managed" and "%s.%s.%s" % (r.get("module"), r.get("type"), r.get("name")) == address
            for i in r.get("instances") or []]
    if held == [storage_id]:
        return render_changed, "terraform state already holds %s as %s%s" % (storage_id, address, rendered)
    stale = bool(held) and gone is not None and all(gone(h) for h in held)
    if held and not stale:
        raise StateOpError("storage '%s': the terraform state of %s holds %s as %s, not %s, and it is not gone from "
                           "the endpoint: the import does not put another resource in its place. If it is to be left "
                           "unmanaged (or is gone after all), remove it from the state first (%s -chdir=%s state rm %s), "
                           "then import again"
                           % (name, directory, ", ".join(str(h) for h in held), address, storage_id,
                              binary, directory, address))
    dropped = " (after removing %s, gone from the endpoint, from it)" % ", ".join(str(h) for h in held) if stale else ""
    installed = " (after installing its module %s)" % call if install else ""
    lock = _release_state_lock(tree, builder, directory, binary, check, force_unlock, run)
    rt = tree.builder_runtime(builder)
    secret_env = tf_secret_env(rt, reveal) if rt is not None else {}
    done: List[str] = []   # what changed the root before a step that failed (said with the failure)
    released = " (%s)" % lock if lock else ""
    if check:
        return True, "would import %s into the terraform state of %s as %s%s%s%s" % (
            storage_id, directory, address, dropped, installed, released)
    if rendered:
        done.append("the root was rendered and initialised")

    def run_or_fail(args: List[str]) -> None:
        res = terraform.run(binary, args, directory, extra_env=secret_env)
        if res["rc"] != 0:  # a lock released before it stays said (it is in the audit trail too)
            before = ([lock] if lock else []) + done
            raise StateOpError("storage '%s': %s failed in %s (rc %d): %s%s"
                               % (name, res["cmd"], directory, res["rc"], (res["stderr"] or res["stdout"]).strip()[-1500:],
                                  " (before it, %s)" % "; ".join(before) if before else ""))

    if install:
        run_or_fail(["get", "-no-color"])
    if stale:
        run_or_fail(["state", "rm", "-no-color", address])
        done.append("%s, gone from the endpoint, was removed from the terraform state (%s holds nothing now: the next "
                    "storage run plans its create, which the gate refuses for a recorded storage; state import again "
                    "once the error is mended)" % (", ".join(str(h) for h in held), address))
    run_or_fail(["import", "-input=false", "-no-color", address, storage_id])
    return True, "imported %s into the terraform state of %s as %s%s%s%s%s" % (
        storage_id, directory, address, rendered, dropped, installed, released)


def _binary_of(tree: Any, builder: Any) -> str:
    """The terraform (or tofu) binary of the builder's root."""
    ex = tree.executables.get(builder.executable or "")
    return ex.binary if ex else "terraform"


def _render_root(tree: Any, builder: Any, overlays: Any) -> bool:
    """Render and initialise the storage root of ``builder`` as a storage run's render does it
    (written for real, ``init -reconfigure`` against its backend), and no other root."""
    from ..render.pipeline import render  # the render imports the state library: not at import time
    try:
        res = render(tree.root, ["storage"], dry_run=False, overlays=overlays or (), workers=1,
                     only_roots=["storage-%s" % builder.name])
    except CsisError as exc:
        raise StateOpError("the storage root of builder '%s' could not be rendered and initialised for the import: "
                           "%s; nothing was imported or recorded" % (builder.name, exc)) from exc
    # its files written, or its init run (an unchanged root a real run never prepared)
    return bool(res.get("changed")) or any(c != UNCHANGED and "init" in c
                                           for r in res.get("roots") or [] for c in r.get("commands") or [])


def _release_state_lock(tree: Any, builder: Any, directory: str, binary: str, check: bool,
                        force_unlock: Optional[Sequence[str]], run: Optional[str]) -> str:
    """The root's state lock before an import: released when its holder on this machine is gone or
    the operator named its ID (audited), else refused (:func:`.check_and_release`). Returns what was
    (check mode: would be) released, for the import's line, or ''."""
    try:
        lock = check_and_release(directory, binary, release=not check, confirmed_gone=force_unlock,
                                 confirm_with=CONFIRM_BY_STATE_IMPORT)
    except StateLockError as exc:
        if check and exc.releasable:
            return "after releasing the state lock: %s" % exc.lock
        raise
    if not lock.get("released"):
        return ""
    audit_root_event(tree.root, "state lock released", "storage-%s" % builder.name, detail=lock["msg"], run=run,
                     lifecycle="storage")
    return str(lock["msg"])


def _declares_module(directory: str, call: str) -> bool:
    """Whether a ``.tf`` file of the rendered root declares ``module "<call>"`` (the render writes
    them in fmt form: one ``module "<name>" {`` line each)."""
    line = re.compile(r'^module "%s" \{' % re.escape(call), re.M)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".tf"))
    except OSError:
        return False
    for n in names:
        try:
            with open(os.path.join(directory, n), "r", encoding="utf-8") as fh:
                if line.search(fh.read()):
                    return True
        except (OSError, UnicodeDecodeError):
            continue
    return False


def _installed_modules(directory: str, data_dir: Optional[str]) -> set:
    """The module call keys ``init``/``get`` installed in the root (``<data dir>/modules/modules.json``)."""
    path = os.path.join(directory, data_dir or ".terraform", "modules", "modules.json")
    try:
        with open(path, "r", encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return set()
    mods = doc.get("Modules") if isinstance(doc, dict) else None
    return {m.get("Key") for m in mods or [] if isinstance(m, dict) and isinstance(m.get("Key"), str)}


def _refuse_foreign(tree: Any, ep: Endpoint, st: Any, builder: Any, name: str, stype: str, storage_id: str,
                    obs: Dict[str, Any]) -> None:
    """Refuse a resource that cannot be the storage's: another tree's (its ``csis_config`` tag), a
    bucket of another name than the storage's (the root manages the declared name: any other would
    be planned as its replacement), a volume that is an instance's root volume."""
    tag = tree.resource_tag()["csis_config"]
    other = (obs.get("tags") or {}).get("csis_config")
    if other and tag and other != tag:
        raise StateOpError("storage '%s': %s %s carries csis_config=%s, another tree's tag (this tree is %s): it is "
                           "that tree's, not imported" % (name, obs.get("what"), storage_id, other, tag))
    if stype == "s3" and storage_id != bucket_for(st, builder):
        raise StateOpError("storage '%s': its bucket is %s (the storage's bucket_name, else its builder's, else its name); "
                           "bucket %s is another: the storage root manages the declared name, and would plan the "
                           "imported bucket's replacement. Import %s, or declare bucket_name: %s"
                           % (name, bucket_for(st, builder), storage_id, bucket_for(st, builder), storage_id))
    if stype != "ebs" or not obs.get("attached_to"):
        return
    try:
        resv = ep.call("ec2", "describe_instances", InstanceIds=sorted(set(obs["attached_to"]))).get("Reservations") or []
    except Exception as exc:  # noqa: BLE001 - said, and nothing recorded
        raise StateOpError("storage '%s': cannot check the instances volume %s is attached to (%s): %s"
                           % (name, storage_id, ", ".join(obs["attached_to"]), error_text(exc))) from exc
    for inst in (i for r in resv for i in r.get("Instances") or []):
        for bdm in inst.get("BlockDeviceMappings") or []:
            if (bdm.get("Ebs") or {}).get("VolumeId") == storage_id and bdm.get("DeviceName") == inst.get("RootDeviceName"):
                raise StateOpError("storage '%s': volume %s is the root volume of instance %s (%s), not a storage "
                                   "volume: not imported" % (name, storage_id, inst.get("InstanceId"), bdm.get("DeviceName")))


def _refuse_replacing_a_live_one(rec: Dict[str, Any], name: str, id_key: str, storage_id: str, look: Any,
                                 state_rm: str) -> None:
    """Refuse to record ``storage_id`` over the storage's recorded resource while that one still
    exists (or cannot be told gone): it would be left unmanaged, and the state query would call the
    data the tree runs on foreign. ``forget.yml ... confirm=true`` and the old resource's ``state
    rm`` (``state_rm``: the command) first say that is meant."""
    recorded = (rec.get("facts") or {}).get(id_key)
    if not recorded or recorded == storage_id or rec.get("state") in (None, "destroyed"):
        return
    seen = look(str(recorded))
    if "error" in seen:
        raise StateOpError("storage '%s': cannot tell whether its recorded %s %s still exists (%s): not imported over it"
                           % (name, seen.get("what"), recorded, seen["error"]))
    if seen.get("present"):
        raise StateOpError("storage '%s' is recorded with %s %s, which still exists (%s%s): importing %s would leave it "
                           "unmanaged (the state query would call it foreign). If %s is to take its place, forget the "
                           "storage first (playbooks/forget.yml -e forget_storage=%s -e confirm=true) and remove %s from "
                           "the storage root's terraform state (%s), then import it; not imported"
                           % (name, seen.get("what"), recorded, seen.get("state"),
                              ", attached to %s" % ", ".join(seen["attached_to"]) if seen.get("attached_to") else "",
                              storage_id, storage_id, name, recorded, state_rm))


def import_storage(config_root: str, name: str, storage_id: str, overlays: Any = (), run: Optional[str] = None,
                   check: bool = False, factory: Optional[ClientFactory] = None,
                   reveal: Optional[Reveal] = None, force_unlock: Optional[Sequence[str]] = (),
                   render_root: bool = False) -> Dict[str, Any]:
    """Record the existing resource ``storage_id`` as the declared storage ``name`` (and import it
    into the storage root's terraform state: :func:`_terraform_adoption`; ``render_root``: render
    and initialise that root first when it is not, as csis_state_import does)."""
    tree, meta = _load(config_root, overlays)
    st = tree.storages.get(name)
    if st is None:
        raise StateOpError("storage '%s' is not declared: declare it first (a recorded storage that is not "
                           "declared is planned as destroyed)" % name)
    builder = tree.storage_builder_for(st)
    if builder is None:
        raise StateOpError("storage '%s': its builder %r is not declared" % (name, st.type))
    stype = tree.kind_of(builder).get("capability")
    if stype not in _ID_RE:
        raise StateOpError("storage '%s': builder '%s' (%s) has nothing to import" % (name, builder.name, builder.type))
    storage_id = (storage_id or "").strip()
    if not _ID_RE[stype].match(storage_id):
        raise StateOpError("storage '%s' (%s): storage_id %r is not %s" % (name, stype, storage_id, _ID_SHAPE[stype]))
    recs = meta["storage-state.yaml"]["storages"]
    if (recs.get(name) or {}).get("state") == "archived":
        # an import would record it active and forget its archive snapshot (which stays, unreferenced:
        # a foreign snapshot in the drift report, and a pre-0.1.0 name lost for good)
        snap = ((recs[name].get("facts") or {}).get("archive")) or archive_snapshot_name(name)
        raise StateOpError("storage '%s' is recorded archived (its archive snapshot %s): an import would record it "
                           "active and leave that snapshot unreferenced. Restore it through its lifecycle (declare "
                           "state: active: the run restores the volume from the snapshot), or declare it destroyed "
                           "(the run deletes the snapshot) and import into the new record" % (name, snap))
    id_key = {"ebs": "volume_id", "efs": "file_system_id", "s3": "bucket_name"}[stype]
    for other, rec in sorted(recs.items()):
        if other != name and rec.get("state") != "destroyed" and (rec.get("facts") or {}).get(id_key) == storage_id:
            raise StateOpError("storage '%s': %s is already recorded for storage '%s'" % (name, storage_id, other))
    rt = tree.builder_runtime(builder)
    ep = _endpoint(tree, rt.name if rt is not None else None, factory, reveal)

    def look(some_id: str) -> Dict[str, Any]:
        if stype == "ebs":
            return lookup_volume(ep, some_id)
        if stype == "efs":
            return lookup_filesystem(ep, some_id, False)
        return lookup_bucket(ep, some_id, False)

    def gone(some_id: str) -> bool:
        """Known absent at the endpoint (not merely unreadable)."""
        seen = look(str(some_id))
        return "error" not in seen and not seen.get("present")

    obs = look(storage_id)
    where = (ep.access.get("endpoints") or {}).get({"ebs": "ec2", "efs": "efs", "s3": "s3"}[stype]) \
        or "region %s" % ep.access.get("region")
    if "error" in obs:
        raise StateOpError("storage '%s': cannot check %s %s at %s: %s" % (name, obs["what"], storage_id, where, obs["error"]))
    if not obs.get("present"):
        raise StateOpError("storage '%s': %s %s does not exist at %s" % (name, obs["what"], storage_id, where))
    if obs.get("state") not in ("available", "in-use"):
        raise StateOpError("storage '%s': %s %s is %s, not available" % (name, obs["what"], storage_id, obs.get("state")))
    _refuse_foreign(tree, ep, st, builder, name, stype, storage_id, obs)
    _refuse_replacing_a_live_one(recs.get(name) or {}, name, id_key, storage_id, look,
                                 "%s -chdir=%s state rm module.%s.%s" % (
                                     _binary_of(tree, builder), os.path.join(tree.root, root_dir("storage", builder.name)),
                                     "storage_%s" % label(name), _TF_RESOURCE[stype]))
    facts: Dict[str, Any] = {"builder": builder.name, "type": stype}
    if stype == "ebs":
        facts.update(volume_id=storage_id, availability_zone=obs.get("availability_zone"), size=obs.get("size"),
                     archive=archive_snapshot_name(name))
    elif stype == "efs":
        facts["file_system_id"] = storage_id
    else:
        facts["bucket_name"] = storage_id
    run = run or run_id()
    result: Dict[str, Any] = {"storage": name, "type": stype, "id": storage_id, "facts": facts, "written": [],
                              "changed": True}
    # terraform first: a failed import leaves meta-state as it was
    adopted, result["terraform"] = _terraform_adoption(tree, builder, name, stype, storage_id, check, gone,
                                                       force_unlock, run, reveal, overlays, render_root)
    old = recs.get(name) or {}
    if old.get("state") == "active" and all((old.get("facts") or {}).get(k) == v for k, v in facts.items()):
        # the record as it is: changed only by the import into terraform (check mode: one that would run)
        result["changed"] = adopted
        return result
    if check:
        return result
    with MetaState(tree.root).transaction(WHAT_IMPORT_STORAGE + name) as txn:
        rec = txn.load_record("storage-state.yaml", name)
        cur = rec.get("state") if rec else None
        if rec is None:
            rec = {"state": None, "generation": 1, "facts": {}, "history": []}
        elif cur == "destroyed":
            rec["generation"] = int(rec.get("generation") or 1) + 1
        kept = {k: v for k, v in (rec.get("facts") or {}).items() if k not in ("volume_id", "file_system_id")}
        rec["facts"] = {**kept, **facts}
        rec["state"] = "active"
        add_history(rec, {"from": cur, "to": "active", "run": run, "at": now(), "generation": rec.get("generation", 1),
                    "action": "import", "id": storage_id})
        txn.save_record("storage-state.yaml", name, rec)
        refresh_storage_model(txn, [name])
    result["written"] = list(txn.written)
    return result
