# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Read back from (and clean up at) the AWS endpoint, for the molecule scenarios' verify
and destroy steps. boto3 only: independent of the collection's own code.

    python endpoint.py volumes --tag KEY=VALUE ...     # JSON list of the volumes with those tags
    python endpoint.py objects --bucket B --prefix P   # JSON list of the object keys under P
    python endpoint.py purge --bucket B --prefix P [--tag KEY=VALUE ...]
        # delete every object version under P and every volume with those tags; JSON counts

The endpoint and credentials come from the environment: CSIS_AWS_ENDPOINT_URL (unset:
the real AWS endpoints), AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List


def client(service: str) -> Any:
    import boto3

    return boto3.client(service, endpoint_url=os.environ.get("CSIS_AWS_ENDPOINT_URL") or None,
                        region_name=os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION"))


def tag_filters(tags: List[str]) -> List[Dict[str, Any]]:
    out = []
    for kv in tags:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise SystemExit("--tag wants KEY=VALUE, got %r" % kv)
        out.append({"Name": "tag:%s" % key, "Values": [value]})
    return out


def volumes(tags: List[str]) -> List[Dict[str, Any]]:
    if not tags:
        raise SystemExit("volumes: name at least one --tag")
    found = []
    for page in client("ec2").get_paginator("describe_volumes").paginate(Filters=tag_filters(tags)):
        for v in page["Volumes"]:
            found.append({
                "id": v["VolumeId"], "size": v["Size"], "type": v.get("VolumeType"),
                "availability_zone": v["AvailabilityZone"], "state": v["State"],
                "encrypted": v.get("Encrypted"), "tags": {t["Key"]: t["Value"] for t in v.get("Tags", [])},
                "attachments": [a["InstanceId"] for a in v.get("Attachments", [])],
            })
    return found


def objects(bucket: str, prefix: str) -> List[str]:
    keys: List[str] = []
    for page in client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def purge(bucket: str, prefix: str, tags: List[str]) -> Dict[str, int]:
    if not prefix.strip("/"):
        raise SystemExit("purge: refusing an empty prefix")
    s3 = client("s3")
    versions = 0
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        batch = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                 for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
        if batch:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
            versions += len(batch)
    deleted = 0
    if tags:
        ec2 = client("ec2")
        for v in volumes(tags):
            for instance in v["attachments"]:
                ec2.detach_volume(VolumeId=v["id"], InstanceId=instance, Force=True)
            ec2.delete_volume(VolumeId=v["id"])
            deleted += 1
    return {"object_versions": versions, "volumes": deleted}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="endpoint.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_vol = sub.add_parser("volumes")
    p_vol.add_argument("--tag", action="append", default=[])
    for name in ("objects", "purge"):
        p = sub.add_parser(name)
        p.add_argument("--bucket", required=True)
        p.add_argument("--prefix", required=True)
        if name == "purge":
            p.add_argument("--tag", action="append", default=[])
    args = parser.parse_args(argv)
    if args.command == "volumes":
        result: Any = volumes(args.tag)
    elif args.command == "objects":
        result = objects(args.bucket, args.prefix)
    else:
        result = purge(args.bucket, args.prefix, args.tag)
    json.dump(result, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
