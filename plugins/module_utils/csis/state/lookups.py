# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The boto3 lookups of the state query (its second layer) and of forget/import.

Managed resources are looked up **by id** (never by the first ``Name`` tag that matches);
the tree's ``csis_config`` tag is used only to find the *other* resources (foreign ones,
:func:`scan_foreign`). Every lookup error that is not a definite "does not exist" (a
permission or transport error, the endpoint down) is kept as an ``error``: it becomes an
``unavailable:`` line, never ``missing``. Clients come from :class:`~..aws.Endpoint`.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from ..aws import ABSENT_CODES, ClientFactory, Endpoint, Unreachable, error_code, error_text, is_absent

#: instance states that mean the machine is gone
GONE_STATES = ("shutting-down", "terminated")
#: volume and filesystem states that mean the storage is gone (EC2 ``State``, EFS ``LifeCycleState``):
#: absent, as a terminated instance is, never merely unhealthy
GONE_STORAGE_STATES = ("deleting", "deleted")
#: S3 errors on a bucket of the foreign scan that only say "this bucket lives elsewhere"
S3_ELSEWHERE = ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException", "301")


def resource_tags(items: Optional[Iterable[Mapping[str, Any]]]) -> Dict[str, str]:
    return {t["Key"]: t["Value"] for t in items or [] if "Key" in t}


def _by_id(ep: Endpoint, service: str, op: str, key: str, head: Mapping[str, Any],
           **kw: Any) -> Tuple[List[Dict[str, Any]], Optional[Dict[str, Any]]]:
    """(what ``op`` lists under ``key``, else None) and, when there is nothing to read,
    the observation instead: ``present: false`` (definitely absent) or the ``error``."""
    try:
        items = ep.call(service, op, **kw).get(key) or []
    except Exception as exc:  # noqa: BLE001 - absent, or kept as an error
        if is_absent(service, exc):
            return [], dict(head, present=False)
        return [], dict(head, error=error_text(exc))
    return items, (None if items else dict(head, present=False))


def lookup_volume(ep: Endpoint, vid: str) -> Dict[str, Any]:
    vols, instead = _by_id(ep, "ec2", "describe_volumes", "Volumes", {"what": "volume", "id": vid}, VolumeIds=[vid])
    if instead is not None:
        return instead
    v = vols[0]
    if v.get("State") in GONE_STORAGE_STATES:
        return {"present": False, "what": "volume", "id": vid, "state": v.get("State")}
    return {"present": True, "what": "volume", "id": vid, "state": v.get("State"), "size": v.get("Size"),
            "availability_zone": v.get("AvailabilityZone"), "tags": resource_tags(v.get("Tags")),
            "attached_to": [a.get("InstanceId") for a in v.get("Attachments") or []]}


def newest_snapshot(snaps: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The most recent of ``snaps`` (``describe_snapshots`` entries), as the restore's data source
    (``most_recent``) picks it; the id breaks a tie."""
    return sorted(snaps, key=lambda s: (str(s.get("StartTime")), str(s.get("SnapshotId"))))[-1]


def lookup_snapshot(ep: Endpoint, name: str, storage: str, tag: Optional[str] = None) -> Dict[str, Any]:
    """The archive snapshot ``name`` of ``storage``, of this tree (``tag``: its ``csis_config``) as the
    restore's data source finds it: another tree's archive of a same-named storage is not this one's."""
    filters = [{"Name": "tag:Name", "Values": [name]}, {"Name": "tag:csis_storage", "Values": [storage]}]
    if tag:
        filters.append({"Name": "tag:csis_config", "Values": [tag]})
    try:
        snaps = ep.call("ec2", "describe_snapshots", OwnerIds=["self"], Filters=filters).get("Snapshots") or []
    except Exception as exc:  # noqa: BLE001
        return {"error": error_text(exc), "what": "archive snapshot", "id": name}
    if not snaps:
        return {"present": False, "what": "archive snapshot", "id": name}
    s = newest_snapshot(snaps)
    out = {"present": True, "what": "archive snapshot", "id": s.get("SnapshotId"), "state": s.get("State"),
           "size": s.get("VolumeSize"), "tags": resource_tags(s.get("Tags"))}
    if len(snaps) > 1:
        out["others"] = sorted(x.get("SnapshotId") for x in snaps if x is not s)
    return out


def lookup_filesystem(ep: Endpoint, fsid: str, want_lifecycle: bool) -> Dict[str, Any]:
    fss, instead = _by_id(ep, "efs", "describe_file_systems", "FileSystems", {"what": "filesystem", "id": fsid},
                          FileSystemId=fsid)
    if instead is not None:
        return instead
    fs = fss[0]
    if fs.get("LifeCycleState") in GONE_STORAGE_STATES:
        return {"present": False, "what": "filesystem", "id": fsid, "state": fs.get("LifeCycleState")}
    out: Dict[str, Any] = {"present": True, "what": "filesystem", "id": fsid, "state": fs.get("LifeCycleState"),
                           "tags": resource_tags(fs.get("Tags"))}
    if want_lifecycle:
        try:
            pols = ep.call("efs", "describe_lifecycle_configuration", FileSystemId=fsid).get("LifecyclePolicies") or []
        except Exception as exc:  # noqa: BLE001
            out["lifecycle_error"] = error_text(exc)
        else:
            merged: Dict[str, str] = {}
            for p in pols:
                merged.update({k: v for k, v in p.items() if isinstance(v, str)})
            out["lifecycle"] = merged
    return out


def lookup_bucket(ep: Endpoint, bucket: str, want_lifecycle: bool) -> Dict[str, Any]:
    try:
        tags = resource_tags(ep.call("s3", "get_bucket_tagging", Bucket=bucket).get("TagSet"))
    except Exception as exc:  # noqa: BLE001
        code = error_code(exc)
        if is_absent("s3", exc):
            return {"present": False, "what": "bucket", "id": bucket}
        if code != "NoSuchTagSet":
            return {"error": error_text(exc), "what": "bucket", "id": bucket}
        tags = {}
    out: Dict[str, Any] = {"present": True, "what": "bucket", "id": bucket, "state": "available", "tags": tags}
    if want_lifecycle:
        try:
            rules = ep.call("s3", "get_bucket_lifecycle_configuration", Bucket=bucket).get("Rules") or []
        except Exception as exc:  # noqa: BLE001
            if error_code(exc) == "NoSuchLifecycleConfiguration":
                rules = []
            else:
                out["lifecycle_error"] = error_text(exc)
                return out
        out["lifecycle"] = rules
    return out


def lookup_instance(ep: Endpoint, iid: str) -> Dict[str, Any]:
    res, instead = _by_id(ep, "ec2", "describe_instances", "Reservations", {"id": iid}, InstanceIds=[iid])
    if instead is not None:
        return instead
    found = [i for r in res for i in r.get("Instances") or []]
    if not found:
        return {"present": False, "id": iid}
    i = found[0]
    state = (i.get("State") or {}).get("Name")
    return {"present": state not in GONE_STATES, "id": iid, "state": state, "ami": i.get("ImageId"),
            "private_ip": i.get("PrivateIpAddress"), "tags": resource_tags(i.get("Tags"))}


def lookup_storage(ep: Endpoint, exp: Mapping[str, Any]) -> Dict[str, Any]:
    """The observation of one expected storage (by recorded id; ``{}`` when nothing to look up)."""
    stype, rec = exp["type"], exp.get("recorded_state")
    if stype == "s3":
        return lookup_bucket(ep, exp["bucket"], bool(exp.get("lifecycle")) and rec == "active")
    if stype == "ebs":
        if rec == "archived":
            return lookup_snapshot(ep, exp["archive"], exp["name"], exp.get("tag"))
        if exp.get("volume_id"):
            return lookup_volume(ep, exp["volume_id"])
        return {}
    if stype == "efs" and exp.get("file_system_id"):
        return lookup_filesystem(ep, exp["file_system_id"], bool(exp.get("lifecycle")) and rec == "active")
    return {}


def paginate(ep: Endpoint, service: str, op: str, key: str, token_in: str, token_out: str,
             **kw: Any) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    token = None
    for _page in range(1000):
        args = dict(kw)
        if token:
            args[token_in] = token
        resp = ep.call(service, op, **args)
        out.extend(resp.get(key) or [])
        token = resp.get(token_out)
        if not token:
            break
    return out


def scan_foreign(ep: Endpoint, runtime: str, tag: str, known: Mapping[str, Iterable[str]]
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
            unavailable.append("foreign %s scan (runtime %s): %s" % (label, runtime, error_text(exc)))

    def found(what: str, rid: str, state: Any, tags: Dict[str, str], kind: str = "storage", **extra: Any) -> None:
        """One tagged resource, listed unless meta-state accounts for it (``known[what]``)."""
        if rid not in known.get(what, ()):
            items.append(dict({"what": what, "id": rid, "name": tags.get("Name") or rid, "state": state, "tags": tags,
                               "runtime": runtime, "kind": kind}, **extra))

    #: instance id -> its root device name (``RootDeviceName``), for every instance the scan read
    root_devices: Dict[str, str] = {}

    def own_volume(attachment: Mapping[str, Any]) -> bool:
        """An instance's own root volume (which carries the instance's tags): attached at the
        instance's root device. Of an instance the scan did not read (another state, no tag, or the
        instance scan unavailable): one deleted with it (``DeleteOnTermination``)."""
        iid = str(attachment.get("InstanceId") or "")
        if iid in root_devices:
            return bool(root_devices[iid]) and attachment.get("Device") == root_devices[iid]
        return bool(attachment.get("DeleteOnTermination"))

    def volumes() -> None:
        for v in paginate(ep, "ec2", "describe_volumes", "Volumes", "NextToken", "NextToken", Filters=flt):
            if v.get("State") in GONE_STORAGE_STATES:  # going or gone, as a terminated instance
                continue
            if any(own_volume(a) for a in v.get("Attachments") or []):
                continue  # an instance's root volume: the instance's, no storage
            found("volume", v["VolumeId"], v.get("State"), resource_tags(v.get("Tags")))

    def snapshots() -> None:
        for s in paginate(ep, "ec2", "describe_snapshots", "Snapshots", "NextToken", "NextToken",
                          OwnerIds=["self"], Filters=flt):
            found("snapshot", s["SnapshotId"], s.get("State"), resource_tags(s.get("Tags")))

    def instances() -> None:
        for r in paginate(ep, "ec2", "describe_instances", "Reservations", "NextToken", "NextToken", Filters=flt + [
                {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}]):
            for i in r.get("Instances") or []:
                root_devices[i["InstanceId"]] = str(i.get("RootDeviceName") or "")
                found("instance", i["InstanceId"], (i.get("State") or {}).get("Name"), resource_tags(i.get("Tags")),
                      kind="instance", ami=i.get("ImageId"))

    def filesystems() -> None:
        for fs in paginate(ep, "efs", "describe_file_systems", "FileSystems", "Marker", "NextMarker"):
            tags = resource_tags(fs.get("Tags"))
            if tags.get("csis_config") == tag and fs.get("LifeCycleState") not in GONE_STORAGE_STATES:
                found("filesystem", fs["FileSystemId"], fs.get("LifeCycleState"), tags)

    def buckets() -> None:
        for b in ep.call("s3", "list_buckets").get("Buckets") or []:
            name = b["Name"]
            if name in known.get("bucket", ()):
                continue
            try:
                tags = resource_tags(ep.call("s3", "get_bucket_tagging", Bucket=name).get("TagSet"))
            except Unreachable:
                raise
            except Exception as exc:  # noqa: BLE001
                code = error_code(exc)
                if code in ("NoSuchTagSet",) + ABSENT_CODES["s3"] + S3_ELSEWHERE:
                    continue
                unavailable.append("foreign bucket scan (runtime %s): bucket %s: %s" % (runtime, name, error_text(exc)))
                continue
            if tags.get("csis_config") == tag:
                items.append({"what": "bucket", "id": name, "name": name, "state": "available", "tags": tags,
                              "runtime": runtime, "kind": "storage"})

    # the instances first (the volume scan tells their root volumes by their root devices), listed
    # after the volumes and snapshots as before
    items_before, unavailable_before = len(items), len(unavailable)
    scan("instance", instances)
    instance_items, instance_unavailable = items[items_before:], unavailable[unavailable_before:]
    del items[items_before:], unavailable[unavailable_before:]
    scan("volume", volumes)
    scan("snapshot", snapshots)
    items.extend(instance_items)
    unavailable.extend(instance_unavailable)
    scan("filesystem", filesystems)
    scan("bucket", buckets)
    return items, unavailable, {}


def observe(exps: Mapping[str, Any], access_for: Callable[[str], Mapping[str, Any]],
            factory: Optional[ClientFactory] = None, foreign: bool = True) -> Dict[str, Any]:
    """Look every expectation up at its runtime's endpoint, then (``foreign``) scan for foreign resources.

    ``access_for(runtime)`` gives the access dict (``aws.tree_access``);
    ``factory(service, access)`` builds a client (default: ``aws.client``).
    Returns ``{"storages": {name: obs}, "instances": {name: obs}, "foreign": [...], "unavailable": [...]}``.
    """
    eps: Dict[str, Endpoint] = {}
    unavailable: List[str] = []

    def endpoint(rt: Optional[str]) -> Optional[Endpoint]:
        if rt is None:
            return None
        if rt not in eps:
            eps[rt] = Endpoint(access_for(rt), factory)
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
        instances[name] = lookup_instance(ep, exp["instance_id"])
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
    found: List[Dict[str, Any]] = []
    seen: set = set()
    for rt in exps["runtimes"] if foreign else ():
        ep = endpoint(rt)
        items, unav, _errors = scan_foreign(ep, rt, exps["tag"], known)
        unavailable += unav
        for it in items:
            if (it["what"], it["id"]) not in seen:
                seen.add((it["what"], it["id"]))
                found.append(it)
    return {"storages": storages, "instances": instances, "foreign": found, "unavailable": unavailable}
