# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Record in meta-state what an apply really did, read from the root's terraform state.

Nothing here trusts the configuration's flags or the requested states: a storage is
``active`` because its module's resources are in the state, ``destroyed`` because they
are gone after an apply that whitelisted the destroy, an instance is ``launched``
because ``aws_instance.this`` is in the state with an id. The caller runs this after the
root's apply step, also when that run applied nothing: the state holds what applies did, and
a record a stopped run could not write is written then (the role's task order guarantees it).
"""
from __future__ import annotations

import copy
import json
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional

from ..clock import now
from ..errors import CsisError
from .. import tfstate
from .backends import requester
from .store import WHAT_UPGRADE, WHAT_UPGRADE_CANCELLED, WHAT_VERIFICATION, MetaState, MetaStateError

HISTORY_MAX = 50


class RecordError(CsisError):
    pass


#: the resource types whose ``id`` a record reads (the ids meta-state keeps, the launch marker)
ID_READ = ("aws_instance", "aws_ebs_volume", "aws_efs_file_system", "aws_efs_access_point", "aws_s3_bucket")


def state_problem(state: Any) -> Optional[str]:
    """What makes ``state`` other than a state document as terraform writes it (what :func:`resources`
    reads), or None: read by terraform's ``state pull`` or from the backend, from another tool or edited."""
    if not isinstance(state, dict):
        return "the document is not a mapping"
    res = state.get("resources")
    if res is not None and not isinstance(res, list):
        return "'resources' is not a list"
    for i, r in enumerate(res or []):
        if not isinstance(r, dict):
            return "resources[%d] is not a mapping" % i
        if r.get("mode") != "managed":
            continue
        if not isinstance(r.get("type"), str) or not r["type"] or not isinstance(r.get("name"), str) or not r["name"]:
            return "resources[%d] has no type or no name" % i
        if not isinstance(r.get("module") or "", str):
            return "resources[%d] (%s.%s): 'module' is not a string" % (i, r["type"], r["name"])
        insts = r.get("instances")
        if insts is not None and not isinstance(insts, list):
            return "resources[%d] (%s.%s): 'instances' is not a list" % (i, r["type"], r["name"])
        for j, inst in enumerate(insts or []):
            attrs = inst.get("attributes") if isinstance(inst, dict) else None
            if not isinstance(attrs, dict):
                return "resources[%d] (%s.%s): instances[%d] has no attributes mapping" % (i, r["type"], r["name"], j)
            if r["type"] in ID_READ and not inst.get("deposed") and (not isinstance(attrs.get("id"), str) or not attrs["id"]):
                return "resources[%d] (%s.%s): instances[%d] has no id" % (i, r["type"], r["name"], j)
    return None


def resources(state: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Flatten raw state into [{address, module, type, name, index, attributes}] (managed only).
    Raises :class:`RecordError` for a state that is not as terraform writes it (:func:`state_problem`)."""
    problem = state_problem(state)
    if problem:
        raise RecordError("the terraform state does not read as terraform writes it: %s" % problem)
    out = []
    for r in state.get("resources") or []:
        if r.get("mode") != "managed":
            continue
        mod = r.get("module") or ""
        for inst in r.get("instances") or []:
            if inst.get("deposed"):
                continue
            idx = inst.get("index_key")
            addr = "%s%s.%s" % (mod + "." if mod else "", r["type"], r["name"])
            if idx is not None:
                addr += "[%s]" % (json.dumps(idx) if isinstance(idx, str) else idx)
            out.append({"address": addr, "module": mod, "type": r["type"], "name": r["name"], "index": idx,
                        "attributes": inst.get("attributes") or {}})
    return out


def under(res: List[Dict[str, Any]], module_addr: str) -> List[Dict[str, Any]]:
    """Resources inside ``module_addr`` (``module.x`` matches ``module.x`` and ``module.x[0]``)."""
    pat = re.compile(r"^%s(\[[^\]]+\])?(\.|$)" % re.escape(module_addr))
    return [r for r in res if pat.match(r["module"] or "")]


def _first(res: List[Dict[str, Any]], rtype: str, name: str = "this") -> Optional[Dict[str, Any]]:
    for r in res:
        if r["type"] == rtype and r["name"] == name:
            return r
    return None


def destroyed_by(address: str, deleted: Optional[Iterable[str]]) -> bool:
    """Whether the apply whose destroyed addresses are ``deleted`` destroyed something of the module
    at ``address`` (``None``: the caller does not say, as before it could: taken as yes)."""
    if deleted is None:
        return True
    return any(d == address or d.startswith(address + ".") or d.startswith(address + "[") for d in deleted)


def unconfirmed_text(kind: str, name: str, recorded: str, why: str) -> str:
    """What a record says of a subject it does not call gone: the state does not hold it, but no
    apply of this run destroyed it (an import that left terraform state untouched, a state edited
    by hand or lost, a record that failed after the apply that destroyed it)."""
    # a storage (declared destroyed: the only storage case): forgotten while declared so, it would
    # be a new storage that must start active, so its declaration goes first (csis_forget refuses)
    fix = ("remove its declaration from storages/, then playbooks/forget.yml -e forget_storage=%s -e force=true" % name
           if kind == "storage" else "playbooks/forget.yml -e forget_instance=%s -e force=true" % name)
    return ("%s %s is recorded %s and is %s, and the root's terraform state does not hold it, but this run's apply "
            "destroyed nothing of it: not recorded as gone. playbooks/state_query.yml shows whether it exists; if it "
            "is gone, %s records that (it looks it up first); if it exists, import it into the root "
            "(playbooks/state_import.yml)" % (kind, name, recorded, why, fix))


def add_history(rec: Dict[str, Any], entry: Dict[str, Any]) -> None:
    """Append ``entry`` to the record's ``history``, which keeps the last :data:`HISTORY_MAX`
    entries; the alias of a closed generation that drops out of it stays in ``retired_aliases``
    (an alias is never drawn again: state/aliases.py)."""
    history = rec.setdefault("history", [])
    history.append(entry)
    dropped = history[:-HISTORY_MAX]
    del history[:-HISTORY_MAX]
    aliases = [str(e["alias"]) for e in dropped if isinstance(e, dict) and e.get("alias")]
    if aliases:
        rec["retired_aliases"] = sorted(set(rec.get("retired_aliases") or []) | set(aliases))


# --------------------------------------------------------------------------- storages
def record_storage_root(ms: MetaState, root: Mapping[str, Any], state: Mapping[str, Any], run: str,
                        done_transitions: Iterable[Mapping[str, Any]] = (),
                        context: Optional[Mapping[str, Any]] = None,
                        event: Optional[Mapping[str, Any]] = None,
                        deleted: Optional[Iterable[str]] = None) -> Dict[str, Any]:
    """Record the storages of an applied storage root; returns {storage: (from, to)}.

    Reads and writes only the records of the root's storages (and their read-model records),
    whatever else meta-state holds. ``event`` (:func:`applied_event`) is audited with them.
    ``deleted``: the addresses this run's apply destroyed (none when it applied nothing); a
    storage recorded ``active`` that the state does not hold is recorded ``destroyed`` only when
    the apply destroyed something of its module, else it is listed in ``_unconfirmed``."""
    res = resources(state)
    deleted = None if deleted is None else list(deleted)
    done = {(t.get("storage"), t.get("action")) for t in done_transitions}
    changes: Dict[str, Any] = {}
    unconfirmed: List[str] = []
    with ms.transaction("csis_record storage root %s" % root.get("builder"), context=context) as txn:
        if event:
            txn.note(event)
        touched = []
        for name, info in sorted((root.get("storages") or {}).items()):
            mine = under(res, info["address"])
            rec = txn.load_record("storage-state.yaml", name)
            cur = rec.get("state") if rec else None
            facts: Dict[str, Any] = {"builder": info["builder"], "type": info["type"]}
            if info.get("bucket_name"):
                facts["bucket_name"] = info["bucket_name"]
            if info.get("archive_snapshot"):
                facts["archive"] = info["archive_snapshot"]
            new: Optional[str] = None
            action = None
            if mine:
                new = "active"
                vol = _first(mine, "aws_ebs_volume")
                fs = _first(mine, "aws_efs_file_system")
                b = _first(mine, "aws_s3_bucket")
                if vol:
                    facts.update(volume_id=vol["attributes"].get("id"),
                                 availability_zone=vol["attributes"].get("availability_zone"),
                                 size=vol["attributes"].get("size"))
                if fs:
                    facts["file_system_id"] = fs["attributes"].get("id")
                elif info["type"] == "efs":
                    for r in mine:
                        if r["type"] == "aws_efs_access_point":
                            facts["file_system_id"] = r["attributes"].get("file_system_id")
                            break
                if b:
                    facts["bucket_name"] = b["attributes"].get("bucket") or facts.get("bucket_name")
                tag = tree_tag((vol or fs or b or {}).get("attributes"))
                if tag:
                    facts["csis_config"] = tag  # the tree's tag the resource carries (validate compares it)
                if cur == "archived":
                    action = "restore"
            else:
                req = info.get("requested_state")
                if req == "archived" and cur == "active" and (name, "snapshot") in done:
                    new, action = "archived", "snapshot"
                elif req == "destroyed" and cur == "archived" and info.get("archive_snapshot"):
                    # the volume went at the archive; destroyed once the snapshot is deleted
                    if (name, "delete_archive_snapshot") in done:
                        new, action = "destroyed", "delete_archive_snapshot"
                elif req == "destroyed" and cur == "active" and not destroyed_by(info["address"], deleted):
                    unconfirmed.append(unconfirmed_text("storage", name, cur, "declared destroyed"))
                elif req == "destroyed" and cur in ("active", "archived"):
                    # (an archived storage's volume went at the archive, an apply recorded then)
                    new = "destroyed"
                    action = "wipe" if (name, "empty_bucket") in done else None
            if new is None or (rec is not None and new == cur and rec.get("facts", {}) == {**rec.get("facts", {}), **facts}):
                touched.append(name)  # the read-model record is checked all the same
                continue
            if rec is None:
                rec = {"state": None, "generation": 1, "facts": {}, "history": []}
            old_facts = rec.get("facts") or {}
            if new != cur:
                if cur == "destroyed" and new == "active":
                    rec["generation"] = int(rec.get("generation") or 1) + 1
                entry = {"from": cur, "to": new, "run": run, "at": now(), "generation": rec.get("generation", 1)}
                if action:
                    entry["action"] = action
                add_history(rec, entry)
                changes[name] = [cur, new]
            rec["state"] = new
            if new in ("destroyed",):
                facts = {k: v for k, v in {**old_facts, **facts}.items() if k not in ("volume_id", "file_system_id")}
            elif new == "archived":
                facts = {k: v for k, v in {**old_facts, **facts}.items() if k != "volume_id"}
            else:
                facts = {**old_facts, **facts}
            rec["facts"] = facts
            txn.save_record("storage-state.yaml", name, rec)
            touched.append(name)
        refresh_storage_model(txn, touched)
    changes["_written"] = list(txn.written)
    changes["_unconfirmed"] = unconfirmed
    return changes


def mounted_storages(launch: Optional[Mapping[str, Any]]) -> set:
    """The storages a launch-params record mounts."""
    return {m.get("storage") for m in (launch or {}).get("mounts") or [] if isinstance(m, dict)}


def tree_tag(attributes: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The ``csis_config`` tag a resource of the applied state carries (its ``attributes``; ``tags_all``
    holds the provider's default tags too), or None: what meta-state records as the tree's name on its
    storages and machines."""
    for key in ("tags_all", "tags"):
        tags = (attributes or {}).get(key)
        value = tags.get("csis_config") if isinstance(tags, dict) else None
        if isinstance(value, str) and value:
            return value
    return None


def attaches(name: str, launch: Optional[Mapping[str, Any]]) -> bool:
    """Whether a launch-params record attaches storage ``name``: launched, and mounting it."""
    return bool(launch and launch.get("launched")) and name in mounted_storages(launch)


def storage_model(rec: Mapping[str, Any], attachments: Iterable[str]) -> Dict[str, Any]:
    """The read-model record (``meta-state/storage.yaml``) of a storage-state record."""
    facts = rec.get("facts") or {}
    return {"builder": facts.get("builder"), "type": facts.get("type"),
            "current_state": rec.get("state"), "generation": rec.get("generation", 1),
            "attachments": sorted(attachments),
            "attachment_cardinality": "single" if facts.get("type") == "ebs" else "many"}


def refresh_storage_model(txn: Any, storages: Iterable[str],
                          launches: Optional[Mapping[str, Optional[Mapping[str, Any]]]] = None) -> None:
    """Bring the read-model records (``meta-state/storage.yaml``: states and attachments as
    recorded) of ``storages`` in line with their ``storage-state.yaml`` records, one record each.

    ``launches``: the launch-params records this transaction wrote (None: removed), by instance.
    A storage's attachments are its read-model's, less those instances, plus those of them
    that are launched and mount it; a storage without a read-model record yet gets them from
    every launch-params record (the only whole read, once per new record)."""
    launches = dict(launches or {})
    every: Optional[Dict[str, Any]] = None
    for name in sorted(set(storages)):
        rec = txn.load_record("storage-state.yaml", name)
        old = txn.load_record("storage.yaml", name)
        if rec is None:
            if old is not None:
                txn.save_record("storage.yaml", name, None)
            continue
        if old is None:
            if every is None:
                every = txn.load("launch-params.yaml").get("instances") or {}
            attachments = {n for n, lp in every.items() if attaches(name, lp)}
        else:
            attachments = set(old.get("attachments") or []) - set(launches)
        attachments |= {n for n, lp in launches.items() if attaches(name, lp)}
        model = storage_model(rec, attachments)
        if model != old:
            txn.save_record("storage.yaml", name, model)


# --------------------------------------------------------------------------- instances
def close_instance_records(txn: Any, pins: Dict[str, Any], name: str, why: str, run: str,
                           op: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """Drop instance ``name``'s launch record, close its open generation (``why``) and its pin,
    with an upgrade entry ``op`` (default ``why``) and no pending replacement in ``pins`` (the
    rest of ``pins.yaml`` as :meth:`~.store.Transaction.load_rest` gave it; the caller saves it),
    reading and staging only that instance's records; returns the launch record it dropped
    (None: there was none)."""
    launch = txn.load_record("launch-params.yaml", name)
    if launch is not None:
        txn.save_record("launch-params.yaml", name, None)
    srec = txn.load_record("instance-state.yaml", name)
    if srec and srec.get("current"):
        add_history(srec, dict(srec["current"], why=why, closed_run=run, closed_at=now()))
        srec["current"] = None
        txn.save_record("instance-state.yaml", name, srec)
    old_pin = txn.load_record("pins.yaml", name)
    if old_pin is not None:
        txn.save_record("pins.yaml", name, None)
    pins.setdefault("pending_replacements", {}).pop(name, None)
    if old_pin is not None:
        upgrades = pins.setdefault("upgrades", [])
        upgrades.append({"kind": "instance", "name": name, "from": old_pin, "op": op or why, "run": run})
        del upgrades[:-200]
    return launch


def _instance_resource(mine: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    return _first(mine, "aws_instance")


def record_instance_root(ms: MetaState, root: Mapping[str, Any], state: Mapping[str, Any], run: str,
                         context: Optional[Mapping[str, Any]] = None,
                         event: Optional[Mapping[str, Any]] = None,
                         deleted: Optional[Iterable[str]] = None) -> Dict[str, Any]:
    """Record the instances of an applied instance root; returns {instance: what happened}.
    ``event`` (:func:`applied_event`) is audited with them. ``deleted`` as
    :func:`record_storage_root`'s: a launched machine the state does not hold is recorded gone
    (decommissioned, torn down) only when this run's apply destroyed something of its module.

    Reads and writes only the records of the root's instances (launch-params, instance-state,
    pins), the rest of ``pins.yaml`` (pending replacements, the upgrade log) and the read-model
    records of the storages they mount, whatever else meta-state holds."""
    res = resources(state)
    deleted = None if deleted is None else list(deleted)
    out: Dict[str, Any] = {}
    unconfirmed: List[str] = []
    with ms.transaction("csis_record instance root %s" % root.get("builder"), context=context) as txn:
        if event:
            txn.note(event)
        pins = txn.load_rest("pins.yaml")
        pending, upgrades = pins["pending_replacements"], pins["upgrades"]
        launches: Dict[str, Optional[Dict[str, Any]]] = {}
        storages: set = set()
        bound: List[str] = []
        for name, info in sorted((root.get("instances") or {}).items()):
            mine = under(res, info["address"])
            inst = _instance_resource(mine)
            prev = txn.load_record("launch-params.yaml", name)
            if inst is None:
                # gone: a decommission or an ephemeral teardown that the apply carried out
                srec = txn.load_record("instance-state.yaml", name)
                if prev is not None or (srec and srec.get("current")):
                    why = "decommission" if info.get("decommission") else ("ephemeral" if info.get("ephemeral") else "gone")
                    never_launched = prev is not None and not prev.get("launched")
                    if (info.get("decommission") or info.get("ephemeral")) and not never_launched \
                            and not destroyed_by(info["address"], deleted):
                        unconfirmed.append(unconfirmed_text(
                            "instance", name, "launched", "to be decommissioned" if info.get("decommission") else "ephemeral"))
                    elif info.get("decommission") or info.get("ephemeral") or never_launched:
                        storages |= mounted_storages(close_instance_records(txn, pins, name, why, run))
                        launches[name] = None
                        out[name] = why
                continue
            srec = txn.load_record("instance-state.yaml", name)
            a = inst["attributes"]
            params = copy.deepcopy(info.get("launch_params") or {})
            ephemeral = bool(info.get("ephemeral"))
            kind = "ephemeral" if ephemeral else "durable"
            if srec is None:
                srec = {"generation": {"durable": 0, "ephemeral": 0}, "current": None, "history": []}
            cur = srec.get("current")
            opened = False
            if not cur or cur.get("instance_id") != a.get("id"):
                if cur:
                    add_history(srec, dict(cur, why="replaced", closed_run=run, closed_at=now()))
                counters = srec.setdefault("generation", {"durable": 0, "ephemeral": 0})
                counters[kind] = int(counters.get(kind) or 0) + 1
                cur = {"number": counters[kind], "kind": kind, "opened_run": run, "opened_at": now()}
                if params.get("alias"):
                    cur["alias"] = params["alias"]  # retired with the generation (state/aliases.py)
                opened = True
            cur.update({"instance_id": a.get("id"), "private_ip": a.get("private_ip"), "public_ip": a.get("public_ip") or None,
                        "ami_id": a.get("ami"), "availability_zone": a.get("availability_zone"),
                        "instance_type": a.get("instance_type")})
            tag = tree_tag(a)
            if tag:
                cur["csis_config"] = tag  # the tree's tag the machine carries (validate compares it)
            srec["current"] = cur
            old_pin = pin = txn.load_record("pins.yaml", name)
            if not ephemeral and (old_pin is None or name in pending or opened) and a.get("ami") and old_pin != a.get("ami"):
                pin = a.get("ami")
                txn.save_record("pins.yaml", name, pin)
                upgrades.append({"kind": "instance", "name": name, "from": old_pin, "to": a.get("ami"),
                                 "op": "bind" if old_pin is None else ("upgrade" if name in pending else "follow"),
                                 "run": run})
                if old_pin is None:
                    bound.append(name)
            pending.pop(name, None)
            prev = prev or {}
            params["build"] = pin if pin is not None else (a.get("ami") or "unbound")
            params["hostname"] = "%s-%03d" % (name, cur["number"])
            params["launched"] = True
            params["launched_run"] = prev.get("launched_run") if (prev.get("launched") and not opened) else run
            if not opened and prev.get("alias"):
                params["alias"] = prev["alias"]  # a standing machine keeps its alias
            if not opened and prev.get("launched") and prev.get("user_data_sha256"):
                # a standing machine ran the launch script it booted with: a newer one (another
                # collection version's, a changed mount) never reaches it (ignore_changes on user_data)
                params["user_data_sha256"] = prev["user_data_sha256"]
            if not opened and prev.get("launched"):
                # nor how that script mounted: a read-only mount is the record's only when its script made it so
                was_ro = {x.get("storage") for x in prev.get("mounts") or [] if isinstance(x, dict) and x.get("read_only")}
                for mnt in params.get("mounts") or []:
                    if isinstance(mnt, dict) and mnt.get("storage") in was_ro:
                        mnt["read_only"] = True
                    elif isinstance(mnt, dict):
                        mnt.pop("read_only", None)
            txn.save_record("launch-params.yaml", name, params)
            txn.save_record("instance-state.yaml", name, srec)
            storages |= mounted_storages(prev) | mounted_storages(params)
            launches[name] = params
            out[name] = "launched" if opened else "standing"
        del upgrades[:-200]
        txn.save_rest("pins.yaml", pins)
        refresh_storage_model(txn, storages, launches)
    out["_written"] = list(txn.written)
    out["_bound"] = bound
    out["_unconfirmed"] = unconfirmed
    return out


#: the resource that stands for a storage or an instance in the state (what a failed record names)
_MAIN_TYPES = ("aws_ebs_volume", "aws_efs_file_system", "aws_s3_bucket", "aws_instance")


def state_holds(root: Mapping[str, Any], state: Mapping[str, Any]) -> List[str]:
    """``<kind> <name>: <resource> <id>`` for every storage and instance of ``root`` that the
    terraform state holds (``<kind> <name>: not in the state`` for the others)."""
    res = resources(state)
    out = []
    for kind, key in (("storage", "storages"), ("instance", "instances")):
        for name, info in sorted((root.get(key) or {}).items()):
            mine = [r for r in under(res, info.get("address") or "") if r["type"] in _MAIN_TYPES]
            out.append("%s %s: %s" % (kind, name, ", ".join("%s %s" % (r["type"], r["attributes"].get("id"))
                                                            for r in mine) or "not in the state"))
    return out


def record_failed_message(root: Mapping[str, Any], state: Mapping[str, Any], exc: BaseException,
                          applied: Optional[str] = None) -> str:
    """What a record that failed after the apply says: what was applied, what the state holds,
    why meta-state did not take it, and that a re-run records it."""
    key = root.get("key") or root.get("directory") or "the root"
    holds = "; ".join(state_holds(root, state)) or "nothing this root declares"
    if applied:
        head = ("%s: the apply happened (%s, in %s) and terraform state holds its result (%s), but recording it "
                "in meta-state failed" % (key, applied, root.get("directory"), holds))
    else:
        head = "%s: recording what terraform state holds (%s) in meta-state failed" % (key, holds)
    return ("%s: %s. Nothing applied is lost: once meta-state can be written again, run the same playbook "
            "again; its plan shows no change for what was applied and its record step records what the state "
            "holds (what this apply destroyed excepted: that run names each such storage or machine, and "
            "playbooks/forget.yml with force=true, which looks it up first, records it)." % (head, exc))


def record_root(config_root: str, root: Mapping[str, Any], run: str,
                done_transitions: Iterable[Mapping[str, Any]] = (), state: Optional[Mapping[str, Any]] = None,
                applied: Optional[str] = None, context: Optional[Mapping[str, Any]] = None,
                deleted: Optional[Iterable[str]] = None) -> Dict[str, Any]:
    """Record what the root's terraform state holds (:func:`record_storage_root`,
    :func:`record_instance_root`). ``applied``: what this run applied to the root (its plan
    summary): audited as an ``applied`` event in the same transaction, so the trail shows every
    apply, one that changed no record too (a tag update, the identity root's groups); and named
    by the :class:`RecordError` raised when meta-state cannot take the record.
    ``context`` (lifecycle, root, plan digest...) goes into the transaction's audit record.
    ``deleted``: the addresses this run's apply destroyed (empty when it applied nothing); a
    subject the state no longer holds is recorded gone only when the apply destroyed it, else it
    is named in ``unconfirmed`` (one line each) and its record stays."""
    ms = MetaState(config_root)
    event = applied_event(root, applied, context)
    try:
        if root["lifecycle"] not in ("storage", "instance-image"):
            if event:  # nothing of it is recorded, but the apply happened: the trail says so
                with ms.transaction("csis_record %s root %s" % (root["lifecycle"], root.get("builder")),
                                    context=context) as txn:
                    txn.note(event)
            return {"written": []}
        if state is None:
            state = tfstate.read(root["directory"], root.get("binary") or "terraform")
        if root["lifecycle"] == "storage":
            got = record_storage_root(ms, root, state, run, done_transitions, context, event, deleted)
            key = "storages"
        else:
            got = record_instance_root(ms, root, state, run, context, event, deleted)
            key = "instances"
    except MetaStateError as exc:  # (no state read: an identity root, whose audit of the apply failed)
        raise RecordError(record_failed_message(root, state if isinstance(state, dict) else {}, exc, applied)) from exc
    except RecordError as exc:  # the state itself (resources()): nothing was recorded from it
        raise RecordError("%s: %s; nothing was recorded (terraform state pull in %s shows it)"
                          % (root.get("key") or root.get("builder"), exc, root.get("directory"))) from exc
    written = got.pop("_written", [])
    bound = got.pop("_bound", [])
    unconfirmed = got.pop("_unconfirmed", [])
    return {key: got, "written": written, "unconfirmed": unconfirmed, **({"bound": bound} if key == "instances" else {})}


def applied_event(root: Mapping[str, Any], applied: Optional[str],
                  context: Optional[Mapping[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The audit event of an apply that happened (``applied``: its plan summary; None: no apply,
    no event): ``{kind: applied, root, detail, plan_digest}``."""
    if not applied:
        return None
    ctx = dict(context or {})
    event: Dict[str, Any] = {"kind": "applied", "root": ctx.get("root") or root.get("key") or root.get("builder"),
                             "detail": "applied: %s" % applied}
    if ctx.get("plan_digest"):
        event["plan_digest"] = ctx["plan_digest"]
    return event


# --------------------------------------------------------------------------- day-2 records
VERIFICATIONS_MAX = 500


def record_verification(config_root: str, verdict: Mapping[str, Any]) -> List[str]:
    """Append a verification verdict to ``meta-state/verifications.yaml`` (the last 500 kept),
    and the result of the image's post-bake tests (the ``test: <command>`` checks) to
    ``meta-state/image-tests.yaml`` under the build the machine runs (the manual's per-build
    post-bake record; the last :data:`IMAGE_TESTS_MAX` results per build kept)."""
    ms = MetaState(config_root)
    with ms.transaction(WHAT_VERIFICATION + str(verdict.get("instance"))) as txn:
        data = txn.load("verifications.yaml")
        data.setdefault("verifications", []).append(dict(verdict))
        del data["verifications"][:-VERIFICATIONS_MAX]
        txn.save("verifications.yaml", data)
        result = image_test_result(verdict)
        if result is not None:
            tests = txn.load("image-tests.yaml")
            rec = tests["builds"].setdefault(str(verdict["build"]), {"results": []})
            rec.setdefault("results", []).append(result)
            del rec["results"][:-IMAGE_TESTS_MAX]
            rec["last_ok"] = result["ok"]
            rec["last_time"] = result["time"]
            txn.save("image-tests.yaml", tests)
    return list(txn.written)


IMAGE_TESTS_MAX = 20
TEST_PREFIX = "test: "


def image_test_result(verdict: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The post-bake part of a verdict (``None`` without a build or without post-bake tests)."""
    tests = [c for c in verdict.get("checks") or [] if str(c.get("name", "")).startswith(TEST_PREFIX)]
    if not verdict.get("build") or not tests:
        return None
    return {"time": verdict.get("time"), "run": verdict.get("run"), "instance": verdict.get("instance"),
            "runtime": verdict.get("runtime"), "ok": all(bool(c.get("ok")) for c in tests),
            "tests": [{"command": str(c["name"])[len(TEST_PREFIX):], "ok": bool(c.get("ok")),
                       "detail": c.get("detail", "")} for c in tests]}


def last_image_test(meta: Mapping[str, Any], build: str) -> Optional[Dict[str, Any]]:
    """The latest post-bake result of ``build`` from a read of ``image-tests.yaml``."""
    rec = ((meta.get("image-tests.yaml") or {}).get("builds") or {}).get(build) or {}
    results = rec.get("results") or []
    return results[-1] if results else None


def last_verification(meta: Mapping[str, Any], instance: str) -> Optional[Dict[str, Any]]:
    for v in reversed((meta.get("verifications.yaml") or {}).get("verifications") or []):
        if isinstance(v, dict) and v.get("instance") == instance:
            return v
    return None


def _instance_name(instance: str) -> None:
    """Refuse an argument that is no instance name (``-e instance=../x``) as the argument it is, not
    as a meta-state record name."""
    from ..config.models import check_name
    try:
        check_name(instance, "instance")
    except ValueError as exc:
        raise RecordError("%s: check -e instance" % exc) from None


def _upgradable(instance: str, launch: Any) -> None:
    """Refuse an upgrade of an instance that is not launched, or is ephemeral."""
    if not isinstance(launch, dict) or not launch.get("launched"):
        raise RecordError("instance '%s' is not launched (meta-state/launch-params.yaml): nothing to upgrade; "
                          "a new instance launches on the series head by itself" % instance)
    if launch.get("ephemeral"):
        raise RecordError("instance '%s' is ephemeral: every run launches it afresh; nothing to upgrade" % instance)


def _cancellable(instance: str, launch: Any, state: Any) -> None:
    """Refuse a cancel for a name meta-state does not know (a typo would read as "nothing to cancel").
    An instance forgotten or decommissioned since keeps its generations in instance-state.yaml (its
    marker went with its launch record): nothing to cancel, no error (a retried cancel)."""
    if not isinstance(launch, dict) and not isinstance(state, dict):
        raise RecordError("instance '%s' is not in meta-state/launch-params.yaml: it was never launched, so it has no "
                          "upgrade to cancel (a mistyped name?)" % instance)


def _same_marker(old: Any, entry: Mapping[str, Any]) -> bool:
    """A marker already there asks the same (``to`` and ``from`` equal): leaving it again changes nothing."""
    return isinstance(old, dict) and all(old.get(k) == entry[k] for k in ("to", "from"))


def mark_upgrade(config_root: str, instance: str, run: str, to: Optional[str] = None,
                 requested_by: Optional[str] = None, check: bool = False) -> Dict[str, Any]:
    """Leave a pending replacement marker for a launched durable instance (``upgrade instance``).

    The next instance-image run plans ``-replace`` for it, whitelists its instance and volume
    attachments, and the record after the apply moves the pin and clears the marker.

    ``check``: read only (no lock, nothing written); ``pending`` is the marker a real call would
    leave (check mode: the render previews the replacement with it, csis_render's ``preview_upgrades``).
    """
    _instance_name(instance)
    ms = MetaState(config_root)
    if check:
        _upgradable(instance, ms.load_record("launch-params.yaml", instance))
        entry = {"to": to, "from": ms.load_record("pins.yaml", instance), "run": run, "at": now(),
                 "requested_by": requested_by or requester()}
        old = ms.load_rest("pins.yaml")["pending_replacements"].get(instance)
        if _same_marker(old, entry):
            return {"changed": False, "pending": old, "written": []}
        return {"changed": True, "pending": entry, "written": []}
    with ms.transaction(WHAT_UPGRADE + instance) as txn:
        _upgradable(instance, txn.load_record("launch-params.yaml", instance))
        pins = txn.load_rest("pins.yaml")
        pending = pins["pending_replacements"]
        entry = {"to": to, "from": txn.load_record("pins.yaml", instance), "run": run, "at": now(),
                 "requested_by": requested_by or requester()}
        old = pending.get(instance)
        if _same_marker(old, entry):
            return {"changed": False, "pending": old, "written": []}
        pending[instance] = entry
        pins.setdefault("upgrades", []).append({"kind": "instance", "name": instance, "from": entry["from"], "to": to,
                                                "op": "upgrade-requested", "run": run})
        del pins["upgrades"][:-200]
        txn.save_rest("pins.yaml", pins)
    return {"changed": True, "pending": entry, "written": list(txn.written)}


def cancel_upgrade(config_root: str, instance: str, run: str, requested_by: Optional[str] = None,
                   check: bool = False) -> Dict[str, Any]:
    """Remove the pending replacement marker of ``instance`` (:func:`mark_upgrade`) before a run
    applied it; ``pending`` is the marker removed (None: there was none, nothing changes).
    ``check``: read only; ``pending`` is the marker a real call would remove."""
    _instance_name(instance)
    ms = MetaState(config_root)
    if check:
        old = ms.load_rest("pins.yaml")["pending_replacements"].get(instance)
        if old is None:
            _cancellable(instance, ms.load_record("launch-params.yaml", instance),
                         ms.load_record("instance-state.yaml", instance))
        return {"changed": old is not None, "pending": old, "written": []}
    with ms.transaction(WHAT_UPGRADE_CANCELLED + instance) as txn:
        pins = txn.load_rest("pins.yaml")
        old = pins["pending_replacements"].pop(instance, None)
        if old is None:
            _cancellable(instance, txn.load_record("launch-params.yaml", instance),
                         txn.load_record("instance-state.yaml", instance))
            return {"changed": False, "pending": None, "written": []}
        pins.setdefault("upgrades", []).append({"kind": "instance", "name": instance, "from": old.get("from"),
                                                "to": old.get("to"), "op": "upgrade-cancelled", "run": run,
                                                "requested_by": requested_by or requester()})
        del pins["upgrades"][:-200]
        txn.save_rest("pins.yaml", pins)
    return {"changed": True, "pending": old, "written": list(txn.written)}
