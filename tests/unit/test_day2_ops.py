# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Unmount receipts, on-machine verification, the booted-image check, verdict records,
upgrade markers and the archived -> destroyed record (library level, no AWS)."""
from __future__ import annotations

import json
import os

import pytest
from trees import write_meta  # noqa: E402  (tests/support)

from ansible_collections.csis.infra.plugins.module_utils.csis.apply import receipts, unmount
from ansible_collections.csis.infra.plugins.module_utils.csis.state import record, verify
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState


# --------------------------------------------------------------------------- unmount
class FakeSSM:
    def __init__(self, status="Success", code=0, out="unmounted: /mnt/data\n"):
        self.status, self.code, self.out, self.sent = status, code, out, []

    def send_command(self, **kw):
        self.sent.append(kw)
        return {"Command": {"CommandId": "c-1", "Status": "Pending"}}

    def get_command_invocation(self, CommandId, InstanceId):
        return {"Status": self.status, "ResponseCode": self.code, "StandardOutputContent": self.out,
                "StandardErrorContent": ""}


@pytest.fixture
def launched_root(tmp_path):
    root = str(tmp_path)
    write_meta(root, "instance-state.yaml", {"instances": {"test2": {"current": {"number": 1, "instance_id": "i-0abc"}}}})
    write_meta(root, "launch-params.yaml", {"instances": {"test2": {"launched": True}}})
    return root


def test_confirm_records_the_operators_word_without_a_remote_call(launched_root, tmp_path):
    rd = str(tmp_path / "receipts")
    r = unmount.unmount(launched_root, "test2", "mnt_data", "/mnt/data", rd, access={}, runtime="rt", confirm=True,
                        confirmed_by="alice", client=object())
    with open(os.path.join(rd, "test2__mnt_data.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    assert data["ok"] is True and data["method"] == "operator-confirmation" and data["confirmed_by"] == "alice"
    assert {"instance", "storage", "ok", "time", "mount_point", "method", "runtime", "exit_status", "output"} <= set(data)
    assert r["path"].endswith("test2__mnt_data.json")
    assert receipts.check_receipts(["test2:mnt_data"], rd, not_before="2000-01-01T00:00:00Z") == []


def test_the_session_unmount_targets_the_recorded_instance_id(launched_root, tmp_path):
    rd = str(tmp_path / "receipts")
    ssm = FakeSSM()
    r = unmount.unmount(launched_root, "test2", "mnt_data", "/mnt/data", rd, access={"session_mechanism": "ssm"},
                        runtime="rt", client=ssm)
    assert ssm.sent[0]["InstanceIds"] == ["i-0abc"] and ssm.sent[0]["DocumentName"] == "AWS-RunShellScript"
    script = "\n".join(ssm.sent[0]["Parameters"]["commands"])
    assert "MP='/mnt/data'" in script and "fuser -km" not in script and "umount -l" not in script
    assert r["ok"] is True and r["method"] == "session" and r["exit_status"] == 0 and r["instance_id"] == "i-0abc"
    assert receipts.check_receipts(["test2:mnt_data"], rd) == []


def test_a_failed_session_unmount_writes_a_refused_receipt_and_raises(launched_root, tmp_path):
    rd = str(tmp_path / "receipts")
    with pytest.raises(unmount.UnmountError, match=r"unmount of /mnt/data on test2 failed \(exit 1"):
        unmount.unmount(launched_root, "test2", "mnt_data", "/mnt/data", rd, access={"session_mechanism": "ssm"},
                        client=FakeSSM("Failed", 1, "busy: /mnt/data is held by: 1234"))
    (msg,) = receipts.check_receipts(["test2:mnt_data"], rd)
    assert msg.startswith("DETACH NOT UNMOUNTED: test2:mnt_data has no successful unmount receipt")


def test_no_recorded_instance_id_or_no_ssm_is_refused(tmp_path):
    with pytest.raises(unmount.UnmountError, match="records no instance id"):
        unmount.unmount(str(tmp_path), "gone", "s", "/mnt/s", str(tmp_path / "r"), access={"session_mechanism": "ssm"},
                        client=FakeSSM())
    with pytest.raises(unmount.UnmountError, match="confirm: true"):
        unmount.unmount(str(tmp_path), "gone", "s", "/mnt/s", str(tmp_path / "r"), access={"session_mechanism": "ssh"})


@pytest.mark.parametrize("mp", ["/mnt/da ta", "relative", "/mnt/../etc", "/", "/mnt/x;rm -rf /", "/mnt/data\n",
                                "/proc\n", "/mnt/./data", "/mnt//data", "/mnt/data/"])
def test_unsafe_mount_points_are_refused(mp):
    with pytest.raises(unmount.UnmountError):
        unmount.unmount_script(mp)


def test_the_unmount_removes_its_own_fstab_line_and_no_other(tmp_path):
    """The fstab line of the unmounted path goes, matched as a string: '.' and '+' in a mount point
    are no pattern that takes another mount's line with it (/mnt/data.1 against /mnt/data-1)."""
    import subprocess

    fstab = tmp_path / "fstab"
    kept = ["# /etc/fstab", "UUID=1 / ext4 defaults 0 1", "UUID=2 /mnt/data-1 xfs defaults,nofail 0 2",
            "UUID=3 /mnt/dataX1 xfs defaults,nofail 0 2", "fs-1:/\t/mnt/data.1.old\tefs\t_netdev 0 0",
            "UUID=5 /mnt/data+1 xfs defaults,nofail 0 2"]
    lines = kept[:3] + ["UUID=4 /mnt/data.1 xfs defaults,nofail 0 2"] + kept[3:] + ["fs-2:/\t/mnt/data.1\tefs\t_netdev 0 0"]
    fstab.write_text("\n".join(lines) + "\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, body in (("mountpoint", "exit 1"), ("fuser", "exit 0")):  # not mounted (any more)
        (bin_ / name).write_text("#!/bin/sh\n%s\n" % body)
        (bin_ / name).chmod(0o755)
    script = "\n".join(unmount.unmount_script("/mnt/data.1")).replace("/etc/fstab", str(fstab))
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=False,
                          env=dict(os.environ, PATH="%s:%s" % (bin_, os.environ["PATH"])))
    assert proc.returncode == 0 and proc.stdout.strip() == "unmounted: /mnt/data.1", proc.stdout + proc.stderr
    assert fstab.read_text().splitlines() == kept
    assert not (tmp_path / "fstab.csis-unmount").exists()


# --------------------------------------------------------------------------- verify on the machine
def prepared(tmp_path, marker=True, mounted=("/mnt/data",), gid=None, mode=0o2770):
    fs = tmp_path / "fs"
    (fs / "var/lib/csis").mkdir(parents=True)
    if marker:
        (fs / "var/lib/csis/launch-applied").write_text("2026-11-29T00:00:00Z\n")
    (fs / "proc").mkdir()
    (fs / "proc/mounts").write_text("".join("/dev/nvme1n1 %s xfs rw 0 0\n" % m for m in mounted))
    sub = fs / "mnt/data/coops"
    sub.mkdir(parents=True)
    os.chmod(str(sub), mode)
    if gid is not None:
        os.chown(str(sub), -1, gid)
    return str(fs)


MOUNT = {"storage": "mnt_data", "type": "ebs", "mount_point": "/mnt/data", "group": "coops", "gid": None,
         "share_mode": "2770"}


def test_a_complete_machine_passes(tmp_path):
    gid = os.getgid()
    fs = prepared(tmp_path, gid=gid)
    v = verify.verify_on_machine(fs, mounts=[dict(MOUNT, gid=gid), {"storage": "b", "type": "s3", "mount_point": "/x"}],
                                 tests=["test -f var/lib/csis/launch-applied", 'test "$CSIS_FS_ROOT" = "%s"' % fs])
    assert v["ok"] is True, v
    assert [c["name"] for c in v["checks"]] == ["startup scripts", "mount /mnt/data (mnt_data)",
                                                "group subtree /mnt/data/coops", "test: test -f var/lib/csis/launch-applied",
                                                'test: test "$CSIS_FS_ROOT" = "%s"' % fs]
    assert v["evidence"] == ["/mnt/data"]


def test_each_failure_is_named(tmp_path):
    fs = prepared(tmp_path, marker=False, mounted=(), mode=0o2775)
    v = verify.verify_on_machine(fs, mounts=[MOUNT], tests=["false"])
    assert v["ok"] is False
    bad = {c["name"]: c["detail"] for c in v["checks"] if not c["ok"]}
    assert "missing" in bad["startup scripts"]
    assert bad["mount /mnt/data (mnt_data)"] == "/mnt/data is not mounted"
    assert bad["test: false"].startswith("exit 1")
    fs2 = prepared(tmp_path / "b", mode=0o2775)
    v = verify.verify_on_machine(fs2, mounts=[dict(MOUNT, gid=os.getgid() + 4242)])
    (sub,) = [c for c in v["checks"] if c["name"].startswith("group subtree")]
    assert not sub["ok"] and "mode is 2775, expected 2770" in sub["detail"] and "expected %d" % (os.getgid() + 4242) in sub["detail"]


def test_an_efs_mount_through_its_groups_access_point_is_checked_at_its_root(tmp_path):
    """The group's access point mounts the directory /<group> of the filesystem, created with the
    group's gid and the storage's share_mode: that directory is the mount point itself, and there is
    no <mount point>/<group> below it (the check of an EBS volume's subtree failed every such machine)."""
    gid = os.getgid()
    fs = tmp_path / "fs"
    (fs / "var/lib/csis").mkdir(parents=True)
    (fs / "var/lib/csis/launch-applied").write_text("2026-12-01T00:00:00Z\n")
    (fs / "proc").mkdir()
    (fs / "proc/mounts").write_text("127.0.0.1:/ /mnt/efs nfs4 rw 0 0\n")
    (fs / "mnt/efs").mkdir(parents=True)
    os.chmod(str(fs / "mnt/efs"), 0o2775)
    efs = {"storage": "efs-storage", "type": "efs", "mount_point": "/mnt/efs", "group": "coops", "gid": gid,
           "share_mode": "2775", "group_root": True}
    v = verify.verify_on_machine(str(fs), mounts=[efs])
    assert v["ok"] is True, v
    assert [c["name"] for c in v["checks"]] == ["startup scripts", "mount /mnt/efs (efs-storage)",
                                                "group directory /mnt/efs (coops)"]
    os.chmod(str(fs / "mnt/efs"), 0o755)
    v = verify.verify_on_machine(str(fs), mounts=[efs])
    (grp,) = [c for c in v["checks"] if c["name"].startswith("group directory")]
    assert not grp["ok"] and "mode is 0755, expected 2775" in grp["detail"]
    # through the public access point (the filesystem's root): no group check at all
    v = verify.verify_on_machine(str(fs), mounts=[dict(efs, group=None, gid=None, group_root=False)])
    assert v["ok"] is True and [c["name"] for c in v["checks"]] == ["startup scripts", "mount /mnt/efs (efs-storage)"]


def test_a_missing_fs_root_fails_cleanly(tmp_path):
    v = verify.verify_on_machine(str(tmp_path / "nope"))
    assert v["ok"] is False and v["checks"][0]["name"] == "file-system root"


# --------------------------------------------------------------------------- booted image
class FakeEC2:
    def __init__(self, booted, name="h8-dask-2", state="running"):
        self.booted, self.name, self.state = booted, name, state

    def describe_instances(self, InstanceIds):
        return {"Reservations": [{"Instances": [{"InstanceId": InstanceIds[0], "ImageId": self.booted,
                                                 "State": {"Name": self.state}}]}]}

    def describe_images(self, ImageIds):
        return {"Images": [{"ImageId": ImageIds[0], "Name": self.name}]}


def test_booted_image_against_the_pin_or_the_name_pattern():
    assert verify.booted_image_check({}, "i-1", "ami-1", client=FakeEC2("ami-1"))["ok"] is True
    c = verify.booted_image_check({}, "i-1", "ami-2", client=FakeEC2("ami-1"))
    assert c["ok"] is False and "expected the pinned build ami-2" in c["detail"]
    assert verify.booted_image_check({}, "i-1", None, "h8-dask", client=FakeEC2("ami-1"))["ok"] is True
    assert verify.booted_image_check({}, "i-1", None, "other", client=FakeEC2("ami-1"))["ok"] is False
    assert verify.booted_image_check({}, None, "ami-1")["ok"] is False


def test_an_unreachable_machine_that_ec2_reports_stopped_is_skipped_not_failed():
    for state in ("stopped", "stopping"):
        booted = verify.booted_image_check({}, "i-1", "ami-1", client=FakeEC2("ami-1", state=state))
        assert (booted["state"], booted["instance_id"]) == (state, "i-1")
        assert verify.skipped_as_stopped("web", "unreachable", booted) == (
            "verify web: SKIPPED -- the machine is stopped (EC2 says i-1 is %s); nothing recorded; "
            "start it and verify again" % state)
    running = verify.booted_image_check({}, "i-1", "ami-1", client=FakeEC2("ami-1"))
    assert verify.skipped_as_stopped("web", "unreachable", running) is None  # unreachable while running: a failure
    stopped = verify.booted_image_check({}, "i-1", "ami-1", client=FakeEC2("ami-1", state="stopped"))
    assert verify.skipped_as_stopped("web", None, stopped) is None  # it answered: its checks count
    assert verify.skipped_as_stopped("web", "unreachable", None) is None  # no EC2 read (check_booted_image off)


def test_verdicts_are_combined_recorded_and_read_back(tmp_path):
    root = str(tmp_path)
    on = verify.verify_on_machine(str(tmp_path / "missing"))
    v = verify.combine("eph", on, {"name": "booted image", "ok": True, "detail": "fine"}, runtime="rt", build=None,
                       run="r1", ephemeral=True)
    assert v["ok"] is False
    assert verify.failure_message(v).startswith("instance eph failed verification: file-system root: ")
    record.record_verification(root, v)
    record.record_verification(root, dict(v, ok=True, time="later"))
    meta = {"verifications.yaml": MetaState(root).load("verifications.yaml")}
    assert record.last_verification(meta, "eph")["ok"] is True
    assert len(meta["verifications.yaml"]["verifications"]) == 2
    unreachable = verify.combine("x", None, None, runtime=None, build=None, run=None, ephemeral=True, error="UNREACHABLE")
    assert unreachable["ok"] is False and unreachable["checks"][0]["name"] == "reach the machine"


@pytest.mark.parametrize("on_machine, what", [
    ({"checks": [{"name": "test: /usr/bin/foo", "ok": "False", "detail": "exit 1"}]}, "checks[0] is not"),
    ({"checks": [{"name": "x", "ok": "no"}]}, "checks[0] is not"),
    ({"checks": [{"ok": False}]}, "checks[0] is not"),
    ({"checks": ["x"]}, "checks[0] is not"),
    ({"checks": {"name": "x", "ok": True}}, "'checks' is a dict, not a list"),
    ({"checks": [{"name": "x", "ok": True}], "evidence": "abc"}, "'evidence' is a str, not a list"),
    ({"checks": {}}, "'checks' is a dict, not a list"),
    ({"checks": False}, "'checks' is a bool, not a list"),
    ({"checks": [{"name": "x", "ok": True}], "evidence": ""}, "'evidence' is a str, not a list"),
    (["x"], "a list, not a mapping"),
])
def test_an_on_machine_verdict_not_in_its_shape_is_a_failed_check_never_a_pass(on_machine, what):
    """``ok: "False"`` would read as passed with bool(): a verdict not in csis_verify_instance's shape
    is recorded as one failed check saying what is wrong (it holds the build's release back)."""
    v = verify.combine("i", on_machine, {"name": "booted image", "ok": True, "detail": "fine"}, runtime="rt",
                       build="ami-1", run="r1", ephemeral=False)
    assert v["ok"] is False and v["evidence"] == []
    (bad,) = [c for c in v["checks"] if not c["ok"]]
    assert bad["name"] == "on-machine verdict" and bad["detail"].startswith("not understood: ") and what in bad["detail"]


# --------------------------------------------------------------------------- upgrade marker
def test_an_upgrade_marker_is_left_for_a_launched_durable_instance_only(tmp_path):
    root = str(tmp_path)
    write_meta(root, "launch-params.yaml", {"instances": {"test2": {"launched": True, "ephemeral": False},
                                                          "eph": {"launched": True, "ephemeral": True}}})
    write_meta(root, "pins.yaml", {"instances": {"test2": "ami-1"}, "pending_replacements": {}, "upgrades": []})
    out = record.mark_upgrade(root, "test2", "r1", requested_by="bob")
    assert out["changed"] is True
    pins = MetaState(root).load("pins.yaml")
    assert pins["pending_replacements"]["test2"]["from"] == "ami-1" and pins["pending_replacements"]["test2"]["to"] is None
    assert record.mark_upgrade(root, "test2", "r2", requested_by="bob")["changed"] is False
    with pytest.raises(record.RecordError, match="ephemeral"):
        record.mark_upgrade(root, "eph", "r1")
    with pytest.raises(record.RecordError, match="not launched"):
        record.mark_upgrade(root, "nope", "r1")
    # an argument that is no instance name is refused as the argument (not as a meta-state record name)
    for fn in (record.mark_upgrade, record.cancel_upgrade):
        for check in (True, False):
            with pytest.raises(record.RecordError, match=r"^instance '\.\./test2' must not contain '/' or '\\': check -e instance$"):
                fn(root, "../test2", "r1", check=check)


def _meta_files(root):
    """Every file under meta-state/ with its bytes (a lock or a temporary file would show too)."""
    out = {}
    for d, _dirs, files in os.walk(os.path.join(root, "meta-state")):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                out[os.path.relpath(os.path.join(d, f), root)] = fh.read()
    return out


def test_check_mode_returns_the_marker_a_real_call_would_leave_and_writes_nothing(tmp_path):
    """csis_upgrade in check mode (upgrade_instance.yml --check): the same refusals and the same
    answer as a real call, no lock taken, not a byte written."""
    root = str(tmp_path)
    write_meta(root, "launch-params.yaml", {"instances": {"test2": {"launched": True, "ephemeral": False},
                                                          "eph": {"launched": True, "ephemeral": True}}})
    write_meta(root, "pins.yaml", {"instances": {"test2": "ami-1"}, "pending_replacements": {}, "upgrades": []})
    before = _meta_files(root)
    out = record.mark_upgrade(root, "test2", "r1", to="ami-2", requested_by="bob", check=True)
    assert out["changed"] is True and out["written"] == []
    assert {k: out["pending"][k] for k in ("to", "from", "run", "requested_by")} == {
        "to": "ami-2", "from": "ami-1", "run": "r1", "requested_by": "bob"}
    with pytest.raises(record.RecordError, match="ephemeral"):
        record.mark_upgrade(root, "eph", "r1", check=True)
    with pytest.raises(record.RecordError, match="not launched"):
        record.mark_upgrade(root, "nope", "r1", check=True)
    assert record.cancel_upgrade(root, "test2", "r1", check=True) == {"changed": False, "pending": None, "written": []}
    assert _meta_files(root) == before
    # with the marker there: asking the same again changes nothing, a cancel would remove it
    real = record.mark_upgrade(root, "test2", "r1", to="ami-2", requested_by="bob")["pending"]
    before = _meta_files(root)
    assert record.mark_upgrade(root, "test2", "r2", to="ami-2", check=True) == {"changed": False, "pending": real,
                                                                                "written": []}
    assert record.mark_upgrade(root, "test2", "r2", to="ami-3", check=True)["changed"] is True
    assert record.cancel_upgrade(root, "test2", "r2", check=True) == {"changed": True, "pending": real, "written": []}
    assert _meta_files(root) == before


def test_an_upgrade_marker_can_be_cancelled_before_a_run_applied_it(tmp_path):
    """upgrade_instance.yml -e cancel=true: the marker goes, the change log says so, the pin stays."""
    root = str(tmp_path)
    write_meta(root, "launch-params.yaml", {"instances": {"test2": {"launched": True, "ephemeral": False}}})
    write_meta(root, "pins.yaml", {"instances": {"test2": "ami-1"}, "pending_replacements": {}, "upgrades": []})
    record.mark_upgrade(root, "test2", "r1", to="ami-2", requested_by="bob")
    out = record.cancel_upgrade(root, "test2", "r2", requested_by="alice")
    assert out["changed"] is True and out["pending"]["to"] == "ami-2" and out["written"]
    pins = MetaState(root).load("pins.yaml")
    assert pins["pending_replacements"] == {} and pins["instances"] == {"test2": "ami-1"}
    assert [(u["op"], u["run"], u.get("requested_by")) for u in pins["upgrades"]] == [
        ("upgrade-requested", "r1", None), ("upgrade-cancelled", "r2", "alice")]
    again = record.cancel_upgrade(root, "test2", "r3")
    assert (again["changed"], again["pending"], again["written"]) == (False, None, [])
    assert MetaState(root).load("pins.yaml") == pins
    # a name meta-state never launched is refused (a typo is no "nothing to cancel"), in check mode too
    for check in (True, False):
        with pytest.raises(record.RecordError, match=r"^instance 'tset2' is not in meta-state/launch-params.yaml: it "
                                                     r"was never launched"):
            record.cancel_upgrade(root, "tset2", "r4", check=check)
    # one forgotten or decommissioned since (its generations kept, its marker gone with its launch record):
    # nothing to cancel, no error (a retried cancel)
    write_meta(root, "instance-state.yaml", {"instances": {"gone": {"generation": {"durable": 1, "ephemeral": 0},
                                                                    "current": None, "history": []}}})
    for check in (True, False):
        assert record.cancel_upgrade(root, "gone", "r5", check=check)["changed"] is False


# --------------------------------------------------------------------------- archived -> destroyed
def test_archived_to_destroyed_is_recorded_only_after_the_snapshot_deletion(tmp_path):
    root = str(tmp_path)
    write_meta(root, "storage-state.yaml", {"storages": {"mnt_data": {
        "state": "archived", "generation": 1, "facts": {"builder": "aws-ebs", "type": "ebs"}}}})
    rp = {"builder": "aws-ebs", "lifecycle": "storage", "storages": {"mnt_data": {
        "builder": "aws-ebs", "type": "ebs", "requested_state": "destroyed", "current_state": "archived",
        "address": "module.storage_mnt_data", "archive_snapshot": "csis-mnt-data-archive"}}}
    ms = MetaState(root)
    assert "mnt_data" not in record.record_storage_root(ms, rp, {"resources": []}, "r1")
    assert ms.load("storage-state.yaml")["storages"]["mnt_data"]["state"] == "archived"
    t = {"storage": "mnt_data", "action": "delete_archive_snapshot"}
    got = record.record_storage_root(ms, rp, {"resources": []}, "r1", [t])
    assert got["mnt_data"] == ["archived", "destroyed"]
    rec = ms.load("storage-state.yaml")["storages"]["mnt_data"]
    assert rec["state"] == "destroyed" and rec["history"][-1]["action"] == "delete_archive_snapshot"


def test_an_upgrade_asked_without_a_name_names_the_awx_user_or_the_os_user(tmp_path, monkeypatch):
    """upgrade_instance.yml passes no requester: the marker names who the audit trail names (the
    AWX user the run passed, else the OS user), never 'unknown' where $USER is unset (AWX's
    execution environments, sudo)."""
    import getpass

    root = str(tmp_path)
    write_meta(root, "launch-params.yaml", {"instances": {"test2": {"launched": True, "ephemeral": False}}})
    write_meta(root, "pins.yaml", {"instances": {"test2": "ami-1"}, "pending_replacements": {}, "upgrades": []})
    monkeypatch.delenv("USER", raising=False)
    for name in ("CSIS_AWX_USER_NAME", "AWX_USER_NAME"):
        monkeypatch.delenv(name, raising=False)
    assert record.mark_upgrade(root, "test2", "r1")["pending"]["requested_by"] == getpass.getuser()
    monkeypatch.setenv("CSIS_AWX_USER_NAME", "carol")
    record.cancel_upgrade(root, "test2", "r2")
    assert MetaState(root).load("pins.yaml")["upgrades"][-1]["requested_by"] == "carol"


def test_the_rest_of_pins_reads_as_a_transaction_reads_it_in_both_layouts(tmp_path):
    """MetaState.load_rest (check mode's and the series heads' read of the pending markers) gives
    what Transaction.load_rest gives, from a whole legacy file and from the per-record layout,
    without reading every instance's pin."""
    root = str(tmp_path)
    write_meta(root, "launch-params.yaml", {"instances": {"test2": {"launched": True, "ephemeral": False}}})
    write_meta(root, "pins.yaml", {"instances": {"test2": "ami-1"}, "upgrades": [],
                                   "pending_replacements": {"test2": {"to": "ami-2", "from": "ami-1", "run": "r0"}}})
    ms = MetaState(root)
    with ms.transaction("read") as txn:
        legacy = txn.load_rest("pins.yaml")
    assert ms.load_rest("pins.yaml") == legacy and legacy["pending_replacements"]["test2"]["to"] == "ami-2"
    record.cancel_upgrade(root, "test2", "r1")  # a commit: per-record from now on
    with ms.transaction("read") as txn:
        split = txn.load_rest("pins.yaml")
    reads = []
    get = ms.objects.get
    ms.objects.get = lambda rel: reads.append(rel) or get(rel)
    assert ms.load_rest("pins.yaml") == split and split["pending_replacements"] == {}
    assert split["upgrades"][-1]["op"] == "upgrade-cancelled"
    # the rest object alone: no instance's pin record is read
    assert reads and not [r for r in reads if "test2" in r], reads


def test_an_upgrade_target_must_be_an_available_build_of_the_instances_image(tmp_path):
    """The replacement is delete-then-create: a `to` build the instance cannot boot (a typo, one not
    available, another image's) would terminate the machine and never launch its successor."""
    from trees import EXAMPLES, copy_as_shipped
    from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree
    from ansible_collections.csis.infra.plugins.module_utils.csis.render.series_heads import (
        UpgradeTargetError, check_upgrade_target)

    tree = load_tree(copy_as_shipped(EXAMPLES, str(tmp_path / "tree")))
    images = {"ami-0good": {"ImageId": "ami-0good", "State": "available", "Name": "imgfile-basic-pckr-ebs-ans-20261101"},
              "ami-0pend": {"ImageId": "ami-0pend", "State": "pending", "Name": "imgfile-basic-pckr-ebs-ans-20261102"},
              "ami-0dask": {"ImageId": "ami-0dask", "State": "available", "Name": "imgfile-basic-dask-pckr-ebs-ans-1"}}

    class EC2:
        def describe_images(self, ImageIds):  # noqa: N803 - boto3's argument name
            if ImageIds[0] not in images:
                err = Exception("An error occurred (InvalidAMIID.NotFound)")
                err.response = {"Error": {"Code": "InvalidAMIID.NotFound"}}
                raise err
            return {"Images": [images[ImageIds[0]]]}

    def check(ami):
        return check_upgrade_target(tree, "test", ami, client_for=lambda runtime: EC2())

    assert check("ami-0good")["name"] == "imgfile-basic-pckr-ebs-ans-20261101"
    with pytest.raises(UpgradeTargetError, match=r"^instance 'test': there is no AMI ami-0typo on runtime "
                                                 r"aws-east2-runtime \(region us-east-2\): replaced onto it, the machine "
                                                 r"would be terminated and its successor never launched; not marked$"):
        check("ami-0typo")
    with pytest.raises(UpgradeTargetError, match=r"AMI ami-0pend \(.*\) is pending, not available; not marked$"):
        check("ami-0pend")
    with pytest.raises(UpgradeTargetError, match=r"^instance 'test': AMI ami-0dask is 'imgfile-basic-dask-pckr-ebs-ans-1', "
                                                 r"not a build of its image 'imgfile-basic' \(whose builds' names start "
                                                 r"with 'imgfile-basic-pckr-ebs-ans'\); not marked$"):
        check("ami-0dask")

    # a lookup that fails (no access, the endpoint down, no client at all) is no missing build: its own ending
    class Denied:
        def describe_images(self, ImageIds):  # noqa: N803 - boto3's argument name
            err = Exception("An error occurred (UnauthorizedOperation)")
            err.response = {"Error": {"Code": "UnauthorizedOperation", "Message": "not allowed"}}
            raise err

    def no_client(runtime):
        raise RuntimeError("The config profile (gone) could not be found")

    for client_for in (lambda runtime: Denied(), no_client):
        with pytest.raises(UpgradeTargetError, match=r"^instance 'test': the build ami-0good cannot be looked up on "
                                                     r"runtime aws-east2-runtime: .*; fix access$"):
            check_upgrade_target(tree, "test", "ami-0good", client_for=client_for, outcome="cancel it",
                                 unchecked="fix access")


def test_an_upgrade_onto_the_build_the_machine_runs_is_said(tmp_path):
    """Without `to` the replacement goes onto the series head: when the machine runs the head already,
    the upgrade is a new machine on the same build (a re-provision), which the operator is told."""
    from trees import EXAMPLES, copy_as_shipped
    from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree
    from ansible_collections.csis.infra.plugins.module_utils.csis.render.series_heads import onto_the_same_build

    tree = load_tree(copy_as_shipped(EXAMPLES, str(tmp_path / "tree")))
    heads = [{"ImageId": "ami-0old", "State": "available", "Name": "imgfile-basic-pckr-ebs-ans-1", "CreationDate": "2026-11-01"},
             {"ImageId": "ami-0head", "State": "available", "Name": "imgfile-basic-pckr-ebs-ans-2", "CreationDate": "2026-11-02"}]

    class EC2:
        def describe_images(self, **kwargs):
            return {"Images": heads}

    def said(pin, to=None):
        return onto_the_same_build(tree, "test", pin, to=to, client_for=lambda runtime: EC2())

    assert said("ami-0head") == (
        "instance 'test' runs ami-0head already, its image's series head: the upgrade replaces the machine onto the "
        "same build (a new generation: a new machine, its root disk afresh); cancel it with -e cancel=true if that is "
        "not what you meant")
    assert said("ami-0old") is None  # onto the newer head: an upgrade
    assert "runs ami-0old already, the build asked for" in said("ami-0old", to="ami-0old")
    assert said("ami-0old", to="ami-0head") is None
    assert said(None) is None  # no pin recorded: nothing to compare
