# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""generated/run-summary.json (apply/runsummary.py): merged per root, one run per file, atomic."""
from __future__ import annotations

import json
import os
import threading

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.apply import runsummary as rs


def test_entries_of_one_run_are_merged_and_counted(tmp_path):
    root = str(tmp_path)
    rs.add_root(root, "run1", {"key": "storage-ebs", "status": "ok", "applied": "True", "plan": "Plan: 1 to add",
                               "gate": {"verdict": "passed", "violations": []}, "recorded": ["storage-state.yaml"],
                               "seconds": "12.34", "started": "2026-11-30T10:00:05Z", "junk": "dropped"})
    data = rs.add_root(root, "run1", {"key": "storage-s3", "status": "failed", "failed_step": "Gate the plan",
                                      "gate": {"verdict": "refused", "violations": ["DESTROY NOT WHITELISTED: x"]},
                                      "applied": False, "started": "2026-11-30T10:00:01Z"})
    assert sorted(data["roots"]) == ["storage-ebs", "storage-s3"]
    ebs = data["roots"]["storage-ebs"]
    assert ebs["applied"] is True and ebs["seconds"] == 12.3 and "junk" not in ebs
    assert data["totals"] == {"roots": 2, "applied": 1, "failed": 1, "refused": 1, "stopped": 0}
    assert data["started"] == "2026-11-30T10:00:01Z"
    with open(rs.path_of(root), encoding="utf-8") as fh:
        assert json.load(fh) == data
    lines = rs.summary_lines(rs.read(root))
    assert lines[0].startswith("this checkout's last real run run1 (started 2026-11-30T10:00:01Z): 2 root(s), 1 applied, "
                               "1 failed, 1 refused")
    assert any(line.startswith("storage-s3: failed; at 'Gate the plan'") and "gate refused" in line for line in lines)


def test_a_root_stopped_because_another_failed_is_counted_apart(tmp_path):
    root = str(tmp_path)
    rs.add_root(root, "run1", {"key": "storage-ebs", "status": "failed", "failed_step": "Check that the recorded storages"})
    data = rs.add_root(root, "run1", {"key": "storage-efs", "status": "stopped", "failed_step": ""})
    assert data["totals"] == {"roots": 2, "applied": 0, "failed": 1, "refused": 0, "stopped": 1}
    lines = rs.summary_lines(data)
    assert lines[0].endswith("1 failed, 0 refused by the gate, 1 stopped as another failed"), lines[0]
    assert any(line.startswith("storage-efs: stopped;") for line in lines), lines


def test_a_new_run_starts_the_file_afresh(tmp_path):
    root = str(tmp_path)
    rs.add_root(root, "run1", {"key": "a", "status": "ok"})
    data = rs.add_root(root, "run2", {"key": "b", "status": "ok"})
    assert data["run_id"] == "run2" and sorted(data["roots"]) == ["b"]


def test_parallel_roots_lose_no_entry(tmp_path):
    root = str(tmp_path)
    threads = [threading.Thread(target=rs.add_root, args=(root, "run", {"key": "root-%d" % i, "status": "ok"}))
               for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(rs.read(root)["roots"]) == 12


def test_no_summary_and_a_damaged_one(tmp_path):
    root = str(tmp_path)
    assert rs.read(root) is None
    assert rs.summary_lines(None) == ["no real run of this checkout has written generated/run-summary.json yet"]
    os.makedirs(os.path.join(root, "generated"))
    with open(rs.path_of(root), "w", encoding="utf-8") as fh:
        fh.write('{"version": 1, "roots": ')
    with pytest.raises(rs.RunSummaryError) as exc:
        rs.read(root)
    assert "generated/run-summary.json" in str(exc.value)
    # a damaged report decides nothing: the next run replaces it
    assert rs.add_root(root, "run", {"key": "a"})["roots"] == {"a": {"key": "a"}}


def test_entry_needs_a_key_and_a_run_id(tmp_path):
    with pytest.raises(rs.RunSummaryError):
        rs.add_root(str(tmp_path), "run", {"status": "ok"})
    with pytest.raises(rs.RunSummaryError):
        rs.add_root(str(tmp_path), "", {"key": "a"})


def test_the_apply_has_its_own_time_beside_the_roots_pass(tmp_path):
    """A lifecycle's roots go step by step together: a root's pass includes waiting for a slower
    sibling, so the line gives the apply's own time apart (csis_apply_wait's seconds)."""
    root = str(tmp_path)
    rs.add_root(root, "run1", {"key": "storage-ebs", "status": "ok", "applied": "True", "plan": "Plan: 1 to add",
                               "seconds": "74.2", "apply_seconds": "16.04"})
    data = rs.add_root(root, "run1", {"key": "storage-efs", "status": "ok", "applied": "False", "seconds": "74.0",
                                      "apply_seconds": ""})
    assert data["roots"]["storage-ebs"]["apply_seconds"] == 16.0
    assert "apply_seconds" not in data["roots"]["storage-efs"]  # nothing applied: no apply time
    lines = rs.summary_lines(data)
    assert "storage-ebs: ok; Plan: 1 to add; applied in 16 s; 74 s in all" in lines, lines
    assert "storage-efs: ok; nothing applied; 74 s in all" in lines, lines


def test_an_apply_that_failed_partway_is_not_called_nothing_applied(tmp_path):
    """terraform stops a failed apply partway: what it did before is in the root's state and not in
    meta-state (the record did not run), so the summary must not say "nothing applied"."""
    root = str(tmp_path)
    data = rs.add_root(root, "run1", {"key": "storage-ebs", "status": "failed", "failed_step": "Apply exactly that plan file",
                                      "applied": "False", "apply_failed": "True", "plan": "Plan: 2 to add"})
    assert data["roots"]["storage-ebs"]["apply_failed"] is True
    line = [x for x in rs.summary_lines(data) if x.startswith("storage-ebs:")][0]
    assert "nothing applied" not in line, line
    assert line.startswith("storage-ebs: failed; at 'Apply exactly that plan file'; Plan: 2 to add; the apply failed partway: "
                           "resources may have been created, changed or destroyed"), line
    assert "playbooks/state_query.yml" in line, line
    # an ephemeral root: its launch pass applied and recorded, its teardown's apply failed partway
    data = rs.add_root(root, "run1", {"key": "instance-image-t", "status": "failed", "applied": "True", "apply_failed": "True",
                                      "recorded": ["launch-params.yaml"]})
    line = [x for x in rs.summary_lines(data) if x.startswith("instance-image-t:")][0]
    assert "an earlier pass of the root applied; this pass's apply failed partway" in line, line
    assert "nothing was recorded" not in line and "recorded launch-params.yaml" in line, line
    # a root refused before its apply still says nothing was applied
    data = rs.add_root(root, "run1", {"key": "storage-efs", "status": "failed", "failed_step": "Gate the plan",
                                      "applied": "False", "apply_failed": "False"})
    assert "storage-efs: failed; at 'Gate the plan'; nothing applied" in rs.summary_lines(data)
