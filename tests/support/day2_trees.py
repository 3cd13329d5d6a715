# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Small configuration trees for the day-2 integration tests (tests/integration/test_day2_*.py).

Each tree is a copy of ``examples/`` with its own ``id`` (so its ``csis_config`` tag), its own
state key and bucket names, and only the storages/instances a test needs, so that a
lifecycle run plans one or two small roots (the machines have 2 shared cores).
"""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Dict, Iterable, List, Optional

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = os.path.join(REPO, ".venv", "bin", "ansible-playbook")


def make_tree(dest: str, tag: str, storages: List[Dict[str, Any]], instances: List[Dict[str, Any]],
              images: Optional[List[Dict[str, Any]]] = None, runtime_patch: Optional[Dict[str, Any]] = None) -> str:
    src = os.path.join(REPO, "examples")
    root = os.path.join(dest, "examples")
    from trees import copy_as_shipped, replace_text

    copy_as_shipped(src, root)
    for rel, old, new in (("cfg/_config.yml", "id: csis-example", "id: %s" % tag),
                          ("cfg/state-backends.yml", "statefiles/csis-example", "statefiles/%s" % tag),
                          ("cfg/storage-builders.yml", "csis-example-default-bucket", "%s-default" % tag)):
        replace_text(os.path.join(root, rel), old, new)
    write_yaml(root, "storages/storage0.yaml", {"storages": storages})
    write_yaml(root, "instances/instances.yaml", {"instances": instances})
    if images is not None:
        write_yaml(root, "images/images.yaml", {"images": images})
    if runtime_patch:
        path = os.path.join(root, "cfg/runtime-builders.yml")
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
        data["runtime_builders"][0].update(runtime_patch)
        write_yaml(root, "cfg/runtime-builders.yml", data)
    return root


def write_yaml(root: str, rel: str, data: Any) -> None:
    with open(os.path.join(root, rel), "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)


def read_yaml(root: str, rel: str) -> Any:
    with open(os.path.join(root, rel), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def meta(root: str, name: str) -> Dict[str, Any]:
    from trees import read_meta

    return read_meta(root, name)


def meta_bytes(root: str) -> Dict[str, bytes]:
    from trees import meta_files

    return meta_files(root)


class Runner:
    """ansible-playbook from the repository against one tree and the session's moto server."""

    def __init__(self, root: str, moto: Any) -> None:
        self.root = root
        self.moto = moto
        self.env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                        ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
        for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
            self.env.pop(key, None)
        self.env.update(moto.env)
        self.env["AWS_EC2_METADATA_DISABLED"] = "true"

    def play(self, playbook: str, overlays: Iterable[str] = ("overlays/apply-all.yml",), real: bool = True,
             args: Iterable[str] = (), **extra: Any) -> subprocess.CompletedProcess:
        xv: Dict[str, Any] = {"csis_config_root": self.root,
                              "csis_overlays": [self.moto.overlay_path] + list(overlays),
                              "csis_dry_run": not real, "csis_auto_approve": True}
        xv.update(extra)
        return subprocess.run([PLAYBOOK, os.path.join("playbooks", playbook), "-e", json.dumps(xv)] + list(args),
                              cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=3600, check=False)


def text(res: subprocess.CompletedProcess) -> str:
    """stdout + stderr with whitespace collapsed (the callback wraps long messages)."""
    return " ".join((res.stdout + res.stderr).split())


def tail(res: subprocess.CompletedProcess, n: int = 6000) -> str:
    return res.stdout[-n:] + res.stderr[-2000:]


def register_ami(moto: Any, name: str) -> str:
    """A self-owned AMI named ``name`` (CreateImage from a short-lived instance of a seeded
    build, so it carries architecture/virtualization like a real bake). moto keeps
    CreationDate to the second: callers registering a newer head wait a second first."""
    import time

    ec2 = moto.client("ec2")
    src = sorted(moto.amis.values())[0]
    subnet = moto.subnet_ids["private-a"]
    iid = ec2.run_instances(ImageId=src, InstanceType="t3.micro", MinCount=1, MaxCount=1, SubnetId=subnet)["Instances"][0]["InstanceId"]
    try:
        ami = ec2.create_image(InstanceId=iid, Name=name, Description="day2 test build %s" % name)["ImageId"]
    finally:
        ec2.terminate_instances(InstanceIds=[iid])
    time.sleep(1.1)
    return ami
