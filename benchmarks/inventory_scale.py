# -*- coding: utf-8 -*-
"""Scale benchmark of the csis.infra.meta_state inventory plugin.

Generates meta-state for N launched instances (default 10,000) in a temporary
configuration root (the local store: one file per record), then times:

* writing that meta-state through one ``MetaState`` transaction;
* a transaction recording one instance (its launch-params and instance-state records,
  ``save_record``; target < 100 ms), and the same through the whole-file API (``load``/``save``);
* what an apply's record step does for a one-instance root in that fleet
  (``record.record_instance_root`` given the root's terraform state as data): the instance
  standing as recorded, and a new instance launched (its pin bound, its storage's read-model
  record updated); the fleet has its pins and its storages' read-model, as a real one has;
* the pure library load (``metastate.launched_instances``) in a fresh ``MetaState`` (the
  reader cache warm, as after any earlier read), and with no reader cache at all;
* ``ansible-inventory --list`` without cache (cold);
* ``ansible-inventory --list`` with the jsonfile cache: the call that fills it and a
  warm call served from it;
* ``ansible-inventory --graph`` (the plugin's parse, without the CLI's per-host variables and
  JSON), and ``--list`` of the same host names from an INI file with no variables (what
  ansible-core itself costs at that many hosts, whatever the plugin);
* validate of a generated N-instance tree (``benchmarks/render_scale.py``'s tree: each
  instance with its own EBS volume and a shared EFS) with matching meta-state (every instance
  launched, every storage active): ``config.validate.load_and_validate`` in-process, and the
  ``playbooks/validate.yml`` playbook.

Prints a small table (best and median wall time of ``--repeat`` runs, the best
CPU time, which is less sensitive to a busy machine, and the target of issue 10 where
there is one). No thresholds are asserted.

    .venv/bin/python benchmarks/inventory_scale.py [--count 10000] [--repeat 3] [--keep] [--no-validate]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
sys.path.insert(0, str(ROOT / ".venv" / "collections"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.launch import compute_launch_params  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.state import record  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import (  # noqa: E402
    MetaState, dumps, launched_instances)
from render_scale import make_tree  # noqa: E402  (the render benchmark's N-instance tree)

GROUPS = ["team", "ops", "data", "web", "batch"]
IMAGES = ["base", "ubuntu-22.04", "gpu", "db"]


def generate(count: int) -> Tuple[Dict, Dict]:
    params, states = {}, {}
    for i in range(count):
        name = "node%05d" % i
        ephemeral = i % 10 == 0
        params[name] = {
            "image": IMAGES[i % len(IMAGES)], "build": "ami-%017x" % (i % 50),
            "machine_type": "t3.medium", "group": GROUPS[i % len(GROUPS)], "runtime": "aws",
            "builder": "aws-ec2", "region": "us-east-1",
            "mounts": [{"storage": "data%d" % (i % 7), "type": "ebs", "builder": "aws-ebs",
                        "mount_point": "/mnt/data", "group": GROUPS[i % len(GROUPS)],
                        "share_mode": "2770", "public_read": False, "device": "/dev/xvdf"}],
            "hostname": "%s-%03d" % (name, 1 + i % 3), "ephemeral": ephemeral,
            "tags": {"Owner": GROUPS[i % len(GROUPS)], "Env": "bench"},
            "launched": True, "launched_run": "bench_run",
        }
        if i % 4 == 0:
            params[name]["alias"] = "alias%05d" % i
        states[name] = {
            "generation": {"durable": 0 if ephemeral else 1, "ephemeral": 1 if ephemeral else 0},
            "current": {"number": 1, "kind": "ephemeral" if ephemeral else "durable",
                        "instance_id": "i-%017x" % i, "private_ip": "10.%d.%d.%d" % (i >> 16, (i >> 8) & 255, i & 255),
                        "ami_id": "ami-%017x" % (i % 50), "availability_zone": "us-east-1a",
                        "opened_run": "bench_run", "opened_at": "2026-11-29T06:13:54Z"},
            "history": [],
        }
    return {"instances": params}, {"instances": states}


def write_records(ms: MetaState, name: str, top: str, records: Dict) -> None:
    """Records written as the store lays them out (one file each), without a transaction: its
    per-file fsync makes tens of thousands of records take many minutes on a busy disk (the
    store's reads check every file as usual)."""
    for key, rec in records.items():
        path = ms.record_path(name, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(dumps({top: {key: rec}}))


def fleet_rest(ms: MetaState, params: Dict) -> None:
    """The pins of the durable instances and the storages they mount (with their read-model),
    as a fleet that real applies recorded holds them."""
    write_records(ms, "pins.yaml", "instances", {n: r["build"] for n, r in params.items() if not r["ephemeral"]})
    storages = {"data%d" % i: {"state": "active", "generation": 1, "history": [],
                               "facts": {"builder": "aws-ebs", "type": "ebs", "volume_id": "vol-%017x" % i}}
                for i in range(7)}
    write_records(ms, "storage-state.yaml", "storages", storages)
    write_records(ms, "storage.yaml", "storages", {
        name: record.storage_model(rec, [n for n, r in params.items() if record.mounted_storages(r) == {name}])
        for name, rec in storages.items()})


def applied_root(name: str, params: Dict, iid: str, ami: str) -> Tuple[Dict, Dict]:
    """(the root item, its terraform state) of a one-instance instance root after its apply."""
    launch = {k: v for k, v in params.items() if k not in ("build", "hostname", "launched", "launched_run")}
    root = {"lifecycle": "instance-image", "builder": "aws-ec2",
            "instances": {name: {"address": "module.inst_%s" % name, "launch_params": launch,
                                 "ephemeral": params.get("ephemeral")}}}
    state = {"resources": [{"mode": "managed", "module": "module.inst_%s" % name, "type": "aws_instance",
                            "name": "this", "instances": [{"attributes": {
                                "id": iid, "ami": ami, "private_ip": "10.200.0.1", "availability_zone": "us-east-1a",
                                "instance_type": "t3.medium"}}]}]}
    return root, state


def validate_meta_state(root: str, count: int) -> None:
    """Meta-state matching ``render_scale.make_tree(count)``: every instance launched (its launch
    parameters computed from the tree, as the recorder does) with its open generation, every
    storage active."""
    tree = load_and_validate(root)[0]
    params, states, storages = {}, {}, {}
    for i, (name, inst) in enumerate(sorted(tree.instances.items())):
        params[name] = dict(compute_launch_params(tree, {}, inst), launched=True, launched_run="bench_run")
        states[name] = {"generation": {"durable": 1, "ephemeral": 0}, "history": [], "current": {
            "number": 1, "kind": "durable", "instance_id": "i-%017x" % i, "private_ip": "10.1.%d.%d" % (i >> 8, i & 255),
            "ami_id": "ami-%017x" % 1, "availability_zone": "us-east-2a", "opened_run": "bench_run",
            "opened_at": "2026-11-29T06:13:54Z"}}
    for i, name in enumerate(sorted(tree.storages)):
        kind = tree.kind_of(tree.storage_builder_for(tree.storages[name]))["capability"]
        facts = {"builder": tree.storages[name].type, "type": kind}
        facts.update({"ebs": {"volume_id": "vol-%017x" % i, "availability_zone": "us-east-2a", "size": 50},
                      "efs": {"file_system_id": "fs-%017x" % i}, "s3": {"bucket_name": name}}.get(kind, {}))
        storages[name] = {"state": "active", "generation": 1, "history": [], "facts": facts}
    assert len(params) == count
    # storage.yaml, the read-model, is left out: validate does not use it
    ms = MetaState(root)
    for name, top, records in (("launch-params.yaml", "instances", params), ("instance-state.yaml", "instances", states),
                               ("storage-state.yaml", "storages", storages)):
        write_records(ms, name, top, records)


#: issue 10's targets at 10,000 launched instances
TARGETS = {
    "1-instance transaction (save_record)": "< 0.100s",
    "record an applied 1-instance root: standing": "< 0.100s",
    "record an applied 1-instance root: new launch": "< 0.100s",
    "ansible-inventory --list (no cache)": "< 1.5s",
    "validate: load_and_validate()": "< 5s",
    "validate: playbooks/validate.yml": "< 5s",
}


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], object], repeat: int) -> List[Tuple[float, float]]:
    """(wall seconds, CPU seconds of this process and its children) per run."""
    out = []
    for _run in range(repeat):
        start, cpu = time.perf_counter(), _cpu()
        fn()
        out.append((time.perf_counter() - start, _cpu() - cpu))
    return out


def ansible_inventory(source: Path, *args: str) -> Callable[[], None]:
    """One ``ansible-inventory -i source`` call: ``--list`` unless ``args`` name ``--graph``."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    action = [] if "--graph" in args else ["--list"]

    def run() -> None:
        proc = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(source), *action, *args],
                              cwd=str(ROOT), env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit("ansible-inventory failed:\n" + proc.stderr)
        if action:
            run.hosts = len(json.loads(proc.stdout)["_meta"]["hostvars"])  # type: ignore[attr-defined]
        else:
            run.hosts = proc.stdout.count("|--node")  # type: ignore[attr-defined]
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--count", type=int, default=10000, help="launched instances (default 10000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the generated tree and print its path")
    parser.add_argument("--no-validate", action="store_true", help="leave out the validate rows (their tree takes a minute to write)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="csis-inv-bench-"))
    os.environ["CSIS_META_STATE_CACHE"] = str(work / "reader-cache")
    os.environ["CSIS_CONFIG_CACHE"] = str(work / "config-cache")  # (filled by the tree's own first validate)
    try:
        root = work / "config"
        lp, st = generate(args.count)
        ms = MetaState(str(root))

        def write() -> None:
            with ms.transaction("benchmarks/inventory_scale.py") as txn:
                txn.save("launch-params.yaml", lp)
                txn.save("instance-state.yaml", st)
        rows: List[Tuple[str, List[Tuple[float, float]]]] = [("write meta-state (1 transaction)", timed(write, 1))]
        sizes = {n: sum(os.path.getsize(os.path.join(d, f)) for d, _s, fs in os.walk(str(root / "meta-state" / n[:-5]))
                        for f in fs) for n in ("launch-params.yaml", "instance-state.yaml")}
        counter = {"i": 0}

        def one_record() -> None:
            counter["i"] += 1
            name = "node%05d" % (counter["i"] % args.count)
            with MetaState(str(root)).transaction("record one instance") as txn:
                rec = txn.load_record("instance-state.yaml", name)
                rec["current"]["opened_run"] = "bench_%d" % counter["i"]
                txn.save_record("instance-state.yaml", name, rec)
                params = txn.load_record("launch-params.yaml", name)
                params["launched_run"] = "bench_%d" % counter["i"]
                txn.save_record("launch-params.yaml", name, params)
        rows.append(("1-instance transaction (save_record)", timed(one_record, args.repeat)))

        def one_whole() -> None:
            counter["i"] += 1
            name = "node%05d" % (counter["i"] % args.count)
            with MetaState(str(root)).transaction("record one instance, whole-file API") as txn:
                data = txn.load("instance-state.yaml")
                data["instances"][name]["current"]["opened_run"] = "bench_%d" % counter["i"]
                txn.save("instance-state.yaml", data)
        rows.append(("1-instance transaction (load/save file)", timed(one_whole, args.repeat)))

        fleet_rest(ms, lp["instances"])
        launched_instances(MetaState(str(root)))  # the reader cache, as after any earlier read

        def standing() -> None:
            counter["i"] += 1
            name = "node%05d" % (1 + 10 * (counter["i"] % (args.count // 10)))  # a durable one
            item, state = applied_root(name, lp["instances"][name], st["instances"][name]["current"]["instance_id"],
                                       lp["instances"][name]["build"])
            got = record.record_instance_root(MetaState(str(root)), item, state, "bench_%d" % counter["i"])
            assert got[name] == "standing", got
        rows.append(("record an applied 1-instance root: standing", timed(standing, args.repeat)))

        def new_launch() -> None:
            counter["i"] += 1
            name = "new%05d" % counter["i"]
            params = dict(lp["instances"]["node00001"], alias=None)
            params.pop("alias")
            item, state = applied_root(name, params, "i-new%05d" % counter["i"], "ami-%017x" % 7)
            got = record.record_instance_root(MetaState(str(root)), item, state, "bench_%d" % counter["i"])
            assert got[name] == "launched" and "pins.yaml" in got["_written"], got

        loaded = {}

        def load() -> None:
            loaded["n"] = len(launched_instances(MetaState(str(root))))
        rows.append(("library: launched_instances()", timed(load, args.repeat)))

        def load_cold() -> None:
            shutil.rmtree(str(work / "reader-cache"), ignore_errors=True)
            os.environ["CSIS_META_STATE_CACHE"] = str(work / ("no-cache-%d" % counter["i"]))
            counter["i"] += 1
            launched_instances(MetaState(str(root)))
            os.environ["CSIS_META_STATE_CACHE"] = str(work / "reader-cache")
        rows.append(("library: launched_instances(), no cache", timed(load_cold, 1)))
        load()  # the reader cache for the inventory runs below

        plain = work / "plain.csis.yml"
        plain.write_text("plugin: csis.infra.meta_state\nconfig_root: config\n")
        cached = work / "cached.csis.yml"
        cached.write_text("plugin: csis.infra.meta_state\nconfig_root: config\ncache: true\n"
                          "cache_plugin: ansible.builtin.jsonfile\ncache_connection: %s\n"
                          "cache_timeout: 3600\n" % (work / "cache"))
        cold = ansible_inventory(plain)
        rows.append(("ansible-inventory --list (no cache)", timed(cold, args.repeat)))
        fill = ansible_inventory(cached, "--flush-cache")
        rows.append(("ansible-inventory --list (cache: fill)", timed(fill, args.repeat)))
        warm = ansible_inventory(cached)
        rows.append(("ansible-inventory --list (cache: warm)", timed(warm, args.repeat)))
        empty = work / "empty.csis.yml"
        empty.write_text("plugin: csis.infra.meta_state\nconfig_root: nothing-here\n")
        rows.append(("ansible-inventory --list (0 hosts, baseline)", timed(ansible_inventory(empty), args.repeat)))
        graph = ansible_inventory(plain, "--graph")
        rows.append(("ansible-inventory --graph (no cache)", timed(graph, args.repeat)))
        ini = work / "names.ini"
        ini.write_text("".join("node%05d\n" % i for i in range(args.count)))
        rows.append(("ansible-inventory --list (INI, no vars: core's floor)", timed(ansible_inventory(ini), args.repeat)))
        # after the inventory rows: it launches instances the rows above would count
        rows.append(("record an applied 1-instance root: new launch", timed(new_launch, args.repeat)))

        if not args.no_validate:
            tree = make_tree(str(work), args.count)
            validate_meta_state(tree, args.count)
            validated = {}

            def validate() -> None:
                validated["tree"] = load_and_validate(tree)[0]
            rows.append(("validate: load_and_validate(), no reader cache", timed(validate, 1)))
            rows.append(("validate: load_and_validate()", timed(validate, args.repeat)))
            assert len(validated["tree"].instances) == args.count

            def playbook() -> None:
                env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
                proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), str(ROOT / "playbooks" / "validate.yml"),
                                       "-e", "csis_config_root=%s" % tree], cwd=str(ROOT), env=env,
                                      capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise SystemExit("validate.yml failed:\n" + proc.stdout[-3000:] + proc.stderr[-3000:])
            rows.append(("validate: playbooks/validate.yml", timed(playbook, args.repeat)))

        assert loaded["n"] == args.count and cold.hosts == fill.hosts == warm.hosts == args.count  # type: ignore[attr-defined]
        print("csis.infra.meta_state inventory: %d launched instances (launch-params/ %.1f MB, "
              "instance-state/ %.1f MB, one file per record); python %s" % (
                  args.count, sizes["launch-params.yaml"] / 1e6, sizes["instance-state.yaml"] / 1e6,
                  sys.version.split()[0]))
        width = max(len(r[0]) for r in rows)
        print("%-*s  %9s  %9s  %9s  %4s  %s" % (width, "measurement", "wall best", "wall med", "cpu best", "runs", "target"))
        for label, times in rows:
            walls = [wall for wall, _cpu_s in times]
            cpu_best = min(cpu_s for _wall, cpu_s in times)
            target = TARGETS.get(label, "")
            print("%s  %8.3fs  %8.3fs  %8.3fs  %4d  %s"
                  % (label.ljust(width), min(walls), statistics.median(walls), cpu_best, len(times), target))
        print("(wall times depend on machine load; cpu = user+sys of the process and its children)")
        if args.keep:
            print("tree kept in %s" % work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
