#!/usr/bin/env python
# -*- coding: utf-8 -*-
"""Render at scale: trees of N instances, each with its own EBS volume, plus one EFS and
one S3 storage, rendered for the identity, storage and instance-image lifecycles.

Per size it times
  * plan     -- ``plan_roots`` alone (load + validate excluded), pure Python;
  * generate -- ``service.render(prepare=False)`` into a fresh directory: load, validate,
                plan, fmt the texts and write the roots (no init/validate);
  * cold     -- ``service.render(prepare=True)`` into a fresh directory: the above plus
                ``fmt -check``, ``init -backend=false`` and ``validate`` in every root
                (in parallel, one shared provider plugin cache);
  * warm     -- the same call again on the rendered tree (nothing changed).

Usage: .venv/bin/python benchmarks/render_scale.py [--sizes 1,10,100,1000] [--workers N]
                                                    [--profile]   (cProfile of generate at the largest size)
No thresholds: it prints a table. See benchmarks/README.md ("Render at scale").
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, ".venv", "collections"))

import yaml  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.render import pipeline as service  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.plan import RenderOptions  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.roots import plan_roots  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate  # noqa: E402

LIFECYCLES = ["identity", "storage", "instance-image"]


def _dump(path: str, data: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)


def make_tree(parent: str, n: int) -> str:
    """A configuration tree of ``n`` instances under ``parent/tree-<n>`` (tfmodules linked)."""
    root = os.path.join(parent, "tree-%d" % n)
    os.makedirs(root)
    link = os.path.join(parent, "tfmodules")
    if not os.path.lexists(link):
        os.symlink(os.path.join(REPO, "tfmodules"), link)
    _dump(os.path.join(root, "cfg", "_config.yml"), {"id": "bench-%d" % n, "config": {
        "use_state_backends": True, "apply_instances": False, "apply_storage": False, "module_source_base": "../tfmodules"}})
    _dump(os.path.join(root, "cfg", "executables.yml"), {"executables": [
        {"name": "tf", "type": "terraform", "binary": "terraform"}]})
    _dump(os.path.join(root, "cfg", "runtime-builders.yml"), {"runtime_builders": [{
        "name": "bench-rt", "region": "us-east-2", "session_mechanism": "ssm", "session_instance_profile": "csis-ssm",
        "networking": {
            "network": "vpc-0123456789abcdef0", "default_subnet_id": "subnet-0123456789abcdef0",
            "addl_security_groups": ["sg-0123456789abcdef0"],
            "subnets": [{"subnet_id": "subnet-0123456789abcdef0", "availability_zone": "us-east-2a"},
                        {"subnet_id": "subnet-0123456789abcdef1", "availability_zone": "us-east-2b"}]}}]})
    _dump(os.path.join(root, "cfg", "state-backends.yml"), {"state_backends": [
        {"name": "s3", "type": "s3", "is_default": True, "bucket": "bench-state", "key": "bench", "region": "us-east-2"},
        {"name": "local", "type": "local", "directory": "state"}]})
    _dump(os.path.join(root, "cfg", "group-builders.yml"), {"group_builders": [
        {"name": "groups", "type": "tf-identity", "runtime": "bench-rt", "executable": "tf", "state_configuration": "local"}]})
    _dump(os.path.join(root, "cfg", "instance-builders.yml"), {"instance_builders": [
        {"name": "fleet", "type": "tofu", "runtime": "bench-rt", "executable": "tf"}]})
    _dump(os.path.join(root, "cfg", "storage-builders.yml"), {"storage_builders": [
        {"name": "vols", "type": "tf-aws-ebs", "is_default": True, "runtime": "bench-rt", "executable": "tf", "size": 50},
        {"name": "shared", "type": "tf-aws-efs", "runtime": "bench-rt", "executable": "tf"},
        {"name": "objects", "type": "tf-aws-s3", "runtime": "bench-rt", "executable": "tf", "bucket_name": "bench-unused"}]})
    _dump(os.path.join(root, "groups", "groups.yaml"), {"groups": [{"name": "team", "gid": 5000}]})
    _dump(os.path.join(root, "images", "images.yaml"), {"images": [
        {"name": "base", "group": "team", "name_pattern": "bench-base", "storage_types": ["ebs", "efs", "s3"]}]})
    storages: List[Dict[str, Any]] = [{"name": "vol-%04d" % i, "type": "vols", "groups": ["team"]} for i in range(n)]
    storages.append({"name": "shared-efs", "type": "shared", "groups": ["team"], "lifecycle": {"ia_days": 30}})
    storages.append({"name": "bench-objects", "type": "objects", "groups": ["team"]})
    _dump(os.path.join(root, "storages", "storages.yaml"), {"storages": storages})
    _dump(os.path.join(root, "instances", "instances.yaml"), {"instances": [
        {"name": "node-%04d" % i, "image": "base", "tags": {"index": str(i)},
         "storages": [{"name": "vol-%04d" % i, "mount_point": "/data"}, {"name": "shared-efs", "mount_point": "/shared"}]}
        for i in range(n)]})
    return root


def timed(fn: Any, *a: Any, **kw: Any) -> float:
    t0 = time.perf_counter()
    fn(*a, **kw)
    return time.perf_counter() - t0


def plan_only(root: str) -> float:
    tree, meta = load_and_validate(root)
    t0 = time.perf_counter()
    for lc in LIFECYCLES:
        plan_roots(tree, meta, lc, RenderOptions())
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--sizes", default="1,10,100,1000")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the generated trees (printed path)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    work = tempfile.mkdtemp(prefix="csis-render-bench-")
    rows = []
    try:
        for n in sizes:
            src = make_tree(work, n)
            t_plan = plan_only(src)
            gen_root = src + "-gen"
            shutil.copytree(src, gen_root)
            t_gen = timed(service.render, gen_root, LIFECYCLES, prepare=False)
            cold_root = src + "-cold"
            shutil.copytree(src, cold_root)
            t_cold = timed(service.render, cold_root, LIFECYCLES, prepare=True, workers=args.workers)
            t_warm = timed(service.render, cold_root, LIFECYCLES, prepare=True, workers=args.workers)
            files = sum(len(fs) for _dir, _subdirs, fs in os.walk(os.path.join(gen_root, "generated")))
            rows.append((n, files, t_plan, t_gen, t_cold, t_warm))
            print("%5d instances: plan %.3fs  generate %.3fs  cold %.2fs  warm %.2fs" % (n, t_plan, t_gen, t_cold, t_warm),
                  file=sys.stderr)
        if args.profile and sizes:
            import cProfile
            import pstats
            root = make_tree(os.path.join(work, "profile"), max(sizes))
            prof = cProfile.Profile()
            prof.enable()
            service.render(root, LIFECYCLES, prepare=False)
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    finally:
        if args.keep:
            print("trees kept under %s" % work, file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("| instances | files | plan_roots (s) | generate, no terraform (s) | cold render + fmt/init/validate (s) | warm re-render (s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, files, t_plan, t_gen, t_cold, t_warm in rows:
        print("| %d | %d | %.3f | %.3f | %.2f | %.2f |" % (n, files, t_plan, t_gen, t_cold, t_warm))
    print("\n(%d CPUs; terraform fmt/init/validate with %d workers; reference system: 15 s for 1 instance, 52 s for 100)"
          % (os.cpu_count() or 0, args.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
