# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Issue 14, item 2: the AWS endpoint goes down in the middle of an apply.

A private moto server (never the session's shared one: stopping that would break every other
test) and a one-EBS tree pointing at it. ``storage.yml`` runs for real; as soon as the new
volume exists at the endpoint (terraform's create call went through, the provider is waiting
for the volume), the server is stopped. ``AWS_MAX_ATTEMPTS=2`` (a user's knob) keeps
terraform's retries short: on these machines the provider still made 9 attempts of
DescribeVolumes and the S3 backend 5 of its state write, about 40 s in all, then gave up.

What is checked: the run fails, naming the root, the failed step and the unreachable
endpoint; meta-state records nothing for the root that did not finish; no terraform process
is left. terraform writes the state it could not save (the volume it created) to the root's
``errored.tfstate``; as soon as it is there, the server is started again on the same port (the
outage ends), and csis-tf-supervise, still in its push retries (``csis_state_push_wait``), pushes
the file to the backend: the run's output says so, the file is gone, and the backend's state
holds the volume the interrupted apply created. On an AWX execution node, whose container goes
with the job, that push is what keeps the apply's state.

The restarted server does NOT have the old one's resources: moto keeps everything in memory
and ``LocalAws`` persists nothing across a restart (its state directory holds only the
endpoint record, the seed ids and the overlay). So the volume the interrupted apply created,
the state bucket and the tree's terraform state object are gone; the seed makes the bucket
and the network again, and the push then writes the state into the new bucket. The next run
converges from there: its plan sees the pushed volume gone (moto lost it), creates and records
a new one, and meta-state then matches reality.
"""
from __future__ import annotations

import os
import sys
import time
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402
import local_aws  # noqa: E402

pytestmark = e2e.needs_terraform()

EBS_ROOT = e2e.EBS_ROOT
FEW_ATTEMPTS = {"AWS_MAX_ATTEMPTS": "2"}


@pytest.fixture
def private_endpoint(tmp_path):
    la = local_aws.LocalAws(str(tmp_path / "aws"))
    la.start(prefer_port=None, tie_to_caller=True)
    la.seed()
    try:
        yield la
    finally:
        la.stop()


def volumes(la, url):
    vols = la.client("ec2", url).describe_volumes(Filters=[{"Name": "tag:Name", "Values": ["mnt_data"]}])["Volumes"]
    return {v["VolumeId"] for v in vols}


def test_endpoint_stopped_mid_apply(private_endpoint, tmp_path):
    la = private_endpoint
    rec = la.recorded()
    url, port = rec["url"], int(rec["port"])
    env = la.env(url)
    root = e2e.make_ebs_tree(str(tmp_path), "down-%s" % uuid.uuid4().hex[:8])
    root_dir = os.path.realpath(os.path.join(root, EBS_ROOT))
    ovl = [la.overlay_path, e2e.APPLY_ALL]
    before = e2e.meta_state_digest(root)

    log = str(tmp_path / "down.log")
    proc = e2e.start_playbook("storage.yml", root, env, log, overlays=ovl, env=FEW_ATTEMPTS)
    errored = os.path.join(root_dir, "errored.tfstate")
    deadline, seen = time.monotonic() + 900, set()
    try:
        while time.monotonic() < deadline and proc.poll() is None and not seen:
            seen = volumes(la, url)
            if not seen:
                time.sleep(0.1)
        assert seen, open(log, encoding="utf-8").read()[-4000:]
        assert la.stop()                                   # the endpoint goes down mid-apply
        # terraform gives up its retries and writes the state it could not save; the outage ends
        # then, while the supervisor retries its push (csis_state_push_wait, 120 s)
        while time.monotonic() < deadline and proc.poll() is None and not os.path.exists(errored):
            time.sleep(0.1)
        assert proc.poll() is None and os.path.exists(errored), open(log, encoding="utf-8").read()[-4000:]
        # the endpoint back, on the same port: moto starts empty (nothing persists), the seed
        # makes the state bucket and the network again
        la.start(port=port, tie_to_caller=True)
        la.seed()
        rc = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            e2e.kill_tree(proc.pid, [root_dir])
            proc.wait()
    out = open(log, encoding="utf-8", errors="replace").read()
    assert rc != 0, out[-4000:]
    flat = " ".join(out.split())
    assert "storage-aws-ebs: Apply exactly that plan file failed:" in flat, out[-4000:]
    assert "connection refused" in flat.lower(), out[-4000:]
    assert "127.0.0.1:%d" % port in flat
    assert not e2e.processes(lambda p: os.path.realpath(p["cwd"]) == root_dir), "terraform left running"
    # meta-state: nothing recorded for the root that did not finish
    assert e2e.meta_state_digest(root) == before
    assert "mnt_data" not in (e2e.meta(root, "storage-state.yaml").get("storages") or {})
    # the state terraform could not save reached the backend once it was back
    assert "wrote it to %s: pushed to the backend" % errored in flat, out[-4000:]
    assert not os.path.exists(errored)
    assert e2e.state_ids(e2e.tf_state_pull(root_dir, env), "aws_ebs_volume") == sorted(seen)
    assert not volumes(la, url), "moto kept state across the restart: extend this test to check it"

    # the next run: its plan reads the pushed state, sees that volume gone (moto lost it) and
    # creates and records a new one
    again = e2e.run_playbook("storage.yml", root, env, overlays=ovl, log=str(tmp_path / "back.log"))
    assert again.rc == 0, again.tail()
    vid = e2e.meta(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    assert volumes(la, url) == {vid}
    assert e2e.state_ids(e2e.tf_state_pull(root_dir, env), "aws_ebs_volume") == [vid]
