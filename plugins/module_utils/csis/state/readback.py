# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Read back from the AWS endpoint what a configuration tree's resources look like: the
summary of instances, volumes, filesystems and buckets the demo prints (``csis_summary``).
Resources are found by the ids meta-state recorded from terraform state; tags
(``csis_config``) only find the rest.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ..aws import client, tree_access
from ..config.loader import Tree
from ..config.secrets import Reveal


def _pages(api: Any, operation: str, key: str, **kwargs: Any) -> List[Any]:
    """Every page's ``key`` list of a paginated describe call (thousands of instances or
    filesystems answer in pages)."""
    out: List[Any] = []
    for page in api.get_paginator(operation).paginate(**kwargs):
        out.extend(page.get(key) or [])
    return out


def summarize(tree: Tree, meta: Mapping[str, Any], reveal: Optional[Reveal] = None) -> Dict[str, Any]:
    """What the endpoint holds of the tree's resources (a runtime's static keys revealed by
    ``reveal``: ``aws.tree_access``). Runtimes that share an account and region see the same
    resources: each is listed once, under the first runtime (by name) that saw it; a bucket is
    read through the runtime of its storage's builder."""
    tag = tree.resource_tag()["csis_config"]
    out: Dict[str, Any] = {"instances": [], "volumes": [], "filesystems": [], "buckets": []}
    seen: set = set()
    storages = (meta.get("storage-state.yaml") or {}).get("storages") or {}
    buckets: Dict[str, List[str]] = {}  # runtime -> the storages whose bucket it reads
    runtimes = sorted(tree.runtimes)
    for name, rec in sorted(storages.items()):
        facts = rec.get("facts") or {}
        if facts.get("type") != "s3" or rec.get("state") != "active" or not runtimes:
            continue
        declared = tree.storages.get(name)
        # no longer declared: the builder meta-state recorded it with
        builder = (tree.storage_builder_for(declared) if declared is not None
                   else tree.storage_builder(str(facts.get("builder") or "")))
        rt = tree.builder_runtime(builder) if builder is not None else None
        buckets.setdefault(rt.name if rt is not None and rt.name in tree.runtimes else runtimes[0], []).append(name)
    for rt_name in runtimes:
        acc = tree_access(tree, rt_name, reveal)
        ec2 = client("ec2", acc)
        by_tag = [{"Name": "tag:csis_config", "Values": [tag]}]
        vols = {v["VolumeId"]: v for v in _pages(ec2, "describe_volumes", "Volumes", Filters=by_tag)}
        alive = {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}
        for r in _pages(ec2, "describe_instances", "Reservations", Filters=by_tag + [alive]):
            for i in r.get("Instances", []):
                if i["InstanceId"] in seen:
                    continue
                seen.add(i["InstanceId"])
                name = next((t["Value"] for t in i.get("Tags", []) if t["Key"] == "Name"), i["InstanceId"])
                attached = [{"volume_id": b["Ebs"]["VolumeId"], "device": b["DeviceName"]}
                            for b in i.get("BlockDeviceMappings", []) if b["Ebs"]["VolumeId"] in vols]
                out["instances"].append({"name": name, "instance_id": i["InstanceId"], "state": i["State"]["Name"],
                                         "private_ip": i.get("PrivateIpAddress"), "ami": i.get("ImageId"),
                                         "runtime": rt_name, "volumes": attached})
        for v in vols.values():
            if v["VolumeId"] in seen:
                continue
            seen.add(v["VolumeId"])
            name = next((t["Value"] for t in v.get("Tags", []) if t["Key"] == "Name"), v["VolumeId"])
            out["volumes"].append({"name": name, "volume_id": v["VolumeId"], "size": v["Size"], "state": v["State"],
                                   "zone": v["AvailabilityZone"],
                                   "attached_to": [a["InstanceId"] for a in v.get("Attachments", [])]})
        efs = client("efs", acc)
        for fs in _pages(efs, "describe_file_systems", "FileSystems"):
            tags = {t["Key"]: t["Value"] for t in fs.get("Tags", [])}
            if tags.get("csis_config") != tag or fs["FileSystemId"] in seen:
                continue
            fsid = fs["FileSystemId"]
            seen.add(fsid)
            aps = efs.describe_access_points(FileSystemId=fsid).get("AccessPoints", [])
            mts = efs.describe_mount_targets(FileSystemId=fsid).get("MountTargets", [])
            out["filesystems"].append({"name": tags.get("Name"), "file_system_id": fsid,
                                       "access_points": sorted(a.get("RootDirectory", {}).get("Path", "") for a in aws_list(aps)),
                                       "mount_targets": len(mts)})
        if not buckets.get(rt_name):
            continue
        s3 = client("s3", acc)
        for name in buckets[rt_name]:
            bucket = (storages[name].get("facts") or {}).get("bucket_name") or name
            try:
                tags = {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=bucket).get("TagSet", [])}
            except Exception as exc:  # noqa: BLE001 - reported, never read as absent
                out["buckets"].append({"storage": name, "bucket": bucket, "error": str(exc)})
                continue
            try:
                rules = len(s3.get_bucket_lifecycle_configuration(Bucket=bucket).get("Rules", []))
            except Exception:  # noqa: BLE001 - no lifecycle configuration
                rules = 0
            out["buckets"].append({"storage": name, "bucket": bucket, "lifecycle_rules": rules, "tags": tags})
    out["buckets"].sort(key=lambda b: b["storage"])
    return out


def aws_list(xs: List[Any]) -> List[Any]:
    return list(xs or [])


def summary_lines(s: Mapping[str, Any]) -> List[str]:
    lines = []
    for i in s["instances"]:
        vols = ", ".join("%s at %s" % (v["volume_id"], v["device"]) for v in i["volumes"]) or "no volumes"
        lines.append("instance %s (%s, %s, %s, %s): %s" % (i["name"], i["instance_id"], i["state"], i["private_ip"], i["ami"], vols))
    for v in s["volumes"]:
        attached = " attached to " + ", ".join(v["attached_to"]) if v["attached_to"] else ""
        lines.append("volume %s (%s, %d GiB, %s, %s)%s" % (v["name"], v["volume_id"], v["size"], v["zone"], v["state"], attached))
    for f in s["filesystems"]:
        lines.append("filesystem %s (%s): %s, %d mount target(s)" % (
            f["name"], f["file_system_id"], _listed("access points", f["access_points"]), f["mount_targets"]))
    for b in s["buckets"]:
        if "error" in b:
            lines.append("bucket %s (storage %s): unavailable: %s" % (b["bucket"], b["storage"], b["error"]))
        else:
            lines.append("bucket %s (storage %s): %d lifecycle rule(s), %s" % (
                b["bucket"], b["storage"], b["lifecycle_rules"],
                _listed("tags", ["%s=%s" % (k, b["tags"][k]) for k in sorted(b["tags"])])))
    return lines


def _listed(what: str, items: List[Any]) -> str:
    """``<what> a, b`` or ``no <what>``: part of a line an operator reads, not a Python list."""
    return "%s %s" % (what, ", ".join(str(i) for i in items)) if items else "no %s" % what
