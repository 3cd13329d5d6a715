# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Gate on large plans: time csis.infra's gate evaluation over synthetic plan JSON.

    .venv/bin/python benchmarks/gate_large_plan.py [--sizes 1000,10000,100000]

Each plan mixes creates, in-place updates, replacements (both orders), deletes, reads
and for_each/count addresses under nested modules; half the destroys are whitelisted by
a module-prefix entry (so the segment matcher does real work). Prints wall time for
JSON decoding and for the evaluation itself. No thresholds: numbers are for reading.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), ".venv", "collections"))

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.plan_verdict import evaluate_plan  # noqa: E402

ACTIONS = [["create"], ["update"], ["delete", "create"], ["create", "delete"], ["delete"], ["read"], ["no-op"]]


def synthetic_plan(n: int) -> dict:
    changes = []
    for i in range(n):
        mod = "module.instance_n%d" % (i % 500)
        if i % 3 == 0:
            addr = '%s.aws_volume_attachment.this["data.%d"]' % (mod, i)
        elif i % 3 == 1:
            addr = "%s.module.inner[%d].aws_instance.this" % (mod, i)
        else:
            addr = "%s.aws_security_group.sg_%d" % (mod, i)
        changes.append({"address": addr, "mode": "managed", "type": "aws_instance", "name": "this",
                        "change": {"actions": ACTIONS[i % len(ACTIONS)], "before": {}, "after": {}}})
    return {"format_version": "1.2", "resource_changes": changes}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000")
    args = ap.parse_args()
    allow = ["module.instance_n%d" % k for k in range(0, 500, 2)]
    print("%10s %12s %12s %10s %10s" % ("changes", "decode (s)", "gate (s)", "destroys", "refused"))
    for n in [int(x) for x in args.sizes.split(",")]:
        text = json.dumps(synthetic_plan(n))
        t0 = time.perf_counter()
        plan = json.loads(text)
        t1 = time.perf_counter()
        verdict = evaluate_plan(plan, allow)
        t2 = time.perf_counter()
        destroys = verdict.destroys if hasattr(verdict, "destroys") else -1
        print("%10d %12.3f %12.3f %10d %10d" % (n, t1 - t0, t2 - t1, destroys, len(getattr(verdict, "violations", []))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
