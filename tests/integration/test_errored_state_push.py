# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A failed apply's ``errored.tfstate`` is pushed to the backend by csis-tf-supervise.

terraform writes ``errored.tfstate`` into the root when an apply changed reality but the backend
did not take the new state. On an AWX execution node the root is in the job's container, which
goes with the job: unless the file reaches the backend before then, the next plan job plans
against the state from before the apply and creates again what it created. The supervisor (the
role's ``binary_path`` of the apply) pushes it (``state push``, terraform's own advice) for up to
``CSIS_TF_PUSH_WAIT`` seconds, and removes it once the backend holds it.

Real terraform, the real S3 backend on the session's moto server; the roots hold ``terraform_data``
resources (no provider to start). The first test makes the backend really fail the apply's state
write: a ``local-exec`` provisioner deletes the state's bucket during the apply, and makes it again
once terraform has written ``errored.tfstate`` (the endpoint back after an outage). The others
push a hand-made ``errored.tfstate`` (the pulled state one serial on) with a lock object in the
bucket: one the failed apply left (released, then pushed) and someone else's (left; the push fails
and the file stays, with the command for the operator).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

import e2e

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = os.path.join(REPO, "roles", "tofu_root", "files")
LAUNCHER = os.path.join(FILES, "csis-tf-supervise")

_spec = importlib.util.spec_from_file_location("csis_tf_supervise", os.path.join(FILES, "csis_tf_supervise.py"))
supervise = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(supervise)

# run by the provisioner: empty and delete the bucket (the backend's state write then fails), and
# leave a detached process that makes the bucket again once terraform wrote errored.tfstate
BREAKER = r'''
import os, subprocess, sys, time
import boto3
bucket, url, root, region = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=url, region_name=region)
if sys.argv[5:] == ["again"]:
    deadline = time.time() + 300
    while not os.path.exists(os.path.join(root, "errored.tfstate")) and time.time() < deadline:
        time.sleep(0.1)
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
    sys.exit(0)
for obj in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
    s3.delete_object(Bucket=bucket, Key=obj["Key"])
s3.delete_bucket(Bucket=bucket)
subprocess.Popen([sys.executable, __file__, bucket, url, root, region, "again"], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
'''


@pytest.fixture()
def env(tf_env, moto_endpoint):
    env = {k: v for k, v in tf_env.items() if k not in ("TF_WORKSPACE", "TF_DATA_DIR")}
    return dict(env, CSIS_TF_BINARY="terraform", CSIS_TF_PYTHON=sys.executable)


def s3(moto_endpoint):
    return moto_endpoint.client("s3")


def state_object(moto_endpoint, bucket, key):
    return json.loads(s3(moto_endpoint).get_object(Bucket=bucket, Key=key)["Body"].read())


def tf(root, env, *args):
    proc = subprocess.run(["terraform", *args], cwd=root, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, "terraform %s -> %d\n%s\n%s" % (" ".join(args), proc.returncode, proc.stdout[-3000:],
                                                                 proc.stderr[-3000:])
    return proc


def test_a_failed_apply_s_state_reaches_the_backend(tmp_path, env, moto_endpoint):
    bucket = "csis-errored-%s" % uuid.uuid4().hex[:8]
    region = env["AWS_REGION"]
    s3(moto_endpoint).create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
    key = "errored/storage.tfstate"
    root = str(tmp_path / "root")
    os.makedirs(root)
    breaker = str(tmp_path / "breaker.py")
    with open(breaker, "w", encoding="utf-8") as fh:
        fh.write(BREAKER)
    command = [sys.executable, breaker, bucket, moto_endpoint.url, root, region]
    with open(os.path.join(root, "main.tf"), "w", encoding="utf-8") as fh:
        fh.write(e2e.s3_backend_block(moto_endpoint.url, bucket, key, region) + """
resource "terraform_data" "volume" {
  input = "mnt_data"
  provisioner "local-exec" {
    command = %s
  }
}
""" % json.dumps(" ".join("'%s'" % part for part in command)))
    tf(root, env, "init", "-input=false", "-no-color")
    log = str(tmp_path / "apply.log")
    res = subprocess.run([LAUNCHER, "apply", "-input=false", "-auto-approve", "-no-color"], cwd=root,
                         env=dict(env, CSIS_TF_LOG=log, CSIS_TF_PUSH_WAIT="60"), capture_output=True, text=True,
                         timeout=600, check=False)
    flat = " ".join(res.stderr.split())
    assert res.returncode != 0, res.stdout[-3000:] + res.stderr[-3000:]      # the apply failed: it still says so
    assert "Failed to save state" in flat or "Failed to persist state" in flat, flat[-3000:]
    assert "pushed to the backend" in flat and "removed" in flat, flat[-3000:]
    assert not os.path.exists(os.path.join(root, "errored.tfstate"))
    # the backend holds what the apply did: the next plan reads it (nothing to create again)
    held = state_object(moto_endpoint, bucket, key)
    assert [r["type"] for r in held["resources"]] == ["terraform_data"], held
    # the apply's log says it too (csis_apply_wait shows its last line)
    with open(log, encoding="utf-8") as fh:
        assert "pushed to the backend" in fh.read()
    plan = subprocess.run(["terraform", "plan", "-input=false", "-no-color", "-detailed-exitcode"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]


@pytest.fixture()
def applied(tmp_path, env, moto_endpoint):
    """A root applied on the session's state bucket, an errored.tfstate one serial on, and the
    lock object's key."""
    key = "errored-push/%s/storage.tfstate" % uuid.uuid4().hex[:8]
    root = str(tmp_path / "root")
    os.makedirs(root)
    with open(os.path.join(root, "main.tf"), "w", encoding="utf-8") as fh:
        fh.write(e2e.s3_backend_block(moto_endpoint.url, moto_endpoint.state_bucket, key, env["AWS_REGION"])
                 + 'resource "terraform_data" "volume" {\n  input = "mnt_data"\n}\n')
    tf(root, env, "init", "-input=false", "-no-color")
    tf(root, env, "apply", "-input=false", "-auto-approve", "-no-color")
    state = json.loads(tf(root, env, "state", "pull").stdout)
    state["serial"] += 1
    state["resources"][0]["instances"][0]["attributes"]["input"] = "after-the-apply"
    with open(os.path.join(root, "errored.tfstate"), "w", encoding="utf-8") as fh:
        json.dump(state, fh)
    return root, key, state["serial"]


def put_lock(moto_endpoint, key, who, created):
    lock = {"ID": str(uuid.uuid4()), "Operation": "OperationTypeApply", "Info": "", "Who": who,
            "Version": "1.11.0", "Created": created, "Path": "%s/%s" % (moto_endpoint.state_bucket, key)}
    s3(moto_endpoint).put_object(Bucket=moto_endpoint.state_bucket, Key=key + ".tflock", Body=json.dumps(lock).encode())
    return lock["ID"]


def push(root, env, monkeypatch, started, budget, exited=None, stopping=lambda: None):
    notes = []
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(root)
    done = supervise.push_errored_state("terraform", started, exited or time.time(), budget, notes.append,
                                        sleep=lambda _s: None, stopping=stopping)
    return done, " ".join(" ".join(notes).split())


def me():
    return supervise._me()


def now_go():
    """A UTC time as terraform's lock info prints it (Go's time.String)."""
    return time.strftime("%Y-%m-%d %H:%M:%S.000000000 +0000 UTC", time.gmtime())


def test_the_failed_apply_s_own_lock_is_released_then_the_state_pushed(applied, env, moto_endpoint, monkeypatch):
    root, key, serial = applied
    started = time.time() - 5
    lock_id = put_lock(moto_endpoint, key, me(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    done, said = push(root, env, monkeypatch, started, 30)
    assert done is True, said
    assert "the state lock %s left by this supervisor's own terraform" % lock_id in said and ": released" in said, said
    assert "pushed to the backend (attempt 2)" in said, said
    held = state_object(moto_endpoint, moto_endpoint.state_bucket, key)
    assert held["serial"] >= serial and held["resources"][0]["instances"][0]["attributes"]["input"] == "after-the-apply"
    assert not os.path.exists(os.path.join(root, "errored.tfstate"))
    listed = s3(moto_endpoint).list_objects_v2(Bucket=moto_endpoint.state_bucket, Prefix=key + ".tflock")
    assert not listed.get("Contents")


def test_someone_else_s_lock_is_left_and_the_file_stays(applied, env, moto_endpoint, monkeypatch):
    root, key, serial = applied
    put_lock(moto_endpoint, key, "deploy@another-host", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    done, said = push(root, env, monkeypatch, time.time() - 5, 1)
    assert done is False, said
    assert "released" not in said
    assert "pushing it failed 1 time(s)" in said and "lock" in said.lower(), said
    assert "the next plan of this root is refused until it is pushed: terraform -chdir=%s state push errored.tfstate" % (
        os.path.realpath(root)) in said, said
    assert os.path.exists(os.path.join(root, "errored.tfstate"))
    assert state_object(moto_endpoint, moto_endpoint.state_bucket, key)["serial"] == serial - 1
    listed = s3(moto_endpoint).list_objects_v2(Bucket=moto_endpoint.state_bucket, Prefix=key + ".tflock")
    assert listed.get("Contents")


def test_a_lock_taken_after_the_apply_exited_is_another_run_s_and_is_left(applied, env, moto_endpoint, monkeypatch):
    """Same user, same host (two checkouts, or AWX containers sharing a host name), an apply lock
    taken after this apply exited: another run's live lock, never released here."""
    root, key, serial = applied
    started = time.time() - 600
    put_lock(moto_endpoint, key, me(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    done, said = push(root, env, monkeypatch, started, 1, exited=started + 60)
    assert done is False and "released" not in said, said
    assert state_object(moto_endpoint, moto_endpoint.state_bucket, key)["serial"] == serial - 1
    assert s3(moto_endpoint).list_objects_v2(Bucket=moto_endpoint.state_bucket, Prefix=key + ".tflock").get("Contents")


def test_a_refusal_no_attempt_can_change_ends_the_attempts_and_so_does_a_signal(applied, env, moto_endpoint, monkeypatch):
    root, key, serial = applied
    path = os.path.join(root, "errored.tfstate")
    with open(path, encoding="utf-8") as fh:
        state = json.load(fh)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(dict(state, lineage="another-state-altogether"), fh)
    done, said = push(root, env, monkeypatch, time.time() - 5, 300)
    assert done is False and "pushing it failed 1 time(s)" in said and "another attempt cannot change that" in said, said
    assert "lineage" in said and os.path.exists(path)
    # the backend refuses for a reason a retry can change (someone else's lock), but a signal came
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(state, fh)
    put_lock(moto_endpoint, key, "deploy@another-host", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    done, said = push(root, env, monkeypatch, time.time() - 5, 300, stopping=lambda: "got SIGTERM")
    assert done is False and "pushing it failed 1 time(s)" in said and "no more attempts: got SIGTERM" in said, said


def test_an_older_file_or_none_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    notes = []
    assert supervise.push_errored_state("terraform", time.time(), time.time(), 30, notes.append) is None
    path = tmp_path / "errored.tfstate"
    path.write_text("{}")
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    assert supervise.push_errored_state("terraform", time.time(), time.time(), 30, notes.append) is None
    assert notes == [] and path.exists()
    os.utime(path, None)
    assert supervise.push_errored_state("terraform", time.time() - 5, time.time(), 0, notes.append) is False
    assert "not pushed (CSIS_TF_PUSH_WAIT=0)" in notes[0] and path.exists()


def test_own_lock_reads_terraform_s_lock_info():
    started = time.time() - 5
    apply_window = [("OperationTypeApply", started, time.time())]
    info = ("Error: Error acquiring the state lock\n\nLock Info:\n  ID:        abc-1\n  Path:      b/k\n"
            "  Operation: OperationTypeApply\n  Who:       %s\n  Version:   1.11.4\n  Created:   %s\n  Info:      \n")
    assert supervise._own_lock(info % (me(), now_go()), apply_window) == "abc-1"
    assert supervise._own_lock(info % ("x@elsewhere", now_go()), apply_window) is None
    old = time.strftime("%Y-%m-%d %H:%M:%S.0 +0000 UTC", time.gmtime(started - 600))
    assert supervise._own_lock(info % (me(), old), apply_window) is None
    later = time.strftime("%Y-%m-%d %H:%M:%S.0 +0000 UTC", time.gmtime(time.time() + 600))
    assert supervise._own_lock(info % (me(), later), apply_window) is None
    plan = (info % (me(), now_go())).replace("OperationTypeApply", "OperationTypePlan")
    assert supervise._own_lock(plan, apply_window) is None
    # a lock of a push attempt it stopped: any operation, within that attempt
    assert supervise._own_lock(plan, apply_window + [(None, started, time.time())]) == "abc-1"
    assert supervise._own_lock("Error: connection refused", apply_window) is None
