# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The lifecycles end to end: real ansible-playbook, real terraform and provider, the
session's moto server (issue 4, "Tests that must exist").

``site``: a copy of ``examples/`` run through the README's ``scripts/demo`` (``site.yml``:
identity, storage, instance-image) ONCE per module: what exists, what is recorded, a no-op
re-run, a dry run. The refusals and failures of one root run on the one-EBS tree in
``test_lifecycle_ebs_e2e.py`` (its own file, so both trees run at once on two workers).
"""
from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

pytestmark = e2e.needs_terraform()

NOOP = "Plan: 0 to add, 0 to change, 0 to destroy"


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
            text = fh.read()
        assert re.search(r'\n  ami_id += "%s"\n' % re.escape(pins[name]), text), text
        assert "ami_name_pattern" not in text, text
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
