# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The stop before an apply detaches a machine's EBS volumes and destroys it
(plugins/module_utils/csis/apply/stopbeforedetach.py, csis.infra.csis_stop_instances), against
the session's moto server with real boto3: a running instance is stopped and waited for, an
already terminated one and an unknown id are skipped; the module, run by ansible on a root whose
local terraform state records the instances, stops only the machine whose attachments the plan
destroys with it, and in check mode stops nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.stopbeforedetach import stop_machines  # noqa: E402

pytestmark = pytest.mark.integration
ANSIBLE = os.path.join(e2e.VENV_BIN, "ansible")
UNKNOWN = "i-0123456789abcdef0"


def _launch(moto_endpoint, count=1):
    ec2 = moto_endpoint.client("ec2")
    ami = moto_endpoint.amis[sorted(moto_endpoint.amis)[0]]
    out = ec2.run_instances(ImageId=ami, InstanceType="t3.micro", MinCount=count, MaxCount=count,
                            SubnetId=moto_endpoint.subnet_ids["private-a"])["Instances"]
    return ec2, [i["InstanceId"] for i in out]


def _state_of(ec2, iid):
    return ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]


def _machine(name, iid):
    return {"address": "module.instance_%s" % name, "name": name, "instance_id": iid, "attachments": []}


def test_a_running_machine_is_stopped_and_a_terminated_or_unknown_one_skipped(moto_endpoint, monkeypatch):
    for key, value in moto_endpoint.env.items():
        monkeypatch.setenv(key, value)
    ec2, (running, gone) = _launch(moto_endpoint, 2)
    try:
        ec2.terminate_instances(InstanceIds=[gone])
        access = {"region": moto_endpoint.region, "endpoints": {"ec2": moto_endpoint.url}}
        res = stop_machines([_machine("web", running), _machine("old", gone), _machine("ghost", UNKNOWN)],
                            access, timeout=60, interval=1)
        assert [(m["name"], m["state"]) for m in res["stopped"]] == [("web", "stopped")]
        assert {m["name"]: m["reason"] for m in res["skipped"]} == {
            "old": "already terminated", "ghost": "EC2 does not know it (not found)"}
        assert _state_of(ec2, running) == "stopped"

        # stopped now: a second run skips it and calls no StopInstances
        again = stop_machines([_machine("web", running)], access, timeout=60, interval=1)
        assert again["stopped"] == [] and [m["reason"] for m in again["skipped"]] == ["already stopped"]
    finally:
        ec2.terminate_instances(InstanceIds=[running])


def _root(tmp_path, moto_endpoint, ids):
    """A rendered root as csis_render gives it, whose local terraform state records ``ids``
    ({module: instance id}) and the web machine's attachment."""
    d = tmp_path / "root"
    (d / ".terraform").mkdir(parents=True)
    (d / ".terraform" / "terraform.tfstate").write_text(json.dumps(
        {"version": 3, "backend": {"type": "local", "config": {"path": None, "workspace_dir": None}}}), encoding="utf-8")
    res = []
    for module, iid in ids.items():
        res.append({"mode": "managed", "module": module, "type": "aws_instance", "name": "this",
                    "instances": [{"attributes": {"id": iid}}]})
    res.append({"mode": "managed", "module": "module.instance_web", "type": "aws_volume_attachment", "name": "this",
                "instances": [{"index_key": "mnt_data", "attributes": {"id": "vai-1", "instance_id": ids["module.instance_web"]}}]})
    (d / "terraform.tfstate").write_text(json.dumps({"version": 4, "serial": 1, "resources": res}), encoding="utf-8")
    return {"key": "instance-aws-east2", "directory": str(d), "binary_path": "terraform", "secrets": {},
            "aws": {"region": moto_endpoint.region, "endpoints": {"ec2": moto_endpoint.url}},
            "instances": {"web": {"label": "web", "address": "module.instance_web"},
                          "plain": {"label": "plain", "address": "module.instance_plain"}}}


def _module(moto_endpoint, args, check=False):
    env = dict(os.environ, **moto_endpoint.env)
    env["ANSIBLE_CONFIG"] = os.path.join(e2e.REPO, "ansible.cfg")
    env["ANSIBLE_LOAD_CALLBACK_PLUGINS"] = "1"
    env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.builtin.json"
    argv = [ANSIBLE, "localhost", "-m", "csis.infra.csis_stop_instances", "-a", json.dumps(args)] + (["--check"] if check else [])
    res = subprocess.run(argv, cwd=e2e.REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    doc = json.JSONDecoder().raw_decode(res.stdout[res.stdout.index("{"):])[0]
    return doc["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_the_module_stops_only_the_machine_whose_attachments_the_plan_destroys(tmp_path, moto_endpoint):
    ec2, (web, plain) = _launch(moto_endpoint, 2)
    try:
        root = _root(tmp_path, moto_endpoint, {"module.instance_web": web, "module.instance_plain": plain})
        # web is decommissioned with its volume attachment; plain (no EBS) is destroyed alone
        addresses = {"create": [], "update": [], "replace": [], "forget": [],
                     "delete": ['module.instance_web.aws_volume_attachment.this["mnt_data"]',
                                "module.instance_web.aws_instance.this", "module.instance_plain.aws_instance.this"]}
        args = {"root": root, "addresses": addresses, "timeout": 60}

        checked = _module(moto_endpoint, args, check=True)
        assert checked["changed"] is True and checked["stopped"] == []
        assert [m["instance_id"] for m in checked["would_stop"]] == [web]
        assert "would stop web (%s)" % web in checked["msg"]
        assert _state_of(ec2, web) == "running"

        done = _module(moto_endpoint, args)
        assert done["changed"] is True, done
        assert [(m["name"], m["instance_id"], m["state"]) for m in done["stopped"]] == [("web", web, "stopped")]
        assert [m["name"] for m in done["machines"]] == ["web"]
        assert done["msg"] == "stopped web (%s) before the apply detaches their volumes" % web
        assert _state_of(ec2, web) == "stopped" and _state_of(ec2, plain) == "running"

        # a plan that destroys no machine with its attachments: nothing to stop, not changed
        none = _module(moto_endpoint, dict(args, addresses={"delete": ["module.instance_plain.aws_instance.this"], "replace": []}))
        assert none["changed"] is False and none["machines"] == [] and none["msg"].startswith("nothing to stop")
    finally:
        ec2.terminate_instances(InstanceIds=[web, plain])
