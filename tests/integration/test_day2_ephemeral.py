# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Ephemeral instances end to end (real terraform, the session's moto server, real
ansible-playbook): launched with ``count = var.ephemeral_present ? 1 : 0``, verified with
``csis.infra.csis_verify_instance`` (here through the ``local`` connection with a prepared
``fs_root`` standing in for the machine's file system; the booted image is read from EC2),
then torn down by a second plan/gate/apply with ``ephemeral_present=false``.

``on_failure: keep`` leaves a failed machine standing and fails the run; ``teardown``
tears it down and still fails the run; ``teardown_after`` tears a standing failed machine
down without re-verifying once elapsed. Verdicts land in ``meta-state/verifications.yaml``.
The tests run in order on one tree.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest

from day2_trees import Runner, make_tree, meta, tail, text, write_yaml

pytestmark = pytest.mark.integration

TAG = "csis-h8-eph"
RT = "aws-east2-runtime"
PATTERN = "imgfile-basic-pckr-ebs-ans"  # seeded by the session's endpoint


def images():
    return [{"name": "eph-img", "name_pattern": PATTERN, "storage_types": ["ebs", "efs", "s3"], "runtimes": [RT],
             "tests": {"post_bake": ["test -d var/lib/csis"]}}]


def eph(name, **kw):
    d = {"name": name, "image": "eph-img", "ephemeral": True}
    d.update(kw)
    return d


def prepared_root(base, name, marker=True):
    d = os.path.join(base, name)
    os.makedirs(os.path.join(d, "var/lib/csis"), exist_ok=True)
    if marker:
        with open(os.path.join(d, "var/lib/csis/launch-applied"), "w", encoding="utf-8") as fh:
            fh.write("2026-11-29T00:00:00Z\n")
    return d


def host_vars(name, fs_root):
    return {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                   "csis_verify_fs_root": fs_root}}


def verdicts(t, name):
    return [v for v in meta(t.root, "verifications.yaml").get("verifications", []) if v["instance"] == name]


def ec2_states(t, name):
    ec2 = t.moto.client("ec2")
    res = ec2.describe_instances(Filters=[{"Name": "tag:Name", "Values": [name]},
                                          {"Name": "tag:csis_config", "Values": [TAG]}])["Reservations"]
    return sorted(i["State"]["Name"] for r in res for i in r["Instances"])


def running(t, name):
    return [s for s in ec2_states(t, name) if s in ("pending", "running")]


@pytest.fixture(scope="module")
def tree(moto_endpoint, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("day2-ephemeral"))
    root = make_tree(base, TAG, [], [eph("eph-keep")], images=images())
    t = Runner(root, moto_endpoint)
    t.base = base
    return t


def test_a_passing_ephemeral_is_verified_and_torn_down(tree):
    fs = prepared_root(tree.base, "good")
    # at -v, with a password among the connection variables (unused by the local connection): never shown
    password = "sentinel-become-%s" % os.urandom(4).hex()
    tree.env["ANSIBLE_VERBOSITY"] = "1"
    try:
        res = tree.play("instance_image.yml", csis_verify_host_vars=host_vars("eph-keep", fs),
                        csis_verify_defaults={"ansible_become_password": password})
    finally:
        del tree.env["ANSIBLE_VERBOSITY"]
    assert res.returncode == 0, tail(res)
    assert password not in res.stdout + res.stderr
    tf = os.path.join(tree.root, "generated/instance-image/open-tofu/instance-generation/"
                                 "open-tofu-instance-generation-instance-eph_keep.tf")
    with open(tf, encoding="utf-8") as fh:
        assert "count = var.ephemeral_present ? 1 : 0" in " ".join(fh.read().split())
    v = verdicts(tree, "eph-keep")
    assert len(v) == 1 and v[0]["ok"] is True and v[0]["ephemeral"] is True
    names = {c["name"] for c in v[0]["checks"]}
    assert {"startup scripts", "booted image", "test: test -d var/lib/csis"} <= names
    assert running(tree, "eph-keep") == [] and "terminated" in ec2_states(tree, "eph-keep")
    assert "eph-keep" not in meta(tree.root, "launch-params.yaml").get("instances", {})
    ist = meta(tree.root, "instance-state.yaml")["instances"]["eph-keep"]
    assert ist["current"] is None and ist["history"][-1]["why"] == "ephemeral" and ist["generation"]["ephemeral"] == 1
    # the run summary holds both passes: the launch and the teardown
    with open(os.path.join(tree.root, "generated", "run-summary.json"), encoding="utf-8") as fh:
        entry = json.load(fh)["roots"]["instance-image-open-tofu"]
    assert entry["status"] == "ok" and entry["applied"] is True, entry
    assert re.match(r"Plan: [1-9]\d* to add, 0 to change, 0 to destroy[^;]*; teardown: Plan: 0 to add, 0 to change, [1-9]",
                    entry["plan"]), entry["plan"]
    assert {"launch-params.yaml", "instance-state.yaml"} <= set(entry["recorded"]), entry["recorded"]


def test_a_failing_ephemeral_under_keep_stays_standing_and_fails_the_run(tree):
    fs = prepared_root(tree.base, "no-marker", marker=False)
    res = tree.play("instance_image.yml", csis_verify_host_vars=host_vars("eph-keep", fs))
    assert res.returncode != 0
    out = text(res)
    assert "instance eph-keep failed verification: startup scripts: /var/lib/csis/launch-applied is missing" in out
    assert "on_failure: keep" in out
    assert len(running(tree, "eph-keep")) == 1
    lp = meta(tree.root, "launch-params.yaml")["instances"]["eph-keep"]
    assert lp["launched"] is True and lp["hostname"] == "eph-keep-002"
    v = verdicts(tree, "eph-keep")
    assert len(v) == 2 and v[-1]["ok"] is False


def test_teardown_after_elapsed_tears_the_standing_machine_down_without_re_verifying(tree):
    write_yaml(tree.root, "instances/instances.yaml", {"instances": [eph("eph-keep", teardown_after="1s")]})
    time.sleep(1.5)
    fs = prepared_root(tree.base, "no-marker", marker=False)
    res = tree.play("instance_image.yml", csis_verify_host_vars=host_vars("eph-keep", fs))
    assert res.returncode == 0, tail(res)
    assert "teardown_after elapsed since its failed verification; tearing down without re-verifying" in text(res)
    assert len(verdicts(tree, "eph-keep")) == 2  # no new verdict
    assert running(tree, "eph-keep") == []
    assert "eph-keep" not in meta(tree.root, "launch-params.yaml").get("instances", {})


def test_a_failing_ephemeral_under_teardown_is_torn_down_and_fails_the_run(tree):
    write_yaml(tree.root, "instances/instances.yaml", {"instances": [eph("eph-td", on_failure="teardown")]})
    fs = prepared_root(tree.base, "no-marker", marker=False)
    res = tree.play("instance_image.yml", csis_verify_host_vars=host_vars("eph-td", fs))
    assert res.returncode != 0
    out = text(res)
    assert "instance eph-td failed verification: startup scripts" in out and "on_failure: teardown" in out
    assert running(tree, "eph-td") == [] and "terminated" in ec2_states(tree, "eph-td"), tail(res, 20000)
    assert "eph-td" not in meta(tree.root, "launch-params.yaml").get("instances", {})
    v = verdicts(tree, "eph-td")
    assert len(v) == 1 and v[0]["ok"] is False
