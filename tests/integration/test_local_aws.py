# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""scripts/local-aws end to end, in a private state directory (never the demo's)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "local-aws")


def run(state_dir, *args, ok=(0,)):
    proc = subprocess.run([sys.executable, SCRIPT, "--state-dir", str(state_dir), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in ok, proc.stdout + proc.stderr
    return proc


def test_start_seed_reuse_stop(tmp_path):
    state = tmp_path / "aws"
    run(state, "status", ok=(1,))
    try:
        run(state, "start")
        first = json.loads((state / "endpoint.json").read_text())
        assert first["url"] == "http://127.0.0.1:%d" % first["port"]
        run(state, "start")  # idempotent: the recorded live server is reused
        assert json.loads((state / "endpoint.json").read_text()) == first
        assert json.loads(run(state, "status").stdout) == first

        seeded = json.loads(run(state, "seed").stdout)
        again = json.loads(run(state, "seed").stdout)
        assert again == seeded, "seed finds what it created"

        overlay = yaml.safe_load((state / "overlay.yml").read_text())
        (rb,) = overlay["runtime_builders"]
        assert rb["name"] == "aws-east2-runtime" and rb["endpoints"] == {"url": first["url"]}
        net = rb["networking"]
        assert net["network"] == seeded["vpc_id"]
        assert net["default_subnet_id"] == seeded["subnet_ids"]["private-a"]
        assert net["default_availability_zone"] == "us-east-2a"
        assert net["ssh_ingress_security_group_ids"] == [seeded["security_groups"]["ssh_relay"]]
        assert net["addl_security_groups"] == [seeded["security_groups"]["addl"]]
        assert [(s["name"], s["availability_zone"], s["public"]) for s in net["subnets"]] == [
            ("private-a", "us-east-2a", False), ("private-b", "us-east-2b", False), ("public-a", "us-east-2a", True)]
        assert overlay["state_backends"] == [{"name": "s3-east2", "endpoints": {"url": first["url"]}}]
        assert sorted(seeded["amis"]) == ["imgfile-basic-dask-pckr-ebs-ans-20261101",
                                          "imgfile-basic-dask-pckr-ebs-ans-20261115",
                                          "imgfile-basic-pckr-ebs-ans-20261101"]

        env_sh = run(state, "env").stdout
        assert "export CSIS_AWS_ENDPOINT_URL='%s'" % first["url"] in env_sh
        assert "export AWS_DEFAULT_REGION='us-east-2'" in env_sh

        reset = run(state, "reset").stdout
        assert "re-seeded" in reset
        assert json.loads((state / "seed.json").read_text())["vpc_id"] != seeded["vpc_id"]
    finally:
        run(state, "stop")
    assert not (state / "endpoint.json").exists()
    run(state, "status", ok=(1,))
