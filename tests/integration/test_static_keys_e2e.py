# -*- coding: utf-8 -*-
"""A runtime's ``!vault`` static keys reach AWS in every step, terraform's and boto3's.

The tree's runtime declares static credentials (``access_key_id``, ``secret_access_key`` as
``!vault`` values), the S3 state backend a profile of its own, and the environment holds no
default credentials at all (no ``AWS_ACCESS_KEY_ID``, no default profile, no instance
metadata). So a step that reached the runtime with the environment's credentials (what the
boto3 steps did before: another account's, in a real setup) fails with "Unable to locate
credentials" instead of passing. Run for real on the local endpoint: the create, the state
import of a volume made out of band (``terraform import`` reads the root's configuration), then the
archive (the storage check of the recorded volume, the archive snapshot, the volume's
destroy), then the drift report; each must reach the runtime with the tree's keys.
"""
from __future__ import annotations

import json
import os
import uuid

import e2e

pytestmark = e2e.needs_terraform()

KEY_ID = "AKIACSISSTATICKEYS01"
SECRET_KEY = "csisStaticKeys0Secret1Do2Not3Leak4QwErT"
PASSWORD = "csis-static-keys-vault-password"
BACKEND_PROFILE = "csis-backend"


def _environment(tmp_path, ep):
    """The endpoint's environment without its credentials: the backend's own profile in a
    shared credentials file, nothing else boto3 or terraform could find."""
    creds = tmp_path / "aws-credentials"
    creds.write_text("[%s]\naws_access_key_id = AKIACSISBACKEND00001\naws_secret_access_key = backend-secret\n"
                     % BACKEND_PROFILE)
    config = tmp_path / "aws-config"
    config.write_text("")
    env = {k: v for k, v in ep.env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    return env, {"AWS_SHARED_CREDENTIALS_FILE": str(creds), "AWS_CONFIG_FILE": str(config),
                 "AWS_EC2_METADATA_DISABLED": "true", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}


def test_static_keys_reach_the_storage_check_the_archive_snapshot_and_drift(moto_endpoint, tmp_path):
    ep = moto_endpoint
    tree_id = "csis-keys-%s" % uuid.uuid4().hex[:8]
    root = e2e.make_ebs_tree(str(tmp_path), tree_id, tree_id=tree_id)
    password_file = tmp_path / "vault-pass"
    password_file.write_text(PASSWORD + "\n")
    e2e.vault_runtime_keys(root, str(password_file), KEY_ID, SECRET_KEY)
    backends = os.path.join(root, "cfg", "state-backends.yml")
    text = open(backends, encoding="utf-8").read()
    assert text.count("    region: us-east-2\n") == 1
    with open(backends, "w", encoding="utf-8") as fh:
        fh.write(text.replace("    region: us-east-2\n", "    region: us-east-2\n    profile: %s\n" % BACKEND_PROFILE))
    endpoint_env, extra = _environment(tmp_path, ep)
    # the environment really holds no credentials: boto3 finds none
    import boto3
    os_env = dict(os.environ)
    try:
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            os.environ.pop(k, None)
        os.environ.update({k: v for k, v in extra.items() if v})
        assert boto3.session.Session().get_credentials() is None
    finally:
        os.environ.clear()
        os.environ.update(os_env)
    overlays = [ep.overlay_path, e2e.APPLY_ALL]

    def play(playbook, name):
        run = e2e.run_playbook(playbook, root, endpoint_env, overlays=overlays, env=extra,
                               args=["--vault-password-file", str(password_file)], log=str(tmp_path / name))
        assert run.rc == 0, run.tail()
        assert "Unable to locate credentials" not in run.out
        return run

    play("storage.yml", "create.log")
    old = e2e.meta(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]

    # the volume deleted out of band and one like it made: the state import adopts it into the
    # root's terraform state, whose `terraform import` reads the root's configuration, and so
    # its static keys (TF_VAR_csis_aws_*, from the !vault values, as the plan step gives them)
    ec2 = ep.client("ec2")
    was = ec2.describe_volumes(VolumeIds=[old])["Volumes"][0]
    ec2.delete_volume(VolumeId=old)
    vid = ec2.create_volume(AvailabilityZone=was["AvailabilityZone"], Size=was["Size"], VolumeType=was["VolumeType"],
                            Encrypted=was["Encrypted"])["VolumeId"]
    imported = e2e.run_playbook("state_import.yml", root, endpoint_env, overlays=overlays, env=extra,
                                args=["--vault-password-file", str(password_file)],
                                extra_vars={"import_storage": "mnt_data", "storage_id": vid},
                                log=str(tmp_path / "import.log"))
    assert imported.rc == 0, imported.tail()
    said = " ".join(imported.out.split())   # the YAML callback folds long lines
    assert "imported %s into the terraform state of " % vid in said, imported.tail()
    assert "(after removing %s, gone from the endpoint, from it)" % old in said, imported.tail()
    assert SECRET_KEY not in imported.out

    # archive: the storage check looks the recorded volume up, the transition snapshots it
    storages = os.path.join(root, "storages", "storage0.yaml")
    doc = e2e.read_yaml(storages)
    doc["storages"][0]["state"] = "archived"
    e2e.write_yaml(storages, doc)
    archived = play("storage.yml", "archive.log")
    check = archived.out.split("Check that the recorded storages still exist", 1)[1].split("TASK [", 1)[0]
    assert "ok: [" in check, check  # it ran (a first create skips it: nothing recorded)
    record = e2e.meta(root, "storage-state.yaml")["storages"]["mnt_data"]
    assert record["state"] == "archived", record
    snaps = ec2.describe_snapshots(OwnerIds=["self"], Filters=[
        {"Name": "tag:csis_storage", "Values": ["mnt_data"]}, {"Name": "tag:csis_config", "Values": [tree_id]}])["Snapshots"]
    assert [s["VolumeId"] for s in snaps] == [vid], snaps
    assert ec2.describe_volumes(Filters=[{"Name": "volume-id", "Values": [vid]}])["Volumes"] == []

    # the drift report reaches the runtime too: the archive snapshot found, nothing unavailable
    play("state_query.yml", "state-query.log")
    report = json.load(open(os.path.join(root, "generated", "state-report.json"), encoding="utf-8"))
    assert report["unavailable"] == [], report["unavailable"]
    assert not [d for d in report["drift"] if d.get("name") == "mnt_data"], report["drift"]
