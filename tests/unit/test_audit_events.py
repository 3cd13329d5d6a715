# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Audit events that change no record (a refused gate, a refused apply check)."""
from __future__ import annotations

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.state import store


def test_an_event_gets_a_revision_and_changes_no_record(tmp_path):
    root = str(tmp_path)
    with store.MetaState(root).transaction("seed") as txn:
        data = txn.load("verifications.yaml")
        data["verifications"].append({"instance": "web", "ok": True})
        txn.save("verifications.yaml", data)
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
