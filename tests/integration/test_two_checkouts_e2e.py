# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Two checkouts of one tree that share nothing but the cloud (issue 10), end to end: real
ansible-playbook, real terraform and provider, the session's moto server.

The tree declares the S3 meta-state store on its S3 state backend
(``meta_state: {backend: s3, state_backend: s3-east2, prefix: ...}``), and every root's
terraform state is on that backend too. Checkout A applies
``site.yml`` (identity, one EBS volume, one instance mounting it). Checkout B is a second copy
of the same declarations, as a fresh clone or an AWX execution node has them: no meta-state,
no rendered roots, no terraform working directory. From B, the inventory plugin lists A's
instance, and ``site.yml`` plans nothing: B reads the same terraform state and the same
records. Neither checkout keeps a record on its own disk.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid

import pytest

from day2_trees import Runner, make_tree, tail, text
from trees import copy_as_shipped, declare_s3_store

from ansible_collections.csis.infra.plugins.module_utils.csis.state.preflight import PreflightError, preflight
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState, launched_instances

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORAGES = [{"name": "mnt_data", "mount_point": "/mnt/data", "groups": ["coops"], "state": "active"}]
INSTANCES = [{"name": "test2", "image": "imgfile-basic-dask", "tags": {"hype": "test"},
              "storages": [{"name": "mnt_data", "mount_point": "/mnt/data"}]}]
RECORDS = ("launch-params.yaml", "instance-state.yaml", "storage-state.yaml", "pins.yaml")


def _local_records(root: str) -> list:
    found = []
    for dirpath, _dirs, files in os.walk(os.path.join(root, "meta-state")):
        found += [os.path.relpath(os.path.join(dirpath, f), root) for f in files if f in RECORDS]
    return sorted(found)


@pytest.fixture(scope="module")
def clones(moto_endpoint, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("two-checkouts"))
    tag = "csis-2co-%s" % uuid.uuid4().hex[:6]
    a = make_tree(os.path.join(base, "a"), tag, STORAGES, INSTANCES)
    declare_s3_store(a, moto_endpoint.url, "two-checkouts/%s" % tag)
    # checkout B: the same declarations, nothing any run wrote
    b = copy_as_shipped(a, os.path.join(base, "b", "examples"))
    first = Runner(a, moto_endpoint).play("site.yml")
    assert first.returncode == 0, tail(first)
    assert re.search(r"instance-image-open-tofu: Plan: [1-9]\d* to add", text(first)), tail(first)
    return a, b, moto_endpoint


def test_a_second_checkout_sees_the_first_checkouts_instance_in_its_inventory(clones, tmp_path, monkeypatch):
    a, b, ep = clones
    for key, value in ep.env.items():  # this process reads the store too
        monkeypatch.setenv(key, value)
    assert not os.path.isdir(os.path.join(b, "meta-state")) or not _local_records(b)
    launched = launched_instances(MetaState(b))
    assert sorted(launched) == ["test2"]
    iid = launched["test2"]["current"]["instance_id"]
    reservations = ep.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"]
    assert reservations[0]["Instances"][0]["State"]["Name"] in ("pending", "running")

    source = tmp_path / "b.csis.yml"
    source.write_text("plugin: csis.infra.meta_state\nconfig_root: %s\n" % b)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1",
               **ep.env)
    proc = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-inventory"), "-i", str(source), "--list"],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    hostvars = json.loads(proc.stdout)["_meta"]["hostvars"]
    assert sorted(hostvars) == ["test2"]
    assert hostvars["test2"]["csis_instance_id"] in (iid, {"__ansible_unsafe": iid})
    # the records live in the store, on neither checkout's disk
    assert _local_records(a) == [] and _local_records(b) == []


def test_a_second_checkout_plans_nothing_the_first_applied(clones, monkeypatch):
    a, b, ep = clones
    for key, value in ep.env.items():
        monkeypatch.setenv(key, value)
    before = MetaState(b).revision()
    res = Runner(b, ep).play("site.yml")
    assert res.returncode == 0, tail(res)
    summaries = dict(re.findall(r"([\w.-]+): (Plan: \d+ to add, \d+ to change, \d+ to destroy)", text(res)))
    assert summaries and set(summaries.values()) == {"Plan: 0 to add, 0 to change, 0 to destroy"}, summaries
    assert "instance-image-open-tofu" in summaries and "storage-aws-ebs" in summaries
    assert MetaState(b).revision() == before  # nothing applied, nothing recorded
    assert _local_records(b) == []


def test_hard_drift_found_from_one_checkout_stops_a_real_run_of_the_other(clones, monkeypatch):
    """The AWX case: the drift job's checkout (A) finds a recorded volume gone; a lifecycle job's
    fresh checkout (B), which has no state report of its own, refuses its real run, reading the
    HARD line from the S3 store. B's state import corrects the record and its query clears the
    line in the store; A, whose own report still holds it, refuses until its own query runs again."""
    a, b, ep = clones
    for key, value in ep.env.items():
        monkeypatch.setenv(key, value)
    managed = MetaState(a).load("storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    ec2 = ep.client("ec2")
    att = ec2.describe_volumes(VolumeIds=[managed])["Volumes"][0]["Attachments"][0]
    ec2.detach_volume(VolumeId=managed, InstanceId=att["InstanceId"], Device=att["Device"], Force=True)
    ec2.delete_volume(VolumeId=managed)

    res = Runner(a, ep).play("state_query.yml")
    assert res.returncode == 0, tail(res)
    assert "missing storage mnt_data: recorded active but not found in reality (volume %s) [HARD]" % managed in text(res)
    assert MetaState(a).load("drift.yaml")["hard"][0]["name"] == "mnt_data"
    assert _local_records(a) == [] and not os.path.exists(os.path.join(a, "meta-state", "drift.yaml"))

    # B's query, whose lookups all fail (its endpoint down), cannot clear what it could not see
    import socket
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = os.path.join(os.path.dirname(b), "down.yml")
    with open(down, "w", encoding="utf-8") as fh:
        fh.write("runtime_builders:\n  - name: aws-east2-runtime\n    endpoints: {url: \"http://127.0.0.1:%d\"}\n" % port)
    before = MetaState(a).revision()
    res = Runner(b, ep).play("state_query.yml", overlays=[down])
    assert res.returncode == 0, tail(res)
    assert "kept in meta-state (not looked up this time): missing storage mnt_data" in text(res), tail(res)
    assert MetaState(a).revision() == before and MetaState(a).load("drift.yaml")["hard"][0]["name"] == "mnt_data"
    os.remove(os.path.join(b, "generated", "state-report.json"))  # B stays a checkout without a report

    assert not os.path.exists(os.path.join(b, "generated", "state-report.json"))
    res = Runner(b, ep).play("identity.yml")
    assert res.returncode != 0
    assert ("state: missing storage mnt_data: recorded active but not found in reality (volume %s) (from meta-state "
            "drift.yaml, state query" % managed) in text(res), tail(res)
    assert "TASK [csis.infra.render : Render the identity roots]" not in res.stdout
    # a dry run is not refused: it warns of the same line and renders on
    res = Runner(b, ep).play("identity.yml", real=False)
    assert res.returncode == 0, tail(res)
    assert ("a real run would refuse to start: state: missing storage mnt_data: recorded active but not found in "
            "reality (volume %s) (from meta-state drift.yaml, state query" % managed) in text(res), tail(res)
    assert "TASK [csis.infra.render : Render the identity roots]" in res.stdout
    res = Runner(b, ep).play("summary.yml")  # the status page says it too
    assert res.returncode == 0, tail(res)
    assert "a real run would refuse to start: state: missing storage mnt_data" in text(res), tail(res)

    # B is an AWX job's checkout: no generated/ (the project's .gitignore keeps it out), so its storage
    # root is neither rendered nor initialised. The import renders and initialises it, then replaces
    # the gone volume in the root's terraform state (shared with A's through the backend); recorded
    # without it, the next storage run would plan the volume's create, which the gate refuses.
    shutil.rmtree(os.path.join(b, "generated", "storage"), ignore_errors=True)
    new = ec2.create_volume(AvailabilityZone="us-east-2a", Size=100)["VolumeId"]
    res = Runner(b, ep).play("state_import.yml", import_storage="mnt_data", storage_id=new)
    assert res.returncode == 0, tail(res)
    said = " ".join(text(res).split())
    directory = os.path.join(b, "generated", "storage", "aws-ebs", "storage-generation")
    assert ("imported %s into the terraform state of %s as module.storage_mnt_data.aws_ebs_volume.this (after "
            "rendering and initialising the root: it was not initialised for a real run) (after removing "
            "%s, gone from the endpoint, from it)" % (new, directory, managed)) in said, tail(res)
    assert MetaState(b).load("drift.yaml")["hard"] == []  # its query ran again and cleared the record

    # A's own report, older than the record, still holds the line: A refuses (what its next real run
    # checks first) until its own query runs again, and the message says which file
    with pytest.raises(PreflightError) as err:
        preflight(a, write=False)
    assert str(err.value).endswith("(from state-report.json; re-run 'state query' after fixing)"), str(err.value)
    assert "drift.yaml" not in str(err.value)
    res = Runner(a, ep).play("state_query.yml")
    assert res.returncode == 0, tail(res)
    found = preflight(a, write=False)
    assert found["hard_drift"] == [] and found["report"].startswith("s3://"), found["report"]
    ec2.delete_volume(VolumeId=new)
