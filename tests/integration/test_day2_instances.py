# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Instance day-2 operations end to end (real terraform, the session's moto server, real
ansible-playbook), on one tree applied once by the fixture; the tests run in order:

* damaged meta-state (issue 16, defect 3), first, on the freshly applied tree: a record cut to
  half its size, then emptied, is refused everywhere (the inventory, ``validate.yml``,
  ``state_query.yml``, a real ``instance_image.yml``) with the file's name and the reason and
  left byte-identical; each test restores the record, so the tree is whole for the next;
* follow: a newer AMI matching the image's name pattern makes the next run replace the
  ``follow`` instance (``-replace``, its volume attachment whitelisted), move its pin and
  advance its hostname generation; the ``pinned`` instance stays;
* an explicit upgrade (``playbooks/upgrade_instance.yml -e instance=<name>``) does the same; its
  ``--check --diff`` before it writes nothing and shows the replacement;
* detach: refused by the gate without an unmount receipt (``DETACH NOT UNMOUNTED``), admitted
  with the unmount step. The unmount goes over SSM to moto, whose ``send_command`` answers
  ``Success`` without running anything: this proves the session path and the receipt, not
  a real unmount (the ``confirm`` path is covered in tests/unit/test_day2_unmount.py);
* decommission: both instances undeclared for one run -> an instance-less root whose plan is
  exactly the pending destroys, whitelisted; the records are forgotten after the apply.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any, List, Tuple

import pytest
import yaml

import e2e
from day2_trees import Runner, make_tree, meta, meta_bytes, register_ami, tail, text, write_yaml

pytestmark = pytest.mark.integration

TAG = "csis-h8-inst"
DASK = "h8inst-dask-pckr"
BASIC = "h8inst-basic-pckr"
RT = "aws-east2-runtime"


def images():
    return [
        {"name": "imgfile-basic-dask", "group": "coops", "name_pattern": DASK, "storage_types": ["ebs", "efs", "s3"],
         "runtimes": [RT], "tests": {"post_bake": ["test -x /usr/bin/env"]}},
        {"name": "imgfile-basic", "group": "stofs", "name_pattern": BASIC, "storage_types": ["efs", "s3"],
         "runtimes": [RT]},
    ]


def instances(mount: bool = True):
    test2 = {"name": "test2", "image": "imgfile-basic-dask", "image_policy": "follow", "tags": {"hype": "test"}}
    if mount:
        test2["storages"] = [{"name": "mnt_data", "mount_point": "/mnt/data"}]
    return [test2, {"name": "test", "image": "imgfile-basic"}]


STORAGES = [{"name": "mnt_data", "mount_point": "/mnt/data", "groups": ["coops"], "state": "active"}]


def ec2_instance(t, iid):
    r = t.moto.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"]
    return r[0]["Instances"][0]


def current(t, name):
    return meta(t.root, "instance-state.yaml")["instances"][name]["current"]


def plans(res):
    return re.findall(r"(instance-image-open-tofu): Plan: (\d+) to add, (\d+) to change, (\d+) to destroy", text(res))


@pytest.fixture(scope="module")
def tree(moto_endpoint, tmp_path_factory):
    t_amis = {"dask1": register_ami(moto_endpoint, DASK + "-1"), "basic1": register_ami(moto_endpoint, BASIC + "-1")}
    root = make_tree(str(tmp_path_factory.mktemp("day2-instances")), TAG, STORAGES, instances(), images=images())
    # the alias pool (meta-state/aliases.txt, hand-appended): each new durable machine takes a name
    os.makedirs(os.path.join(root, "meta-state"), exist_ok=True)
    with open(os.path.join(root, "meta-state", "aliases.txt"), "w", encoding="utf-8") as fh:
        fh.write("# memorable names\ncoops-model\nsage\nbasil\n")
    t = Runner(root, moto_endpoint)
    t.amis = t_amis
    res = t.play("site.yml")
    assert res.returncode == 0, tail(res)
    pins = meta(root, "pins.yaml")["instances"]
    assert pins == {"test2": t_amis["dask1"], "test": t_amis["basic1"]}
    lp = meta(root, "launch-params.yaml")["instances"]
    assert lp["test2"]["hostname"] == "test2-001" and lp["test"]["hostname"] == "test-001"
    assert (lp["test2"]["alias"], lp["test"]["alias"]) == ("coops-model", "sage")
    assert current(t, "test2")["alias"] == "coops-model"
    return t


# ---------------------------------------------------------------- damaged meta-state (issue 16)
# The tree as its first run left it: a record cut short or emptied is refused by every reader
# and never rebuilt. Each test puts the record back, whatever happens, for the tests after it.
INVENTORY_BIN = os.path.join(e2e.VENV_BIN, "ansible-inventory")


def _flat(out: str) -> str:
    """Output with whitespace collapsed (the callback wraps long messages)."""
    return " ".join(out.split())


def _inventory(t) -> subprocess.CompletedProcess:
    source = os.path.join(os.path.dirname(t.root), "hosts.csis.yml")
    if not os.path.exists(source):
        with open(source, "w", encoding="utf-8") as fh:
            yaml.safe_dump({"plugin": "csis.infra.meta_state", "config_root": t.root}, fh)
    env = e2e.run_env({}, {"ANSIBLE_CONFIG": os.path.join(e2e.REPO, "ansible.cfg"),
                           "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "1"})
    return subprocess.run([INVENTORY_BIN, "-i", source, "--list"], cwd=e2e.REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def _damaged_runs(t) -> List[Tuple[str, Any]]:
    over = [t.moto.overlay_path, e2e.APPLY_ALL]
    return [
        ("validate.yml", e2e.run_playbook("validate.yml", t.root, t.moto.env, overlays=over, dry_run=None)),
        ("state_query.yml", e2e.run_playbook("state_query.yml", t.root, t.moto.env, overlays=over, dry_run=None)),
        ("instance_image.yml", e2e.run_playbook("instance_image.yml", t.root, t.moto.env, overlays=over)),
    ]


def _test2_record(root: str) -> Tuple[str, str]:
    """(the path of test2's launch-params record, its name in messages): one file per record (issue 10)."""
    return os.path.join(root, "meta-state", "launch-params", "test2.yaml"), "launch-params/test2.yaml"


def test_the_inventory_lists_the_launched_hosts(tree):
    proc = _inventory(tree)
    assert proc.returncode == 0, proc.stderr
    assert {"test", "test2"} <= set(json.loads(proc.stdout)["_meta"]["hostvars"])


def test_a_launch_params_file_cut_to_half_is_refused_everywhere_and_left_as_it_is(tree):
    path, shown = _test2_record(tree.root)
    with open(path, "rb") as fh:
        whole = fh.read()
    half = whole[:len(whole) // 2]
    with open(path, "wb") as fh:
        fh.write(half)
    before = e2e.meta_state_digest(tree.root)
    reason = "meta-state/%s: is incomplete: it stops at byte %d without its end line" % (shown, len(half))
    try:
        proc = _inventory(tree)
        assert proc.returncode != 0
        assert "csis.infra.meta_state: %s/%s" % (tree.root, reason) in _flat(proc.stderr), proc.stderr
        for playbook, run in _damaged_runs(tree):
            assert run.rc != 0, (playbook, run.tail())
            out = _flat(run.out)
            assert reason in out, (playbook, run.tail())
            assert "is valid" not in out and "foreign" not in out, (playbook, run.tail())
            assert "terraform apply" not in out and "Apply complete" not in out, (playbook, run.tail())
            assert e2e.meta_state_digest(tree.root) == before, playbook
        with open(path, "rb") as fh:
            assert fh.read() == half
    finally:
        with open(path, "wb") as fh:
            fh.write(whole)
    proc = _inventory(tree)
    assert proc.returncode == 0 and "test2" in json.loads(proc.stdout)["_meta"]["hostvars"], proc.stderr


def test_an_emptied_file_is_no_empty_inventory(tree):
    path, shown = _test2_record(tree.root)
    with open(path, "rb") as fh:
        whole = fh.read()
    with open(path, "wb"):
        pass
    try:
        proc = _inventory(tree)
        assert proc.returncode != 0
        assert "%s/meta-state/%s: is empty (0 bytes), but csis.infra never writes an empty meta-state file" % (
            tree.root, shown) in _flat(proc.stderr), proc.stderr
        assert os.path.getsize(path) == 0
    finally:
        with open(path, "wb") as fh:
            fh.write(whole)


# ---------------------------------------------------------------- instance day-2 operations
def test_follow_replaces_onto_the_new_head_and_pinned_stays(tree):
    old2, old1 = current(tree, "test2")["instance_id"], current(tree, "test")["instance_id"]
    tree.amis["dask2"] = register_ami(tree.moto, DASK + "-2")
    tree.amis["basic2"] = register_ami(tree.moto, BASIC + "-2")
    # (a dry run with a moved head writes nothing either: pins move only in the record after an apply,
    # and dry runs reach no record: test_lifecycle_e2e.py::test_dry_run_plans_nothing)
    res = tree.play("instance_image.yml")
    assert res.returncode == 0, tail(res)
    out = text(res)
    assert "replacing module.instance_test2.aws_instance.this" in out
    assert "module.instance_test2.aws_volume_attachment.this" in out  # whitelisted by the replacement
    # the machine was stopped before the apply detached its volume (no DetachVolume under a mounted filesystem)
    assert re.search(r"Stop the machines whose volumes the apply detaches as it destroys them\] \*+\n(?:[^\n]*\n)?"
                     r"changed: \[csis-instance-image-open-tofu\]", res.stdout), tail(res)
    # a follow moves a pin, binds none: the render already named the new AMI, so the root is not rendered again
    assert re.search(r"Render the root again, naming the AMI its launch pinned\] \*+\n(?:[^\n]*\n)?skipping: ",
                     res.stdout), tail(res)
    cur2 = current(tree, "test2")
    assert cur2["instance_id"] != old2 and cur2["number"] == 2 and cur2["ami_id"] == tree.amis["dask2"]
    assert ec2_instance(tree, cur2["instance_id"])["ImageId"] == tree.amis["dask2"]
    assert ec2_instance(tree, old2)["State"]["Name"] in ("terminated", "shutting-down")
    pins = meta(tree.root, "pins.yaml")
    assert pins["instances"]["test2"] == tree.amis["dask2"]
    assert pins["upgrades"][-1]["op"] == "follow" and pins["upgrades"][-1]["name"] == "test2"
    lp = meta(tree.root, "launch-params.yaml")["instances"]
    assert lp["test2"]["hostname"] == "test2-002" and lp["test2"]["build"] == tree.amis["dask2"]
    hist = meta(tree.root, "instance-state.yaml")["instances"]["test2"]["history"]
    assert hist[-1]["why"] == "replaced" and hist[-1]["instance_id"] == old2
    # the new generation takes the next free name; the replaced machine's alias is retired with it
    assert hist[-1]["alias"] == "coops-model" and lp["test2"]["alias"] == cur2["alias"] == "basil"
    assert lp["test"]["alias"] == "sage"  # a standing machine keeps its alias
    # the new machine wears the volume
    vid = meta(tree.root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    vol = tree.moto.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"][0]
    assert [a["InstanceId"] for a in vol["Attachments"]] == [cur2["instance_id"]]
    # meta-state records the tree's tag the new machine and the volume really carry (validate compares the
    # tree's name with it): read from the applied state, the same as EC2 reports
    tags = {t["Key"]: t["Value"] for t in ec2_instance(tree, cur2["instance_id"]).get("Tags") or []}
    assert cur2["csis_config"] == tags["csis_config"] and tags["csis_config"]
    vol_tags = {t["Key"]: t["Value"] for t in vol.get("Tags") or []}
    assert meta(tree.root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["csis_config"] == vol_tags["csis_config"]
    # pinned: untouched although a newer head exists
    assert current(tree, "test")["instance_id"] == old1 and pins["instances"]["test"] == tree.amis["basic1"]
    assert lp["test"]["hostname"] == "test-001"


def test_an_explicit_upgrade_replaces_a_pinned_instance(tree):
    old = current(tree, "test")["instance_id"]
    # a build that cannot be the instance's is refused before any marker: a typo (the replacement is
    # delete-then-create: the apply would terminate the machine, then fail to launch its successor),
    # and another image's build
    before = meta_bytes(tree.root)
    res = tree.play("upgrade_instance.yml", instance="test", to="ami-0deadbeef0000000")
    assert res.returncode != 0, tail(res)
    assert ("instance 'test': there is no AMI ami-0deadbeef0000000 on runtime %s (region us-east-2): replaced onto "
            "it, the machine would be terminated and its successor never launched; not marked" % RT) in text(res), tail(res)
    res = tree.play("upgrade_instance.yml", instance="test", to=tree.amis["dask2"])
    assert res.returncode != 0, tail(res)
    assert ("instance 'test': AMI %s is '%s-2', not a build of its image 'imgfile-basic'"
            % (tree.amis["dask2"], DASK)) in text(res).replace("''", "'"), tail(res)
    assert "Render the instance-image roots" not in res.stdout
    assert meta_bytes(tree.root) == before and current(tree, "test")["instance_id"] == old
    # --check --diff first: no marker written, nothing else changed, and the render shows the
    # replacement the marker asks for (the head's AMI, the next hostname, the -replace of a real run)
    before = meta_bytes(tree.root)
    res = tree.play("upgrade_instance.yml", instance="test", args=("--check", "--diff"))
    assert res.returncode == 0, tail(res)
    out = text(res)
    assert "test: check mode: the marker is not written; the lifecycle below renders as if it were" in out, tail(res)
    assert "instance-image-open-tofu: check mode: rendered in memory only" in out
    assert "a real run would plan -replace=module.instance_test.aws_instance.this" in out, tail(res)
    assert '+ ami_id = "%s"' % tree.amis["basic2"] in out and "test-002" in out, tail(res)
    assert meta_bytes(tree.root) == before
    assert current(tree, "test")["instance_id"] == old
    res = tree.play("upgrade_instance.yml", instance="test")
    assert res.returncode == 0, tail(res)
    assert "replacing module.instance_test.aws_instance.this" in text(res)
    cur = current(tree, "test")
    assert cur["instance_id"] != old and cur["number"] == 2 and cur["ami_id"] == tree.amis["basic2"]
    pins = meta(tree.root, "pins.yaml")
    assert pins["instances"]["test"] == tree.amis["basic2"] and pins["pending_replacements"] == {}
    assert meta(tree.root, "launch-params.yaml")["instances"]["test"]["hostname"] == "test-002"
    # and the follow instance did not move again
    assert current(tree, "test2")["number"] == 2
    # once more, in check mode: test runs its image's series head already, so the upgrade would be a new
    # machine on the same build; said (a re-provision is no error), nothing written
    before = meta_bytes(tree.root)
    res = tree.play("upgrade_instance.yml", instance="test", args=("--check",))
    assert res.returncode == 0, tail(res)
    assert ("instance 'test' runs %s already, its image's series head: the upgrade replaces the machine onto the same "
            "build" % tree.amis["basic2"]) in text(res), tail(res)
    assert meta_bytes(tree.root) == before


def test_a_detach_without_unmount_receipt_is_refused(tree):
    write_yaml(tree.root, "instances/instances.yaml", {"instances": instances(mount=False)})
    before = meta_bytes(tree.root)
    res = tree.play("instance_image.yml", csis_unmount_mode="skip")
    assert res.returncode != 0
    assert "DETACH NOT UNMOUNTED: test2:mnt_data has no successful unmount receipt" in text(res)
    assert meta_bytes(tree.root) == before
    vid = meta(tree.root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    vol = tree.moto.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"][0]
    assert len(vol["Attachments"]) == 1


def test_a_detach_with_the_unmount_step_is_admitted(tree):
    res = tree.play("instance_image.yml")
    assert res.returncode == 0, tail(res)
    d = os.path.join(tree.root, "generated/instance-image/open-tofu/instance-generation/unmount-receipts")
    with open(os.path.join(d, "test2__mnt_data.json"), encoding="utf-8") as fh:
        receipt = json.load(fh)
    assert receipt["ok"] is True and receipt["method"] == "session" and receipt["session"] == "ssm"
    assert receipt["instance_id"] == current(tree, "test2")["instance_id"]
    assert receipt["mount_point"] == "/mnt/data" and receipt["exit_status"] == 0
    vid = meta(tree.root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    vol = tree.moto.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"][0]
    assert vol["Attachments"] == []
    lp = meta(tree.root, "launch-params.yaml")["instances"]["test2"]
    assert lp["mounts"] == [] and lp["launched"] is True and lp["hostname"] == "test2-002"
    assert meta(tree.root, "storage.yaml")["storages"]["mnt_data"]["attachments"] == []


def test_decommission_through_an_instance_less_root(tree):
    ids = {n: current(tree, n)["instance_id"] for n in ("test", "test2")}
    # (with the apply flag off a decommission is planned and gated only, and nothing is forgotten: the
    # record runs only after an apply, as for every root: test_day2_storage.py, test_unapplied_upstream.py)
    res = tree.play("instance_image.yml", csis_undeclare=["test", "test2"])
    assert res.returncode == 0, tail(res)
    p = plans(res)
    assert p and p[0][1] == "0" and p[0][2] == "0" and int(p[0][3]) >= 2, p
    root_tf = os.path.join(tree.root, "generated/instance-image/open-tofu/instance-generation")
    assert not [f for f in os.listdir(root_tf) if f.startswith("open-tofu-instance-generation-instance-")]
    for n, iid in ids.items():
        assert ec2_instance(tree, iid)["State"]["Name"] in ("terminated", "shutting-down")
    assert meta(tree.root, "launch-params.yaml")["instances"] == {}
    assert meta(tree.root, "pins.yaml")["instances"] == {}
    ist = meta(tree.root, "instance-state.yaml")["instances"]
    assert ist["test2"]["current"] is None and ist["test2"]["history"][-1]["why"] == "decommission"
    # forget: nothing is left to forget (the apply closed the records), and it says so (not "nothing
    # is recorded": the generation history stays)
    before = meta(tree.root, "instance-state.yaml")
    res = tree.play("forget.yml", overlays=(), forget_instance="test2")
    assert res.returncode == 0, tail(res)
    assert "was closed as decommission in run" in text(res) and "so there is nothing to forget" in text(res), tail(res)
    assert meta(tree.root, "instance-state.yaml") == before
