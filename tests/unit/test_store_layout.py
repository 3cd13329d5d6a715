# -*- coding: utf-8 -*-
"""The per-record local layout of meta-state (issue 10): records, migration, revisions, the
audit trail, lost updates, the meta_state setting. Pure library, temporary directories."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from ansible_collections.csis.infra.plugins.module_utils.csis.state import backends
from ansible_collections.csis.infra.plugins.module_utils.csis.state import store
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import (
    Conflict, MetaState, MetaStateError, audit_trail, launched_instances, record_at)

LP, IS = "launch-params.yaml", "instance-state.yaml"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CSIS_META_STATE_CACHE", str(tmp_path / "reader-cache"))


def _ms(tmp_path: Path) -> MetaState:
    return MetaState(str(tmp_path / "cfg"), lock_timeout=5)


def _launch(name: str, **extra):
    return dict({"image": "base", "launched": True, "group": "team"}, **extra)


def _current(iid: str):
    return {"generation": {"durable": 1, "ephemeral": 0},
            "current": {"number": 1, "kind": "durable", "instance_id": iid}}


def _files(ms: MetaState):
    return sorted(os.path.relpath(os.path.join(d, f), ms.dir) for d, _s, fs in os.walk(ms.dir) for f in fs)


def test_records_are_one_file_each_and_load_assembles_them(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction("t") as txn:
        txn.save(LP, {"instances": {"a": _launch("a"), "b": _launch("b")}})
        txn.save(IS, {"instances": {"a": _current("i-a")}})
    assert _files(ms) == [".lock", "audit/00000001.yaml", "instance-state/a.yaml",
                          "launch-params/a.yaml", "launch-params/b.yaml", "revision.yaml"]
    assert ms.load(LP) == {"instances": {"a": _launch("a"), "b": _launch("b")}}
    assert yaml.safe_load(Path(ms.record_path(LP, "b")).read_text()) == {"instances": {"b": _launch("b")}}
    assert sorted(launched_instances(ms)) == ["a", "b"]
    assert ms.revision() == 1 and txn.revision == 1


def test_a_transaction_writes_only_the_records_it_changed(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save(LP, {"instances": {"n%03d" % i: _launch("x") for i in range(50)}})
    before = {f: os.stat(os.path.join(ms.dir, f)).st_ino for f in _files(ms) if f.startswith("launch-params/")}
    with ms.transaction("one") as txn:
        data = txn.load(LP)
        data["instances"]["n007"]["alias"] = "db"
        del data["instances"]["n009"]
        txn.save(LP, data)
    after = {f: os.stat(os.path.join(ms.dir, f)).st_ino for f in _files(ms) if f.startswith("launch-params/")}
    assert set(before) - set(after) == {"launch-params/n009.yaml"}
    assert [f for f in after if after[f] != before[f]] == ["launch-params/n007.yaml"]
    assert txn.written == [LP] and txn.revision == 2
    trail = audit_trail(ms)
    assert [d["revision"] for d in trail] == [1, 2]
    changes = {(c["key"], c["action"]) for c in trail[1]["changes"]}
    assert changes == {("n007", "changed"), ("n009", "deleted")}
    assert trail[1]["what"] == "one" and trail[1]["who"]["user"]
    n007 = [c for c in trail[1]["changes"] if c["key"] == "n007"][0]
    assert n007["diff"] == ['alias: (none) -> "db"']


def test_record_api_reads_and_writes_one_record(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save(LP, {"instances": {"a": _launch("a")}})
    with ms.transaction("rec") as txn:
        assert txn.load_record(LP, "a") == _launch("a")
        assert txn.load_record(LP, "zz") is None
        txn.save_record(LP, "c", _launch("c"))
        txn.save_record(IS, "c", _current("i-c"))
    assert sorted(ms.load(LP)["instances"]) == ["a", "c"]
    assert ms.load_record(IS, "c")["current"]["instance_id"] == "i-c"
    with ms.transaction() as txn:
        txn.save_record(IS, "c", None)
    assert ms.load(IS)["instances"] == {}


def test_a_commit_that_contradicts_is_refused_for_the_changed_names(tmp_path):
    ms = _ms(tmp_path)
    with pytest.raises(MetaStateError, match=r"open generation .* has no launch record of 'x'.*nothing was written"):
        with ms.transaction() as txn:
            txn.save_record(IS, "x", _current("i-x"))
    assert ms.revision() == 0 and not os.path.exists(os.path.join(ms.dir, "instance-state"))


@pytest.mark.parametrize("key", ["../escape", "a/b", ".hidden", "", "x" * 64])
def test_a_record_name_that_could_escape_is_refused(tmp_path, key):
    ms = _ms(tmp_path)
    with pytest.raises(MetaStateError, match=r"meta-state/launch-params.yaml: 'instances\..*' is not a record name"):
        with ms.transaction() as txn:
            txn.save(LP, {"instances": {key: _launch(key)}})
    assert not os.path.exists(os.path.join(ms.dir, "launch-params"))


def test_damaged_record_files_are_refused_naming_them(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save(LP, {"instances": {"a": _launch("a")}})
    path = Path(ms.record_path(LP, "a"))
    whole = path.read_bytes()
    for text, reason in ((b"", "is empty (0 bytes)"), (whole[:-10], "is incomplete"),
                         (b"# only a comment\n", "holds no records, only comments")):
        path.write_bytes(text)
        with pytest.raises(MetaStateError, match=r"^meta-state/launch-params/a.yaml: " + reason.replace("(", r"\(").replace(")", r"\)")):
            ms.load(LP)
        with pytest.raises(MetaStateError, match=r"^meta-state/launch-params/a.yaml: "):
            with ms.transaction() as txn:
                txn.save_record(LP, "a", _launch("a", alias="new"))
        assert path.read_bytes() == text  # never overwritten
    path.write_bytes(store.dumps({"instances": {"b": _launch("b")}}).encode())
    with pytest.raises(MetaStateError, match=r"^meta-state/launch-params/a.yaml: must hold exactly the record 'instances.a'"):
        ms.load(LP)
    (path.parent / "not a name.yaml").write_text("x: 1\n")
    path.write_bytes(whole)
    with pytest.raises(MetaStateError, match=r"meta-state/launch-params/not a name.yaml: is not a record file"):
        ms.load(LP)


def test_whole_files_migrate_on_the_first_transaction(tmp_path):
    """Today's files (launch-params.yaml etc.) are read as they are, then migrated."""
    ms = _ms(tmp_path)
    os.makedirs(ms.dir)
    legacy = {LP: {"instances": {"a": _launch("a"), "b": _launch("b", launched=False)}},
              IS: {"instances": {"a": _current("i-a")}},
              "storage-state.yaml": {"storages": {"d": {"state": "active", "generation": 1}}},
              "storage.yaml": {"storages": {"d": {"current_state": "active"}}},
              "pins.yaml": {"instances": {"a": "ami-1"}, "pending_replacements": {"a": {"to": None, "from": "ami-1"}},
                            "upgrades": [{"kind": "instance", "name": "a", "from": None, "to": "ami-1", "op": "bind"}]}}
    for name, data in legacy.items():
        Path(ms.path(name)).write_text(store.LEGACY_HEADER + yaml.safe_dump(data))
    expected = {name: ms.load(name) for name in store.FILES}
    assert sorted(launched_instances(ms)) == ["a"]
    assert MetaState(ms.config_root).revision() == 0
    # a transaction touching one file migrates it (its records written, the whole file removed)
    with ms.transaction("migrate") as txn:
        txn.save_record(LP, "c", _launch("c"))
    files = _files(ms)
    assert LP not in files and {"launch-params/a.yaml", "launch-params/b.yaml", "launch-params/c.yaml"} <= set(files)
    assert IS in files  # untouched files stay as they are until written
    expected[LP]["instances"]["c"] = _launch("c")
    assert {name: ms.load(name) for name in store.FILES} == expected
    trail = audit_trail(ms)
    assert trail[0]["changes"][0]["action"] == "migrated" and trail[0]["changes"][0]["records"] == 3
    # every keyed file migrates once written (pins: a record per pin, the rest beside them);
    # the others stay whole files
    with ms.transaction() as txn:
        for name in store.KEYED:
            txn.save(name, txn.load(name))
        txn.save("runs.yaml", {"runs": [{"run": "r1"}]})
    assert not any(os.path.exists(ms.path(n)) for n in store.KEYED)
    assert {"pins/a.yaml", "pins/_rest.yaml", "runs.yaml"} <= set(_files(ms))
    expected["runs.yaml"] = {"runs": [{"run": "r1"}]}
    assert {name: ms.load(name) for name in store.FILES} == expected
    # a whole file put back by hand (a restored backup) is what is read again, and migrates again
    Path(ms.path(LP)).write_text(yaml.safe_dump({"instances": {"a": _launch("a")}}))
    assert sorted(ms.load(LP)["instances"]) == ["a"]
    with ms.transaction() as txn:
        txn.save(LP, txn.load(LP))
    assert sorted(os.listdir(os.path.join(ms.dir, "launch-params"))) == ["a.yaml"]


def test_lost_update_is_refused_and_nothing_is_overwritten(tmp_path):
    """A writer whose base moved (its lock expired and another run committed) writes nothing."""
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save(LP, {"instances": {"a": _launch("a")}})
    slow = MetaState(ms.config_root)
    lock = slow.objects.lock(1, "slow")  # the slow writer's lock
    stale = store.Transaction(slow, None, "slow")
    data = stale.load(LP)
    data["instances"]["a"]["alias"] = "stale"
    stale.save(LP, data)
    lock.release()  # as if it had expired and been broken: another run commits meanwhile
    with ms.transaction("fast") as txn:
        txn.save_record(LP, "a", _launch("a", alias="fresh"))
    with pytest.raises(Conflict, match=r"meta-state/revision.yaml: another run committed since this transaction began"):
        stale._commit()
    assert ms.load(LP)["instances"]["a"]["alias"] == "fresh"
    # the record itself is conditioned too: a change made behind the store's back is never overwritten
    stale = store.Transaction(slow, None, "slow")
    data = stale.load(LP)
    data["instances"]["a"]["alias"] = "stale"
    stale.save(LP, data)
    Path(ms.record_path(LP, "a")).write_text(store.dumps({"instances": {"a": _launch("a", alias="by-hand")}}))
    with pytest.raises(Conflict, match=r"meta-state/launch-params/a.yaml: changed since this transaction read it"):
        stale._commit()
    assert ms.load(LP)["instances"]["a"]["alias"] == "by-hand"


def test_history_filters_and_record_as_of_a_revision(tmp_path):
    ms = _ms(tmp_path)
    for alias in ("one", "two", "three"):
        with ms.transaction("set %s" % alias, context={"root": "instances-aws"}) as txn:
            txn.save_record(LP, "a", _launch("a", alias=alias))
    with ms.transaction("storage") as txn:
        txn.save("storage-state.yaml", {"storages": {"d": {"state": "active"}}})
        txn.save("storage.yaml", {"storages": {"d": {"current_state": "active"}}})
    assert [d["revision"] for d in audit_trail(ms, instance="a")] == [1, 2, 3]
    assert [d["revision"] for d in audit_trail(ms, storage="d")] == [4]
    assert [d["revision"] for d in audit_trail(ms, root="instances-aws")] == [1, 2, 3]
    assert audit_trail(ms, instance="nobody") == []
    assert [record_at(ms, LP, "a", r)["alias"] for r in (1, 2, 3, 4)] == ["one", "two", "three", "three"]
    assert record_at(ms, LP, "a", 0) is None


def test_the_reader_cache_is_used_and_follows_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "CACHE_MIN", 3)
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save(LP, {"instances": {"n%d" % i: _launch("x") for i in range(5)}})
    assert len(ms.load(LP)["instances"]) == 5
    cache = [os.path.join(d, f) for d, _s, fs in os.walk(str(tmp_path / "reader-cache")) for f in fs]
    assert len(cache) == 1 and json.load(open(cache[0]))["format"] == 1
    fresh = MetaState(ms.config_root)
    parsed = []
    real = fresh._decode_record
    monkeypatch.setattr(fresh, "_decode_record", lambda *a: (parsed.append(a[1]), real(*a))[1])
    assert len(fresh.load(LP)["instances"]) == 5 and parsed == []  # all from the cache
    with ms.transaction() as txn:
        txn.save_record(LP, "n2", _launch("x", alias="changed"))
    assert fresh.load(LP)["instances"]["n2"]["alias"] == "changed" and parsed == ["n2"]


def test_the_s3_setting_is_read_from_the_tree_and_checked(tmp_path):
    root = tmp_path / "cfg"
    (root / "cfg").mkdir(parents=True)
    (root / "cfg" / "_config.yml").write_text("config: {}\n")
    assert MetaState(str(root)).backend == "local"
    (root / "cfg" / "state-backends.yml").write_text(yaml.safe_dump({"state_backends": [
        {"name": "s3-main", "type": "s3", "bucket": "csis-state", "key": "statefiles/x", "region": "us-east-2",
         "endpoints": {"url": "http://127.0.0.1:1"}, "use_path_style": True},
        {"name": "files", "type": "local", "directory": "state"}]}))
    (root / "cfg" / "_config.yml").write_text(yaml.safe_dump({"config": {}, "meta_state": {
        "backend": "s3", "state_backend": "s3-main", "prefix": "team-a"}}))
    ms = MetaState(str(root))
    assert ms.backend == "s3" and ms.where == "s3://csis-state/team-a/meta-state"
    assert ms.objects.access["endpoints"] == {"s3": "http://127.0.0.1:1"}
    for setting, message in (
            ({"backend": "s3", "state_backend": "nope"}, "names 'nope', which is not a state backend declared"),
            ({"backend": "s3", "state_backend": "files"}, "names 'files', a local state backend"),
            ({"backend": "s3"}, "needs 'state_backend'"),
            ({"backend": "ftp", "state_backend": "s3-main"}, "'meta_state' is not valid: backend"),
            ({"backend": "s3", "state_backend": "s3-main", "prefix": "../up"}, "prefix '../up' must be a relative")):
        (root / "cfg" / "_config.yml").write_text(yaml.safe_dump({"config": {}, "meta_state": setting}))
        with pytest.raises(MetaStateError, match=r"^cfg/_config.yml: .*" + r".*".join(map(str, [message.replace("(", ".").replace(")", ".")]))):
            MetaState(str(root)).load(LP)


def test_who_names_awx_when_it_passed_its_ids():
    out = backends.who({"CSIS_AWX_JOB_ID": "42", "AWX_USER_NAME": "alice", "CSIS_AWX_WORKFLOW_JOB_ID": "7"})
    assert out["awx_job_id"] == "42" and out["awx_user_name"] == "alice" and out["awx_workflow_job_id"] == "7"
    assert "awx_job_id" not in backends.who({})


@pytest.mark.parametrize("old,new,expected", [
    ("who:\n  host: vm", "who: someone\nwas:\n  host: vm", "'who' must be a mapping, got string"),
    ("context: {}", "context: x", "'context' must be a mapping, got string"),
    ("revision: 1", "revision: one", "'revision' must be a revision number, got string"),
    ("  key: d\n", "  key: 5\n", "'changes[0].key' must be a string, got integer"),
    ("diff:\n  - '<record>", "diff:\n  - 5\n  - '<record>", "'changes[0].diff' must be a list of strings, got list"),
])
def test_an_audit_record_with_a_damaged_field_is_refused_naming_it(tmp_path, old, new, expected):
    """csis_history walks the audit records' fields: a damaged one is a message naming the record, not a
    TypeError from the middle of the history."""
    ms = _ms(tmp_path)
    with ms.transaction("t") as txn:
        txn.save("storage-state.yaml", {"storages": {"d": {"state": "active", "generation": 1}}})
    path = Path(ms.dir, "audit", "00000001.yaml")
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(MetaStateError) as err:
        store.history_report(ms.config_root, storage="d")
    assert str(err.value) == "meta-state/audit/00000001.yaml: %s; %s" % (expected, store.DAMAGED)


def test_a_damaged_reader_cache_is_read_past(tmp_path, monkeypatch):
    """The parse cache is derived data in the user's cache directory: a cached text that does not parse,
    or that holds what a record may not, is read past (every record parsed again), never trusted."""
    monkeypatch.setattr(store, "CACHE_MIN", 3)
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save(LP, {"instances": {"n%d" % i: _launch("x") for i in range(5)}})
    want = ms.load(LP)
    (cache,) = [os.path.join(d, f) for d, _s, fs in os.walk(str(tmp_path / "reader-cache")) for f in fs]
    doc = json.load(open(cache))
    for damage in (json.dumps(_launch("x", launched="yes")), "{not json"):
        doc["records"]["n2"][1] = damage
        with open(cache, "w") as fh:
            json.dump(doc, fh)
        assert MetaState(ms.config_root).load(LP) == want
