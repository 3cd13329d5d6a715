# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""ansible-core issue 87387: async_wrapper loses its worker on a loaded controller.

``async_wrapper``'s first process waits 2.5 s for its worker's "started" notification, then
returns and closes the pipe; a worker slower than that writes "started" to the job's results
file, fails on the closed pipe before it starts the module, and nothing ever writes a result.
The ansible-core maintainers reproduce it with a sleep before the notification; so does this
test (until the parent has given up, however loaded the machine), for the first async job of
one real storage run only (a ``sitecustomize`` on the run's
``PYTHONPATH``, active in ``async_wrapper`` processes alone; real ansible-core, real terraform
and provider, the session's moto server). ``csis_apply_wait`` sees the job gone before
terraform started (the root's ``.apply.log`` not written since), the role starts the same plan
file once more, and the run applies and records the volume once.
"""
from __future__ import annotations

import os
import uuid

import pytest

import e2e

pytestmark = pytest.mark.integration

INJECT = '''
import os, sys, time
if any("async_wrapper" in os.path.basename(a) for a in sys.argv[:1]):
    marker = os.environ.get("CSIS_TEST_LOSE_ASYNC_WORKER", "")
    import multiprocessing.connection as _conn
    _send = _conn.Connection.send

    def send(self, obj):
        try:
            os.rename(marker, marker + ".taken")   # the first job only
        except OSError:
            return _send(self, obj)
        # slower than the parent's 2.5 s wait, however loaded the machine: until the parent has
        # given up and closed its end (the other end reads as at its end), at most 60 s
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self.poll(0.2):
            pass
        return _send(self, obj)

    _conn.Connection.send = send
'''


def test_a_job_whose_worker_is_lost_before_terraform_starts_is_started_once_more(moto_endpoint, tmp_path):
    ep = moto_endpoint
    key = "lost-%s" % uuid.uuid4().hex[:8]
    root = e2e.make_ebs_tree(str(tmp_path), key, tree_id=key)
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(INJECT, encoding="utf-8")
    marker = tmp_path / "lose-the-first-worker"
    marker.write_text("", encoding="utf-8")
    env = {"PYTHONPATH": str(inject), "CSIS_TEST_LOSE_ASYNC_WORKER": str(marker)}
    env.update(e2e.ansible_dirs_in(str(tmp_path)))  # the lost job's payload stays in the test's directory
    run = e2e.run_playbook("storage.yml", root, ep.env, overlays=[ep.overlay_path, e2e.APPLY_ALL], env=env,
                           log=str(tmp_path / "run.log"))
    assert run.rc == 0, run.tail()
    assert not marker.exists() and os.path.exists(str(marker) + ".taken"), "the fault was not injected"
    text = " ".join(run.out.split())
    assert "is gone before its command started" in text and "Nothing was applied" in text, run.tail()
    assert "This run starts the same plan file once more now." in text, run.tail()
    assert "TASK [csis.infra.tofu_root : Apply exactly that plan file, second start]" in run.out
    rec = e2e.meta(root, "storage-state.yaml")["storages"]["mnt_data"]
    assert rec["state"] == "active"
    vols = ep.client("ec2").describe_volumes(
        Filters=[{"Name": "tag:csis_config", "Values": [key]}])["Volumes"]
    assert [v["VolumeId"] for v in vols] == [rec["facts"]["volume_id"]]
