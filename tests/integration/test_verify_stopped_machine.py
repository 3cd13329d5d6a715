# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A machine its operator stopped is not a failed verification (the reference manual:
``verify <name>: SKIPPED -- the machine is stopped ...`` records nothing).

Real ansible (the module run as a task), real boto3 against the session's moto endpoint: an
instance launched and stopped there, recorded in meta-state as ``test2``'s. The machine could not
be reached (the ``error`` the playbooks pass when the on-machine check got no answer): stopped, the
task is skipped with the SKIPPED warning and ``verifications.yaml`` is not written; running, the
same unreachable machine is a failed verdict, recorded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState  # noqa: E402

pytestmark = pytest.mark.integration
ANSIBLE = os.path.join(e2e.VENV_BIN, "ansible")


def _verify(root: str, moto_endpoint, instance_id: str) -> subprocess.CompletedProcess:
    args = {"config_root": root, "instance": "test2", "error": "ssm: the machine did not answer",
            "aws": {"region": "us-east-2", "endpoints": {"ec2": moto_endpoint.url}},
            "expected_build": moto_endpoint.amis[sorted(moto_endpoint.amis)[0]], "run_id": "r2",
            "fail_on_failure": True}
    env = dict(os.environ, **moto_endpoint.env)
    env["ANSIBLE_CONFIG"] = os.path.join(e2e.REPO, "ansible.cfg")
    env["ANSIBLE_LOAD_CALLBACK_PLUGINS"] = "1"
    env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.builtin.json"
    return subprocess.run([ANSIBLE, "localhost", "-m", "csis.infra.csis_record_verification", "-a", json.dumps(args)],
                          cwd=e2e.REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_stopped_machine_is_skipped_and_nothing_is_recorded(tmp_path, moto_endpoint):
    ec2 = moto_endpoint.client("ec2")
    ami = moto_endpoint.amis[sorted(moto_endpoint.amis)[0]]
    iid = ec2.run_instances(ImageId=ami, InstanceType="t3.micro", MinCount=1, MaxCount=1,
                            SubnetId=moto_endpoint.subnet_ids["private-a"])["Instances"][0]["InstanceId"]
    try:
        ec2.stop_instances(InstanceIds=[iid])
        root = e2e.copy_example_tree(str(tmp_path))
        with MetaState(root).transaction("test: test2 launched, then stopped by its operator") as txn:
            txn.save("launch-params.yaml", {"instances": {"test2": {
                "image": "imgfile-basic-dask", "build": ami, "group": "coops", "machine_type": "t3.micro",
                "runtime": "aws-east2-runtime", "builder": "open-tofu", "region": "us-east-2", "hostname": "test2-001",
                "ephemeral": False, "launched": True, "launched_run": "r1", "tags": {}, "identity_type": "posix",
                "session": "ssm", "mounts": []}}})
            txn.save("instance-state.yaml", {"instances": {"test2": {
                "generation": {"durable": 1, "ephemeral": 0}, "history": [],
                "current": {"number": 1, "kind": "durable", "instance_id": iid, "ami_id": ami,
                            "opened_run": "r1", "opened_at": "2026-12-05T00:00:00Z"}}}})

        stopped = _verify(root, moto_endpoint, iid)
        assert stopped.returncode == 0, stopped.stdout[-3000:] + stopped.stderr[-2000:]
        # the json callback's document (ansible.cfg's task timing prints lines around it)
        doc = json.JSONDecoder().raw_decode(stopped.stdout[stopped.stdout.index("{"):])[0]
        result = doc["plays"][0]["tasks"][0]["hosts"]["localhost"]
        line = "verify test2: SKIPPED -- the machine is stopped (EC2 says %s is stopped); nothing recorded" % iid
        assert result["skipped"] is True and result["ok"] is None and result["msg"].startswith(line), result
        assert any(line in w for w in result.get("warnings") or []), result
        assert MetaState(root).load("verifications.yaml").get("verifications") in (None, [])

        # running, the same unreachable machine is a failed verification, recorded
        ec2.start_instances(InstanceIds=[iid])
        running = _verify(root, moto_endpoint, iid)
        assert running.returncode != 0
        (verdict,) = MetaState(root).load("verifications.yaml")["verifications"]
        assert verdict["ok"] is False and verdict["instance"] == "test2"
        assert any(c["name"] == "reach the machine" and not c["ok"] for c in verdict["checks"]), verdict
    finally:
        ec2.terminate_instances(InstanceIds=[iid])
