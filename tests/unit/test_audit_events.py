# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Audit events that change no record (a refused gate, a refused apply check)."""
from __future__ import annotations

import os

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.state import store


def ebs_root(root):
    """A one-EBS storage root as the render describes it, and the state its apply left."""
    rp = {"key": "storage-aws-ebs", "builder": "aws-ebs", "lifecycle": "storage", "directory": root,
          "storages": {"mnt_data": {"builder": "aws-ebs", "type": "ebs", "requested_state": "active",
                                    "current_state": None, "address": "module.storage_mnt_data"}}}
    state = {"resources": [{"mode": "managed", "module": "module.storage_mnt_data", "type": "aws_ebs_volume",
                            "name": "this", "instances": [{"attributes": {"id": "vol-0123abcd", "size": 100,
                                                                          "availability_zone": "us-east-2a"}}]}]}
    return rp, state


def seeded(root):
    """One committed transaction (a verification record); returns it."""
    with store.MetaState(root).transaction("seed") as txn:
        data = txn.load("verifications.yaml")
        data["verifications"].append({"instance": "web", "ok": True})
        txn.save("verifications.yaml", data)
    return txn


def test_an_event_gets_a_revision_and_changes_no_record(tmp_path):
    root = str(tmp_path)
    txn = seeded(root)
    before = store.MetaState(root).load("verifications.yaml")
    rev = store.audit_event(root, {"kind": "gate refused", "root": "storage-x", "detail": "DESTROY NOT WHITELISTED: a"},
                            what="csis gate refused: storage-x", context={"root": "storage-x", "run": "r2"})
    assert rev == txn.revision + 1
    assert store.MetaState(root).load("verifications.yaml") == before
    (doc,) = store.audit_trail(store.MetaState(root), root="storage-x")
    assert doc["events"] == [{"kind": "gate refused", "root": "storage-x", "detail": "DESTROY NOT WHITELISTED: a"}]
    assert doc["changes"] == [] and doc["context"]["run"] == "r2"
    lines = store.history_report(root, root="storage-x")["lines"]
    assert len(lines) == 1 and "gate refused storage-x" in lines[0] and "DESTROY NOT WHITELISTED: a" in lines[0]


def test_no_event_and_no_change_commits_nothing(tmp_path):
    ms = store.MetaState(str(tmp_path))
    with ms.transaction("nothing") as txn:
        txn.load("pins.yaml")
    assert txn.revision is None and txn.written == []


def test_a_secret_shaped_event_is_refused(tmp_path):
    with pytest.raises(store.MetaStateError):
        store.audit_event(str(tmp_path), {"kind": "failed", "root": "r", "token": "AKIAABCDEFGHIJKLMNOP"})


def test_a_record_names_its_lifecycle_root_and_plan_digest_in_the_trail(tmp_path):
    """csis_record's context (the role passes the lifecycle, the root and the digest of the plan the
    gate passed and the apply applied) lands in the transaction's audit record and its history line."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import record

    root = str(tmp_path)
    rp = {"key": "storage-aws-ebs", "builder": "aws-ebs", "lifecycle": "storage", "directory": str(tmp_path),
          "storages": {"mnt_data": {"builder": "aws-ebs", "type": "ebs", "requested_state": "active",
                                    "current_state": None, "address": "module.storage_mnt_data"}}}
    state = {"resources": [{"mode": "managed", "module": "module.storage_mnt_data", "type": "aws_ebs_volume",
                            "name": "this", "instances": [{"attributes": {"id": "vol-0123abcd", "size": 100,
                                                                          "availability_zone": "us-east-2a"}}]}]}
    digest = "ab" * 32
    context = {"lifecycle": "storage", "root": "storage-aws-ebs", "plan_digest": digest, "run_id": "r1"}
    out = record.record_root(root, rp, "r1", state=state, context=context)
    assert out["storages"]["mnt_data"] == [None, "active"]
    (doc,) = store.audit_trail(store.MetaState(root), root="storage-aws-ebs")
    assert doc["context"] == context
    assert {c["file"] for c in doc["changes"]} >= {"storage-state.yaml"}
    lines = store.history_report(root, storage="mnt_data")["lines"]
    assert lines and all("(plan %s)" % digest[:12] in line for line in lines), lines


def test_a_revision_the_store_never_had_is_refused_not_shown_as_the_present(tmp_path):
    root = str(tmp_path)
    txn = seeded(root)
    assert store.history_report(root, storage="mnt_data", revision=txn.revision)["as_of"]["revision"] == txn.revision
    for bad in (txn.revision + 1, 99999, -1):
        with pytest.raises(store.MetaStateError) as exc:
            store.history_report(root, storage="mnt_data", revision=bad)
        assert str(exc.value) == "revision %d: %s holds revisions 0 to %d (the last committed one)" % (
            bad, store.MetaState(root).where, txn.revision)


def test_an_apply_that_changes_no_record_is_in_the_trail_and_no_apply_writes_nothing(tmp_path):
    """A tag update (or the identity root's groups) changes no meta-state record, yet the apply
    happened: the record step audits it (``applied``, with the plan's digest); a record without
    an apply (an empty plan) commits nothing."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import record

    root = str(tmp_path)
    rp, state = ebs_root(root)
    context = {"lifecycle": "storage", "root": "storage-aws-ebs", "plan_digest": "cd" * 32, "run_id": "r1"}
    record.record_root(root, rp, "r1", state=state, context=context, applied="1 to add, 0 to change, 0 to destroy")
    first = store.MetaState(root).revision()
    record.record_root(root, rp, "r2", state=state, context=dict(context, run_id="r2"))  # no apply: nothing
    assert store.MetaState(root).revision() == first
    record.record_root(root, rp, "r3", state=state, context=dict(context, run_id="r3", plan_digest="ef" * 32),
                       applied="0 to add, 1 to change, 0 to destroy")  # the volume's tags
    doc = store.audit_trail(store.MetaState(root), root="storage-aws-ebs")[-1]
    assert doc["revision"] == first + 1 and doc["changes"] == []
    assert doc["events"] == [{"kind": "applied", "root": "storage-aws-ebs", "plan_digest": "ef" * 32,
                              "detail": "applied: 0 to add, 1 to change, 0 to destroy"}]
    # the identity root records nothing, but its apply is audited the same way
    ident = {"key": "identity-posix-groups", "builder": "posix-groups", "lifecycle": "identity", "directory": root}
    assert record.record_root(root, ident, "r4", context={"root": "identity-posix-groups", "plan_digest": "01" * 32},
                              applied="3 to add, 0 to change, 0 to destroy") == {"written": []}
    (doc,) = store.audit_trail(store.MetaState(root), root="identity-posix-groups")
    assert doc["what"] == "csis_record identity root posix-groups" and doc["events"][0]["kind"] == "applied"
    lines = store.history_report(root, root="identity-posix-groups")["lines"]
    assert lines == [l for l in lines if "applied identity-posix-groups" in l and "applied: 3 to add" in l
                     and "plan_digest 010101010101" in l] and len(lines) == 1, lines


def test_history_names_an_approvals_people_and_a_root_by_its_whole_name(tmp_path):
    root = str(tmp_path)
    store.audit_event(root, {"kind": "approval", "root": "storage-aws-ebs", "plan_digest": "ab" * 32,
                             "requested_by": "alice", "approved_by": "bob", "method": "awx", "workflow": "40",
                             "apply_job": "47"}, what="csis.infra approval storage-aws-ebs",
                      context={"root": "storage-aws-ebs"})
    store.audit_event(root, {"kind": "gate refused", "root": "storage-aws-efs", "detail": "x"},
                      what="csis gate refused: storage-aws-efs", context={"root": "storage-aws-efs"})
    (line,) = store.history_report(root, root="storage-aws-ebs")["lines"]
    assert line.endswith("-- apply_job 47, approved_by bob, method awx, plan_digest abababababab, requested_by alice, "
                         "workflow 40"), line
    assert store.history_report(root, root="storage-aws-e")["lines"] == []  # no root of that name
    assert len(store.history_report(root, root="storage-aws-efs")["lines"]) == 1


def test_the_history_of_a_storage_shows_the_state_querys_hard_lines_about_it(tmp_path):
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import drift

    root = str(tmp_path)
    line = {"kind": "storage", "name": "mnt_data", "drift": "missing", "hard": True, "detail": "gone (volume vol-1)"}
    report = {"run": "q1", "drift": [line], "reality": {"storages": {}, "instances": {}}}
    drift.record_hard(root, report)
    drift.record_hard(root, dict(report, run="q2", drift=[]))
    drift.record_hard(root, dict(report, run="q3", drift=[dict(line, kind="instance", name="web")]))
    found = [d["what"] for d in store.audit_trail(store.MetaState(root), storage="mnt_data")]
    assert found == ["csis_state_query q1", "csis_state_query q2"]  # flagged, then cleared
    assert [d["what"] for d in store.audit_trail(store.MetaState(root), instance="web")] == ["csis_state_query q3"]
    assert store.audit_trail(store.MetaState(root), storage="other") == []


def test_every_history_line_and_refusal_is_one_line_whatever_a_run_id_or_user_holds(tmp_path, monkeypatch):
    """A run id (csis_run_id) or an AWX user name holding a newline or a terminal escape cannot
    split a history line, a refusal line or a workspace commit's body into forged lines."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply import workspace
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import drift, preflight

    root = str(tmp_path)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "_config.yml").write_text("config: {}\n", encoding="utf-8")
    monkeypatch.setenv("CSIS_AWX_USER_NAME", "mallory\nr99 forged")
    line = {"kind": "storage", "name": "x", "drift": "missing", "hard": True, "detail": "gone\x1b[2J"}
    drift.record_hard(root, {"run": "Q1\nstate: forged; re-run", "drift": [line], "reality": {}})
    with pytest.raises(preflight.PreflightError) as err:
        preflight.preflight(root, write=False)
    assert str(err.value) == ("state: missing storage x: gone\\x1b[2J (from meta-state drift.yaml, state query "
                              "Q1\\nstate: forged; re-run; re-run 'state query' after fixing)")
    lines = store.history_report(root)["lines"]
    assert len(lines) == 1 and "\n" not in lines[0] and "mallory\\nr99 forged" in lines[0], lines
    assert drift.console_lines({"run": "a\nb", "drift": [line]})[0] == "state report for run a\\nb"
    body = workspace.commit_message("Plan: 1 to add", "storage-x", "d" * 64, "R1\nPlan digest: forged").split("\n")
    assert "Run: R1\\nPlan digest: forged" in body and sum(b.startswith("Plan digest:") for b in body) == 1


def test_a_storages_history_shows_who_approved_the_plan_that_changed_it(tmp_path):
    """Filtering the history by storage kept only the records that changed it: the approval of the
    plan whose apply did (an event, no record of the storage) was left out, though it says who
    approved. The records of the same plan digest come along; an empty plan's digest ties nothing."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply import approvals
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply.plan_verdict import plan_content_digest
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import record

    assert store.EMPTY_PLAN_DIGEST == plan_content_digest({"resource_changes": []})
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "cfg"))
    digest, other = "cd" * 32, "ef" * 32
    approvals.approve(root, "storage-aws-ebs", other, method="auto-approve", approved_by="eve", require_receipt=False)
    approvals.approve(root, "storage-aws-ebs", digest, method="auto-approve", approved_by="alice", require_receipt=False)
    approvals.approve(root, "storage-aws-ebs", store.EMPTY_PLAN_DIGEST, method="auto-approve", approved_by="mallory",
                      require_receipt=False)
    rp, state = ebs_root(root)
    record.record_root(root, rp, "r1", state=state,
                       context={"lifecycle": "storage", "root": "storage-aws-ebs", "plan_digest": digest, "run_id": "r1"})
    report = store.history_report(root, storage="mnt_data")
    kinds = [(doc["revision"], [e.get("approved_by") for e in doc.get("events") or []]) for doc in report["trail"]]
    assert kinds == [(2, ["alice"]), (4, [])], kinds
    assert any("approval" in line and "alice" in line for line in report["lines"]), report["lines"]
    # the check of what was last done to a storage (forget) still reads its own records only
    assert [doc["revision"] for doc in store.audit_trail(store.MetaState(root), storage="mnt_data")] == [4]


def test_an_archive_destroyed_after_the_apply_names_the_approval_of_its_plan(tmp_path):
    """archived -> destroyed: the plan is empty and the storage's record changes only when the
    record after the snapshot's deletion runs (tasks/transitions_after.yml); with the plan's context
    (its digest covers the step) the storage's history names who approved that plan."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply import approvals
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import record

    root = str(tmp_path)
    os.makedirs(os.path.join(root, "cfg"))
    rp, state = ebs_root(root)
    record.record_root(root, rp, "r1", state=state)
    archived = dict(rp, storages={"mnt_data": dict(rp["storages"]["mnt_data"], requested_state="archived",
                                                   current_state="active")})
    record.record_root(root, archived, "r2", state={"resources": []},
                       done_transitions=[{"storage": "mnt_data", "action": "snapshot", "from": "active", "to": "archived"}])
    digest = "ab" * 32
    approvals.approve(root, "storage-aws-ebs", digest, method="auto-approve", approved_by="alice", require_receipt=False)
    gone = dict(rp, storages={"mnt_data": dict(rp["storages"]["mnt_data"], requested_state="destroyed",
                                               current_state="archived", archive_snapshot="csis-mnt_data-archive")})
    context = {"lifecycle": "storage", "root": "storage-aws-ebs", "plan_digest": digest, "run_id": "r3"}
    step = {"storage": "mnt_data", "action": "delete_archive_snapshot", "from": "archived", "to": "destroyed"}
    record.record_root(root, gone, "r3", state={"resources": []}, context=context)           # the record after the apply
    assert store.MetaState(root).load_record("storage-state.yaml", "mnt_data")["state"] == "archived"
    record.record_root(root, gone, "r3", state={"resources": []}, done_transitions=[step], context=context)
    assert store.MetaState(root).load_record("storage-state.yaml", "mnt_data")["state"] == "destroyed"
    lines = store.history_report(root, storage="mnt_data")["lines"]
    assert any("approval" in line and "alice" in line for line in lines), lines


def test_an_instances_history_shows_its_upgrade_request_cancel_and_verifications(tmp_path):
    """An upgrade request and its cancel change pins.yaml's pending replacements as a whole (one diff
    line whose path does not name the instance), a verification appends to verifications.yaml's list:
    the instance's history found none of them (playbooks/history.yml -e history_instance=web)."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import record

    root = str(tmp_path)
    launch = {"launched": True, "ephemeral": False, "image": "img", "build": "ami-0123456789abcdef0"}
    with store.MetaState(root).transaction("seed launch") as txn:
        txn.save("launch-params.yaml", {"instances": {"web": launch, "db": dict(launch)}})
    record.mark_upgrade(root, "web", run="r1", to="ami-0fedcba9876543210", requested_by="alice")
    record.mark_upgrade(root, "db", run="r1", requested_by="alice")
    record.cancel_upgrade(root, "web", run="r2", requested_by="bob")
    record.record_verification(root, {"instance": "web", "ok": True, "checks": [], "time": "t", "run": "r3"})
    record.record_verification(root, {"instance": "db", "ok": True, "checks": [], "time": "t", "run": "r3"})
    whats = [doc["what"] for doc in store.history_report(root, instance="web")["trail"]]
    assert whats == ["seed launch", "csis upgrade web", "csis upgrade cancelled web", "csis verification of web"], whats
    whats = [doc["what"] for doc in store.history_report(root, instance="db")["trail"]]
    assert whats == ["seed launch", "csis upgrade db", "csis verification of db"], whats
    # a name that is only a part of another's names neither
    assert store.history_report(root, instance="we")["trail"] == []


def test_a_roots_failure_is_in_the_history_of_each_instance_and_storage_it_declares(tmp_path):
    """A failed apply or a refused gate of the instance root changes no record: the audit event names
    what the root declares (csis_audit's instances/storages), so history_instance shows it too."""
    root = str(tmp_path)
    store.audit_root_event(root, "failed", "instance-image-open-tofu", detail="Error: launching the instance",
                           step="Apply exactly that plan file", instances=["test2", "test"])
    store.audit_root_event(root, "gate refused", "storage-aws-ebs", detail="DESTROY NOT WHITELISTED: x",
                           storages=["mnt_data"])
    (line,) = store.history_report(root, instance="test2")["lines"]
    assert "failed instance-image-open-tofu" in line and "Error: launching the instance" in line, line
    assert "test2" not in line.split(" -- ", 1)[1], line  # the line names the root, not every instance it declares
    assert store.history_report(root, instance="test")["lines"] == [line]
    assert store.history_report(root, instance="tes")["lines"] == []
    (line,) = store.history_report(root, storage="mnt_data")["lines"]
    assert "gate refused storage-aws-ebs" in line, line
    assert store.history_report(root, instance="mnt_data")["lines"] == []  # a storage's name is no instance's
