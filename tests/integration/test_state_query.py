# -*- coding: utf-8 -*-
"""The drift report end to end: the example tree applied for real (terraform + the session's
moto server) through ``playbooks/site.yml`` once for the module, then reality is changed
behind the system's back with boto3 and ``playbooks/state_query.yml`` /
``forget.yml`` / ``state_import.yml`` / ``site.yml`` are run for real.

The copy of the tree gets its own ``id`` (so its ``csis_config`` tag), state key and bucket
name, so that other tests sharing the moto server can never look foreign to it.
"""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Dict, List

import pytest

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = os.path.join(REPO, ".venv", "bin", "ansible-playbook")
TAG = "csis-drift"
BUCKET = "csis-drift-default-bucket"


def _copy_tree(dest: str) -> str:
    src = os.path.join(REPO, "examples")
    from trees import copy_as_shipped, replace_text

    copy_as_shipped(src, os.path.join(dest, "examples"))
    root = os.path.join(dest, "examples")
    for rel, old, new in (("cfg/_config.yml", "id: csis-example", "id: %s" % TAG),
                          ("cfg/state-backends.yml", "statefiles/csis-example", "statefiles/%s" % TAG),
                          ("cfg/storage-builders.yml", "csis-example-default-bucket", BUCKET),
                          ("storages/storage0.yaml", "csis-example-default-bucket", BUCKET)):
        replace_text(os.path.join(root, rel), old, new)
    # the bucket without its lifecycle rules: drift is about the bucket, and the provider waits
    # ~55 s after creating a lifecycle configuration (tests/integration/test_lifecycle_e2e.py
    # applies the example's rules as shipped)
    import e2e
    storages = os.path.join(root, "storages", "storage0.yaml")
    data = e2e.read_yaml(storages)
    for storage in data["storages"]:
        if storage.get("type") == "aws-s3":
            assert storage.pop("lifecycle", None) is not None, storage
    e2e.write_yaml(storages, data)
    return root


class Tree:
    def __init__(self, root: str, moto: Any, tmp: str) -> None:
        self.root = root
        self.moto = moto
        self.tmp = tmp
        self.env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                        ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
        for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
            self.env.pop(key, None)
        self.env.update(moto.env)
        self.env["AWS_EC2_METADATA_DISABLED"] = "true"

    def play(self, playbook: str, overlays: List[str] = (), **extra: Any) -> subprocess.CompletedProcess:
        xv: Dict[str, Any] = {"csis_config_root": self.root,
                              "csis_overlays": [self.moto.overlay_path] + list(overlays)}
        xv.update(extra)
        return subprocess.run([PLAYBOOK, os.path.join("playbooks", playbook), "-e", json.dumps(xv)],
                              cwd=REPO, env=self.env, capture_output=True, text=True, timeout=1800, check=False)

    def query(self, overlays: List[str] = ()) -> Dict[str, Any]:
        res = self.play("state_query.yml", overlays)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
        return self.report()

    def report(self) -> Dict[str, Any]:
        with open(os.path.join(self.root, "generated", "state-report.json"), encoding="utf-8") as fh:
            return json.load(fh)

    def meta(self, name: str) -> Dict[str, Any]:
        from trees import read_meta

        return read_meta(self.root, name)


def _text(res: subprocess.CompletedProcess) -> str:
    """stdout + stderr with whitespace collapsed (the callback wraps long messages)."""
    return " ".join((res.stdout + res.stderr).split())


def _lines(report: Dict[str, Any]) -> List[tuple]:
    return sorted((d["drift"], d["kind"], d["name"]) for d in report["drift"])


@pytest.fixture(scope="module")
def tree(moto_endpoint, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("drift"))
    t = Tree(_copy_tree(tmp), moto_endpoint, tmp)
    res = t.play("site.yml", ["overlays/apply-all.yml"], csis_dry_run=False, csis_auto_approve=True)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    st = t.meta("storage-state.yaml")["storages"]
    assert st["mnt_data"]["state"] == "active" and st["mnt_data"]["facts"]["volume_id"].startswith("vol-")
    return t


def test_a_clean_tree_reports_no_drift(tree):
    rep = tree.query()
    assert rep["drift"] == [] and rep["unavailable"] == [], rep
    assert rep["tree"] == TAG
    vid = tree.meta("storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    assert rep["reality"]["storages"]["mnt_data"]["present"] is True
    assert rep["reality"]["storages"]["mnt_data"]["id"] == vid
    assert rep["reality"]["storages"]["default-bucket"]["id"] == BUCKET
    assert rep["reality"]["instances"]["test2"]["present"] is True
    assert rep["summary"]["hard"] == 0


def test_a_bucket_with_the_trees_tags_but_no_record_is_foreign(tree):
    s3 = tree.moto.client("s3")
    name = "csis-drift-stray-bucket"
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": tree.moto.region})
    s3.put_bucket_tagging(Bucket=name, Tagging={"TagSet": [{"Key": "csis_config", "Value": TAG}]})
    try:
        rep = tree.query()
        assert _lines(rep) == [("foreign", "storage", name)], rep["drift"]
        assert rep["drift"][0]["detail"] == ("bucket %s (tagged csis_config=%s) exists but meta-state has no record "
                                             "of it (and it is not in the YAML)" % (name, TAG))
        assert rep["summary"]["foreign"] == 1 and rep["summary"]["hard"] == 0
    finally:
        s3.delete_bucket(Bucket=name)


def test_a_second_volume_with_the_same_name_is_foreign_and_the_managed_one_is_found_by_id(tree):
    ec2 = tree.moto.client("ec2")
    managed = tree.meta("storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    orphan = ec2.create_volume(AvailabilityZone="us-east-2a", Size=1, TagSpecifications=[{
        "ResourceType": "volume", "Tags": [{"Key": "Name", "Value": "mnt_data"}, {"Key": "csis_config", "Value": TAG}]}])
    try:
        rep = tree.query()
        assert _lines(rep) == [("foreign", "storage", "mnt_data")], rep["drift"]
        detail = rep["drift"][0]["detail"]
        assert orphan["VolumeId"] in detail and detail.endswith("the managed volume of storage mnt_data is %s" % managed)
        assert rep["reality"]["storages"]["mnt_data"]["id"] == managed
        assert rep["reality"]["storages"]["mnt_data"]["state"] == "in-use"  # the attached one, not the orphan
    finally:
        ec2.delete_volume(VolumeId=orphan["VolumeId"])


def test_an_endpoint_that_is_down_gives_unavailable_lines_not_missing(tree):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = os.path.join(tree.tmp, "down.yml")
    with open(down, "w", encoding="utf-8") as fh:
        fh.write("runtime_builders:\n  - name: aws-east2-runtime\n    endpoints: {url: \"http://127.0.0.1:%d\"}\n" % port)
    res = tree.play("state_query.yml", [down])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    rep = tree.report()
    assert rep["drift"] == [], rep["drift"]
    assert rep["summary"]["missing"] == 0 and rep["summary"]["hard"] == 0
    joined = "\n".join(rep["unavailable"])
    for what in ("storage mnt_data:", "storage efs-storage:", "storage default-bucket:", "instance test2:",
                 "instance test:", "foreign volume scan"):
        assert what in joined, (what, rep["unavailable"])
    assert "127.0.0.1:%d" % port in joined
    assert all(v["present"] is None for v in rep["reality"]["storages"].values())
    assert "unavailable: storage mnt_data:" in _text(res)
    # the AWX drift job's setting: a query that could not look is not green
    res = tree.play("state_query.yml", [down], csis_state_fail_on_unavailable=True)
    assert res.returncode != 0
    assert ("the state query could not look %d thing(s) up, so the report cannot say whether they drifted"
            % len(rep["unavailable"])) in _text(res), res.stdout[-4000:]
    assert "127.0.0.1:%d" % port in _text(res)


def test_a_deleted_volume_is_missing_hard_and_stops_the_next_run_until_corrected(tree):
    ec2 = tree.moto.client("ec2")
    managed = tree.meta("storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    att = ec2.describe_volumes(VolumeIds=[managed])["Volumes"][0]["Attachments"][0]
    ec2.detach_volume(VolumeId=managed, InstanceId=att["InstanceId"], Device=att["Device"], Force=True)
    ec2.delete_volume(VolumeId=managed)

    rep = tree.query()
    assert _lines(rep) == [("missing", "storage", "mnt_data")], rep["drift"]
    line = rep["drift"][0]
    assert line["hard"] is True
    assert line["detail"] == "recorded active but not found in reality (volume %s)" % managed
    message = ("state: missing storage mnt_data: recorded active but not found in reality (volume %s) "
               "(from state-report.json; re-run 'state query' after fixing)" % managed)

    # the next real run refuses to start, with the reference's message
    res = tree.play("site.yml", ["overlays/apply-all.yml"], csis_dry_run=False, csis_auto_approve=True)
    assert res.returncode != 0
    assert message in _text(res), res.stdout[-4000:] + res.stderr[-2000:]
    assert "TASK [csis.infra.render : Render the identity roots]" not in res.stdout
    # a dry run is not refused
    res = tree.play("identity.yml")
    assert res.returncode == 0, res.stdout[-3000:]

    # state import refuses an id the endpoint does not know, and records an existing one
    res = tree.play("state_import.yml", import_storage="mnt_data", storage_id="vol-0123456789abcdef0")
    assert res.returncode != 0 and "vol-0123456789abcdef0 does not exist at" in _text(res), res.stdout[-3000:]
    assert tree.report()["summary"]["hard"] == 1
    new = ec2.create_volume(AvailabilityZone="us-east-2a", Size=100)["VolumeId"]
    res = tree.play("state_import.yml", import_storage="mnt_data", storage_id=new)
    assert res.returncode == 0, res.stdout[-4000:]
    rec = tree.meta("storage-state.yaml")["storages"]["mnt_data"]
    assert rec["state"] == "active" and rec["facts"]["volume_id"] == new and rec["facts"]["size"] == 100
    assert rec["history"][-1]["action"] == "import"
    rep = tree.report()  # the playbook queried again
    assert rep["summary"]["hard"] == 0 and rep["drift"] == [], rep["drift"]
    assert rep["reality"]["storages"]["mnt_data"]["id"] == new

    # forget refuses a storage whose volume still exists, unless confirmed
    res = tree.play("forget.yml", forget_storage="mnt_data")
    assert res.returncode != 0 and "volume %s still exists" % new in _text(res), res.stdout[-3000:]
    assert "mnt_data" in tree.meta("storage-state.yaml")["storages"]
    res = tree.play("forget.yml", forget_storage="mnt_data", confirm=True)
    assert res.returncode == 0, res.stdout[-4000:]
    assert "mnt_data" not in tree.meta("storage-state.yaml")["storages"]
    assert "mnt_data" not in tree.meta("storage.yaml")["storages"]
    assert tree.report()["drift"] == []

    # the record is corrected: a real run starts again (apply flags off: plan and gate only)
    res = tree.play("identity.yml", csis_dry_run=False)
    assert res.returncode == 0, res.stdout[-4000:]
    assert "re-run 'state query'" not in _text(res)
    ec2.delete_volume(VolumeId=new)


def test_forget_an_instance_refuses_while_the_machine_exists(tree):
    iid = tree.meta("instance-state.yaml")["instances"]["test"]["current"]["instance_id"]
    res = tree.play("forget.yml", forget_instance="test")
    assert res.returncode != 0 and "the machine %s still exists" % iid in _text(res), res.stdout[-3000:]
    assert "test" in tree.meta("launch-params.yaml")["instances"]
    res = tree.play("forget.yml", forget_instance="test", confirm=True)
    assert res.returncode == 0, res.stdout[-4000:]
    assert "test" not in tree.meta("launch-params.yaml")["instances"]
    assert "test" not in tree.meta("pins.yaml")["instances"]
    state = tree.meta("instance-state.yaml")["instances"]["test"]
    assert state["current"] is None and state["history"][-1]["why"] == "forgotten"
    # the machine is still tagged with the tree's tag: now it is foreign
    rep = tree.report()
    assert ("foreign", "instance", "test") in _lines(rep), rep["drift"]
    assert rep["summary"]["hard"] == 0
    res = tree.play("forget.yml", forget_instance="test")
    assert res.returncode != 0 and "nothing is recorded for it" in _text(res)


def test_an_import_into_a_root_rendered_after_the_storage_was_declared_installs_its_module(tree):
    """A storage declared after its root's last real run: state import records it and leaves the
    terraform state alone while the root does not declare it; once a dry run rendered it (and
    installed nothing: terraform would say "Module not installed"), the import installs the
    module and imports, and the next real run plans no create of it."""
    import e2e

    storages = os.path.join(tree.root, "storages", "storage0.yaml")
    doc = e2e.read_yaml(storages)
    doc["storages"].append({"name": "p2", "mount_point": "/mnt/p2", "groups": ["coops"], "state": "active"})
    e2e.write_yaml(storages, doc)
    directory = os.path.join(tree.root, "generated", "storage", "aws-ebs", "storage-generation")
    # as the storage declares it (an unencrypted one, or another zone, would be planned as a replacement,
    # which the gate refuses: docs/drift.md)
    vid = tree.moto.client("ec2").create_volume(AvailabilityZone="us-east-2a", Size=100, VolumeType="gp3",
                                                Encrypted=True)["VolumeId"]

    res = tree.play("state_import.yml", import_storage="p2", storage_id=vid)
    assert res.returncode == 0, res.stdout[-4000:]
    said = _text(res).replace("''", "'")  # the YAML callback doubles the quotes of a quoted string
    assert ("terraform state not touched: %s was rendered before storage 'p2' was declared" % directory) in said, said
    assert tree.meta("storage-state.yaml")["storages"]["p2"]["facts"]["volume_id"] == vid

    res = tree.play("storage.yml")  # a dry run renders the module call; the root's init is untouched
    assert res.returncode == 0, res.stdout[-4000:]
    res = tree.play("state_import.yml", import_storage="p2", storage_id=vid)
    assert res.returncode == 0, res.stdout[-4000:]
    assert ("imported %s into the terraform state of %s as module.storage_p2.aws_ebs_volume.this "
            "(after installing its module storage_p2)" % (vid, directory)) in _text(res), res.stdout[-4000:]

    # a real run (apply flags off: plan and gate only) manages the imported volume: no create of it
    res = tree.play("storage.yml", csis_dry_run=False)
    assert res.returncode == 0, "\n".join(line for line in res.stdout.splitlines() if "fatal" in line or "msg" in line
                                          or "=>" in line or "REFUSED" in line or "Error" in line)[-6000:]
    assert "RECORDED STORAGE WOULD BE CREATED" not in _text(res)
    assert "module.storage_p2.aws_ebs_volume.this" not in [line.split()[1] for line in res.stdout.splitlines()
                                                           if "create" in line and len(line.split()) > 1], _text(res)
