#!/usr/bin/env python
# -*- coding: utf-8 -*-
"""The dry run at N instances through the playbooks, against the reference system.

One set of declarations (default 100 instances, each with its own EBS volume, plus one
shared EFS and one S3 storage), written twice:

* as a csis.infra tree (``render_scale.make_tree``, pointed at this benchmark's own
  seeded moto server), run as ``playbooks/storage.yml`` then ``playbooks/instance_image.yml``
  (the dry run is the default), cold: no ``generated/``;
* as a reference tree (``cs-image-system init-config --from standard-aws-posix``, then the
  same declarations), run as ``cs-image-system run storage instance-image`` (dry by default),
  cold. The reference (``cs-image-system==0.1.1``, Python >= 3.13) is installed into a
  temporary venv with pip; its ``packer``, ``aws`` and ``ansible-playbook`` version checks
  get stubs, its ``tofu`` is terraform, its AWS profile's ``endpoint_url`` is the moto server
  (seeded as ``tests/support/local_aws.py`` seeds it, plus the AlmaLinux base image the
  posix starter queries).

Both use the same terraform, the same provider mirror and plugin cache. Printed: wall and CPU
time (user+sys of the process tree, ``getrusage(RUSAGE_CHILDREN)``) per playbook and per task
(``profile_tasks``), the reference's, the ratios and the target (>= 5x). No thresholds.

Usage: .venv/bin/python benchmarks/dry_run_scale.py [--instances 100] [--reference-venv DIR]
                                                     [--python python3.13] [--no-reference] [--keep DIR]
See benchmarks/README.md ("Dry run at 100 instances, against the reference").
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, ".venv", "collections"))
sys.path.insert(0, REPO)

import yaml  # noqa: E402

from render_scale import make_tree  # noqa: E402  (one tree generator: the render benchmark's)
from tests.support.local_aws import LocalAws  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis import terraform as tf  # noqa: E402

REFERENCE = "cs-image-system==0.1.1"
TARGET = 5.0
BASE_AMI_NAME = "AlmaLinux OS 10.0.20261101 x86_64"  # what the posix starter's base query matches
PLAYBOOKS = ("storage", "instance_image")


def _dump(path: str, data: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed_run(cmd: List[str], env: Dict[str, str], cwd: str, log: str) -> Tuple[float, float, int]:
    """(wall, cpu of the process tree, rc); output to ``log``."""
    cpu0, t0 = _cpu(), time.perf_counter()
    with open(log, "wb") as out:
        rc = subprocess.call(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0, _cpu() - cpu0, rc


# -- the endpoint -----------------------------------------------------------------------------
def seed_base_ami(aws: LocalAws, subnet_id: str) -> str:
    """A self-owned image named like the vendor image the posix starter's base query finds."""
    ec2 = aws.client("ec2")
    found = ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [BASE_AMI_NAME]}])["Images"]
    if found:
        return str(found[0]["ImageId"])
    stock = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])["Images"]
    iid = ec2.run_instances(ImageId=stock[0]["ImageId"], InstanceType="t3.micro", MinCount=1, MaxCount=1,
                            SubnetId=subnet_id)["Instances"][0]["InstanceId"]
    try:
        return str(ec2.create_image(InstanceId=iid, Name=BASE_AMI_NAME)["ImageId"])
    finally:
        ec2.terminate_instances(InstanceIds=[iid])


# -- csis.infra -------------------------------------------------------------------------------
def csis_tree(parent: str, n: int, seeded: Dict[str, Any]) -> str:
    """render_scale's tree, its runtime and state backend pointed at the seeded endpoint."""
    root = make_tree(parent, n)
    sub = [s for s in seeded["subnets"] if not s["public"]]
    _dump(os.path.join(root, "cfg", "runtime-builders.yml"), {"runtime_builders": [{
        "name": "bench-rt", "region": seeded["region"], "session_mechanism": "ssm",
        "session_instance_profile": seeded["instance_profile"]["name"],
        "endpoints": {"url": seeded["url"]},
        "networking": {
            "network": seeded["vpc_id"], "default_subnet_id": sub[0]["subnet_id"],
            "addl_security_groups": [seeded["security_groups"]["addl"]],
            "subnets": [{"subnet_id": s["subnet_id"], "availability_zone": s["availability_zone"]} for s in sub]}}]})
    _dump(os.path.join(root, "cfg", "state-backends.yml"), {"state_backends": [
        {"name": "s3", "type": "s3", "is_default": True, "bucket": seeded["state_bucket"], "key": "bench",
         "region": seeded["region"], "endpoints": {"url": seeded["url"]}},
        {"name": "local", "type": "local", "directory": "state"}]})
    return root


TASK_LINE = re.compile(r"^(?P<task>.+?) -{3,} (?P<secs>[0-9.]+)s$")


def profile_tasks(log: str) -> List[Tuple[str, float]]:
    """The TASKS RECAP lines of ansible.posix.profile_tasks."""
    out: List[Tuple[str, float]] = []
    with open(log, "r", encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    recap = text.split("TASKS RECAP", 1)[-1]
    for line in recap.splitlines():
        m = TASK_LINE.match(line.strip())
        if m:
            out.append((m.group("task").replace("csis.infra.render : ", ""), float(m.group("secs"))))
    return out


def run_csis(root: str, env: Dict[str, str], logs: str) -> Dict[str, Any]:
    res: Dict[str, Any] = {"playbooks": []}
    for pb in PLAYBOOKS:
        log = os.path.join(logs, "csis-%s.log" % pb)
        wall, cpu, rc = timed_run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"),
                                   os.path.join(REPO, "playbooks", pb + ".yml"), "-e", "csis_config_root=" + root],
                                  env, REPO, log)
        if rc != 0:
            raise SystemExit("csis.infra %s.yml failed (rc %d): see %s" % (pb, rc, log))
        res["playbooks"].append({"name": pb + ".yml", "wall": wall, "cpu": cpu, "tasks": profile_tasks(log)})
    res["wall"] = sum(p["wall"] for p in res["playbooks"])
    res["cpu"] = sum(p["cpu"] for p in res["playbooks"])
    return res


# -- the reference ----------------------------------------------------------------------------
def find_python313(given: Optional[str]) -> str:
    cands = [given] if given else []
    cands += ["python3.13", "python3.14"] + sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[3-9]*/bin/python3")))
    for c in cands:
        path = shutil.which(c) if c and "/" not in c else c
        if not path or not os.access(path, os.X_OK):
            continue
        try:
            ok = subprocess.run([path, "-c", "import sys; sys.exit(sys.version_info < (3, 13))"],
                                capture_output=True, check=False).returncode == 0
        except OSError:
            ok = False
        if ok:
            return path
    raise SystemExit("the reference needs Python >= 3.13 (--python PATH); none found")


def install_reference(venv: str, python: str) -> Tuple[str, float]:
    exe = os.path.join(venv, "bin", "cs-image-system")
    if os.path.exists(exe):
        return exe, 0.0
    t0 = time.perf_counter()
    subprocess.check_call([python, "-m", "venv", venv])
    subprocess.check_call([os.path.join(venv, "bin", "pip"), "install", "-q", "--disable-pip-version-check", REFERENCE],
                          stdout=subprocess.DEVNULL)
    return exe, time.perf_counter() - t0


def write_stubs(bindir: str) -> None:
    """Version-check stand-ins: a dry run executes none of these tools, it only checks versions."""
    stubs = {
        "packer": 'echo "1764547200,,version,1.14.2"',
        "aws": 'echo "aws-cli/2.32.0 Python/3.13.0 Linux/6.1 exe/x86_64"',
        "ansible-playbook": 'echo "ansible-playbook [core 2.19.4]"',
    }
    os.makedirs(bindir, exist_ok=True)
    for name, body in stubs.items():
        path = os.path.join(bindir, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("#!/bin/sh\n# benchmark stub: version checks only\n%s\n" % body)
        os.chmod(path, 0o755)


def reference_tree(exe: str, root: str, n: int, seeded: Dict[str, Any], env: Dict[str, str]) -> None:
    subprocess.check_call([exe, "init-config", root, "--from", "standard-aws-posix"], env=env, stdout=subprocess.DEVNULL)
    path = os.path.join(root, "cfg", "_config.yml")
    with open(path, encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh)
    cfg["id"] = "bench-%d" % n
    _dump(path, cfg)
    _dump(os.path.join(root, "cfg", "executables.yml"), {"executables": [
        {"name": "aws-cli", "binary": "aws", "version": ">=2.32"},
        {"name": "packer", "binary": "packer", "version": ">=1.14"},
        {"name": "ansible-playbook", "binary": "ansible-playbook", "version": ">=2.16"},
        {"name": "bash", "binary": "bash", "version": ">=5"},
        {"name": "open-tofu", "type": "tofu", "binary": shutil.which("terraform") or "terraform", "version": ">1,<2"}]})
    sub = [s for s in seeded["subnets"] if not s["public"]]
    sgs = seeded["security_groups"]
    _dump(os.path.join(root, "cfg", "runtime-builders.yml"), {"runtime_builders": [{
        "name": "aws-main", "type": "aws", "is_default": True, "aliases": ["aws"],
        "account_id": str(seeded["account_id"]), "region": seeded["region"],
        "credentials": {"profile_name": "csis-mock"}, "session_mechanism": "ssm",
        "session_instance_profile": seeded["instance_profile"]["name"], "default_machine_type": "t3.medium",
        "default_image_builder": "packer-ebs", "tags": {"Project": "bench"},
        "networking": {"network": seeded["vpc_id"], "ssh_ingress_security_group_ids": [sgs["ssh_relay"]],
                       "addl_security_groups": [sgs["addl"]],
                       "subnets": [{"name": s["name"], "subnet_id": s["subnet_id"], "availability_zone": s["availability_zone"],
                                    "is_default": i == 0} for i, s in enumerate(sub)]}}]})
    _dump(os.path.join(root, "cfg", "state-backends.yml"), {"state_backends": [{
        "name": "s3-main", "type": "s3", "is_default": True, "bucket": seeded["state_bucket"], "key": "statefiles/bench/",
        "region": seeded["region"], "profile": "csis-mock", "encrypt": True, "use_lockfile": True}]})
    _dump(os.path.join(root, "cfg", "storage-builders.yml"), {"storage_builders": [
        {"name": "aws-ebs", "type": "tf-aws-ebs", "is_default": True, "runtime": "aws-main", "executable": "open-tofu",
         "size": 50},
        {"name": "aws-efs", "type": "tf-aws-efs", "runtime": "aws-main", "executable": "open-tofu"},
        {"name": "aws-s3", "type": "tf-aws-s3", "runtime": "aws-main", "executable": "open-tofu",
         "bucket_name": "bench-unused"}]})
    # the base's query: moto reports root_device_type "standard" for every image (the digest, section 0)
    path = os.path.join(root, "cfg", "os-builders.yml")
    with open(path, encoding="utf-8") as fh:
        osb = yaml.safe_load(fh)
    for b in osb["os_builders"]:
        b["storage_types"] = ["ebs", "efs", "s3"]
        for rt in b.get("runtimes", []):
            rt.get("query", {}).get("filters", {}).pop("root_device_type", None)
    _dump(path, osb)
    storages: List[Dict[str, Any]] = [{"name": "vol-%04d" % i, "groups": ["team"], "state": "active"} for i in range(n)]
    storages.append({"name": "shared-efs", "type": "aws-efs", "groups": ["team"], "lifecycle": {"ia_days": 30}})
    storages.append({"name": "bench-objects", "type": "aws-s3", "groups": ["team"], "bucket_name": "bench-objects"})
    _dump(os.path.join(root, "storages", "storages.yaml"), {"storages": storages})
    _dump(os.path.join(root, "instances", "instances.yaml"), {"instances": [
        {"name": "node-%04d" % i, "image": "team-node", "machine_type": "t3.medium", "tags": {"index": str(i)},
         "storages": [{"name": "vol-%04d" % i, "mount_point": "/data"}, {"name": "shared-efs", "mount_point": "/shared"}]}
        for i in range(n)]})


def reference_env(work: str, seeded: Dict[str, Any], base_env: Dict[str, str]) -> Dict[str, str]:
    aws_dir = os.path.join(work, "aws")
    os.makedirs(aws_dir, exist_ok=True)
    with open(os.path.join(aws_dir, "config"), "w", encoding="utf-8") as fh:
        fh.write("[profile csis-mock]\nregion = %s\nendpoint_url = %s\n" % (seeded["region"], seeded["url"]))
    with open(os.path.join(aws_dir, "credentials"), "w", encoding="utf-8") as fh:
        fh.write("[csis-mock]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    env = dict(base_env)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "CSIS_AWS_ENDPOINT_URL"):
        env.pop(k, None)
    env.update({"AWS_CONFIG_FILE": os.path.join(aws_dir, "config"),
                "AWS_SHARED_CREDENTIALS_FILE": os.path.join(aws_dir, "credentials"),
                "PATH": os.path.join(work, "stubs") + os.pathsep + env.get("PATH", "")})
    return env


def run_reference(exe: str, root: str, env: Dict[str, str], logs: str) -> Dict[str, Any]:
    log = os.path.join(logs, "reference.log")
    wall, cpu, rc = timed_run([exe, "--root-dir", root, "run", "storage", "instance-image"], env, root, log)
    if rc != 0:
        raise SystemExit("the reference's dry run failed (rc %d): see %s" % (rc, log))
    return {"wall": wall, "cpu": cpu}


# -- main -------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--instances", type=int, default=100)
    ap.add_argument("--python", help="Python >= 3.13 for the reference's venv (default: found on PATH or pyenv)")
    ap.add_argument("--reference-venv", help="a venv holding %s already (default: a new temporary one)" % REFERENCE)
    ap.add_argument("--no-reference", action="store_true", help="csis.infra only")
    ap.add_argument("--keep", help="work in this directory and keep it (trees, logs)")
    args = ap.parse_args()
    n = args.instances
    work = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="csis-dry-run-bench-")
    os.makedirs(work, exist_ok=True)
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    aws = LocalAws(os.path.join(work, "aws-state"))
    try:
        aws.start(prefer_port=None, tie_to_caller=True)
        seeded = aws.seed()
        seed_base_ami(aws, [s for s in seeded["subnets"] if not s["public"]][0]["subnet_id"])
        base_env = dict(os.environ)
        base_env.update(aws.env())
        base_env["TF_CLI_CONFIG_FILE"] = tf.ensure_cli_config(base_env)  # same mirror and plugin cache for both
        csis_env = dict(base_env, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))

        ref: Optional[Dict[str, Any]] = None
        install = 0.0
        if not args.no_reference:
            venv = os.path.abspath(args.reference_venv) if args.reference_venv else os.path.join(work, "reference-venv")
            exe, install = install_reference(venv, find_python313(args.python))
            write_stubs(os.path.join(work, "stubs"))
            renv = reference_env(work, seeded, base_env)
            rroot = os.path.join(work, "reference-%d" % n)
            reference_tree(exe, rroot, n, seeded, renv)
            ref = run_reference(exe, rroot, renv, logs)
            print("reference: %.1fs wall, %.1fs CPU" % (ref["wall"], ref["cpu"]), file=sys.stderr)
        root = csis_tree(os.path.join(work, "csis"), n, seeded)
        ours = run_csis(root, csis_env, logs)
        print("csis.infra: %.1fs wall, %.1fs CPU" % (ours["wall"], ours["cpu"]), file=sys.stderr)
    finally:
        aws.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print("Dry run at %d instances (each with its own EBS volume, plus one EFS and one S3 storage), cold\n" % n)
    print("| run | wall (s) | CPU, user+sys (s) |")
    print("|---|---:|---:|")
    for p in ours["playbooks"]:
        print("| csis.infra `%s` | %.1f | %.1f |" % (p["name"], p["wall"], p["cpu"]))
    print("| **csis.infra, both playbooks** | **%.1f** | **%.1f** |" % (ours["wall"], ours["cpu"]))
    if ref:
        print("| reference `run storage instance-image` | %.1f | %.1f |" % (ref["wall"], ref["cpu"]))
        print("| **ratio (reference / csis.infra)** | **%.1f×** | **%.1f×** |" % (ref["wall"] / ours["wall"], ref["cpu"] / ours["cpu"]))
        print("| target | ≥ %.0f× | |" % TARGET)
    print("\nPer task (profile_tasks, wall):\n")
    print("| playbook | task | s |")
    print("|---|---|---:|")
    for p in ours["playbooks"]:
        for task, secs in p["tasks"]:
            if secs >= 0.2:
                print("| %s | %s | %.2f |" % (p["name"], task, secs))
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print("\n(%d CPUs, load average %.1f at the end%s)" % (
        os.cpu_count() or 0, load, "; reference installed in %.0fs, not counted" % install if install else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
