# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What meta-state (and the tree) say should exist: the first layer of the state query.

:func:`expectations` lists every owned storage (declared or recorded) with the ids
terraform recorded (``facts.volume_id``, ``facts.file_system_id``, the bucket name), and
every launched instance with its recorded instance id, pinned build and pending
replacement. Pure: no endpoint is asked.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

from ..config.models import archive_snapshot_name, bucket_for
from .verify import verdict_of

STORAGE_TYPES = ("ebs", "efs", "s3")


def expectations(tree: Any, meta: Mapping[str, Any]) -> Dict[str, Any]:
    """What meta-state and the tree say should exist.

    ``{"tag": <csis_config>, "runtimes": [names], "storages": {name: {...}}, "instances": {name: {...}}}``;
    each storage: ``name, declared, declared_state, recorded_state, type, builder, runtime,
    volume_id, file_system_id, bucket, archive, lifecycle, tag`` (the tree's ``csis_config``); each instance: ``name, runtime,
    instance_id, recorded_ami, pin, pending``.
    """
    storage_recs = ((meta.get("storage-state.yaml") or {}).get("storages") or {})
    tag = tree.resource_tag()["csis_config"]
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
            bucket = facts.get("bucket_name") or (bucket_for(st, builder) if st is not None else None) or name
        out_st[name] = {
            "name": name, "declared": st is not None, "declared_state": st.state if st is not None else None,
            "recorded_state": (rec or {}).get("state"), "type": stype,
            "builder": builder.name if builder is not None else facts.get("builder"),
            "runtime": rt.name if rt is not None else None,
            "volume_id": facts.get("volume_id"), "file_system_id": facts.get("file_system_id"),
            "bucket": bucket,
            "archive": facts.get("archive") or (archive_snapshot_name(name)
                                                if stype == "ebs" else None),
            "lifecycle": lifecycle, "tag": tag,
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
            builder = tree.instance_builder_for(inst) if inst is not None else None
            # the builder's runtime launches it (validation checks an instance's own runtime against it)
            rt = tree.builder_runtime(builder) if builder is not None else tree.runtime(rt_name or "default")
            rt_name = rt.name if rt is not None else rt_name
        out_in[name] = {"name": name, "runtime": rt_name, "instance_id": cur.get("instance_id"),
                        "recorded_ami": cur.get("ami_id"), "pin": pin_map.get(name),
                        "pending": pending.get(name) if name in pending else None,
                        "is_pending": name in pending, "ephemeral": lp.get("ephemeral") is True,
                        "verification": _last_verdict(meta, name, cur.get("instance_id"))}
    return {"tag": tag, "runtimes": sorted(tree.runtimes),
            "storages": out_st, "instances": out_in}


def _last_verdict(meta: Mapping[str, Any], name: str, instance_id: Any = None) -> Dict[str, Any]:
    """``{ok, time, failed}`` of the last verification of the instance's standing machine
    (``instance_id``; ``verifications.yaml``, when the caller read it: :func:`~.verify.verdict_of`,
    so an earlier generation's verdict is not this machine's), ``failed`` naming the checks that
    failed; empty without one."""
    verdict = verdict_of((meta.get("verifications.yaml") or {}).get("verifications") or [], name,
                         instance_id if isinstance(instance_id, str) else None)
    if verdict is None:
        return {}
    bad = ["%s: %s" % (c.get("name"), c.get("detail")) for c in verdict.get("checks") or []
           if isinstance(c, dict) and not c.get("ok")]
    return {"ok": verdict.get("ok"), "time": verdict.get("time"), "failed": "; ".join(bad) or "no checks ran"}
