# -*- coding: utf-8 -*-
"""playbooks/verify_instance.yml: durable instances verified where they run, reached
through the csis.infra.meta_state inventory (here with the local connection and a prepared
file-system root standing in for the machine), verdicts recorded in meta-state.

Real ansible-playbook, real inventory plugin, real modules; the booted-AMI check (EC2)
is covered by the ephemeral tests against moto and switched off here.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState  # noqa: E402

pytestmark = pytest.mark.integration
REPO = e2e.REPO
VENV_PY = os.path.join(REPO, ".venv", "bin", "python")


def _launch_test2(root: str) -> None:
    with MetaState(root).transaction("test: a launched test2") as txn:
        txn.save("launch-params.yaml", {"instances": {"test2": {
            "image": "imgfile-basic-dask", "build": "ami-0123456789abcdef0", "group": "coops",
            "machine_type": "t3.medium", "runtime": "aws-east2-runtime", "builder": "open-tofu",
            "region": "us-east-2", "hostname": "test2-001", "ephemeral": False, "launched": True,
            "launched_run": "r1", "tags": {"hype": "test"}, "identity_type": "posix", "session": "ssm",
            "mounts": [{"storage": "mnt_data", "type": "ebs", "builder": "aws-ebs", "mount_point": "/mnt/data",
                        "group": "coops", "share_mode": "2770", "public_read": False, "device": "/dev/xvdf"}]}}})
        txn.save("instance-state.yaml", {"instances": {"test2": {
            "generation": {"durable": 1, "ephemeral": 0}, "history": [],
            "current": {"number": 1, "kind": "durable", "instance_id": "i-0123456789abcdef0",
                        "private_ip": "10.42.1.6", "ami_id": "ami-0123456789abcdef0",
                        "opened_run": "r1", "opened_at": "2026-11-29T00:00:00Z"}}}})


def _machine(fs: str) -> None:
    """A file-system root that looks like test2 after a complete launch."""
    os.makedirs(os.path.join(fs, "var/lib/csis"), exist_ok=True)
    with open(os.path.join(fs, "var/lib/csis/launch-applied"), "w") as fh:
        fh.write("2026-11-29T00:00:00Z\n")
    sub = os.path.join(fs, "mnt/data/coops")
    os.makedirs(sub, exist_ok=True)
    os.chown(sub, -1, 3000)
    os.chmod(sub, 0o2770)
    os.makedirs(os.path.join(fs, "proc"), exist_ok=True)
    with open(os.path.join(fs, "proc/mounts"), "w") as fh:
        fh.write("/dev/nvme1n1 /mnt/data xfs rw,relatime 0 0\n")


def _run(root: str, inventory: str, fs: str, *extra: str) -> subprocess.CompletedProcess:
    argv = [os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", inventory, *extra,
            os.path.join(REPO, "playbooks", "verify_instance.yml"),
            "-e", "csis_config_root=%s" % root, "-e", "ansible_connection=local",
            "-e", "ansible_python_interpreter=%s" % VENV_PY, "-e", "csis_verify_fs_root=%s" % fs,
            "-e", "csis_verify_booted_image=false"]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="chgrp of the group subtree needs root")
def test_verify_durable_instance_through_the_inventory(tmp_path):
    root = e2e.copy_example_tree(str(tmp_path))
    _launch_test2(root)
    inventory = str(tmp_path / "hosts.csis.yml")
    with open(inventory, "w") as fh:
        yaml.safe_dump({"plugin": "csis.infra.meta_state", "config_root": root}, fh)
    fs = str(tmp_path / "machine")
    _machine(fs)

    # the documented form, `--limit test2` (an AWX template's Limit): the render the checks come from
    # runs on the controller within the limited play (it once ran in a play of its own on localhost,
    # which the limit cut out: "test2 is launched but not declared in the tree ... (decommission it)")
    ok = _run(root, inventory, fs, "--diff", "--limit", "test2")
    assert ok.returncode == 0, ok.stdout[-4000:] + ok.stderr[-2000:]
    assert "not declared" not in ok.stdout, ok.stdout[-4000:]
    # the in-memory render is no change of this run, and its files are no diff of a verification
    render = ok.stdout.split("TASK [Render the instance roots in check mode", 1)[1].split("TASK [", 1)[0]
    assert re.search(r"^ok: \[test2 -> localhost\]", render, re.M), render
    assert "instance-generation" not in ok.stdout, ok.stdout[-6000:]
    verdicts = MetaState(root).load("verifications.yaml")["verifications"]
    assert [v["instance"] for v in verdicts] == ["test2"] and verdicts[-1]["ok"] is True
    names = {c["name"] for c in verdicts[-1]["checks"]}
    assert any("marker" in n or "startup" in n for n in names), names
    # nothing but the verdict was written: the render ran in check mode
    assert not os.path.exists(os.path.join(root, "generated"))
    # --check: the same checks, no verdict appended, and the record step says a real run would append one
    check = _run(root, inventory, fs, "--check")
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-2000:]
    assert re.search(r"^test2\s+: ok=\d+\s+changed=1 ", check.stdout, re.M), check.stdout[-3000:]
    assert len(MetaState(root).load("verifications.yaml")["verifications"]) == 1

    # the launch script did not finish (no marker): the host fails and the verdict says why
    os.unlink(os.path.join(fs, "var/lib/csis/launch-applied"))
    bad = _run(root, inventory, fs)
    assert bad.returncode != 0
    verdicts = MetaState(root).load("verifications.yaml")["verifications"]
    assert len(verdicts) == 2 and verdicts[-1]["ok"] is False
    failed = [c for c in verdicts[-1]["checks"] if not c["ok"]]
    assert failed and any("launch-applied" in str(c.get("detail")) for c in failed), failed
