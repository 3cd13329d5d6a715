# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The state query: compare meta-state with what the AWS endpoint reports.

Three layers, so that the classification is testable without an endpoint:

1. :func:`expectations` -- what meta-state (and the tree) say should exist: every owned
   storage (declared or recorded) with the ids terraform recorded (``facts.volume_id``,
   ``facts.file_system_id``, the bucket name), and every launched instance with its
   recorded instance id, pinned build and pending replacement.
2. :func:`observe` -- the boto3 lookups. Managed resources are looked up **by id**
   (never by the first ``Name`` tag that matches); the tree's ``csis_config`` tag is used
   only to find the *other* resources (foreign ones). Every lookup error that is not a
   definite "does not exist" (a permission or transport error, the endpoint down) is kept
   as an error: it becomes an ``unavailable:`` line, never ``missing``.
3. :func:`classify` -- pure: expectations + observations -> the report
   (``drift`` lines, ``unavailable``, ``notes``, ``summary``).

:func:`query` runs the three, :func:`write_report` writes ``generated/state-report.json``
atomically, :func:`console_lines` / :func:`hard_lines` render it.

Plain Python; boto3 is imported only when a lookup runs.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from .fsutil import write_atomic

REPORT_NAME = "state-report.json"
DRIFTS = ("missing", "stale", "foreign", "changed")
#: provider states in which a recorded active storage is healthy
HEALTHY_STATES = ("available", "in-use", "active", "ready", "completed")
#: instance states in which a launched instance is healthy
RUNNING_STATES = ("pending", "running")
#: instance states that mean the machine is gone
GONE_STATES = ("shutting-down", "terminated")
STORAGE_TYPES = ("ebs", "efs", "s3")

#: error codes that mean "this resource does not exist" (everything else is unavailable)
ABSENT_CODES = {
    "ec2": ("InvalidVolume.NotFound", "InvalidInstanceID.NotFound", "InvalidSnapshot.NotFound"),
    "efs": ("FileSystemNotFound",),
    "s3": ("NoSuchBucket", "404", "NotFound"),
}
#: error codes that mean "we were not allowed to look" (prefixed REFUSED in the report)
REFUSED_CODES = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure",
                 "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException",
                 "Forbidden", "403", "UnrecognizedClientException", "InvalidAccessKeyId")
#: S3 errors on a bucket of the foreign scan that only say "this bucket lives elsewhere"
_S3_ELSEWHERE = ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException", "301")


class DriftError(Exception):
    """The query cannot run at all (no tree, unreadable meta-state)."""


# --------------------------------------------------------------------------- errors
def error_code(exc: BaseException) -> Optional[str]:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        code = (resp.get("Error") or {}).get("Code")
        if code is not None:
            return str(code)
        status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if status is not None:
            return str(status)
    return None


def is_absent(service: str, exc: BaseException) -> bool:
    """Whether ``exc`` definitely says "does not exist" (never true for transport errors)."""
    return error_code(exc) in ABSENT_CODES.get(service, ())


def is_transport(exc: BaseException) -> bool:
    """A connection/timeout error: the endpoint is not reachable."""
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError, HTTPClientError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return False
    return isinstance(exc, (BotoConnectionError, HTTPClientError))


def error_text(exc: BaseException) -> str:
    code = error_code(exc)
    text = " ".join(str(exc).split())
    if code in REFUSED_CODES:
        return "REFUSED (%s): %s" % (code, text)
    return text or type(exc).__name__


# --------------------------------------------------------------------------- expectations
def _label(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def expectations(tree: Any, meta: Mapping[str, Any]) -> Dict[str, Any]:
    """What meta-state and the tree say should exist.

    ``{"tag": <csis_config>, "runtimes": [names], "storages": {name: {...}}, "instances": {name: {...}}}``;
    each storage: ``name, declared, declared_state, recorded_state, type, builder, runtime,
    volume_id, file_system_id, bucket, archive, lifecycle``; each instance: ``name, runtime,
    instance_id, recorded_ami, pin, pending``.
    """
    storage_recs = ((meta.get("storage-state.yaml") or {}).get("storages") or {})
    out_st: Dict[str, Dict[str, Any]] = {}
    for name in sorted(set(tree.storages) | set(storage_recs)):
        rec = storage_recs.get(name) if isinstance(storage_recs.get(name), dict) else None
        facts = dict((rec or {}).get("facts") or {})
        st = tree.storages.get(name)
        builder = tree.storage_builder_for(st) if st is not None else None
        if builder is None and facts.get("builder"):
            builder = tree.storage_builder(facts["builder"])
        kind = tree.kind_of(builder) if builder is not None else {}
        stype = kind.get("capability") or facts.get("type")
        if stype not in STORAGE_TYPES:
            continue  # generic tf-aws storages: nothing to compare
        rt = tree.builder_runtime(builder) if builder is not None else None
        lifecycle = None
        if st is not None and st.lifecycle and not (stype == "efs" and st.config.get("file_system_id")):
            lifecycle = dict(st.lifecycle)
        bucket = None
        if stype == "s3":
            bucket = facts.get("bucket_name") or (st.bucket_name if st is not None else None) or name
        out_st[name] = {
            "name": name, "declared": st is not None, "declared_state": st.state if st is not None else None,
            "recorded_state": (rec or {}).get("state"), "type": stype,
            "builder": builder.name if builder is not None else facts.get("builder"),
            "runtime": rt.name if rt is not None else None,
            "volume_id": facts.get("volume_id"), "file_system_id": facts.get("file_system_id"),
            "bucket": bucket,
            "archive": facts.get("archive") or ("csis-%s-archive" % _label(name).replace("_", "-")
                                                if stype == "ebs" else None),
            "lifecycle": lifecycle,
        }
    lps = ((meta.get("launch-params.yaml") or {}).get("instances") or {})
    iss = ((meta.get("instance-state.yaml") or {}).get("instances") or {})
    pins = meta.get("pins.yaml") or {}
    pin_map = pins.get("instances") or {}
    pending = pins.get("pending_replacements") or {}
    out_in: Dict[str, Dict[str, Any]] = {}
    for name in sorted(lps):
        lp = lps[name]
        if not isinstance(lp, dict) or lp.get("launched") is not True:
            continue
        cur = ((iss.get(name) or {}).get("current") or {})
        rt_name = lp.get("runtime")
        if rt_name not in tree.runtimes:
            inst = tree.instances.get(name)
            rt = tree.runtime(inst.runtime if inst is not None else (rt_name or "default"))
            rt_name = rt.name if rt is not None else rt_name
        out_in[name] = {"name": name, "runtime": rt_name, "instance_id": cur.get("instance_id"),
                        "recorded_ami": cur.get("ami_id"), "pin": pin_map.get(name),
                        "pending": pending.get(name) if name in pending else None,
                        "is_pending": name in pending}
    return {"tag": tree.resource_tag()["csis_config"], "runtimes": sorted(tree.runtimes),
            "storages": out_st, "instances": out_in}


# --------------------------------------------------------------------------- lookups
def _tags(items: Optional[Iterable[Mapping[str, Any]]]) -> Dict[str, str]:
    return {t["Key"]: t["Value"] for t in items or [] if "Key" in t}


class _Endpoint:
    """Clients of one runtime; a transport error makes every later call fail fast."""

    def __init__(self, access: Mapping[str, Any], factory: Callable[[str, Mapping[str, Any]], Any]):
        self.access = access
        self.factory = factory
        self.clients: Dict[str, Any] = {}
        self.down: Dict[str, str] = {}

    def _where(self, service: str) -> str:
        return ((self.access.get("endpoints") or {}).get(service)
                or "%s.%s.amazonaws.com" % (service, self.access.get("region")))

    def call(self, service: str, op: str, **kw: Any) -> Any:
        where = self._where(service)
        if where in self.down:
            raise _Unreachable(self.down[where])
        try:
            if service not in self.clients:
                self.clients[service] = self.factory(service, self.access)
            return getattr(self.clients[service], op)(**kw)
        except Exception as exc:  # noqa: BLE001 - classified by the caller
            if is_transport(exc):
                self.down[where] = "endpoint %s unreachable (%s; not retried)" % (where, type(exc).__name__)
                raise _Unreachable("endpoint %s unreachable: %s" % (where, error_text(exc))) from exc
            raise


class _Unreachable(Exception):
    pass


def _err(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, _Unreachable) else error_text(exc)


def _lookup_volume(ep: _Endpoint, vid: str) -> Dict[str, Any]:
    try:
        vols = ep.call("ec2", "describe_volumes", VolumeIds=[vid]).get("Volumes") or []
    except Exception as exc:  # noqa: BLE001
        if is_absent("ec2", exc):
            return {"present": False, "what": "volume", "id": vid}
        return {"error": _err(exc), "what": "volume", "id": vid}
    if not vols:
        return {"present": False, "what": "volume", "id": vid}
    v = vols[0]
    return {"present": True, "what": "volume", "id": vid, "state": v.get("State"), "size": v.get("Size"),
            "availability_zone": v.get("AvailabilityZone"), "tags": _tags(v.get("Tags")),
            "attached_to": [a.get("InstanceId") for a in v.get("Attachments") or []]}


def _lookup_snapshot(ep: _Endpoint, name: str, storage: str) -> Dict[str, Any]:
    try:
        snaps = ep.call("ec2", "describe_snapshots", OwnerIds=["self"], Filters=[
            {"Name": "tag:Name", "Values": [name]}, {"Name": "tag:csis_storage", "Values": [storage]}]).get("Snapshots") or []
    except Exception as exc:  # noqa: BLE001
        return {"error": _err(exc), "what": "archive snapshot", "id": name}
    if not snaps:
        return {"present": False, "what": "archive snapshot", "id": name}
    s = sorted(snaps, key=lambda x: str(x.get("StartTime")))[-1]
    out = {"present": True, "what": "archive snapshot", "id": s.get("SnapshotId"), "state": s.get("State"),
           "size": s.get("VolumeSize"), "tags": _tags(s.get("Tags"))}
    if len(snaps) > 1:
        out["others"] = sorted(x.get("SnapshotId") for x in snaps if x is not s)
    return out


def _lookup_filesystem(ep: _Endpoint, fsid: str, want_lifecycle: bool) -> Dict[str, Any]:
    try:
        fss = ep.call("efs", "describe_file_systems", FileSystemId=fsid).get("FileSystems") or []
    except Exception as exc:  # noqa: BLE001
        if is_absent("efs", exc):
            return {"present": False, "what": "filesystem", "id": fsid}
        return {"error": _err(exc), "what": "filesystem", "id": fsid}
    if not fss:
        return {"present": False, "what": "filesystem", "id": fsid}
    fs = fss[0]
    out: Dict[str, Any] = {"present": True, "what": "filesystem", "id": fsid, "state": fs.get("LifeCycleState"),
                           "tags": _tags(fs.get("Tags"))}
    if want_lifecycle:
        try:
            pols = ep.call("efs", "describe_lifecycle_configuration", FileSystemId=fsid).get("LifecyclePolicies") or []
        except Exception as exc:  # noqa: BLE001
            out["lifecycle_error"] = _err(exc)
        else:
            merged: Dict[str, str] = {}
            for p in pols:
                merged.update({k: v for k, v in p.items() if isinstance(v, str)})
            out["lifecycle"] = merged
    return out


def _lookup_bucket(ep: _Endpoint, bucket: str, want_lifecycle: bool) -> Dict[str, Any]:
    try:
        tags = _tags(ep.call("s3", "get_bucket_tagging", Bucket=bucket).get("TagSet"))
    except Exception as exc:  # noqa: BLE001
        code = error_code(exc)
        if is_absent("s3", exc):
            return {"present": False, "what": "bucket", "id": bucket}
        if code != "NoSuchTagSet":
            return {"error": _err(exc), "what": "bucket", "id": bucket}
        tags = {}
    out: Dict[str, Any] = {"present": True, "what": "bucket", "id": bucket, "state": "available", "tags": tags}
    if want_lifecycle:
        try:
            rules = ep.call("s3", "get_bucket_lifecycle_configuration", Bucket=bucket).get("Rules") or []
        except Exception as exc:  # noqa: BLE001
            if error_code(exc) == "NoSuchLifecycleConfiguration":
                rules = []
            else:
                out["lifecycle_error"] = _err(exc)
                return out
        out["lifecycle"] = rules
    return out


def _lookup_instance(ep: _Endpoint, iid: str) -> Dict[str, Any]:
    try:
        res = ep.call("ec2", "describe_instances", InstanceIds=[iid]).get("Reservations") or []
    except Exception as exc:  # noqa: BLE001
        if is_absent("ec2", exc):
            return {"present": False, "id": iid}
        return {"error": _err(exc), "id": iid}
    found = [i for r in res for i in r.get("Instances") or []]
    if not found:
        return {"present": False, "id": iid}
    i = found[0]
    state = (i.get("State") or {}).get("Name")
    return {"present": state not in GONE_STATES, "id": iid, "state": state, "ami": i.get("ImageId"),
            "private_ip": i.get("PrivateIpAddress"), "tags": _tags(i.get("Tags"))}


def lookup_storage(ep: _Endpoint, exp: Mapping[str, Any]) -> Dict[str, Any]:
    """The observation of one expected storage (by recorded id; ``{}`` when nothing to look up)."""
    stype, rec = exp["type"], exp.get("recorded_state")
    if stype == "s3":
        return _lookup_bucket(ep, exp["bucket"], bool(exp.get("lifecycle")) and rec == "active")
    if stype == "ebs":
        if rec == "archived":
            return _lookup_snapshot(ep, exp["archive"], exp["name"])
        if exp.get("volume_id"):
            return _lookup_volume(ep, exp["volume_id"])
        return {}
    if stype == "efs" and exp.get("file_system_id"):
        return _lookup_filesystem(ep, exp["file_system_id"], bool(exp.get("lifecycle")) and rec == "active")
    return {}


def _paginate(ep: _Endpoint, service: str, op: str, key: str, token_in: str, token_out: str,
              **kw: Any) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    token = None
    for _ in range(1000):
        args = dict(kw)
        if token:
            args[token_in] = token
        resp = ep.call(service, op, **args)
        out.extend(resp.get(key) or [])
        token = resp.get(token_out)
        if not token:
            break
    return out


def scan_foreign(ep: _Endpoint, runtime: str, tag: str, known: Mapping[str, Iterable[str]]
                 ) -> Tuple[List[Dict[str, Any]], List[str], Dict[str, str]]:
    """Resources carrying ``csis_config=<tag>`` whose id meta-state does not record.

    Returns (items, unavailable lines, notes-free error map). ``known`` maps
    ``volume``/``filesystem``/``bucket``/``instance``/``snapshot`` to the ids already accounted for.
    """
    items: List[Dict[str, Any]] = []
    unavailable: List[str] = []
    flt = [{"Name": "tag:csis_config", "Values": [tag]}]

    def scan(label: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            unavailable.append("foreign %s scan (runtime %s): %s" % (label, runtime, _err(exc)))

    def volumes() -> None:
        for v in _paginate(ep, "ec2", "describe_volumes", "Volumes", "NextToken", "NextToken", Filters=flt):
            if v["VolumeId"] in known.get("volume", ()):
                continue
            tags = _tags(v.get("Tags"))
            items.append({"what": "volume", "id": v["VolumeId"], "name": tags.get("Name") or v["VolumeId"],
                          "state": v.get("State"), "tags": tags, "runtime": runtime, "kind": "storage"})

    def snapshots() -> None:
        for s in _paginate(ep, "ec2", "describe_snapshots", "Snapshots", "NextToken", "NextToken",
                           OwnerIds=["self"], Filters=flt):
            if s["SnapshotId"] in known.get("snapshot", ()):
                continue
            tags = _tags(s.get("Tags"))
            items.append({"what": "snapshot", "id": s["SnapshotId"], "name": tags.get("Name") or s["SnapshotId"],
                          "state": s.get("State"), "tags": tags, "runtime": runtime, "kind": "storage"})

    def instances() -> None:
        for r in _paginate(ep, "ec2", "describe_instances", "Reservations", "NextToken", "NextToken", Filters=flt + [
                {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}]):
            for i in r.get("Instances") or []:
                if i["InstanceId"] in known.get("instance", ()):
                    continue
                tags = _tags(i.get("Tags"))
                items.append({"what": "instance", "id": i["InstanceId"], "name": tags.get("Name") or i["InstanceId"],
                              "state": (i.get("State") or {}).get("Name"), "tags": tags, "runtime": runtime,
                              "kind": "instance", "ami": i.get("ImageId")})

    def filesystems() -> None:
        for fs in _paginate(ep, "efs", "describe_file_systems", "FileSystems", "Marker", "NextMarker"):
            tags = _tags(fs.get("Tags"))
            if tags.get("csis_config") != tag or fs["FileSystemId"] in known.get("filesystem", ()):
                continue
            items.append({"what": "filesystem", "id": fs["FileSystemId"], "name": tags.get("Name") or fs["FileSystemId"],
                          "state": fs.get("LifeCycleState"), "tags": tags, "runtime": runtime, "kind": "storage"})

    def buckets() -> None:
        for b in ep.call("s3", "list_buckets").get("Buckets") or []:
            name = b["Name"]
            if name in known.get("bucket", ()):
                continue
            try:
                tags = _tags(ep.call("s3", "get_bucket_tagging", Bucket=name).get("TagSet"))
            except _Unreachable:
                raise
            except Exception as exc:  # noqa: BLE001
                code = error_code(exc)
                if code in ("NoSuchTagSet",) + ABSENT_CODES["s3"] + _S3_ELSEWHERE:
                    continue
                unavailable.append("foreign bucket scan (runtime %s): bucket %s: %s" % (runtime, name, _err(exc)))
                continue
            if tags.get("csis_config") == tag:
                items.append({"what": "bucket", "id": name, "name": name, "state": "available", "tags": tags,
                              "runtime": runtime, "kind": "storage"})

    scan("volume", volumes)
    scan("snapshot", snapshots)
    scan("instance", instances)
    scan("filesystem", filesystems)
    scan("bucket", buckets)
    return items, unavailable, {}


def observe(exps: Mapping[str, Any], access_for: Callable[[str], Mapping[str, Any]],
            factory: Optional[Callable[[str, Mapping[str, Any]], Any]] = None) -> Dict[str, Any]:
    """Look every expectation up at its runtime's endpoint, then scan for foreign resources.

    ``access_for(runtime)`` gives the access dict (``reality.runtime_access``);
    ``factory(service, access)`` builds a client (default: ``transitions.aws_client``).
    Returns ``{"storages": {name: obs}, "instances": {name: obs}, "foreign": [...], "unavailable": [...]}``.
    """
    if factory is None:
        from .transitions import aws_client as factory  # type: ignore[no-redef]
    eps: Dict[str, _Endpoint] = {}
    unavailable: List[str] = []

    def endpoint(rt: Optional[str]) -> Optional[_Endpoint]:
        if rt is None:
            return None
        if rt not in eps:
            eps[rt] = _Endpoint(access_for(rt), factory)
        return eps[rt]

    storages: Dict[str, Dict[str, Any]] = {}
    for name, exp in exps["storages"].items():
        ep = endpoint(exp.get("runtime"))
        if ep is None:
            storages[name] = {"error": "no runtime to look it up in (its builder %r is not declared)" % exp.get("builder")}
            continue
        storages[name] = lookup_storage(ep, exp)
    instances: Dict[str, Dict[str, Any]] = {}
    for name, exp in exps["instances"].items():
        if not exp.get("instance_id"):
            instances[name] = {}
            continue
        ep = endpoint(exp.get("runtime") if exp.get("runtime") in exps["runtimes"] else None)
        if ep is None:
            instances[name] = {"error": "no runtime to look it up in (runtime %r is not declared)" % exp.get("runtime"),
                               "id": exp["instance_id"]}
            continue
        instances[name] = _lookup_instance(ep, exp["instance_id"])
    known: Dict[str, set] = {"volume": set(), "filesystem": set(), "bucket": set(), "instance": set(), "snapshot": set()}
    for name, exp in exps["storages"].items():
        for key, kind in (("volume_id", "volume"), ("file_system_id", "filesystem"), ("bucket", "bucket")):
            if exp.get(key):
                known[kind].add(exp[key])
        obs = storages.get(name) or {}
        if obs.get("what") == "archive snapshot" and obs.get("present"):
            known["snapshot"].update([obs["id"]] + list(obs.get("others") or []))
    for exp in exps["instances"].values():
        if exp.get("instance_id"):
            known["instance"].add(exp["instance_id"])
    foreign: List[Dict[str, Any]] = []
    seen: set = set()
    for rt in exps["runtimes"]:
        ep = endpoint(rt)
        items, unav, _ = scan_foreign(ep, rt, exps["tag"], known)
        unavailable += unav
        for it in items:
            if (it["what"], it["id"]) not in seen:
                seen.add((it["what"], it["id"]))
                foreign.append(it)
    return {"storages": storages, "instances": instances, "foreign": foreign, "unavailable": unavailable}


# --------------------------------------------------------------------------- classification
def _line(kind: str, name: str, drift: str, detail: str, hard: bool = False) -> Dict[str, Any]:
    return {"kind": kind, "name": name, "drift": drift, "detail": detail, "hard": hard}


def _describe(obs: Mapping[str, Any]) -> str:
    return "%s %s" % (obs.get("what") or "resource", obs.get("id"))


def _efs_expected(lc: Mapping[str, Any]) -> Dict[str, str]:
    out = {}
    if "ia_days" in lc:
        out["TransitionToIA"] = "AFTER_%d_DAYS" % int(lc["ia_days"])
    if "archive_days" in lc:
        out["TransitionToArchive"] = "AFTER_%d_DAYS" % int(lc["archive_days"])
    return out


def _s3_rule_matches(rule: Mapping[str, Any], lc: Mapping[str, Any]) -> bool:
    if rule.get("Status", "Enabled") != "Enabled":
        return False
    prefix = lc.get("prefix", "")
    flt = rule.get("Filter") or {}
    rule_prefix = flt.get("Prefix", rule.get("Prefix", ""))
    if (flt.get("And") or {}).get("Prefix") is not None:
        rule_prefix = flt["And"]["Prefix"]
    if (rule_prefix or "") != (prefix or ""):
        return False
    if lc.get("transition_days"):
        if not any(int(t.get("Days") or -1) == int(lc["transition_days"])
                   and t.get("StorageClass") == lc.get("storage_class") for t in rule.get("Transitions") or []):
            return False
    if lc.get("expire_days"):
        if int((rule.get("Expiration") or {}).get("Days") or -1) != int(lc["expire_days"]):
            return False
    return True


def lifecycle_gap(stype: str, declared: Optional[Mapping[str, Any]], obs: Mapping[str, Any]) -> Optional[str]:
    """What of the declared lifecycle the resource does not carry (None: all of it, or nothing declared)."""
    if not declared or "lifecycle" not in obs:
        return None
    if stype == "efs":
        want = _efs_expected(declared)
        have = obs.get("lifecycle") or {}
        miss = ["%s=%s" % (k, v) for k, v in sorted(want.items()) if have.get(k) != v]
        return ", ".join(miss) or None
    if stype == "s3":
        if any(_s3_rule_matches(r, declared) for r in obs.get("lifecycle") or []):
            return None
        bits = []
        if declared.get("transition_days"):
            bits.append("transition to %s after %s days" % (declared.get("storage_class"), declared["transition_days"]))
        if declared.get("expire_days"):
            bits.append("expiration after %s days" % declared["expire_days"])
        return " and ".join(bits) or "rule"
    return None


_FOREIGN_WHAT_TYPE = {"volume": "ebs", "snapshot": "ebs", "filesystem": "efs", "bucket": "s3"}


def classify(exps: Mapping[str, Any], reality: Mapping[str, Any], run: str = "") -> Dict[str, Any]:
    """Pure: expectations + observations -> the report (see docs/drift.md for the lines)."""
    tag = exps.get("tag")
    drift: List[Dict[str, Any]] = []
    unavailable: List[str] = []
    notes: List[str] = []
    rep_st: Dict[str, Any] = {}
    rep_in: Dict[str, Any] = {}
    storages = exps.get("storages") or {}
    obs_st = reality.get("storages") or {}

    # foreign resources that carry the Name of a storage recorded destroyed (or archived, for a
    # volume) are that storage's leftovers: stale, not foreign
    leftovers: Dict[str, List[Dict[str, Any]]] = {}
    foreign_items: List[Dict[str, Any]] = []
    for it in reality.get("foreign") or []:
        exp = storages.get(it.get("name")) if it.get("kind") == "storage" else None
        if (exp is not None and _FOREIGN_WHAT_TYPE.get(it["what"]) == exp["type"] and it["what"] != "snapshot"
                and (exp.get("recorded_state") == "destroyed"
                     or (exp.get("recorded_state") == "archived" and it["what"] == "volume"))):
            leftovers.setdefault(exp["name"], []).append(it)
        else:
            foreign_items.append(it)

    for name, exp in sorted(storages.items()):
        obs = obs_st.get(name) or {}
        rec = exp.get("recorded_state")
        rep_st[name] = {"present": obs.get("present"), "type": exp["type"], "id": obs.get("id"),
                        "state": obs.get("state"), "size": obs.get("size"), "tags": obs.get("tags") or {}}
        if "error" in obs:
            rep_st[name]["present"] = None
            unavailable.append("storage %s: %s" % (name, obs["error"]))
            continue
        other = (obs.get("tags") or {}).get("csis_config")
        if obs.get("present") and other and tag and other != tag:
            notes.append("storage %s: %s carries csis_config=%s, another tree's tag (this tree is %s)"
                         % (name, _describe(obs), other, tag))
        if obs.get("others"):
            notes.append("storage %s: more %ss named %s: %s" % (name, obs["what"], exp.get("archive"),
                                                                 ", ".join(obs["others"])))
        for it in leftovers.get(name, []):
            drift.append(_line("storage", name, "stale", "recorded %s but %s %s (Name %s) still exists"
                               % (rec, it["what"], it["id"], it["name"])))
        if rec is None:
            if obs.get("present"):
                drift.append(_line("storage", name, "foreign", "%s exists but meta-state has no record of it%s"
                                   % (_describe(obs), "" if exp.get("declared") else " (and it is not in the YAML)")))
            continue
        if rec == "destroyed":
            if obs.get("present"):
                drift.append(_line("storage", name, "stale", "recorded destroyed but %s still exists" % _describe(obs)))
            continue
        if not obs:
            what = {"ebs": "volume id", "efs": "filesystem id", "s3": "bucket name"}[exp["type"]]
            notes.append("storage %s: recorded %s but meta-state holds no %s to look it up by; record it with "
                         "state_import" % (name, rec, what))
            continue
        if not obs.get("present"):
            drift.append(_line("storage", name, "missing", "recorded %s but not found in reality (%s)"
                               % (rec, _describe(obs)), hard=True))
            continue
        if obs.get("state") not in HEALTHY_STATES:
            drift.append(_line("storage", name, "stale", "recorded %s but %s is %s" % (rec, _describe(obs), obs.get("state"))))
        if obs.get("lifecycle_error"):
            unavailable.append("storage %s: lifecycle of %s: %s" % (name, _describe(obs), obs["lifecycle_error"]))
        gap = lifecycle_gap(exp["type"], exp.get("lifecycle"), obs) if rec == "active" else None
        if gap:
            drift.append(_line("storage", name, "stale", "declared lifecycle (%s) is not on %s" % (gap, _describe(obs))))

    obs_in = reality.get("instances") or {}
    for name, exp in sorted((exps.get("instances") or {}).items()):
        obs = obs_in.get(name) or {}
        rep_in[name] = {"present": obs.get("present"), "id": exp.get("instance_id"), "state": obs.get("state"),
                        "ami": obs.get("ami"), "private_ip": obs.get("private_ip")}
        if not exp.get("instance_id"):
            notes.append("instance %s: recorded launched but instance-state.yaml holds no instance id to look it up by"
                         % name)
            continue
        if "error" in obs:
            rep_in[name]["present"] = None
            unavailable.append("instance %s: %s" % (name, obs["error"]))
            continue
        iid = exp["instance_id"]
        if not obs.get("present"):
            detail = ("recorded launched but not found in reality (instance %s)" % iid if not obs.get("state")
                      else "recorded launched but instance %s is %s" % (iid, obs["state"]))
            drift.append(_line("instance", name, "missing", detail, hard=True))
            continue
        other = (obs.get("tags") or {}).get("csis_config")
        if other and tag and other != tag:
            notes.append("instance %s: instance %s carries csis_config=%s, another tree's tag (this tree is %s)"
                         % (name, iid, other, tag))
        if obs.get("state") not in RUNNING_STATES:
            drift.append(_line("instance", name, "stale", "recorded launched but instance %s is %s" % (iid, obs.get("state"))))
        booted, pin = obs.get("ami"), exp.get("pin") or exp.get("recorded_ami")
        if exp.get("is_pending"):
            pend = exp.get("pending")
            target = (pend.get("to") or pend.get("build")) if isinstance(pend, dict) else pend
            notes.append("instance %s: pending replacement: boots %s, pinned %s%s" % (
                name, booted, exp.get("pin"), (", to be replaced by %s" % target) if target else ""))
        elif booted and pin and booted != pin:
            drift.append(_line("instance", name, "changed", "instance %s boots %s but its pinned build is %s"
                               % (iid, booted, pin)))

    for it in sorted(foreign_items, key=lambda x: (x["kind"], x["name"], x["id"])):
        exp = storages.get(it["name"]) if it["kind"] == "storage" else None
        rec_inst = (exps.get("instances") or {}).get(it["name"]) if it["kind"] == "instance" else None
        extra = ""
        if exp is not None and _FOREIGN_WHAT_TYPE.get(it["what"]) == exp["type"]:
            managed = exp.get("volume_id") or exp.get("file_system_id") or (exp.get("bucket") if exp["type"] == "s3" else None)
            if managed and it["what"] != "snapshot":
                extra = "; the managed %s of storage %s is %s" % (it["what"], it["name"], managed)
        elif rec_inst is not None and rec_inst.get("instance_id"):
            extra = "; the managed instance %s is %s" % (it["name"], rec_inst["instance_id"])
        declared = (it["name"] in storages and storages[it["name"]].get("declared")) if it["kind"] == "storage" \
            else it["name"] in (exps.get("instances") or {})
        drift.append(_line(it["kind"], it["name"], "foreign", "%s %s (tagged csis_config=%s) exists but meta-state has no "
                           "record of it%s%s" % (it["what"], it["id"], tag, "" if declared else " (and it is not in the YAML)",
                                                 extra)))

    unavailable += list(reality.get("unavailable") or [])  # the foreign scans, after the records
    summary = {d: sum(1 for x in drift if x["drift"] == d) for d in DRIFTS}
    summary["hard"] = sum(1 for x in drift if x["hard"])
    summary["unavailable"] = len(unavailable)
    summary["notes"] = len(notes)
    return {"run": run, "tree": tag,
            "reality": {"storages": rep_st, "instances": rep_in,
                        "foreign": [{k: it.get(k) for k in ("kind", "what", "name", "id", "state", "runtime")}
                                    for it in reality.get("foreign") or []]},
            "drift": drift, "unavailable": unavailable, "notes": notes, "summary": summary}


# --------------------------------------------------------------------------- rendering
def drift_text(d: Mapping[str, Any]) -> str:
    return "%-8s %-8s %s: %s%s" % (d["drift"], d["kind"], d["name"], d["detail"], " [HARD]" if d.get("hard") else "")


def console_lines(report: Mapping[str, Any]) -> List[str]:
    lines = ["state report for run %s" % report.get("run")]
    lines += ["  unavailable: %s" % u for u in report.get("unavailable") or []]
    lines += ["  note: %s" % n for n in report.get("notes") or []]
    drift = report.get("drift") or []
    if drift:
        lines += ["  " + drift_text(d) for d in drift]
    elif report.get("unavailable"):
        lines.append("  no drift in what could be read (%d lookup(s) unavailable)" % len(report["unavailable"]))
    else:
        lines.append("  no drift: meta-state agrees with reality")
    return lines


def hard_lines(report: Mapping[str, Any]) -> List[str]:
    """The refusal lines of a report's HARD drift (what makes a lifecycle run refuse to start)."""
    return ["state: %s %s %s: %s (from %s; re-run 'state query' after fixing)"
            % (d["drift"], d["kind"], d["name"], d["detail"], REPORT_NAME)
            for d in report.get("drift") or [] if d.get("hard")]


def report_path(config_root: str) -> str:
    return os.path.join(os.path.abspath(config_root), "generated", REPORT_NAME)


def write_report(config_root: str, report: Mapping[str, Any]) -> Tuple[str, bool]:
    """Write ``generated/state-report.json`` atomically; return (path, whether the findings changed)."""
    path = report_path(config_root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    previous = read_report(config_root)
    write_atomic(path, (json.dumps(report, indent=2, sort_keys=True) + "\n").encode("utf-8"), mode=0o644)

    def findings(r: Optional[Mapping[str, Any]]) -> Any:
        return None if r is None else [r.get(k) for k in ("drift", "unavailable", "notes")]

    return path, findings(previous) != findings(report)


def read_report(config_root: str) -> Optional[Dict[str, Any]]:
    try:
        with open(report_path(config_root), "r", encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def run_id() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


# --------------------------------------------------------------------------- entry point
def query(config_root: str, overlays: Iterable[str] = (), run: Optional[str] = None,
          factory: Optional[Callable[[str, Mapping[str, Any]], Any]] = None) -> Dict[str, Any]:
    """Load the tree and meta-state, look everything up, classify. Writes nothing."""
    from .config import read_meta
    from .loader import load_tree
    from .reality import runtime_access

    tree = load_tree(config_root, overlays=overlays)
    meta, problems = read_meta(tree.root, ("storage-state.yaml", "launch-params.yaml", "instance-state.yaml",
                                           "pins.yaml"))
    if problems:
        raise DriftError("\n".join(str(p) for p in problems))
    exps = expectations(tree, meta)
    reality = observe(exps, lambda rt: runtime_access(tree, rt), factory)
    return classify(exps, reality, run or run_id())
