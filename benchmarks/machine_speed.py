#!/usr/bin/env python
# -*- coding: utf-8 -*-
"""How fast this machine is right now, on the two kinds of work the suite is made of, so a
suite's time can be told apart from the machine's (benchmarks/README.md, "Session 30"):

  * sha256 -- the AWS provider binary hashed once, what terraform does before every command
              that loads providers (the lock file's check: about half a second of CPU each,
              hundreds of times per suite);
  * python -- a fixed pure-Python workload (JSON and dict work, as the library and Ansible do).

Each is the best of three runs (CPU time of this process), so a busy neighbour inflates it
less. One line on stdout, nothing written. ``scripts/test`` prints it before the suite starts.

Usage: .venv/bin/python benchmarks/machine_speed.py [--provider PATH]
No thresholds: compare the figures between runs (same machine type) to see whether a slower
suite is the code's doing or the machine's.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import time
from typing import Callable, Optional


def _provider() -> Optional[str]:
    """The AWS provider binary in the bootstrap's plugin cache, else in the machine's mirror."""
    patterns = [os.path.expanduser("~/.cache/csis-infra/plugin-cache/registry.terraform.io/hashicorp/aws/*/*/"
                                   "terraform-provider-aws_*"),
                "/opt/tf-plugins/registry.terraform.io/hashicorp/aws/*/*/terraform-provider-aws_*"]
    for pattern in patterns:
        found = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
        if found:
            return found[-1]
    return None


def _hash(path: str) -> None:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)


def _python() -> None:
    doc = {"instances": {"n%04d" % i: {"image": "ami-%08x" % i, "mounts": [{"storage": "s%d" % (i % 7)}],
                                       "tags": {"k%d" % k: "v" * k for k in range(8)}} for i in range(2000)}}
    for _round in range(24):
        text = json.dumps(doc, sort_keys=True)
        doc = json.loads(text)
        doc["instances"] = {k: dict(v, seen=len(text)) for k, v in sorted(doc["instances"].items())}


def _best(work: Callable[[], None], runs: int = 3) -> float:
    best = float("inf")
    for _run in range(runs):
        t0 = time.process_time()
        work()
        best = min(best, time.process_time() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--provider", help="the binary to hash (default: the AWS provider in the plugin cache)")
    args = ap.parse_args()
    provider = args.provider or _provider()
    parts = []
    if provider:
        size = os.path.getsize(provider) / 1e6
        parts.append("sha256 of the AWS provider (%.0f MB) %.2f s" % (size, _best(lambda: _hash(provider))))
    else:
        parts.append("sha256: no AWS provider binary found")
    parts.append("python workload %.2f s" % _best(_python))
    print("machine speed (CPU seconds, best of 3; lower is faster): " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
