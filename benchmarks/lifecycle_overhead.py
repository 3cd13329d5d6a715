#!/usr/bin/env python
# -*- coding: utf-8 -*-
"""Lifecycle overhead: what the playbook adds around terraform for one storage root.

A one-EBS tree (the example tree cut to the storage ``mnt_data``: tests/support/e2e.py,
``make_ebs_tree``) against a moto server this script starts (its own port and state):

* playbook, create -- ``playbooks/storage.yml`` real run (render, init, plan binding,
  plan, gate, apply-check, binding check, apply of that plan file, record): creates the volume;
* bare, create     -- ``terraform init`` / ``plan -out`` / ``apply tfplan`` on a copy of the
  same rendered root (same files, same depth, its own state key): creates a volume;
* playbook, no-op  -- the playbook again (every plan empty);
* bare, no-op      -- ``init`` / ``plan`` again on the bare copy.

Prints wall times and the overhead (playbook - bare), plus the playbook's slowest tasks
(from ``profile_tasks``). No thresholds. See benchmarks/README.md ("Lifecycle overhead").

``--roots N`` (issue 12, target 2): the same tree with N EBS storage builders, one volume each,
so the storage lifecycle has N roots (one in-memory host each, planned and applied in
parallel); the bare figures are each root's own init/plan/apply run alone on a copy, and the
ratio is the playbook's wall time over the slowest root's bare time (target: <= 1.2x). It also
runs the N bare sequences all at once (N terraform processes on the same cores, as the playbook
runs the N roots) and prints the playbook's ratio to that: what the playbook adds to terraform's
own time for N roots on this machine, serialisation included.

``--repeat N`` (one root): the whole comparison N times, each on a new tree and its own state keys,
then each run's ratios and their median: one run moves by about a tenth between runs.

Usage: .venv/bin/python benchmarks/lifecycle_overhead.py [--keep DIR] [--roots N | --repeat N]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, ".venv", "collections"))
sys.path.insert(0, os.path.join(REPO, "tests", "support"))

import e2e  # noqa: E402
import local_aws  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import terraform_env  # noqa: E402


def bare(root_dir: str, env: Dict[str, str]) -> List[Tuple[str, float]]:
    """init, plan -out, apply <plan> (only if the plan has changes); [(step, seconds)]."""
    steps = [("init", ["init", "-input=false", "-no-color", "-reconfigure",
                       "-backend-config=" + next(f for f in os.listdir(root_dir) if f.endswith(".tfbackend.hcl"))]),
             ("plan", ["plan", "-input=false", "-no-color", "-detailed-exitcode", "-out=tfplan"])]
    out: List[Tuple[str, float]] = []
    for name, args in steps:
        t0 = time.monotonic()
        p = subprocess.run(["terraform"] + args, cwd=root_dir, env=env, capture_output=True, text=True, check=False)
        out.append((name, time.monotonic() - t0))
        if name == "plan":
            if p.returncode == 0:
                return out                      # nothing to apply
            if p.returncode != 2:
                raise SystemExit("bare plan failed:\n" + p.stdout + p.stderr)
        elif p.returncode != 0:
            raise SystemExit("bare %s failed:\n%s%s" % (name, p.stdout, p.stderr))
    t0 = time.monotonic()
    p = subprocess.run(["terraform", "apply", "-input=false", "-no-color", "-auto-approve", "tfplan"], cwd=root_dir,
                       env=env, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit("bare apply failed:\n" + p.stdout + p.stderr)
    out.append(("apply", time.monotonic() - t0))
    return out


def bare_env(ep_env: Dict[str, str], root_dir: str) -> Dict[str, str]:
    """The bare commands' environment: the root's endpoint environment, as csis.infra's own runs
    give terraform (docs/terraform.md)."""
    return terraform_env(e2e.run_env(ep_env), root=root_dir)


def add_builders(root: str, n: int) -> List[str]:
    """N EBS storage builders (aws-ebs, aws-ebs-2 ... aws-ebs-N), one volume each: N roots."""
    builders_path = os.path.join(root, "cfg", "storage-builders.yml")
    doc = e2e.read_yaml(builders_path)
    ebs = next(b for b in doc["storage_builders"] if b["name"] == "aws-ebs")
    names = ["aws-ebs"] + ["aws-ebs-%d" % i for i in range(2, n + 1)]
    for name in names[1:]:
        extra = dict(ebs, name=name)
        extra.pop("is_default", None)
        doc["storage_builders"].append(extra)
    e2e.write_yaml(builders_path, doc)
    storages = [{"name": "mnt_data", "mount_point": "/mnt/data", "is_default": True, "groups": ["coops"],
                 "state": "active"}]
    storages += [{"name": "vol%d" % i, "type": name, "mount_point": "/mnt/vol%d" % i, "groups": ["coops"],
                  "state": "active"} for i, name in enumerate(names[1:], start=2)]
    e2e.write_yaml(os.path.join(root, "storages", "storage0.yaml"), {"storages": storages})
    return names


def bare_copy(root: str, builder: str, key_from: str, key_to: str, name: str = "bare-copy") -> str:
    """A copy of the builder's rendered root next to it (same depth), with its own state key."""
    src = os.path.join(root, "generated", "storage", builder, "storage-generation")
    dst = os.path.join(root, "generated", "storage", builder, name)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".terraform", "tfplan*", "unmount-receipts"))
    for f in os.listdir(dst):
        if f.endswith(".tfbackend.hcl"):
            path = os.path.join(dst, f)
            text = open(path, encoding="utf-8").read().replace(key_from, key_to)
            open(path, "w", encoding="utf-8").write(text)
    return dst


def slowest_tasks(out: str, n: int = 6) -> List[str]:
    recap = out.split("TASKS RECAP", 1)[-1]
    return [m.group(1).strip() + " " + m.group(2) for m in
            re.finditer(r"^(.+?) -+ (\d+\.\d+s)$", recap, re.M)][:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--keep", help="work in this directory and keep it (default: a temporary one, removed)")
    ap.add_argument("--roots", type=int, default=1, help="storage roots (EBS builders, one volume each); default 1")
    ap.add_argument("--repeat", type=int, default=1,
                    help="one root: run the whole comparison N times, each on a new tree, and print the median "
                         "ratio (one run moves by a tenth between runs on a busy machine); default 1")
    args = ap.parse_args()
    if args.repeat < 1 or (args.repeat > 1 and args.roots > 1):
        ap.error("--repeat N takes N >= 1, and only with one root (--roots 1)")
    work = args.keep or tempfile.mkdtemp(prefix="csis-lifecycle-bench-")
    os.makedirs(work, exist_ok=True)
    la = local_aws.LocalAws(os.path.join(work, "aws"))
    rec = la.start(prefer_port=None)
    try:
        la.seed()
        ep_env = la.env(rec["url"])
        overlays = [la.overlay_path, e2e.APPLY_ALL]
        if args.roots > 1:
            root = e2e.make_ebs_tree(work, "bench-playbook")
            return many_roots(root, ep_env, overlays, work, add_builders(root, args.roots))
        runs = [one_root(work, ep_env, overlays, i if args.repeat > 1 else None) for i in range(1, args.repeat + 1)]
    finally:
        la.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    ratios: Dict[str, List[float]] = {"create": [], "no-op": []}
    for i, rows in enumerate(runs, start=1):
        if len(runs) > 1:
            print("\nrun %d of %d" % (i, len(runs)))
        print("| run | wall (s) | where the time goes |")
        print("|---|---:|---|")
        for name, secs, note in rows:
            print("| %s | %.1f | %s |" % (name, secs, note))
        t = {name: secs for name, secs, _note in rows}
        for kind in ("create", "no-op"):
            over = t["playbook, %s" % kind] - t["bare, %s" % kind]
            ratios[kind].append(t["playbook, %s" % kind] / max(t["bare, %s" % kind], 1e-9))
            print("overhead (%s): %.1f s (%.2fx the bare terraform commands; target <= 1.3x)"
                  % (kind, over, ratios[kind][-1]))
    if len(runs) > 1:
        print()
        for kind in ("create", "no-op"):
            print("%s, %d runs: %s; median %.2fx (target <= 1.3x)"
                  % (kind, len(runs), ", ".join("%.2fx" % r for r in ratios[kind]), statistics.median(ratios[kind])))
    return 0


def one_root(work: str, ep_env: Dict[str, str], overlays: List[str], n: Optional[int]) -> List[Tuple[str, float, str]]:
    """Target 1 once: a new one-EBS tree's create and no-op through the playbook, and the bare
    commands on a copy of its rendered root ([(run, seconds, note)]). ``n``: the repetition,
    which names the tree and its state keys (a repetition creates its own volumes)."""
    suffix = "" if n is None else "-%d" % n
    root = e2e.make_ebs_tree(work, "bench-playbook%s" % suffix, name="examples%s" % suffix)
    rows: List[Tuple[str, float, str]] = []
    log = os.path.join(work, "create%s.log" % suffix)
    run = e2e.run_playbook("storage.yml", root, ep_env, overlays=overlays, log=log)
    if run.rc != 0:
        raise SystemExit("playbook run failed:\n" + run.tail())
    rows.append(("playbook, create", run.seconds, "; ".join(slowest_tasks(run.out, 4))))

    # the same rendered root, copied next to it (same depth: module sources resolve), own state key
    dst = bare_copy(root, "aws-ebs", "statefiles/bench-playbook%s/" % suffix, "statefiles/bench-bare%s/" % suffix)
    tf_env = bare_env(ep_env, dst)
    b = bare(dst, tf_env)
    rows.append(("bare, create", sum(s for _step, s in b), ", ".join("%s %.1fs" % x for x in b)))

    run2 = e2e.run_playbook("storage.yml", root, ep_env, overlays=overlays,
                            log=os.path.join(work, "noop%s.log" % suffix))
    if run2.rc != 0:
        raise SystemExit("playbook re-run failed:\n" + run2.tail())
    rows.append(("playbook, no-op", run2.seconds, "; ".join(slowest_tasks(run2.out, 4))))
    b2 = bare(dst, tf_env)
    rows.append(("bare, no-op", sum(s for _step, s in b2), ", ".join("%s %.1fs" % x for x in b2)))
    return rows


def many_roots(root: str, ep_env: Dict[str, str], overlays: List[str], work: str, builders: List[str]) -> int:
    """Target 2: the playbook over N roots against each root's bare sequence run alone."""
    rows: List[Tuple[str, float, str]] = []
    for kind in ("create", "no-op"):
        run = e2e.run_playbook("storage.yml", root, ep_env, overlays=overlays, log=os.path.join(work, "%s.log" % kind))
        if run.rc != 0:
            raise SystemExit("playbook run failed:\n" + run.tail())
        rows.append(("playbook, %d roots, %s" % (len(builders), kind), run.seconds, "; ".join(slowest_tasks(run.out, 3))))
    bare_rows = {"create": [], "no-op": []}
    for builder in builders:
        dst = bare_copy(root, builder, "statefiles/bench-playbook/", "statefiles/bench-bare-%s/" % builder)
        tf_env = bare_env(ep_env, dst)
        for kind in ("create", "no-op"):
            steps = bare(dst, tf_env)
            bare_rows[kind].append((builder, sum(s for _step, s in steps)))
    # the same N bare sequences all at once (as many processes as the playbook runs roots, on the
    # same cores): what terraform alone needs for N roots on this machine; the playbook's ratio
    # to it is what the playbook adds, serialisation included
    together: Dict[str, float] = {}
    dsts = [bare_copy(root, b, "statefiles/bench-playbook/", "statefiles/bench-together-%s/" % b, "bare-together")
            for b in builders]
    for kind in ("create", "no-op"):
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(dsts)) as pool:
            list(pool.map(lambda d: bare(d, bare_env(ep_env, d)), dsts))
        together[kind] = time.monotonic() - t0
    print("| run | wall (s) | notes |")
    print("|---|---:|---|")
    for name, secs, note in rows:
        print("| %s | %.1f | %s |" % (name, secs, note))
    for kind in ("create", "no-op"):
        slow = max(bare_rows[kind], key=lambda kv: kv[1])
        print("| bare %s, slowest root alone (%s) | %.1f | each root: %s |" % (
            kind, slow[0], slow[1], ", ".join("%.1f" % secs for _b, secs in bare_rows[kind])))
    for kind in ("create", "no-op"):
        print("| bare %s, all %d roots at once | %.1f | |" % (kind, len(builders), together[kind]))
    for (name, secs, _note), kind in zip(rows, ("create", "no-op")):
        slow = max(secs_ for _b, secs_ in bare_rows[kind])
        print("%s: %.2fx the slowest root's bare time (target <= 1.2x); %.2fx the %d bare sequences run at once"
              % (name, secs / max(slow, 1e-9), secs / max(together[kind], 1e-9), len(builders)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
