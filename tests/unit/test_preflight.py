# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What a real run checks before it plans (state/preflight.py, MetaState.check_writable), the
ephemeral machines to verify (state/ephemeral.py) and the message of a record that fails after
an apply (state/record.py). Library level, real files, no AWS."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading

import pytest
from trees import write_meta  # noqa: E402  (tests/support)

from ansible_collections.csis.infra.plugins.module_utils.csis.state import ephemeral, preflight, record
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState, MetaStateError, NotWritable, audit_trail


def write_report(root, drift, run="r1"):
    os.makedirs(os.path.join(root, "generated"), exist_ok=True)
    with open(os.path.join(root, "generated", "state-report.json"), "w", encoding="utf-8") as fh:
        json.dump({"run": run, "drift": drift}, fh)


def listing(root):
    """What is in the tree besides its cfg/_config.yml."""
    return sorted(p for p in (os.path.relpath(os.path.join(d, f), root) for d, dirs, files in os.walk(root)
                              for f in files + dirs) if p not in ("cfg", os.path.join("cfg", "_config.yml")))


def tree_at(tmp_path):
    """A configuration root: the preflight refuses a directory without cfg/_config.yml."""
    (tmp_path / "cfg").mkdir(exist_ok=True)
    (tmp_path / "cfg" / "_config.yml").write_text("config: {}\n", encoding="utf-8")
    return str(tmp_path)


def _chattr_works(tmp_path):
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        return False
    probe = tmp_path / "chattr-probe"
    probe.mkdir()
    ok = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, check=False).returncode == 0
    if ok:
        subprocess.run(["chattr", "-i", str(probe)], check=True)
    probe.rmdir()
    return ok


@pytest.fixture
def immutable(tmp_path):
    """chattr +i on a path for the test's duration (skips where chattr does not work)."""
    if not _chattr_works(tmp_path):
        pytest.skip("chattr +i does not work here (not root, or the file system has no attributes)")
    done = []

    def make(path):
        subprocess.run(["chattr", "+i", str(path)], check=True)
        done.append(path)

    yield make
    for path in done:
        subprocess.run(["chattr", "-i", str(path)], check=False)


MISSING = {"kind": "storage", "name": "mnt_data", "drift": "missing", "hard": True,
           "detail": "recorded active but not found in reality (volume vol-1)"}
STALE = {"kind": "storage", "name": "old", "drift": "stale", "hard": False, "detail": "leftover"}


# --------------------------------------------------------------------------- HARD drift
def test_no_report_and_an_empty_tree_start(tmp_path):
    root = tree_at(tmp_path)
    res = preflight.preflight(root)
    assert res["hard_drift"] == [] and res["report"] is None
    assert res["meta_state"] == {"path": os.path.join(root, "meta-state"), "exists": False, "files": [],
                                 "writable": True}
    assert listing(root) == []  # the probe of a missing meta-state left nothing


def test_an_awx_job_on_the_local_store_is_refused_with_what_to_do(tmp_path, monkeypatch):
    """An AWX job's container, and what it would record in the tree's local store, is gone when it
    ends: a run that is an AWX job is refused there; one outside AWX (or with the operator's word,
    which the role gives by passing no job) starts. On the S3 store it starts (the store's kind)."""
    root = tree_at(tmp_path)
    assert preflight.preflight(root, awx_job=None)["meta_state"]["writable"] is True
    with pytest.raises(preflight.PreflightError) as exc:
        preflight.preflight(root, awx_job="41")
    (line,) = exc.value.problems
    assert line.startswith("meta-state is the tree's local store (%s), and this run is AWX job 41: what it records "
                           % os.path.join(root, "meta-state")), line
    assert "Declare the S3 store for AWX" in line and "-e csis_awx_local_meta_state=true" in line
    assert listing(root) == []  # the write probe, which ran too (every finding at once), left nothing
    with pytest.raises(preflight.PreflightError):
        preflight.preflight(root, awx_job=" 41 ")
    assert preflight.local_store_under_awx(MetaState(root), "  ") is None  # blank: no AWX job
    # a store setting that cannot be opened is named as the other checks name it, not raised on its own
    (tmp_path / "cfg" / "_config.yml").write_text("config: {}\nmeta_state: {backend: s3}\n", encoding="utf-8")
    for job in (None, "41"):
        with pytest.raises(preflight.PreflightError) as exc:
            preflight.preflight(root, awx_job=job)
        assert all("AWX job" not in p for p in exc.value.problems), exc.value.problems
    (tmp_path / "cfg" / "_config.yml").write_text("config: {}\n", encoding="utf-8")

    class S3Like:
        kind = "s3"

    assert preflight.local_store_under_awx(MetaState(root), "") is None
    monkeypatch.setattr(MetaState, "objects", property(lambda self: S3Like()))
    assert preflight.local_store_under_awx(MetaState(root), "41") is None


def test_hard_lines_refuse_with_the_reference_message_and_soft_lines_do_not(tmp_path):
    root = tree_at(tmp_path)
    write_report(root, [STALE])
    assert preflight.preflight(root)["report"].endswith("generated/state-report.json")
    write_report(root, [STALE, MISSING])
    with pytest.raises(preflight.PreflightError) as err:
        preflight.preflight(root)
    assert str(err.value) == ("state: missing storage mnt_data: recorded active but not found in reality "
                              "(volume vol-1) (from state-report.json; re-run 'state query' after fixing)")
    assert err.value.result["hard_drift"] == [MISSING]
    assert err.value.result["meta_state"]["writable"] is True  # checked as well: every finding at once


def test_a_report_that_cannot_be_read_refuses(tmp_path):
    root = tree_at(tmp_path)
    os.makedirs(os.path.join(root, "generated"))
    with open(os.path.join(root, "generated", "state-report.json"), "w", encoding="utf-8") as fh:
        fh.write('{"drift": [')
    with pytest.raises(preflight.PreflightError, match=r"state-report.json: cannot be read .*run 'state query' again"):
        preflight.preflight(root)


# --------------------------------------------------------------------------- HARD drift kept in meta-state
def _report(run, drift, unseen=()):
    """A state report as the query makes it: ``unseen`` storages could not be looked up."""
    return {"run": run, "drift": drift,
            "reality": {"storages": {n: {"present": None} for n in unseen}, "instances": {}}}


def test_the_querys_hard_lines_kept_in_meta_state_refuse_a_checkout_without_the_report(tmp_path):
    """An AWX job's fresh checkout has no generated/state-report.json: meta-state's drift.yaml,
    which every checkout reads (the S3 store under AWX), refuses the run."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import drift
    root = tree_at(tmp_path)
    assert drift.record_hard(root, _report("q1", [STALE])) == {
        "where": "meta-state/drift.yaml", "changed": False, "revision": None, "kept": []}  # nothing HARD: nothing written
    assert not os.path.exists(os.path.join(root, "meta-state"))
    assert drift.record_hard(root, _report("q2", [STALE, MISSING]), write=False)["changed"] is True
    assert not os.path.exists(os.path.join(root, "meta-state"))  # check mode: only said
    out = drift.record_hard(root, _report("q2", [STALE, MISSING]))
    assert out["changed"] is True and out["revision"] == 1
    stored = MetaState(root).load("drift.yaml")
    assert stored["hard"] == [{k: MISSING[k] for k in ("kind", "name", "drift", "detail")}] and stored["run"] == "q2"
    assert not os.path.exists(os.path.join(root, "generated"))  # the run below has no report of its own
    with pytest.raises(preflight.PreflightError) as err:
        preflight.preflight(root)
    assert str(err.value) == ("state: missing storage mnt_data: recorded active but not found in reality (volume vol-1) "
                              "(from meta-state drift.yaml, state query q2; re-run 'state query' after fixing)")
    assert err.value.result["hard_drift"] == [MISSING] and err.value.result["report"] == "meta-state/drift.yaml"
    # the same lines again write nothing (a daily drift job does not fill the audit trail)
    assert drift.record_hard(root, _report("q3", [MISSING]))["changed"] is False
    assert MetaState(root).revision() == 1
    # a query that could not look the volume up (the endpoint down, expired credentials) keeps its line
    out = drift.record_hard(root, _report("q4", [STALE], unseen=["mnt_data"]))
    assert out["changed"] is False and out["kept"] == [{k: MISSING[k] for k in ("kind", "name", "drift", "detail")}]
    with pytest.raises(preflight.PreflightError):
        preflight.preflight(root)
    # the checkout that ran the query: a line in both names the report, as the reference's message does
    write_report(root, [MISSING], run="q2")
    with pytest.raises(preflight.PreflightError, match=r"\(from state-report.json; re-run 'state query' after fixing\)$"):
        preflight.preflight(root)
    # a query that saw the volume back clears the record; this checkout's own older report still
    # refuses until its own query runs again (a report newer than the record, written when the
    # record could not be, refuses the same way)
    assert drift.record_hard(root, _report("q5", [STALE])) == {
        "where": "meta-state/drift.yaml", "changed": True, "revision": 2, "kept": []}
    with pytest.raises(preflight.PreflightError, match=r"\(from state-report.json; "):
        preflight.preflight(root)
    write_report(root, [STALE], run="q6")
    res = preflight.preflight(root)
    assert res["hard_drift"] == [] and res["report"] == "meta-state/drift.yaml and %s" % os.path.join(
        root, "generated", "state-report.json")
    assert [a["what"] for a in audit_trail(MetaState(root))][-2:] == ["csis_state_query q2", "csis_state_query q5"]


def test_a_drift_record_written_by_hand_without_a_run_still_refuses(tmp_path):
    root = tree_at(tmp_path)
    write_meta(root, "drift.yaml", {"hard": [{k: MISSING[k] for k in ("kind", "name", "drift", "detail")}]})
    with pytest.raises(preflight.PreflightError, match=r"\(from meta-state drift.yaml, state query unknown; "):
        preflight.preflight(root)


def test_a_damaged_drift_record_refuses_naming_it(tmp_path):
    root = tree_at(tmp_path)
    write_meta(root, "drift.yaml", {"hard": [{"kind": "storage", "name": "x", "drift": "missing"}], "run": "q"})
    with pytest.raises(preflight.PreflightError) as err:
        preflight.preflight(root)
    assert str(err.value) == ("meta-state/drift.yaml: 'hard[0]'.detail must be a non-empty string, got null. It holds "
                              "only the last state query's HARD lines: remove it and run playbooks/state_query.yml "
                              "again, which writes it anew")
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import drift
    with pytest.raises(MetaStateError, match=r"drift.yaml: 'hard\[0\]'.detail .* remove it and run playbooks/state_query.yml"):
        drift.record_hard(root, _report("q", []))


# --------------------------------------------------------------------------- meta-state
def test_an_existing_meta_state_is_read_probed_and_locked_leaving_nothing(tmp_path):
    root = tree_at(tmp_path)
    write_meta(root, "storage-state.yaml", {"storages": {}})
    before = listing(root)
    res = preflight.meta_state(root)
    assert res["writable"] is True and res["exists"] is True and res["files"] == ["storage-state.yaml"]
    # no probe left; only the store's own lock file, which every transaction keeps
    assert [p for p in listing(root) if p not in before] == ["meta-state/.lock"]
    assert open(os.path.join(root, "meta-state", ".lock"), encoding="utf-8").read() == ""


def test_a_damaged_meta_state_file_refuses_naming_it(tmp_path):
    root = tree_at(tmp_path)
    os.makedirs(os.path.join(root, "meta-state"))
    open(os.path.join(root, "meta-state", "launch-params.yaml"), "w").close()
    with pytest.raises(preflight.PreflightError, match=r"meta-state/launch-params.yaml: is empty"):
        preflight.preflight(root)


def test_meta_state_that_is_a_file_refuses_naming_the_path(tmp_path):
    root = tree_at(tmp_path)
    open(os.path.join(root, "meta-state"), "w").close()
    with pytest.raises(preflight.PreflightError) as err:
        preflight.preflight(root)
    assert "%s is not a directory" % os.path.join(root, "meta-state") in str(err.value)
    assert "stops before planning anything" in str(err.value)
    assert err.value.result["meta_state"]["writable"] is False


def test_an_immutable_meta_state_directory_refuses_naming_it(tmp_path, immutable):
    root = tree_at(tmp_path)
    write_meta(root, "storage-state.yaml", {"storages": {}})
    immutable(tmp_path / "meta-state")
    with pytest.raises(NotWritable) as err:
        MetaState(root).check_writable()
    assert str(err.value) == ("meta-state: the directory %s cannot be written: Operation not permitted"
                              % os.path.join(root, "meta-state"))
    with pytest.raises(preflight.PreflightError, match="make it writable"):
        preflight.preflight(root)
    # a run that writes nothing (a dry run, the summary) only reads: the reads pass
    assert preflight.preflight(root, write=False)["meta_state"]["writable"] is None


def test_an_immutable_meta_state_file_refuses_naming_it(tmp_path, immutable):
    root = tree_at(tmp_path)
    write_meta(root, "storage-state.yaml", {"storages": {}})
    immutable(tmp_path / "meta-state" / "storage-state.yaml")
    with pytest.raises(NotWritable, match=r"meta-state/storage-state.yaml: .* is immutable or append-only"):
        MetaState(root).check_writable()


def test_a_missing_meta_state_under_an_unwritable_root_refuses(tmp_path, immutable):
    root = tmp_path / "cfg"
    root.mkdir()
    immutable(root)
    with pytest.raises(NotWritable, match=r"cfg/meta-state \(it does not exist yet and cannot be created in "
                                          r".*cfg\) cannot be written: Operation not permitted"):
        MetaState(str(root)).check_writable()


def test_a_held_lock_is_waited_for_then_named(tmp_path):
    root = tree_at(tmp_path)
    write_meta(root, "storage-state.yaml", {"storages": {}})
    entered, leave = threading.Event(), threading.Event()

    def hold():
        with MetaState(root).transaction("the other run"):
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert entered.wait(10)
        with pytest.raises(MetaStateError, match="meta-state is locked by .*the other run"):
            MetaState(root, lock_timeout=0.2).check_writable()
    finally:
        leave.set()
        t.join()
    assert MetaState(root, lock_timeout=0.2).check_writable()["exists"] is True


# --------------------------------------------------------------------------- ephemeral targets
def eph_root():
    return {"key": "instance-image-x", "ephemeral": ["e1", "e2", "e3", "e4"], "instances": {
        "e1": {"on_failure": "keep", "skip_verify": False},
        "e2": {"on_failure": "teardown", "skip_verify": True, "skip_reason": "Ephemeral instance e2: elapsed"},
        "e3": {"on_failure": "keep"},
        "e4": {"on_failure": "teardown"},
        "durable": {}}}


def test_ephemeral_targets_from_the_record_the_policies_and_meta_state(tmp_path):
    root = tree_at(tmp_path)
    write_meta(root, "launch-params.yaml", {"instances": {n: {"launched": True} for n in ("e1", "e2", "e4")}})
    write_meta(root, "instance-state.yaml", {"instances": {
        "e1": {"generation": {"ephemeral": 1}, "current": {"number": 1, "kind": "ephemeral", "instance_id": "i-1",
                                                           "private_ip": "10.0.0.1"}},
        "e4": {"generation": {"ephemeral": 1}, "current": {"number": 1, "kind": "ephemeral", "instance_id": "i-4"}}}})
    got = ephemeral.targets(root, eph_root(), recorded={"e1": "launched", "e2": "standing", "e3": "ephemeral",
                                                        "e4": "standing", "durable": "standing"},
                            connection="ssh", defaults={"ansible_user": "ops", "csis_verify_fs_root": "/"},
                            per_host={"e4": {"ansible_connection": "local", "csis_verify_fs_root": "/srv/e4"}})
    assert got["standing"] == ["e1", "e2", "e4"]
    assert got["skipped"] == [{"name": "e2", "reason": "Ephemeral instance e2: elapsed"}]
    assert got["keep_on_failure"] == ["e1", "e3"]
    assert got["verify"] == [
        {"name": "e1", "address": "10.0.0.1", "connection": "ssh", "instance_id": "i-1",
         "vars": {"ansible_user": "ops", "csis_verify_fs_root": "/"}},
        {"name": "e4", "address": "e4", "connection": "local", "instance_id": "i-4",
         "vars": {"ansible_user": "ops", "csis_verify_fs_root": "/srv/e4", "ansible_connection": "local"}},
    ]
    assert got["host_vars"] == [
        {"host": "e1", "key": "ansible_user", "value": "ops"}, {"host": "e1", "key": "csis_verify_fs_root", "value": "/"},
        {"host": "e4", "key": "ansible_user", "value": "ops"},
        {"host": "e4", "key": "csis_verify_fs_root", "value": "/srv/e4"},
        {"host": "e4", "key": "ansible_connection", "value": "local"}]


def test_ephemeral_targets_read_meta_state_through_the_store(tmp_path):
    root = tree_at(tmp_path)
    os.makedirs(os.path.join(root, "meta-state"))
    open(os.path.join(root, "meta-state", "instance-state.yaml"), "w").close()  # truncated to nothing
    with pytest.raises(MetaStateError, match="instance-state.yaml: is empty"):
        ephemeral.targets(root, eph_root(), recorded={"e1": "launched"})
    # nothing standing to verify: nothing read
    got = ephemeral.targets(root, eph_root(), recorded={"e2": "standing"})
    assert got["standing"] == ["e2"] and got["verify"] == [] and got["host_vars"] == []


# --------------------------------------------------------------------------- a record that fails after the apply
STORAGE_ROOT = {"key": "storage-aws-ebs", "directory": "/gen/storage/aws-ebs/storage", "builder": "aws-ebs",
                "lifecycle": "storage", "storages": {"mnt_data": {"builder": "aws-ebs", "type": "ebs",
                                                                  "address": "module.storage_mnt_data"}}}
STATE = {"resources": [{"mode": "managed", "module": "module.storage_mnt_data", "type": "aws_ebs_volume",
                        "name": "this", "instances": [{"attributes": {"id": "vol-0abc", "size": 100,
                                                                      "availability_zone": "us-east-2a"}}]}]}


def test_a_failed_record_names_what_was_applied_and_that_a_re_run_records_it(tmp_path):
    root = tree_at(tmp_path)
    open(os.path.join(root, "meta-state"), "w").close()  # meta-state cannot be created
    with pytest.raises(record.RecordError) as err:
        record.record_root(root, STORAGE_ROOT, "r1", state=STATE, applied="Plan: 1 to add, 0 to change, 0 to destroy")
    msg = str(err.value)
    assert msg.startswith("storage-aws-ebs: the apply happened (Plan: 1 to add, 0 to change, 0 to destroy, in "
                          "/gen/storage/aws-ebs/storage) and terraform state holds its result (storage mnt_data: "
                          "aws_ebs_volume vol-0abc), but recording it in meta-state failed: meta-state: cannot "
                          "create the directory"), msg
    assert msg.endswith("Nothing applied is lost: once meta-state can be written again, run the same playbook "
                        "again; its plan shows no change for what was applied and its record step records what "
                        "the state holds (what this apply destroyed excepted: that run names each such storage or "
                        "machine, and playbooks/forget.yml with force=true, which looks it up first, records it).")
    with pytest.raises(record.RecordError, match=r"^storage-aws-ebs: recording what terraform state holds "
                                                 r"\(storage mnt_data: not in the state\) in meta-state failed"):
        record.record_root(root, STORAGE_ROOT, "r1", state={"resources": []})


def test_a_root_that_is_no_tree_is_refused_before_anything_is_written(tmp_path):
    missing = str(tmp_path / "missing")
    with pytest.raises(preflight.MetaStateError, match="the configuration root does not exist or is not a directory"):
        preflight.preflight(missing)
    assert not os.path.exists(missing)
    with pytest.raises(preflight.MetaStateError, match="not a configuration tree: it has no cfg/_config.yml"):
        preflight.preflight(str(tmp_path))
    assert os.listdir(str(tmp_path)) == []


def test_a_damaged_revision_record_refuses_before_the_run_plans(tmp_path):
    """Every commit reads meta-state/revision.yaml first: a damaged one would fail the first
    record after an approval; the preflight names it before anything is planned."""
    root = tree_at(tmp_path)
    os.makedirs(os.path.join(root, "meta-state"))
    with open(os.path.join(root, "meta-state", "revision.yaml"), "w", encoding="utf-8") as fh:
        fh.write("garbage: [\n")
    with pytest.raises(preflight.PreflightError) as exc:
        preflight.preflight(root)
    assert any("meta-state/revision.yaml: is not a revision record" in p for p in exc.value.problems), exc.value.problems
