# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The lifecycles end to end: real ansible-playbook, real terraform and provider, the
session's moto server (issue 4, "Tests that must exist").

``site``: a copy of ``examples/`` run through the README's ``scripts/demo`` (``site.yml``:
identity, storage, instance-image) ONCE per module: what exists, what is recorded, a no-op
re-run, a dry run; then, on the same tree, the drift report (``state_query.yml``,
``forget.yml``, ``state_import.yml``) with reality changed behind the system's back: one
applied example tree for both (issue 12: an applied tree is the costliest part of a test).
The refusals and failures of one root run on the one-EBS tree in ``test_lifecycle_ebs_e2e.py``
(its own file, so both trees run at once on two workers).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from types import SimpleNamespace
from typing import Any, Dict, List

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402
from day2_trees import Runner, text  # noqa: E402

pytestmark = e2e.needs_terraform()

NOOP = "Plan: 0 to add, 0 to change, 0 to destroy"
REPO = e2e.REPO
PLAYBOOK = e2e.PLAYBOOK_BIN


def overlays(ep, *more):
    return [ep.overlay_path, e2e.APPLY_ALL] + list(more)


def volume(ep, vid):
    return ep.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"][0]


# ====================================================================== the example tree
@pytest.fixture(scope="module")
def site(moto_endpoint, tmp_path_factory):
    """The README's first command, ``scripts/demo``, exactly as a user runs it (its copy of the
    example tree in a temporary directory, the session's endpoint)."""
    parent = str(tmp_path_factory.mktemp("site"))
    before = e2e.checkout_fingerprint()
    run = e2e.run_demo(parent, moto_endpoint.env, moto_endpoint.state_dir, log=os.path.join(parent, "site-1.log"))
    assert run.rc == 0, run.tail()
    root = os.path.join(parent, "examples")
    return SimpleNamespace(root=root, parent=parent, run=run, checkout_before=before,
                           checkout_after=e2e.checkout_fingerprint())


def test_the_demo_works_on_a_copy_and_leaves_the_checkout_as_it_was(site):
    """scripts/demo then scripts/test, the README's order: the demo must not write into the
    checkout (examples/ above all: the golden render test renders it)."""
    assert "copied examples/ to %s" % site.root in site.run.out
    assert "The demo's tree is %s" % site.root in site.run.out
    assert site.checkout_after == site.checkout_before
    assert os.path.isdir(os.path.join(site.root, "meta-state"))
    # a first run that warns about nothing: Ansible's warnings (a missing inventory, a deprecated
    # dependency, a module's notice) would be the first thing a new user reads
    warnings = [line for line in site.run.out.splitlines() if line.startswith(("[WARNING]", "[DEPRECATION WARNING]"))
                or "Warning:" in line]
    assert warnings == [], warnings
    # its last lines, summary.yml's read-back, are text, not Python lists and mappings
    flat = " ".join(site.run.out.split())
    assert "access points /coops, /stofs, 2 mount target(s)" in flat, site.run.tail()
    assert "(storage default-bucket): 1 lifecycle rule(s), tags BillingCode=CSIS-0001, " in flat, site.run.tail()


def test_site_applies_the_example_tree(site, moto_endpoint):
    ep, root = moto_endpoint, site.root
    # the instance root, rendered once more after its launch, names the AMI the launch pinned
    pins = e2e.meta(root, "pins.yaml")["instances"]
    assert set(pins) == {"test", "test2"}, pins
    changed = e2e.changed_tasks(site.run.out)
    assert "csis.infra.tofu_root : Render the root again, naming the AMI its launch pinned " \
        "-> csis-instance-image-open-tofu" in changed, changed
    inst_dir = os.path.join(root, "generated", "instance-image", "open-tofu", "instance-generation")
    for name in ("test", "test2"):
        with open(os.path.join(inst_dir, "open-tofu-instance-generation-instance-%s.tf" % name), encoding="utf-8") as fh:
            hcl = fh.read()
        assert re.search(r'\n  ami_id += "%s"\n' % re.escape(pins[name]), hcl), hcl
        assert "ami_name_pattern" not in hcl, hcl
    plans = e2e.plan_summaries(site.run.out)
    assert set(plans) == {"identity-posix-groups", "storage-aws-ebs", "storage-aws-efs", "storage-aws-s3",
                          "instance-image-open-tofu"}, plans
    # the run summary (generated/run-summary.json), written root by root, shown by summary.yml
    with open(os.path.join(root, "generated", "run-summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    assert set(summary["roots"]) == set(plans), summary
    for key, entry in summary["roots"].items():
        assert entry["status"] == "ok" and entry["applied"] is True, (key, entry)
        assert entry["gate"]["verdict"] == "passed" and entry["plan"].startswith("Plan: "), (key, entry)
        assert entry["seconds"] > 0 and entry["started"] <= entry["finished"], (key, entry)
        # the apply's own time, apart from the root's pass (which waits for its siblings' steps)
        assert 0 <= entry["apply_seconds"] < entry["seconds"], (key, entry)
    assert summary["totals"] == {"roots": 5, "applied": 5, "failed": 0, "refused": 0, "stopped": 0}
    # the EBS volume's apply is not the S3 lifecycle configuration's (the provider's 55 s wait)
    storage = summary["roots"]
    assert storage["storage-aws-ebs"]["apply_seconds"] < storage["storage-aws-s3"]["apply_seconds"], storage
    # summary.yml (the demo's last step) prints it; the callback wraps long lines
    assert "5 root(s), 5 applied, 0 failed, 0 refused by the gate" in " ".join(site.run.out.split())
    # the render says what it rendered in lines, one per root directory (no Python list)
    assert re.search(r"msg:\n    - 'storage: 3 root\(s\)'\n    - %s/generated/storage/aws-\w+/storage-generation\n"
                     % re.escape(root), site.run.out), site.run.tail()
    ec2, efs, s3 = ep.client("ec2"), ep.client("efs"), ep.client("s3")

    # the instances: ids from the instance root's state, compared with the endpoint and meta-state
    state = e2e.tf_state_pull(os.path.join(root, "generated", "instance-image", "open-tofu", "instance-generation"),
                              ep.env)
    by_module = {r["module"]: r["instances"][0]["attributes"]["id"] for r in state["resources"]
                 if r.get("type") == "aws_instance" and r.get("mode") == "managed"}
    assert set(by_module) == {"module.instance_test", "module.instance_test2"}
    real = {i["InstanceId"]: i for res in ec2.describe_instances(InstanceIds=list(by_module.values()))["Reservations"]
            for i in res["Instances"]}
    assert all(i["State"]["Name"] == "running" for i in real.values())

    storage_state = e2e.meta(root, "storage-state.yaml")["storages"]
    vid = storage_state["mnt_data"]["facts"]["volume_id"]
    test2 = real[by_module["module.instance_test2"]]
    devices = {b["DeviceName"]: b["Ebs"]["VolumeId"] for b in test2["BlockDeviceMappings"]}
    assert devices.get("/dev/xvdf") == vid, devices
    vol = volume(ep, vid)
    assert [(a["InstanceId"], a["Device"]) for a in vol["Attachments"]] == [(test2["InstanceId"], "/dev/xvdf")]
    assert vol["Size"] == 100 and vol["AvailabilityZone"] == "us-east-2a"

    # EFS: access points per group, mount targets
    fs_id = storage_state["efs-storage"]["facts"]["file_system_id"]
    aps = efs.describe_access_points(FileSystemId=fs_id)["AccessPoints"]
    groups = {t["Value"] for ap in aps for t in ap.get("Tags", []) if t["Key"] == "csis:group"}
    assert groups == {"coops", "stofs"}, aps
    assert efs.describe_mount_targets(FileSystemId=fs_id)["MountTargets"]

    # S3: lifecycle rule and tags
    bucket = "csis-example-default-bucket"
    rules = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    transitions = [t for r in rules if r["Status"] == "Enabled" for t in r.get("Transitions", [])]
    seen = [{"Days": t.get("Days"), "StorageClass": t["StorageClass"]} for t in transitions]
    assert {"Days": 30, "StorageClass": "STANDARD_IA"} in seen, rules
    tags = {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=bucket)["TagSet"]}
    assert tags.get("env") == "production" and tags.get("team") == "devops", tags

    # state: S3 objects for the S3-backed roots, a local file for identity
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=ep.state_bucket, Prefix="statefiles/csis-example/")
            .get("Contents", [])}
    for k in ("aws_ebs", "aws_efs", "aws_s3"):
        assert "statefiles/csis-example/%s.tfstate" % k in keys, keys
    assert len([k for k in keys if k.endswith(".tfstate")]) == 4, keys
    assert not [k for k in keys if k.endswith(".tflock")], keys
    assert os.path.getsize(os.path.join(root, "state", "posix_groups.tfstate")) > 0

    # meta-state matches reality
    launch = e2e.meta(root, "launch-params.yaml")["instances"]
    assert launch["test"]["launched"] is True and launch["test2"]["launched"] is True
    inst = e2e.meta(root, "instance-state.yaml")["instances"]
    assert inst["test"]["current"]["instance_id"] == by_module["module.instance_test"]
    assert inst["test2"]["current"]["instance_id"] == by_module["module.instance_test2"]
    assert inst["test2"]["current"]["private_ip"] == test2["PrivateIpAddress"]
    assert storage_state["mnt_data"]["state"] == "active"
    assert storage_state["efs-storage"]["state"] == "active"
    assert storage_state["default-bucket"]["state"] == "active"
    assert storage_state["mnt_data"]["facts"]["size"] == 100
    assert set(e2e.meta(root, "pins.yaml")["instances"]) == {"test", "test2"}
    # every applied root's plan was receipted and its approval recorded: the OS user, auto-approve
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply import approvals
    for key in plans:
        receipts = approvals.receipts_of(root, key)
        assert len(receipts) == 1, (key, receipts)
        receipt = list(receipts.values())[0]
        assert receipt["requested_by"] == approvals.os_user() and receipt["summary"].startswith("Plan: "), receipt
        assert [(a["approved_by"], a["method"]) for a in receipt["approvals"]] == [(approvals.os_user(), "auto-approve")]
    # the approver saw every address: the volume's creation and its size
    assert re.search(r"\+ module\.\S+\.aws_ebs_volume\.this: create", site.run.out), site.run.tail()


RENDER_CHECK = textwrap.dedent("""\
    - hosts: localhost
      connection: local
      gather_facts: false
      tasks:
        - name: what a render would change now (check mode)
          csis.infra.csis_render:
            config_root: "{{ csis_config_root }}"
            lifecycle: [identity, storage, instance-image]
            dry_run: false
            overlays: "{{ csis_overlays }}"
          check_mode: true
          register: rendered
        - ansible.builtin.copy:
            dest: "{{ result_file }}"
            content: "{{ rendered | to_json }}"
""")


def test_rerun_changes_nothing(site, moto_endpoint):
    ep, root = moto_endpoint, site.root
    before = e2e.meta_state_digest(root, with_state_dir=True)
    # two forks: the storage lifecycle's three roots are more than Ansible runs at once, which
    # the render says (the identity and instance-image lifecycles have one root each)
    run = e2e.run_playbook("site.yml", root, ep.env, overlays=overlays(ep), log=os.path.join(site.parent, "site-2.log"),
                           args=["--forks", "2"])
    assert run.rc == 0, run.tail()
    plans = e2e.plan_summaries(run.out)
    assert len(plans) == 5 and set(plans.values()) == {NOOP}, plans
    flat = " ".join(run.out.split())
    assert flat.count("Ansible runs 2 forks") == 1, flat
    assert "3 roots, and Ansible runs 2 forks: the roots are planned and applied 2 at a time" in flat, flat
    counts = e2e.recap(run.out)
    assert {h: c["changed"] for h, c in counts.items() if h.startswith("csis-")} == \
        {h: 0 for h in counts if h.startswith("csis-")}, counts
    # no task of the re-run changed anything: the first run's record step rendered the instance
    # root once more with the AMI its launch pinned (the first render named the image's
    # pattern), so the re-run's render finds every root as it renders it
    assert e2e.changed_tasks(run.out) == [], e2e.changed_tasks(run.out)
    assert e2e.meta_state_digest(root, with_state_dir=True) == before
    # nothing to apply: the steps from the approval to the apply (tofu_root tasks/apply.yml) are
    # skipped whole, and the run summary says no root applied anything
    assert "Re-read the apply flags" not in run.out and "Start the apply" not in run.out
    with open(os.path.join(root, "generated", "run-summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    assert summary["totals"] == {"roots": 5, "applied": 0, "failed": 0, "refused": 0, "stopped": 0}, summary
    assert all(e["applied"] is False and e["status"] == "ok" and "apply_seconds" not in e
               for e in summary["roots"].values()), summary

    pb = os.path.join(site.parent, "render-check.yml")
    result = os.path.join(site.parent, "render-check.json")
    with open(pb, "w", encoding="utf-8") as fh:
        fh.write(RENDER_CHECK)
    check = e2e.run_playbook(pb, root, ep.env, overlays=overlays(ep), extra_vars={"result_file": result})
    assert check.rc == 0, check.tail()
    rendered = json.load(open(result, encoding="utf-8"))
    assert rendered["changed"] is False, [r for r in rendered["roots"] if r.get("changed")]


def test_dry_run_plans_nothing(site, moto_endpoint):
    ep, root = moto_endpoint, site.root
    before = e2e.meta_state_digest(root, with_state_dir=True)
    run = e2e.run_playbook("site.yml", root, ep.env, overlays=overlays(ep), dry_run=None)
    assert run.rc == 0, run.tail()
    assert "dry run: nothing is planned or applied" in run.out
    assert set(e2e.recap(run.out)) == {"localhost"}, e2e.recap(run.out)   # no root host: nothing planned
    assert "Plan to a plan file" not in run.out
    # the dry run, the playbooks' default, warns about nothing: each lifecycle's second play
    # (its roots) has no host to run on and is skipped without Ansible's "Could not match
    # supplied host pattern" warning
    assert run.out.count("skipping: no hosts matched") == 3, run.tail()
    warnings = [line for line in run.out.splitlines() if line.startswith(("[WARNING]", "[DEPRECATION WARNING]"))]
    assert warnings == [], warnings
    # ... but it lists what a real run would execute per root (the manual's deferred commands)
    for key in ("identity-", "storage-aws-ebs", "instance-image-"):
        assert re.search(r"%s[\w.-]* would run:" % re.escape(key), run.out), key
    assert "plan -input=false -detailed-exitcode -out=tfplan" in run.out and "csis_gate_plan tfplan" in run.out
    assert e2e.meta_state_digest(root, with_state_dir=True) == before
    # the first render (identity) validated every later root beside its own (csis_render_prepare_ahead):
    # the storage and instance-image renders after it found theirs validated and name none
    flat = " ".join(run.out.split())
    ahead = re.findall(r"validated ahead with them: ([\w, -]+)", flat)
    assert len(ahead) == 1, ahead
    following = {"storage-aws-ebs", "storage-aws-efs", "storage-aws-s3", "instance-image-open-tofu"}
    assert set(ahead[0].split(", ")) == following, ahead


# ====================================================================== the drift report on it
# The drift report end to end on the same tree, after the tests above: reality is changed behind
# the system's back with boto3 and state_query.yml / forget.yml / state_import.yml / site.yml run
# for real (docs/drift.md). These come last: they delete, forget and import. The tree's id,
# csis-example, is the demo tree's alone on the session's endpoint (every other tree a test
# applies has its own: tests/support/e2e.py, make_ebs_tree), so nothing of another test can look
# foreign here.
TAG = "csis-example"
BUCKET = "csis-example-default-bucket"


class Tree(Runner):
    """The drift tests' runner: day2_trees' environment; plays without its apply defaults."""

    def __init__(self, root: str, moto: Any, tmp: str) -> None:
        super().__init__(root, moto)
        self.tmp = tmp

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


def _lines(report: Dict[str, Any]) -> List[tuple]:
    return sorted((d["drift"], d["kind"], d["name"]) for d in report["drift"])


@pytest.fixture(scope="module")
def drift(site, moto_endpoint):
    """The demo's tree, as the tests above leave it (applied, re-run, dry run)."""
    t = Tree(site.root, moto_endpoint, site.parent)
    st = t.meta("storage-state.yaml")["storages"]
    assert st["mnt_data"]["state"] == "active" and st["mnt_data"]["facts"]["volume_id"].startswith("vol-")
    return t


def test_a_clean_tree_reports_no_drift(drift):
    rep = drift.query()
    assert rep["drift"] == [] and rep["unavailable"] == [], rep
    assert rep["tree"] == TAG
    vid = drift.meta("storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    assert rep["reality"]["storages"]["mnt_data"]["present"] is True
    assert rep["reality"]["storages"]["mnt_data"]["id"] == vid
    assert rep["reality"]["storages"]["default-bucket"]["id"] == BUCKET
    assert rep["reality"]["instances"]["test2"]["present"] is True
    assert rep["summary"]["hard"] == 0


def test_a_bucket_with_the_trees_tags_but_no_record_is_foreign(drift):
    s3 = drift.moto.client("s3")
    name = "csis-drift-stray-bucket"
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": drift.moto.region})
    s3.put_bucket_tagging(Bucket=name, Tagging={"TagSet": [{"Key": "csis_config", "Value": TAG}]})
    try:
        rep = drift.query()
        assert _lines(rep) == [("foreign", "storage", name)], rep["drift"]
        assert rep["drift"][0]["detail"] == ("bucket %s (tagged csis_config=%s) exists but meta-state has no record "
                                             "of it (and it is not in the YAML)" % (name, TAG))
        assert rep["summary"]["foreign"] == 1 and rep["summary"]["hard"] == 0
    finally:
        s3.delete_bucket(Bucket=name)


def test_a_second_volume_with_the_same_name_is_foreign_and_the_managed_one_is_found_by_id(drift):
    ec2 = drift.moto.client("ec2")
    managed = drift.meta("storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    orphan = ec2.create_volume(AvailabilityZone="us-east-2a", Size=1, TagSpecifications=[{
        "ResourceType": "volume", "Tags": [{"Key": "Name", "Value": "mnt_data"}, {"Key": "csis_config", "Value": TAG}]}])
    try:
        rep = drift.query()
        assert _lines(rep) == [("foreign", "storage", "mnt_data")], rep["drift"]
        detail = rep["drift"][0]["detail"]
        assert orphan["VolumeId"] in detail and detail.endswith("the managed volume of storage mnt_data is %s" % managed)
        assert rep["reality"]["storages"]["mnt_data"]["id"] == managed
        assert rep["reality"]["storages"]["mnt_data"]["state"] == "in-use"  # the attached one, not the orphan
    finally:
        ec2.delete_volume(VolumeId=orphan["VolumeId"])


def test_an_endpoint_that_is_down_gives_unavailable_lines_not_missing(drift):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = os.path.join(drift.tmp, "down.yml")
    with open(down, "w", encoding="utf-8") as fh:
        fh.write("runtime_builders:\n  - name: aws-east2-runtime\n    endpoints: {url: \"http://127.0.0.1:%d\"}\n" % port)
    res = drift.play("state_query.yml", [down])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    rep = drift.report()
    assert rep["drift"] == [], rep["drift"]
    assert rep["summary"]["missing"] == 0 and rep["summary"]["hard"] == 0
    joined = "\n".join(rep["unavailable"])
    for what in ("storage mnt_data:", "storage efs-storage:", "storage default-bucket:", "instance test2:",
                 "instance test:", "foreign volume scan"):
        assert what in joined, (what, rep["unavailable"])
    assert "127.0.0.1:%d" % port in joined
    assert all(v["present"] is None for v in rep["reality"]["storages"].values())
    assert "unavailable: storage mnt_data:" in text(res)
    # the AWX drift job's setting: a query that could not look is not green
    res = drift.play("state_query.yml", [down], csis_state_fail_on_unavailable=True)
    assert res.returncode != 0
    assert ("the state query could not look %d thing(s) up, so the report cannot say whether they drifted"
            % len(rep["unavailable"])) in text(res), res.stdout[-4000:]
    assert "127.0.0.1:%d" % port in text(res)


def test_a_deleted_volume_is_missing_hard_and_stops_the_next_run_until_corrected(drift):
    ec2 = drift.moto.client("ec2")
    managed = drift.meta("storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    att = ec2.describe_volumes(VolumeIds=[managed])["Volumes"][0]["Attachments"][0]
    ec2.detach_volume(VolumeId=managed, InstanceId=att["InstanceId"], Device=att["Device"], Force=True)
    ec2.delete_volume(VolumeId=managed)

    rep = drift.query()
    assert _lines(rep) == [("missing", "storage", "mnt_data")], rep["drift"]
    line = rep["drift"][0]
    assert line["hard"] is True
    assert line["detail"] == "recorded active but not found in reality (volume %s)" % managed
    message = ("state: missing storage mnt_data: recorded active but not found in reality (volume %s) "
               "(from state-report.json; re-run 'state query' after fixing)" % managed)

    # the next real run refuses to start, with the reference's message
    res = drift.play("site.yml", ["overlays/apply-all.yml"], csis_dry_run=False, csis_auto_approve=True)
    assert res.returncode != 0
    assert message in text(res), res.stdout[-4000:] + res.stderr[-2000:]
    assert "TASK [csis.infra.render : Render the identity roots]" not in res.stdout
    # (a dry run is not refused, it warns: test_two_checkouts_e2e.py; an import of an id the endpoint does
    # not know is refused: tests/unit/test_stateops.py)

    # state import records an existing volume
    new = ec2.create_volume(AvailabilityZone="us-east-2a", Size=100)["VolumeId"]
    res = drift.play("state_import.yml", import_storage="mnt_data", storage_id=new)
    assert res.returncode == 0, res.stdout[-4000:]
    rec = drift.meta("storage-state.yaml")["storages"]["mnt_data"]
    assert rec["state"] == "active" and rec["facts"]["volume_id"] == new and rec["facts"]["size"] == 100
    assert rec["history"][-1]["action"] == "import"
    rep = drift.report()  # the playbook queried again
    assert rep["summary"]["hard"] == 0 and rep["drift"] == [], rep["drift"]
    assert rep["reality"]["storages"]["mnt_data"]["id"] == new

    # the record is corrected: what a real run checks first (csis_preflight, above) finds nothing now
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.preflight import preflight
    assert preflight(drift.root, write=False)["hard_drift"] == []

    # forget, confirmed, drops a storage whose volume still exists (refused unconfirmed, and forgetting it
    # again changes nothing: test_forget_an_instance_refuses_while_the_machine_exists below, through the
    # same playbook, and tests/unit/test_stateops.py for a storage)
    res = drift.play("forget.yml", forget_storage="mnt_data", confirm=True)
    assert res.returncode == 0, res.stdout[-4000:]
    assert "mnt_data" not in drift.meta("storage-state.yaml")["storages"]
    assert "mnt_data" not in drift.meta("storage.yaml")["storages"]
    assert drift.report()["drift"] == []
    ec2.delete_volume(VolumeId=new)


def test_forget_an_instance_refuses_while_the_machine_exists(drift):
    iid = drift.meta("instance-state.yaml")["instances"]["test"]["current"]["instance_id"]
    res = drift.play("forget.yml", forget_instance="test")
    assert res.returncode != 0 and "the machine %s still exists" % iid in text(res), res.stdout[-3000:]
    assert "test" in drift.meta("launch-params.yaml")["instances"]
    res = drift.play("forget.yml", forget_instance="test", confirm=True)
    assert res.returncode == 0, res.stdout[-4000:]
    assert "test" not in drift.meta("launch-params.yaml")["instances"]
    assert "test" not in drift.meta("pins.yaml")["instances"]
    state = drift.meta("instance-state.yaml")["instances"]["test"]
    assert state["current"] is None and state["history"][-1]["why"] == "forgotten"
    # the machine is still tagged with the tree's tag: now it is foreign
    rep = drift.report()
    assert ("foreign", "instance", "test") in _lines(rep), rep["drift"]
    assert rep["summary"]["hard"] == 0
    # forgetting it again changes nothing (idempotent, as an AWX job's retry would; a misspelt name still fails:
    # tests/unit/test_stateops.py)
    res = drift.play("forget.yml", forget_instance="test")
    assert res.returncode == 0 and "already forgotten (run " in text(res), res.stdout[-3000:]
    assert not [t for t in e2e.changed_tasks(res.stdout) if t.startswith("Forget instance")], res.stdout[-3000:]


def test_an_import_into_a_root_rendered_after_the_storage_was_declared_installs_its_module(drift):
    """A storage declared after its root's last real run, and rendered there by a dry run (which
    installs nothing: terraform would say "Module not installed"): the state import installs the
    module and imports (once the state lock a gone run left is released), and the next real run
    plans no create of it. (A root whose files do not declare the storage, or not initialised at
    all, is rendered and initialised by the import first: test_two_checkouts_e2e.py.)"""
    storages = os.path.join(drift.root, "storages", "storage0.yaml")
    doc = e2e.read_yaml(storages)
    doc["storages"].append({"name": "p2", "mount_point": "/mnt/p2", "groups": ["coops"], "state": "active"})
    e2e.write_yaml(storages, doc)
    directory = os.path.join(drift.root, "generated", "storage", "aws-ebs", "storage-generation")
    # as the storage declares it (an unencrypted one, or another zone, would be planned as a replacement,
    # which the gate refuses: docs/drift.md)
    vid = drift.moto.client("ec2").create_volume(AvailabilityZone="us-east-2a", Size=100, VolumeType="gp3",
                                                 Encrypted=True)["VolumeId"]

    res = drift.play("storage.yml")  # a dry run renders the module call; the root's init is untouched
    assert res.returncode == 0, res.stdout[-4000:]
    # the root's state is locked by a run on another machine (a killed AWX job's: its container gone):
    # the import refuses before it touches the root, naming the lock's ID and how to release it
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply.statelock import lock_key
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState, audit_trail
    from ansible_collections.csis.infra.plugins.module_utils.csis.tfstate import backend_of

    bucket, key = lock_key(backend_of(directory))
    lock_id = str(uuid.uuid4())
    s3 = drift.moto.client("s3")
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps({
        "ID": lock_id, "Operation": "OperationTypeApply", "Info": "", "Who": "runner@awx-ee-7f9c", "Version": "1.11.0",
        "Created": "2026-12-07T01:00:00.000000000Z", "Path": "%s/%s" % (bucket, key[:-len(".tflock")])}).encode())
    before = drift.meta("storage-state.yaml")
    # (csis_force_unlock as the "csis state import" AWX job template's survey passes a blank answer: null)
    res = drift.play("state_import.yml", import_storage="p2", storage_id=vid, csis_force_unlock=None)
    flat = " ".join(text(res).split())
    assert res.returncode != 0 and "STATE LOCKED:" in flat and "a run on another machine" in flat, res.stdout[-4000:]
    assert "run the state import again with -e csis_force_unlock=%s" % lock_id in flat, res.stdout[-4000:]
    assert drift.meta("storage-state.yaml") == before
    with open(os.path.join(directory, ".terraform", "modules", "modules.json"), encoding="utf-8") as fh:
        installed = [m["Key"] for m in json.load(fh)["Modules"]]
    assert "storage_p2" not in installed, "the refused import installed the module: %s" % installed
    # the operator found that run gone and names its lock: the import releases it, installs, imports
    res = drift.play("state_import.yml", import_storage="p2", storage_id=vid, csis_force_unlock=lock_id)
    assert res.returncode == 0, res.stdout[-4000:]
    assert ("imported %s into the terraform state of %s as module.storage_p2.aws_ebs_volume.this "
            "(after installing its module storage_p2) (released the state lock: " % (vid, directory)) in text(res), \
        res.stdout[-4000:]
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix=key)
    released = [e for d in audit_trail(MetaState(drift.root)) for e in d.get("events") or []
                if e.get("kind") == "state lock released"]
    assert [e["root"] for e in released] == ["storage-aws-ebs"] and lock_id in released[0]["detail"], released

    # the root's next plan manages the imported volume: no create of it (what the gate would refuse as
    # RECORDED STORAGE WOULD BE CREATED; a real run's plan after an import through the role:
    # tests/faults/test_kill_at_every_step.py)
    planned = e2e.terraform_in(directory, drift.moto.env, "plan", "-no-color", "-lock=false", "-input=false")
    # neither created nor replaced nor destroyed (the gate refuses each for a recorded storage)
    assert not re.search(r"module\.storage_p2\.aws_ebs_volume\.this (will be created|must be replaced|will be destroyed)",
                         planned), planned[-4000:]
