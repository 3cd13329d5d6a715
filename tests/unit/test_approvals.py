# -*- coding: utf-8 -*-
"""What the approver reads (every address, its action, its changed attributes, secrets
masked) and the plan receipts and approval records in the meta-state store
(plugins/module_utils/csis/apply/approvals.py), on a real local store."""
from __future__ import annotations

import os

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.apply import approvals
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.gate import run_gate
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.plan_verdict import MASKED, UNKNOWN, change_lines, evaluate_plan
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState, audit_trail

D1, D2 = "a" * 64, "b" * 64
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example secret access key


def plan(*changes):
    return {"format_version": "1.2", "resource_changes": list(changes)}


def rc(address, actions, before=None, after=None, **extra):
    return {"address": address, "change": dict({"actions": actions, "before": before, "after": after}, **extra)}


def test_the_approver_reads_every_address_its_action_and_what_changes_with_secrets_masked():
    p = plan(
        rc("module.ebs.aws_ebs_volume.this", ["create"], None,
           {"size": 100, "type": "gp3", "kms_key_id": None, "tags": {"Name": "mnt_data"}, "password": "hunter2x",
            "note": "key " + SECRET_KEY},
           after_unknown={"id": True, "arn": True}, after_sensitive={"password": True}),
        rc("aws_instance.web", ["update"], {"instance_type": "t3.micro", "ami": "ami-1", "user_data": "a"},
           {"instance_type": "t3.small", "ami": "ami-1", "user_data": "b"},
           after_unknown={"public_ip": True}, before_sensitive={"user_data": True}, after_sensitive={"user_data": True}),
        rc("aws_ebs_volume.old", ["delete"], {"size": 5}, None),
        rc("aws_s3_bucket.b", ["delete", "create"], {"bucket": "x", "id": "x"}, {"bucket": "y"},
           after_unknown={"id": True}, replace_paths=[["bucket"]]),
        rc("aws_s3_bucket.same", ["no-op"], {"bucket": "z"}, {"bucket": "z"}),
    )
    verdict = evaluate_plan(p, ["aws_ebs_volume.old", "aws_s3_bucket.b"])
    lines = change_lines(verdict)
    text = "\n".join(lines)
    assert lines[0] == "- aws_ebs_volume.old: destroy"  # by address
    assert "~ aws_instance.web: update in place" in lines
    assert '    instance_type: "t3.micro" -> "t3.small"' in lines
    assert "    user_data: %s -> %s" % (MASKED, MASKED) in lines
    assert "    public_ip: null -> %s" % UNKNOWN in lines
    assert "- aws_ebs_volume.old: destroy" in lines
    assert "-/+ aws_s3_bucket.b: replace (delete then create); forced by bucket" in lines
    assert '    bucket: "x" -> "y"' in lines
    assert "+ module.ebs.aws_ebs_volume.this: create" in lines
    assert "    size = 100" in lines and '    tags = {"Name": "mnt_data"}' in lines
    # sensitive by terraform's mark, and secret-shaped by its value: never shown
    assert "    password = %s" % MASKED in lines and "    note = %s" % MASKED in lines
    assert "hunter2x" not in text and SECRET_KEY not in text
    # null values and values only known after the apply are not listed for a create; no-ops not at all
    assert "kms_key_id" not in text and "arn" not in text and "aws_s3_bucket.same" not in text


def test_a_long_listing_is_cut_and_says_so():
    p = plan(*[rc("aws_ssm_parameter.p%03d" % i, ["create"], None, {"name": "p%d" % i}) for i in range(300)])
    lines = change_lines(evaluate_plan(p), limit=50)
    assert len(lines) == 50
    assert lines[-1].startswith("... 551 more line(s)")


def test_the_gate_returns_the_listing_and_the_structured_changes(tmp_path):
    path = tmp_path / "plan.json"
    import json
    path.write_text(json.dumps(plan(rc("aws_ebs_volume.v", ["create"], None, {"size": 8}))))
    res = run_gate(plan_json=str(path))
    assert res["change_lines"] == ["+ aws_ebs_volume.v: create", "    size = 8"]
    assert res["resource_changes"] == [{"address": "aws_ebs_volume.v", "action": "create", "actions": ["create"],
                                        "attributes": [{"name": "size", "before": "", "after": "8"}]}]


@pytest.fixture()
def tree(tmp_path):
    root = tmp_path / "tree"
    os.makedirs(root / "cfg")
    return str(root)


def test_an_apply_job_needs_the_plan_jobs_receipt_and_records_who_approved(tree):
    with pytest.raises(approvals.ApprovalRefused) as exc:
        approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned=D1)
    assert str(exc.value).startswith("storage-aws-ebs: no plan job receipted this plan (aaaaaaaaaaaa): "
                                     "meta-state/plan-receipts/storage-aws-ebs.yaml holds no receipt for it")
    assert "an extra var alone approves nothing" in str(exc.value)
    assert not os.path.exists(os.path.join(tree, "meta-state", "plan-receipts"))  # a refusal writes nothing

    approvals.request(tree, "storage-aws-ebs", D1, summary="Plan: 1 to add, 0 to change, 0 to destroy",
                      requested_by="alice", job="41", workflow="40", lifecycle="storage")
    # the pinned digest (csis_approved_plans) must still be this plan's
    with pytest.raises(approvals.ApprovalRefused, match="the plan differs from the one approved in the plan job"):
        approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned=D2)
    with pytest.raises(approvals.ApprovalRefused, match=r"\(none approved != a{64}\)"):
        approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned="")
    res = approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned=D1, job="44",
                            workflow="40", distinct_approver=True)
    receipt = approvals.receipts_of(tree, "storage-aws-ebs")[D1]
    assert receipt["requested_by"] == "alice" and receipt["plan_job"] == "41" and receipt["workflow"] == "40"
    assert receipt["approvals"] == [res["approval"]]
    assert {k: res["approval"][k] for k in ("approved_by", "method", "apply_job", "workflow")} == {
        "approved_by": "bob", "method": "awx", "apply_job": "44", "workflow": "40"}
    # the audit trail names the approval
    events = [e for rec in audit_trail(MetaState(tree)) for e in rec.get("events") or []]
    assert {"kind": "approval", "root": "storage-aws-ebs", "plan_digest": D1, "requested_by": "alice",
            "approved_by": "bob", "method": "awx", "workflow": "40", "apply_job": "44"} in events


def test_distinct_approver_refuses_the_requester_an_unknown_launcher_and_a_terminal_run(tree):
    approvals.request(tree, "storage-aws-ebs", D1, requested_by="alice")
    for by, shown in (("alice", "(alice) must differ from the plan job's requester (alice)"),
                      (None, "(unknown: AWX passed no awx_user_name)")):
        with pytest.raises(approvals.ApprovalRefused) as exc:
            approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by=by, pinned=D1, distinct_approver=True)
        assert "approvals.distinct_approver is set (cfg/_config.yml)" in str(exc.value) and shown in str(exc.value)
    with pytest.raises(approvals.ApprovalRefused, match="a prompted run is both"):
        approvals.approve(tree, "storage-aws-ebs", D2, method="prompt", require_receipt=False, distinct_approver=True)
    assert approvals.receipts_of(tree, "storage-aws-ebs")[D1].get("approvals", []) == []
    assert D2 not in approvals.receipts_of(tree, "storage-aws-ebs")


def test_a_terminal_run_receipts_and_approves_its_own_plan_as_the_os_user(tree):
    res = approvals.approve(tree, "identity-posix-groups", D1, method="auto-approve", require_receipt=False,
                            summary="Plan: 2 to add, 0 to change, 0 to destroy", run_id="r1")
    receipt = approvals.receipts_of(tree, "identity-posix-groups")[D1]
    assert receipt["requested_by"] == approvals.os_user() == res["approval"]["approved_by"]
    assert receipt["approvals"][0]["method"] == "auto-approve" and receipt["summary"].startswith("Plan: 2 to add")


def test_receipts_are_kept_per_root_and_the_oldest_go_first(tree, monkeypatch):
    stamps = iter("2026-12-01T00:%02d:00Z" % i for i in range(60))
    monkeypatch.setattr(approvals, "now_iso", lambda: next(stamps))
    digests = ["%064x" % i for i in range(approvals.KEEP + 3)]
    for d in digests:
        approvals.request(tree, "storage-aws-ebs", d, requested_by="alice")
    kept = approvals.receipts_of(tree, "storage-aws-ebs")
    assert set(kept) == set(digests[3:])


def test_a_root_key_too_long_for_a_record_name_is_stored_under_a_hashed_name(tree):
    key = "instance-image-" + "b" * 60
    approvals.request(tree, key, D1, requested_by="alice")
    assert approvals.receipt_key(key) != key and len(approvals.receipt_key(key)) <= 63
    assert approvals.receipts_of(tree, key)[D1]["requested_by"] == "alice"


def test_a_missing_or_malformed_digest_is_refused_for_what_it_is_and_nothing_is_written(tree):
    for call, what in ((lambda d: approvals.request(tree, "storage-aws-ebs", d), "receipt"),
                       (lambda d: approvals.approve(tree, "storage-aws-ebs", d, method="prompt"), "approve")):
        with pytest.raises(approvals.ApprovalRefused) as exc:
            call("")
        assert str(exc.value) == "storage-aws-ebs: no plan digest to %s (the gate returns plan_digest)" % what
        for bad in ("abc", "A" * 64, "g" * 64, "a" * 65):
            with pytest.raises(approvals.ApprovalRefused) as exc:
                call(bad)
            assert str(exc.value) == ("storage-aws-ebs: %r is not a plan digest (64 hex characters, the gate's "
                                      "plan_digest); nothing to %s" % (bad, what))
    assert not os.path.exists(os.path.join(tree, "meta-state", "plan-receipts"))


DELETE_SNAPSHOT = {"storage": "mnt_old", "action": "delete_archive_snapshot", "from": "archived", "to": "destroyed",
                   "snapshot_name": "csis-archive-mnt_old-1", "tags": {"csis_config": "example"}}


def test_storage_steps_the_plan_does_not_show_are_part_of_what_an_apply_job_is_bound_to(tree, tmp_path):
    """An archived storage declared destroyed: its root plans nothing and deletes the archive
    snapshot after the apply. The digest covers that step, so the receipt of some other empty
    plan (an earlier plan job's, or this one's for a root without steps) approves nothing of it,
    and an apply job whose checkout now takes a step its plan job did not is refused."""
    path = tmp_path / "empty.json"
    path.write_text('{"format_version": "1.2", "resource_changes": []}', encoding="utf-8")
    empty = run_gate(plan_json=str(path))["plan_digest"]
    stepped = run_gate(plan_json=str(path), storage_steps=[DELETE_SNAPSHOT])["plan_digest"]
    assert stepped != empty
    # the same steps in another order, or as another copy, digest alike (the plan job's and the apply job's)
    other = dict(DELETE_SNAPSHOT, storage="mnt_older", snapshot_name="csis-archive-mnt_older-1")
    assert run_gate(plan_json=str(path), storage_steps=[other, dict(DELETE_SNAPSHOT)])["plan_digest"] == \
        run_gate(plan_json=str(path), storage_steps=[DELETE_SNAPSHOT, other])["plan_digest"]
    # a plan job receipted the empty plan (no steps then); the apply job's checkout now deletes a snapshot
    approvals.request(tree, "storage-aws-ebs", empty, requested_by="alice", job="41")
    with pytest.raises(approvals.ApprovalRefused) as exc:
        approvals.approve(tree, "storage-aws-ebs", stepped, method="awx", approved_by="bob", pinned=empty)
    assert "the plan differs from the one approved in the plan job" in str(exc.value)
    # and with the pin of the stepped plan, the empty plan's receipt is no receipt of it
    with pytest.raises(approvals.ApprovalRefused) as exc:
        approvals.approve(tree, "storage-aws-ebs", stepped, method="awx", approved_by="bob", pinned=stepped)
    assert "no plan job receipted this plan" in str(exc.value)
    # a plan job that gated the steps receipted them: approved
    approvals.request(tree, "storage-aws-ebs", stepped, requested_by="alice", job="52",
                      summary="Plan: 0 to add, 0 to change, 0 to destroy.; storage steps mnt_old: delete_archive_snapshot")
    assert approvals.approve(tree, "storage-aws-ebs", stepped, method="awx", approved_by="bob",
                             pinned=stepped)["receipt"]["plan_job"] == "52"
    # a root without steps keeps the plan's own digest
    assert run_gate(plan_json=str(path), storage_steps=[])["plan_digest"] == empty


def test_a_second_requester_of_the_same_plan_does_not_open_the_two_person_rule(tree):
    """alice plans, bob plans the same changes again (the same digest refreshes the receipt):
    alice may still not approve what she asked for, nor bob; carol may."""
    approvals.request(tree, "storage-aws-ebs", D1, requested_by="alice", job="41")
    receipt = approvals.request(tree, "storage-aws-ebs", D1, requested_by="bob", job="42")
    assert receipt["requested_by"] == "bob"
    assert approvals.receipts_of(tree, "storage-aws-ebs")[D1]["requesters"] == ["alice", "bob"]
    for who in ("alice", "bob"):
        with pytest.raises(approvals.ApprovalRefused) as exc:
            approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by=who, pinned=D1,
                              distinct_approver=True)
        assert "the apply job's launcher (%s) must differ from the plan job's requester (alice, bob)" % who \
            in str(exc.value)
    done = approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="carol", pinned=D1,
                             distinct_approver=True)
    assert done["receipt"]["requesters"] == ["alice", "bob"]
    # a receipt written before the list existed counts its requested_by
    assert approvals._requesters({"requested_by": "dave"}) == ["dave"]


def test_a_plan_job_awx_passed_no_name_is_no_requester_the_two_person_rule_can_check(tree, monkeypatch):
    """A plan job without awx_user_name (a schedule's, or one outside AWX) runs as the execution
    node's OS user: the receipt names that user, but not as a requester. Under distinct_approver
    a plan that only such jobs asked for is refused to every launcher (before, the OS user was
    the requester, and anyone but "runner" could approve); once a named user plans the same
    changes, the rule holds against her. Without the rule, anyone may approve it, as before."""
    monkeypatch.setattr(approvals, "os_user", lambda: "runner")
    receipt = approvals.request(tree, "storage-aws-ebs", D1, job="41")
    assert (receipt["requested_by"], receipt["requesters"], receipt["unnamed_requesters"]) == ("runner", [], ["runner"])
    for by in ("bob", "runner"):
        with pytest.raises(approvals.ApprovalRefused) as exc:
            approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by=by, pinned=D1,
                              distinct_approver=True)
        assert ("storage-aws-ebs: approvals.distinct_approver is set (cfg/_config.yml): no plan job of this plan was "
                "launched by a named user (AWX passed no awx_user_name; it ran as OS user runner: a schedule, or a run "
                "outside AWX)") in str(exc.value)
    assert approvals.receipts_of(tree, "storage-aws-ebs")[D1].get("approvals", []) == []
    # alice plans the same changes: she is the requester the rule checks; the unnamed request stays recorded
    receipt = approvals.request(tree, "storage-aws-ebs", D1, requested_by="alice", job="42")
    assert (receipt["requesters"], receipt["unnamed_requesters"]) == (["alice"], ["runner"])
    with pytest.raises(approvals.ApprovalRefused, match=r"launcher \(alice\) must differ from the plan job's requester \(alice\)"):
        approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="alice", pinned=D1, distinct_approver=True)
    assert approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned=D1,
                             distinct_approver=True)["approval"]["approved_by"] == "bob"
    # without the rule an unnamed plan job's plan is approved as before
    approvals.request(tree, "storage-aws-ebs", D2, job="43")
    assert approvals.approve(tree, "storage-aws-ebs", D2, method="awx", approved_by="bob", pinned=D2)["receipt"][
        "requested_by"] == "runner"


def test_a_receipt_past_receipt_max_age_is_refused_and_a_new_plan_job_refreshes_it(tree, monkeypatch):
    """approvals.receipt_max_age: an apply job refuses a receipt older than that (the plan's approval
    node denied long ago, the digest applied by hand later); a plan job that gates the same plan
    again refreshes it. Terminal runs write their receipt as they approve: no age to check."""
    monkeypatch.setattr(approvals, "now_iso", lambda: "2026-12-01T10:00:00Z")
    approvals.request(tree, "storage-aws-ebs", D1, requested_by="alice", job="41")
    monkeypatch.setattr(approvals, "now_iso", lambda: "2026-12-01T17:59:59Z")
    res = approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned=D1,
                            max_age=8 * 3600, max_age_text="8h", check_mode=True)
    assert res["receipt"]["requested_by"] == "alice"
    monkeypatch.setattr(approvals, "now_iso", lambda: "2026-12-02T12:30:00Z")
    before = approvals.receipts_of(tree, "storage-aws-ebs")
    with pytest.raises(approvals.ApprovalRefused) as exc:
        approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned=D1,
                          max_age=8 * 3600, max_age_text="8h")
    assert str(exc.value) == (
        "storage-aws-ebs: a plan job receipted this plan (aaaaaaaaaaaa) at 2026-12-01T10:00:00Z, 26 h 30 min ago, "
        "and approvals.receipt_max_age is 8h (cfg/_config.yml): an approval that old is not applied. Run the "
        "workflow from its plan job again (a plan job that gates the same plan refreshes its receipt); not applying")
    assert approvals.receipts_of(tree, "storage-aws-ebs") == before          # a refusal writes nothing
    # without the setting, the same receipt stands
    approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned=D1, check_mode=True)
    # a plan job gates the same plan again: the receipt is fresh
    approvals.request(tree, "storage-aws-ebs", D1, requested_by="carol", job="52")
    res = approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned=D1,
                            max_age=8 * 3600, max_age_text="8h")
    assert res["receipt"]["requested_at"] == "2026-12-02T12:30:00Z" and res["receipt"]["approvals"][-1]["approved_by"] == "bob"
    # a terminal run: its own receipt, written now
    approvals.approve(tree, "storage-aws-ebs", D2, method="auto-approve", require_receipt=False, max_age=60)


def test_a_receipt_whose_time_cannot_be_read_is_refused_under_receipt_max_age(tree):
    approvals.request(tree, "storage-aws-ebs", D1, requested_by="alice")
    ms = MetaState(tree)
    with ms.transaction(what="test") as tx:
        rec = tx.load_record(approvals.RECEIPTS, approvals.receipt_key("storage-aws-ebs"))
        rec["plans"][D1]["requested_at"] = "yesterday"
        tx.save_record(approvals.RECEIPTS, approvals.receipt_key("storage-aws-ebs"), rec)
    with pytest.raises(approvals.ApprovalRefused, match=r"has no readable requested_at \('yesterday'\)"):
        approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned=D1, max_age=3600)


def test_a_receipt_dated_ahead_of_the_clock_is_refused_under_receipt_max_age(tree, monkeypatch):
    """A receipt from the future (a plan job's node with a fast clock, a hand-edited record) never
    ages: refused past a few minutes of skew, accepted within them."""
    monkeypatch.setattr(approvals, "now_iso", lambda: "2026-12-01T10:04:00Z")
    approvals.request(tree, "storage-aws-ebs", D1, requested_by="alice")
    monkeypatch.setattr(approvals, "now_iso", lambda: "2026-12-01T10:00:00Z")
    approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned=D1, max_age=3600,
                      check_mode=True)
    monkeypatch.setattr(approvals, "now_iso", lambda: "2026-12-01T09:00:00Z")
    with pytest.raises(approvals.ApprovalRefused, match=r"is dated 2026-12-01T10:04:00Z, 64 min ahead of this machine's clock"):
        approvals.approve(tree, "storage-aws-ebs", D1, method="awx", approved_by="bob", pinned=D1, max_age=3600)
