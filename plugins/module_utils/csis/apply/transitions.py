# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Storage transitions that terraform does not do: the EBS archive snapshot, its
deletion after a restore or a destroy, and the S3 wipe before a bucket's destroy.

Resources are found by the ids terraform recorded in the root's state, never by the
first ``Name`` tag that matches. Whether a volume is attached is read from EC2 (reality),
not from declarations. The role runs these only after the gate passed and
``csis_apply_check`` allowed the apply in the same run.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional

from .. import aws
from ..config.secrets import Reveal
from ..errors import CsisError
from ..state.lookups import newest_snapshot
from ..state.record import resources, under
from .. import tfstate


class TransitionError(CsisError):
    pass


def _volume_id(root: Mapping[str, Any], storage: str, state: Optional[Mapping[str, Any]] = None) -> Optional[str]:
    info = (root.get("storages") or {}).get(storage) or {}
    st = state if state is not None else tfstate.read(root["directory"], root.get("binary_path") or "terraform")
    for r in under(resources(st), info.get("address", "module.storage_%s" % storage)):
        if r["type"] == "aws_ebs_volume":
            return r["attributes"].get("id")
    return None


def archive_snapshots(ec2: Any, name: str, storage: str, tags: Optional[Mapping[str, str]] = None) -> List[Dict[str, Any]]:
    """The archive snapshots of ``storage``: its Name, its ``csis_storage`` tag and the tree's
    own tags (``csis_config``), so another tree's archive of a same-named storage never counts."""
    filters = [{"Name": "tag:Name", "Values": [name]}, {"Name": "tag:csis_storage", "Values": [storage]}]
    filters += [{"Name": "tag:%s" % k, "Values": [v]} for k, v in sorted((tags or {}).items())]
    resp = ec2.describe_snapshots(OwnerIds=["self"], Filters=filters)
    return resp.get("Snapshots") or []


def reusable(existing: List[Dict[str, Any]], volume: Optional[str]) -> List[Dict[str, Any]]:
    """The archive snapshots an archive run may take as its own instead of snapshotting again:
    those of ``volume`` (the one the root's state holds, or, once the apply destroyed it, the one
    meta-state recorded: a run stopped after taking it), or any when neither is known (a record
    from before volume ids were kept). A snapshot of another volume is an earlier archive's, left
    behind by a restore whose deletion failed: taking it would destroy the volume with an old copy
    of its data."""
    if volume is None:
        return list(existing)
    return [s for s in existing if s.get("VolumeId") == volume]


def snapshot(root: Mapping[str, Any], t: Mapping[str, Any], access: Mapping[str, Any],
             state: Optional[Mapping[str, Any]] = None, timeout: float = 1800.0) -> Dict[str, Any]:
    ec2 = aws.client("ec2", access)
    name = t["snapshot_name"]
    storage = t["storage"]
    existing = archive_snapshots(ec2, name, storage, t.get("tags"))
    vol = _volume_id(root, storage, state)
    mine = reusable(existing, vol or t.get("volume_id"))
    if mine:
        snap = newest_snapshot(mine)
        created = False
    else:
        if not vol:
            raise TransitionError("no volume named %s to archive (the root's state records no aws_ebs_volume for "
                                  "storage '%s')" % (storage, storage))
        desc = ec2.describe_volumes(VolumeIds=[vol])["Volumes"]
        if not desc:
            raise TransitionError("no volume named %s to archive (%s is gone)" % (storage, vol))
        att = [a.get("InstanceId") for a in desc[0].get("Attachments") or [] if a.get("State") in ("attaching", "attached")]
        if att:
            raise TransitionError("storage '%s' cannot be archived: volume %s is still attached to %s (detach in one run, "
                                  "transition in the next; N21)" % (storage, vol, ", ".join(att)))
        # the volume's cost tags (its hierarchy's, runtime's, builder's and own: the render's cost_tags), then
        # the ones the archive is found by, which win
        tags = dict(t.get("cost_tags") or {})
        tags.update({"Name": name, "csis_storage": storage})
        tags.update(t.get("tags") or {})
        snap = ec2.create_snapshot(VolumeId=vol, Description="csis.infra archive of storage %s" % storage,
                                   TagSpecifications=[{"ResourceType": "snapshot", "Tags": [
                                       {"Key": k, "Value": v} for k, v in sorted(tags.items())]}])
        created = True
    sid = snap["SnapshotId"]
    deadline = time.time() + timeout
    while True:
        cur = ec2.describe_snapshots(SnapshotIds=[sid])["Snapshots"][0]
        if cur.get("State") == "completed":
            break
        if cur.get("State") == "error":
            raise TransitionError("archive snapshot %s of storage '%s' failed" % (sid, storage))
        if time.time() > deadline:
            raise TransitionError("archive snapshot %s of storage '%s' did not complete in %ds" % (sid, storage, timeout))
        time.sleep(5)
    return {"snapshot_id": sid, "created": created}


def delete_archive_snapshot(root: Mapping[str, Any], t: Mapping[str, Any], access: Mapping[str, Any]) -> Dict[str, Any]:
    del root  # the snapshots are found by their tags
    ec2 = aws.client("ec2", access)
    deleted = []
    for s in archive_snapshots(ec2, t["snapshot_name"], t["storage"], t.get("tags")):
        ec2.delete_snapshot(SnapshotId=s["SnapshotId"])
        deleted.append(s["SnapshotId"])
    return {"deleted": deleted}


def empty_bucket(root: Mapping[str, Any], t: Mapping[str, Any], access: Mapping[str, Any]) -> Dict[str, Any]:
    """Delete every object version and delete marker (and plain objects) of the bucket."""
    del root  # the bucket is named by the transition
    s3 = aws.client("s3", access)
    bucket = t["bucket"]
    removed = 0
    try:
        paginator = s3.get_paginator("list_object_versions")
        for page in paginator.paginate(Bucket=bucket):
            keys = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                    for v in (page.get("Versions") or []) + (page.get("DeleteMarkers") or [])]
            for i in range(0, len(keys), 1000):
                if keys[i:i + 1000]:
                    s3.delete_objects(Bucket=bucket, Delete={"Objects": keys[i:i + 1000], "Quiet": True})
                    removed += len(keys[i:i + 1000])
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents") or []]
            if keys:
                s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
                removed += len(keys)
    except s3.exceptions.NoSuchBucket:
        return {"removed": 0, "bucket": bucket, "absent": True}
    return {"removed": removed, "bucket": bucket}


ACTIONS = {"snapshot": snapshot, "delete_archive_snapshot": delete_archive_snapshot, "empty_bucket": empty_bucket}


def changed_by(action: Optional[str], res: Mapping[str, Any]) -> bool:
    """Whether a transition's result changed anything: a snapshot taken (not one found), a
    snapshot deleted, an object removed."""
    if action == "snapshot":
        return bool(res.get("created"))
    if action == "delete_archive_snapshot":
        return bool(res.get("deleted"))
    if action == "empty_bucket":
        return bool(res.get("removed"))
    return False


def _bucket_holds_anything(s3: Any, bucket: str) -> Optional[bool]:
    """Whether the bucket holds an object, a version or a delete marker; None when it does not exist."""
    try:
        page = s3.list_object_versions(Bucket=bucket, MaxKeys=1)
    except s3.exceptions.NoSuchBucket:
        return None
    return bool(page.get("Versions") or page.get("DeleteMarkers"))


def probe_transition(root: Mapping[str, Any], t: Mapping[str, Any], reveal: Optional[Reveal] = None) -> Dict[str, Any]:
    """What :func:`run_transition` would do, read without changing anything (check mode):
    ``{"would": <what>, "changed": bool}``."""
    action = t.get("action")
    if action == "record":
        return {"would": "nothing (a record only)", "changed": False}
    if action not in ACTIONS:
        raise TransitionError("unknown storage transition action %r" % (action,))
    access = aws.root_access(root.get("aws") or {}, root.get("secrets"), reveal, "root '%s'" % root.get("key", "?"))
    try:
        if action == "empty_bucket":
            holds = _bucket_holds_anything(aws.client("s3", access), t["bucket"])
            return {"would": "nothing (no bucket %s)" % t["bucket"] if holds is None else
                    ("empty bucket %s" % t["bucket"] if holds else "nothing (bucket %s is empty)" % t["bucket"]),
                    "changed": bool(holds)}
        found = archive_snapshots(aws.client("ec2", access), t["snapshot_name"], t["storage"], t.get("tags"))
    except Exception as exc:  # botocore errors: name the storage and the step
        raise TransitionError("storage '%s': %s (check mode) failed: %s" % (t.get("storage"), action, exc))
    ids = sorted(str(x.get("SnapshotId")) for x in found)
    if action == "snapshot":
        try:
            mine = reusable(found, _volume_id(root, t["storage"]) or t.get("volume_id")) if found else []
        except Exception:  # pylint: disable=broad-except
            mine = found  # the state unreadable here: the run reads it, and names any error
        return ({"would": "reuse archive snapshot %s" % newest_snapshot(mine)["SnapshotId"], "changed": False} if mine else
                {"would": "snapshot storage %s as %s" % (t["storage"], t["snapshot_name"]), "changed": True})
    return ({"would": "delete archive snapshot(s) %s" % ", ".join(ids), "changed": True} if ids else
            {"would": "nothing (no archive snapshot %s)" % t["snapshot_name"], "changed": False})


def run_transition(root: Mapping[str, Any], t: Mapping[str, Any], reveal: Optional[Reveal] = None) -> Dict[str, Any]:
    """Carry out transition ``t`` of a rendered root, reaching AWS as the root's runtime
    (``aws.root_access``: its static keys revealed by ``reveal``)."""
    action = t.get("action")
    if action == "record":
        return {"noop": True}
    fn = ACTIONS.get(action)
    if fn is None:
        raise TransitionError("unknown storage transition action %r" % (action,))
    access = aws.root_access(root.get("aws") or {}, root.get("secrets"), reveal, "root '%s'" % root.get("key", "?"))
    try:
        return fn(root, t, access)
    except TransitionError:
        raise
    except Exception as exc:  # botocore errors: name the storage and the step
        raise TransitionError("storage '%s': %s failed: %s" % (t.get("storage"), action, exc))
