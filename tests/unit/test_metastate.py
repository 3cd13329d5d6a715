# -*- coding: utf-8 -*-
"""Unit tests for plugins/module_utils/csis/state/store.py (pure library, real processes)."""
from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
COLLECTIONS = ROOT / ".venv" / "collections"
if str(COLLECTIONS) not in sys.path:  # tests/conftest.py normally does this
    sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.csis.infra.plugins.module_utils.csis.state import store as metastate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import DAMAGED  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import (  # noqa: E402
    HEADER, MetaState, MetaStateError, launched_instances)

from store_faults import ends_before_lock_check, paused_commit  # noqa: E402  (tests/support, on sys.path through tests/conftest.py)

# the directory holding the ansible_collections this process imported the library from (the
# checkout's .venv/collections under scripts/test; the copy's parent under `ansible-test units`,
# scripts/units), for the processes these tests start
LIBRARY_PATH = str(Path(metastate.__file__).parents[7])


def _ms(tmp_path: Path, **kw) -> MetaState:
    return MetaState(str(tmp_path / "cfg"), **kw)


def _write_raw(ms: MetaState, name: str, text: str) -> Path:
    os.makedirs(ms.dir, exist_ok=True)
    path = Path(ms.dir) / name
    path.write_text(text, encoding="utf-8")
    return path


SAMPLES = {
    "launch-params.yaml": {"instances": {"test2": {
        "image": "base", "build": "ami-0123456789abcdef0", "machine_type": "t3.micro",
        "group": "team", "runtime": "aws", "builder": "aws-ec2", "region": "eu-west-1",
        "mounts": [{"storage": "data", "type": "ebs", "builder": "aws-ebs", "mount_point": "/mnt/data",
                    "group": "team", "share_mode": "2770", "public_read": False, "device": "/dev/xvdf"}],
        "hostname": "test2-001", "ephemeral": False, "tags": {"Owner": "team"},
        "launched": True, "launched_run": "2026_11_29t06_13_54"}}},
    "instance-state.yaml": {"instances": {"test2": {
        "generation": {"durable": 1, "ephemeral": 0},
        "current": {"number": 1, "kind": "durable", "instance_id": "i-0abc", "private_ip": "10.0.0.5",
                    "ami_id": "ami-0123456789abcdef0", "availability_zone": "eu-west-1a",
                    "opened_run": "r1", "opened_at": "2026-11-29T06:13:54Z"},
        "history": []}}},
    "pins.yaml": {"instances": {"test2": "ami-0123456789abcdef0"}, "pending_replacements": {},
                  "upgrades": [{"kind": "instance", "name": "test2", "op": "bind", "run": "r1"}]},
    "storage-state.yaml": {"storages": {"data": {
        "state": "active", "generation": 1, "facts": {"builder": "aws-ebs", "type": "ebs"},
        "history": [{"from": None, "to": "active", "run": "r1", "generation": 1}]}}},
    "storage.yaml": {"run": "r1", "storages": {"data": {"builder": "aws-ebs", "type": "ebs",
                                                        "current_state": "active"}}},
    "verifications.yaml": {"verifications": [{"instance": "test2", "ok": True, "checks": []}]},
    "lineage.yaml": {"builds": [{"build_id": "ami-1", "series": "base"}]},
    "runs.yaml": {"runs": [{"run": "r1", "ok": True, "apply": {"storage": "applied"}}]},
}


# ---------------------------------------------------------------------------
# reading / shapes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(metastate.FILES))
def test_missing_files_read_as_empty_shape(tmp_path, name):
    ms = _ms(tmp_path)
    assert ms.load(name) == metastate.empty(name)


@pytest.mark.parametrize("name", sorted(metastate.FILES))
@pytest.mark.parametrize("text,reason", [
    ("", "is empty (0 bytes), but csis.infra never writes an empty meta-state file"),
    ("\n  \n", "is empty (4 bytes)"),
    ("# nothing yet\n", "holds no records, only comments"),
    (metastate.LEGACY_HEADER, "holds no records, only comments"),
])
def test_empty_files_are_refused_not_read_as_empty(tmp_path, name, text, reason):
    ms = _ms(tmp_path)
    path = _write_raw(ms, name, text)
    with pytest.raises(MetaStateError) as err:
        ms.load(name)
    assert str(err.value).startswith("meta-state/%s: %s" % (name, reason))
    assert "nothing is read from it or written to it until it is restored" in str(err.value)
    assert path.read_text(encoding="utf-8") == text


def test_empty_shapes():
    assert metastate.empty("pins.yaml") == {"instances": {}, "pending_replacements": {}, "upgrades": []}
    assert metastate.empty("instance-state.yaml") == {"instances": {}}
    assert metastate.empty("runs.yaml") == {"runs": []}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_round_trip(tmp_path, name):
    ms = _ms(tmp_path)
    with ms.transaction("test") as txn:
        for other in metastate.partners([name]):  # the files it must agree with
            txn.save(other, SAMPLES[other])
    got = ms.load(name)
    assert got == metastate.validate(name, SAMPLES[name])
    if name in metastate.KEYED:  # one file per record, each a whole file holding that record
        top = metastate.KEYED[name]
        assert not os.path.exists(ms.path(name)) and got[top]
        for key, record in got[top].items():
            text = Path(ms.record_path(name, key)).read_text(encoding="utf-8")
            assert text == metastate.dumps({top: {key: record}})
        return
    text = Path(ms.path(name)).read_text(encoding="utf-8")
    assert text.startswith(HEADER) and text.endswith(metastate.FOOTER)
    assert text == metastate.dumps(got)


def test_load_returns_independent_copies(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save("launch-params.yaml", SAMPLES["launch-params.yaml"])
        txn.save("pins.yaml", SAMPLES["pins.yaml"])
        inside = txn.load("pins.yaml")
        inside["instances"]["x"] = "ami-x"
        assert "x" not in txn.load("pins.yaml")["instances"]
    first = ms.load("pins.yaml")
    first["instances"].clear()
    assert ms.load("pins.yaml")["instances"] == {"test2": "ami-0123456789abcdef0"}


def test_timestamps_stay_strings_and_datetimes_are_converted(tmp_path):
    ms = _ms(tmp_path)
    _write_raw(ms, "runs.yaml", "runs:\n- run: r1\n  at: 2026-11-29T06:13:54Z\n  day: 2026-11-29\n")
    run = ms.load("runs.yaml")["runs"][0]
    assert run["at"] == "2026-11-29T06:13:54Z" and run["day"] == "2026-11-29"
    when = dt.datetime(2026, 11, 29, 6, 13, 54, tzinfo=dt.timezone.utc)
    with ms.transaction() as txn:
        txn.save("runs.yaml", {"runs": [{"run": "r2", "at": when, "pair": ("a", "b")}]})
    run = ms.load("runs.yaml")["runs"][0]
    assert run == {"run": "r2", "at": "2026-11-29T06:13:54+00:00", "pair": ["a", "b"]}


def test_extra_top_level_keys_are_kept(tmp_path):
    ms = _ms(tmp_path)
    _write_raw(ms, "lineage.yaml", "run: r7\nfuture_key: {a: 1}\nbuilds: []\n")
    data = ms.load("lineage.yaml")
    assert data["run"] == "r7" and data["future_key"] == {"a": 1}
    with ms.transaction() as txn:
        data = txn.load("lineage.yaml")
        data["builds"].append({"build_id": "ami-1"})
        txn.save("lineage.yaml", data)
    assert ms.load("lineage.yaml")["future_key"] == {"a": 1}


def test_missing_expected_keys_are_filled(tmp_path):
    ms = _ms(tmp_path)
    _write_raw(ms, "pins.yaml", "instances: {}\n")
    assert ms.load("pins.yaml") == {"instances": {}, "pending_replacements": {}, "upgrades": []}


def test_corrupt_yaml_names_file_and_line(tmp_path):
    ms = _ms(tmp_path)
    _write_raw(ms, "launch-params.yaml", "instances:\n  a:\n    image: [unclosed\n    group: x\n")
    with pytest.raises(MetaStateError) as err:
        ms.load("launch-params.yaml")
    msg = str(err.value)
    assert msg.startswith("meta-state/launch-params.yaml: YAML syntax error at line ")
    assert "line 4" in msg or "line 3" in msg


@pytest.mark.parametrize("name,text,expected", [
    ("launch-params.yaml", "instances: [a, b]\n",
     "meta-state/launch-params.yaml: top-level key 'instances' must be a mapping, got list"),
    ("launch-params.yaml", "- a\n- b\n",
     "meta-state/launch-params.yaml: the document must be a mapping, got list"),
    ("launch-params.yaml", "instances: {a: 3}\n",
     "meta-state/launch-params.yaml: 'instances.a' must be a mapping, got integer"),
    ("runs.yaml", "runs: {a: 1}\n",
     "meta-state/runs.yaml: top-level key 'runs' must be a list, got mapping"),
    ("storage-state.yaml", "storages: {data: {state: gone, generation: 1}}\n",
     "meta-state/storage-state.yaml: 'storages.data.state' must be one of active|archived|destroyed, got 'gone'"),
    ("storage-state.yaml", "storages: {data: {state: active, generation: one}}\n",
     "meta-state/storage-state.yaml: 'storages.data.generation' must be an integer, got string"),
    ("instance-state.yaml", "instances: {a: {current: [1]}}\n",
     "meta-state/instance-state.yaml: 'instances.a.current' must be a mapping, got list"),
    ("instance-state.yaml", "instances: {a: {generation: {durable: x}}}\n",
     "meta-state/instance-state.yaml: 'instances.a.generation.durable' must be an integer, got string"),
    ("pins.yaml", "instances: {123: ami-0abc}\n",
     "meta-state/pins.yaml: 'instances' must map instance names to AMI ids: the key 123 is integer, not a name"),
    # values no csis.infra writer makes: refused where they are read, not a traceback in a reader
    ("instance-state.yaml", "instances: {a: {history: !!binary aGVsbG8=}}\n",
     "meta-state/instance-state.yaml: 'instances.a.history' holds a bytes; meta-state holds only plain data; " + DAMAGED),
    ("instance-state.yaml", "instances: {a: {history: !!set {x: null}}}\n",
     "meta-state/instance-state.yaml: 'instances.a.history' holds a set; meta-state holds only plain data; " + DAMAGED),
    ("instance-state.yaml", "instances: {a: {history: &h [*h]}}\n",
     "meta-state/instance-state.yaml: instances.a.history[0]: a YAML alias refers to a node that contains it (a cycle); "
     + DAMAGED),
    ("pins.yaml", "instances: {a: [ami-1]}\n",
     "meta-state/pins.yaml: 'instances.a' must map an instance name to an AMI id string, got list"),
    ("verifications.yaml", "verifications: 3\n",
     "meta-state/verifications.yaml: top-level key 'verifications' must be a list, got integer"),
    # record names and record fields are checked where they are read, not at the first write (a legacy
    # whole file, or a record, edited by hand: names that could leave a folder, break a line or a host name)
    ("launch-params.yaml", "instances: {'../../escaped': {launched: true}}\n",
     "meta-state/launch-params.yaml: 'instances.../../escaped' is not a record name (letters, digits, '_', '.', "
     "'-', starting with a letter or digit, at most 63 characters): no instance or storage has it; " + DAMAGED),
    ("storage-state.yaml", "storages: {\"nl\\nrm -rf ~\": {state: active}}\n",
     "meta-state/storage-state.yaml: 'storages.nl\\nrm -rf ~' is not a record name (letters, digits, '_', '.', "
     "'-', starting with a letter or digit, at most 63 characters): no instance or storage has it; " + DAMAGED),
    ("launch-params.yaml", "instances: {a: {mounts: [{storage: [1]}]}}\n",
     "meta-state/launch-params.yaml: 'instances.a.mounts[0].storage' must be a string, got list"),
    ("launch-params.yaml", "instances: {a: {mounts: [{storage: '../x'}]}}\n",
     "meta-state/launch-params.yaml: 'instances.a.mounts[0].storage' must be a storage name, got '../x'; " + DAMAGED),
    ("launch-params.yaml", "instances: {a: {mounts: [{storage: data, mount_point: \"/proc\\n\"}]}}\n",
     "meta-state/launch-params.yaml: 'instances.a.mounts[0].mount_point' must be an absolute path of plain names, "
     "got '/proc\\n'; " + DAMAGED),
    ("launch-params.yaml", "instances: {a: {tags: [a, b]}}\n",
     "meta-state/launch-params.yaml: 'instances.a.tags' must be a mapping, got list"),
    ("launch-params.yaml", "instances: {a: {alias: \"web\\n[ERROR] x\"}}\n",
     "meta-state/launch-params.yaml: 'instances.a.alias' must be a host name, got 'web\\n[ERROR] x'; " + DAMAGED),
    ("launch-params.yaml", "instances: {a: {ephemeral: 'no'}}\n",
     "meta-state/launch-params.yaml: 'instances.a.ephemeral' must be true or false, got string"),
    ("launch-params.yaml", "instances: {a: {machine_type: [t3.medium]}}\n",
     "meta-state/launch-params.yaml: 'instances.a.machine_type' must be a string, got list"),
    ("pins.yaml", "instances: {a: not-an-ami}\n",
     "meta-state/pins.yaml: 'instances.a' must be an AMI id (ami-<hex>), got 'not-an-ami'; " + DAMAGED),
    ("storage.yaml", "storages: {data: {attachments: 5}}\n",
     "meta-state/storage.yaml: 'storages.data.attachments' must be a list, got integer"),
    ("plan-receipts.yaml", "roots: {storage-aws-ebs: {plans: {abc: {approvals: 5}}}}\n",
     "meta-state/plan-receipts.yaml: roots.storage-aws-ebs.plans.abc.approvals must be a list, got integer"),
    ("instance-state.yaml", "instances: {a: {current: {number: 1, private_ip: '-oProxyCommand=touch /tmp/x'}}}\n",
     "meta-state/instance-state.yaml: 'instances.a.current.private_ip' must be an IP address, got "
     "'-oProxyCommand=touch /tmp/x'; " + DAMAGED),
    ("verifications.yaml", "verifications: [{instance: a, ok: 'no'}]\n",
     "meta-state/verifications.yaml: 'verifications[0].ok' must be true or false, got string"),
    # fields the recorder, the validation and the state query read (an id sent to EC2, a builder looked
    # up by name): refused where they are read, not as a traceback after an apply
    ("instance-state.yaml", "instances: {a: {current: {instance_id: i-1, kind: durable}}}\n",
     "meta-state/instance-state.yaml: 'instances.a.current.number' must be a generation number (1 or more), got None"),
    ("instance-state.yaml", "instances: {a: {generation: null, current: null}}\n",
     "meta-state/instance-state.yaml: 'instances.a.generation' must be a mapping, got null"),
    ("instance-state.yaml", "instances: {a: {current: {number: 1, instance_id: [i-1]}}}\n",
     "meta-state/instance-state.yaml: 'instances.a.current.instance_id' must be a string, got list"),
    ("storage-state.yaml", "storages: {data: {state: active, facts: {volume_id: [vol-1]}}}\n",
     "meta-state/storage-state.yaml: 'storages.data.facts.volume_id' must be a string, got list"),
    ("storage-state.yaml", "storages: {data: {state: active, facts: {builder: [aws-ebs]}}}\n",
     "meta-state/storage-state.yaml: 'storages.data.facts.builder' must be a string, got list"),
    ("verifications.yaml", "verifications: [{instance: a, ok: true, build: [ami-1]}]\n",
     "meta-state/verifications.yaml: 'verifications[0].build' must be a string, got list"),
    # a key written twice (csis.infra never does): the second would silently win
    ("launch-params.yaml", "instances: {a: {hostname: a-001, hostname: evil-999}}\n",
     "meta-state/launch-params.yaml: YAML syntax error at line 1, column 34: found duplicate key 'hostname'"),
])
def test_wrong_shapes_name_the_file(tmp_path, name, text, expected):
    ms = _ms(tmp_path)
    _write_raw(ms, name, text)
    with pytest.raises(MetaStateError) as err:
        ms.load(name)
    assert str(err.value) == expected


def test_the_hostname_of_a_longest_name_is_read(tmp_path):
    """A hostname is ``<name>-<generation>``: longer than a record name may be, and still a host name."""
    ms = _ms(tmp_path)
    name = "a" * 63
    rec = dict(SAMPLES["launch-params.yaml"]["instances"]["test2"], hostname=name + "-001", alias=None)
    with ms.transaction() as txn:
        txn.save("launch-params.yaml", {"instances": {name: rec}})
    assert MetaState(ms.config_root).load("launch-params.yaml")["instances"][name]["hostname"] == name + "-001"


def test_a_fifo_in_a_record_folder_is_refused_not_waited_on(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save("launch-params.yaml", SAMPLES["launch-params.yaml"])
    os.mkfifo(os.path.join(ms.dir, "launch-params", "zz.yaml"))
    signal.alarm(20)  # before the fix, open() waited for a writer forever
    try:
        with pytest.raises(MetaStateError, match=r"^meta-state/launch-params/zz.yaml: is not a regular file"):
            MetaState(ms.config_root).load("launch-params.yaml")
    finally:
        signal.alarm(0)


def test_a_revision_record_that_is_no_number_is_refused(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save("launch-params.yaml", SAMPLES["launch-params.yaml"])
    Path(ms.dir, "revision.yaml").write_text('{"revision": Infinity}')
    with pytest.raises(MetaStateError, match=r"^meta-state/revision.yaml: is not a revision record"):
        MetaState(ms.config_root).revision()


def test_a_revision_counter_that_went_back_is_refused_before_anything_is_written(tmp_path):
    """revision.yaml restored from a backup (revision 1) while audit/ holds revision 2's record: a
    commit would write its records and then be refused its audit record (a change with no record).
    It is refused before it writes anything, saying what to set."""
    ms = _ms(tmp_path)
    for n in range(2):
        with ms.transaction() as txn:
            data = txn.load("launch-params.yaml")
            data["instances"]["n%d" % n] = {"launched": False}
            txn.save("launch-params.yaml", data)
    backup = Path(ms.dir, "revision.yaml").read_text()
    with ms.transaction() as txn:
        txn.save("runs.yaml", SAMPLES["runs.yaml"])
    Path(ms.dir, "revision.yaml").write_text(backup)  # back to revision 2; audit/00000003.yaml stays
    before = {p: p.read_bytes() for p in Path(ms.dir).rglob("*") if p.is_file() and p.name != ".lock"}
    with pytest.raises(MetaStateError, match=r"^meta-state/audit/00000003.yaml: the audit record of revision 3 is "
                                             r"already there while meta-state/revision.yaml says revision 2: .*nothing "
                                             r"was written\. Set its revision to the highest number under audit/"):
        with MetaState(ms.config_root).transaction() as txn:
            data = txn.load("launch-params.yaml")
            data["instances"]["n9"] = {"launched": False}
            txn.save("launch-params.yaml", data)
    after = {p: p.read_bytes() for p in Path(ms.dir).rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before


def test_wrong_shape_refused_on_save_and_nothing_written(tmp_path):
    ms = _ms(tmp_path)
    with pytest.raises(MetaStateError, match=r"^meta-state/storage-state.yaml: 'storages.d.state'"):
        with ms.transaction() as txn:
            txn.save("storage-state.yaml", {"storages": {"d": {"state": "deleted"}}})
    assert not os.path.exists(ms.path("storage-state.yaml"))


def test_non_plain_data_refused(tmp_path):
    ms = _ms(tmp_path)
    with pytest.raises(MetaStateError, match=r"meta-state/runs.yaml: 'runs\[0\].x' holds a set"):
        with ms.transaction() as txn:
            txn.save("runs.yaml", {"runs": [{"x": {1, 2}}]})


def test_unknown_file_refused(tmp_path):
    ms = _ms(tmp_path)
    with pytest.raises(MetaStateError, match=r"meta-state/hosts.yaml: not a known meta-state file"):
        ms.load("hosts.yaml")
    with pytest.raises(MetaStateError, match="not a known"):
        ms.load("../launch-params.yaml")


def test_not_utf8(tmp_path):
    ms = _ms(tmp_path)
    os.makedirs(ms.dir)
    Path(ms.path("runs.yaml")).write_bytes(b"runs: ['\xff\xfe']\n")
    with pytest.raises(MetaStateError, match=r"^meta-state/runs.yaml: not UTF-8"):
        ms.load("runs.yaml")


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------

def test_serialization_is_deterministic():
    a = {"instances": {"b": {"z": 1, "a": 2}, "a": {"k": [3, 1]}}}
    b = {"instances": {"a": {"k": [3, 1]}, "b": {"a": 2, "z": 1}}}
    assert metastate.dumps(a) == metastate.dumps(b)
    assert metastate.dumps(a) == (HEADER + "instances:\n  a:\n    k:\n    - 3\n    - 1\n  b:\n    a: 2\n    z: 1\n"
                                  + metastate.FOOTER)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_dumps_matches_yaml_safe_dump(name):
    import yaml
    data = metastate.validate(name, SAMPLES[name])
    data["odd"] = {"yes": "no", "on": "2026-11-29", "long": "word " * 40, "u": "caf\u00e9 \u2713",
                   "multi": "line1\nline2\n", "num": "0755", "empty": "", "f": 1.5, "n": None}
    assert metastate.dumps(data) == (HEADER + yaml.safe_dump(data, sort_keys=True, default_flow_style=False)
                                     + metastate.FOOTER)


def test_unchanged_save_leaves_bytes_and_mtime(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save("launch-params.yaml", SAMPLES["launch-params.yaml"])
    path = Path(ms.record_path("launch-params.yaml", "test2"))
    os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    before = path.read_bytes(), path.stat().st_mtime_ns, path.stat().st_ino
    with ms.transaction() as txn:
        txn.save("launch-params.yaml", txn.load("launch-params.yaml"))
        txn.save("runs.yaml", {"runs": []})  # empty shape, file absent: not created
    assert txn.written == []
    after = path.read_bytes(), path.stat().st_mtime_ns, path.stat().st_ino
    assert after == before
    assert not os.path.exists(ms.path("runs.yaml"))
    # a real change is written, and only that file
    with ms.transaction() as txn:
        data = txn.load("launch-params.yaml")
        data["instances"]["test2"]["alias"] = "db"
        txn.save("launch-params.yaml", data)
        txn.save("pins.yaml", txn.load("pins.yaml"))
    assert txn.written == ["launch-params.yaml"]
    assert path.stat().st_mtime_ns != before[1]


def test_exception_inside_transaction_writes_nothing(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save("runs.yaml", {"runs": [{"run": "r1"}]})
    old = Path(ms.path("runs.yaml")).read_bytes()
    with pytest.raises(RuntimeError, match="boom"):
        with ms.transaction() as txn:
            txn.save("runs.yaml", {"runs": [{"run": "r2"}]})
            txn.save("lineage.yaml", {"builds": [{"build_id": "ami-2"}]})
            raise RuntimeError("boom")
    assert Path(ms.path("runs.yaml")).read_bytes() == old
    assert not os.path.exists(ms.path("lineage.yaml"))
    # the lock was released
    with MetaState(ms.config_root, lock_timeout=0).transaction():
        pass


def test_file_mode_is_kept_and_new_files_are_readable(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save("runs.yaml", {"runs": [{"run": "r1"}]})
    path = Path(ms.path("runs.yaml"))
    assert path.stat().st_mode & 0o444 == 0o444  # mkstemp's 0600 is not kept
    os.chmod(path, 0o640)
    with ms.transaction() as txn:
        txn.save("runs.yaml", {"runs": [{"run": "r2"}]})
    assert path.stat().st_mode & 0o777 == 0o640


def test_atomic_write_uses_replace_and_fsync(tmp_path, monkeypatch):
    ms = _ms(tmp_path)
    calls = []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(("replace", a, b)), real_replace(a, b))[1])
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(("fsync", fd)), real_fsync(fd))[1])
    with ms.transaction() as txn:
        txn.save("runs.yaml", {"runs": [{"run": "r1"}]})
    kinds = [c[0] for c in calls]
    # the revision marker, runs.yaml, the audit record, the revision: each file, rename, directory; the
    # audit record's new folder (the first commit's) is synced into its parent before its file
    assert kinds == ["fsync", "replace", "fsync"] * 2 + ["fsync"] + ["fsync", "replace", "fsync"] * 2
    replaced = [(c[1], c[2]) for c in calls if c[0] == "replace"]
    assert [dst for _src, dst in replaced] == [os.path.join(ms.dir, "revision.yaml"), ms.path("runs.yaml"),
                                               os.path.join(ms.dir, "audit", "00000001.yaml"),
                                               os.path.join(ms.dir, "revision.yaml")]
    src = replaced[1][0]
    assert os.path.dirname(src) == ms.dir
    assert src.endswith(".tmp") and not os.path.exists(src)


def test_crash_mid_write_leaves_old_file(tmp_path, monkeypatch):
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save("runs.yaml", {"runs": [{"run": "r1"}]})
    old = Path(ms.path("runs.yaml")).read_bytes()

    real_fsync, calls = os.fsync, []

    def crash(fd):
        calls.append(fd)
        if len(calls) > 2:  # the revision marker is written, runs.yaml is not
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(MetaStateError, match=r"^meta-state/runs.yaml: cannot write: Input/output error"):
        with ms.transaction() as txn:
            txn.save("runs.yaml", {"runs": [{"run": "r2"}]})
    monkeypatch.undo()
    assert Path(ms.path("runs.yaml")).read_bytes() == old
    # no temporary left behind
    assert sorted(os.listdir(ms.dir)) == [".lock", "audit", "revision.yaml", "runs.yaml"]
    assert ms.load("runs.yaml")["runs"] == [{"run": "r1"}]  # the crashed commit's marker is read through
    with MetaState(ms.config_root, lock_timeout=0).transaction():
        pass  # and the lock is free


def test_readers_only_see_whole_files(tmp_path):
    ms = _ms(tmp_path)
    big = {"instances": {"n%04d" % i: {"image": "x" * 50, "launched": True} for i in range(400)}}
    small = {"instances": {"only": {"launched": True}}}
    stop = threading.Event()
    errors = []

    def reader():
        while not stop.is_set():
            try:
                n = len(ms.load("launch-params.yaml")["instances"])
                if n not in (0, 1, 400):
                    errors.append(n)
            except Exception as exc:  # pragma: no cover - the failure we test against
                errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        # a dozen commits, each a whole file replaced under a reader that never pauses: the
        # interleavings that matter are pinned down one by one by the paused-commit tests below
        for i in range(12):
            with ms.transaction() as txn:
                txn.save("launch-params.yaml", big if i % 2 else small)
    finally:
        stop.set()
        thread.join()
    assert errors == []


def test_a_read_whose_writer_ends_before_the_lock_is_looked_at_is_read_again(tmp_path):
    # the reader reads between the marker and the next revision (half the records deleted), then
    # the writer ends before the reader asks whether a lock is held: a free lock with the marker
    # gone is a commit that ended, not one that crashed, so the reader must read again
    ms = _ms(tmp_path)
    big = {"instances": {"n%04d" % i: {"launched": True} for i in range(40)}}
    with ms.transaction() as txn:
        txn.save("launch-params.yaml", big)
    thread, go = paused_commit(ms, {"instances": {"only": {"launched": True}}}, after=20)
    reader = MetaState(ms.config_root)
    looked = ends_before_lock_check(reader, thread, go)
    try:
        assert sorted(reader.load("launch-params.yaml")["instances"]) == ["only"]
    finally:
        go.set()
        thread.join(30)
    assert looked  # the reader did fall between the marker and the next revision


def test_a_read_never_returns_half_a_commit_that_does_not_end(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save("launch-params.yaml", {"instances": {"n%04d" % i: {"launched": True} for i in range(10)}})
    thread, go = paused_commit(ms, {"instances": {}}, after=5)
    try:
        started = time.monotonic()
        with pytest.raises(MetaStateError, match=r"^meta-state/revision\.yaml: a commit was in progress for all "
                                                 r"of the \d+ s this read waited \(writer: .*paused writer.*\), so "
                                                 r"no whole view could be read and nothing half-written is returned; "
                                                 r"try again once it is done \(the lock of a killed writer frees "
                                                 r"itself\)$"):
            MetaState(ms.config_root, lock_timeout=1).load("launch-params.yaml")
        assert time.monotonic() - started >= 1
    finally:
        go.set()
        thread.join(30)
    assert MetaState(ms.config_root).load("launch-params.yaml")["instances"] == {}


# ---------------------------------------------------------------------------
# locking (real processes)
# ---------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {collections!r})
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState
    ms = MetaState({root!r})
    with ms.transaction("holder-test") as txn:
        runs = txn.load("runs.yaml")
        print("LOCKED", flush=True)
        time.sleep({hold})
        runs["runs"].append({{"run": "holder"}})
        txn.save("runs.yaml", runs)
    print("DONE", flush=True)
""")


def _holder(ms: MetaState, hold: float) -> subprocess.Popen:
    code = HOLDER.format(collections=LIBRARY_PATH, root=ms.config_root, hold=hold)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip() == "LOCKED", line
    return proc


def test_second_writer_waits_then_proceeds_without_lost_update(tmp_path):
    ms = _ms(tmp_path)
    proc = _holder(ms, 1.0)
    try:
        started = time.monotonic()
        with ms.transaction("waiter") as txn:
            waited = time.monotonic() - started
            runs = txn.load("runs.yaml")  # sees the holder's write: read under the lock
            runs["runs"].append({"run": "waiter"})
            txn.save("runs.yaml", runs)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == 0
    assert waited >= 0.5
    assert [r["run"] for r in ms.load("runs.yaml")["runs"]] == ["holder", "waiter"]


def test_lock_timeout_names_the_holder(tmp_path):
    ms = _ms(tmp_path)
    proc = _holder(ms, 3.0)
    try:
        with pytest.raises(MetaStateError) as err:
            with MetaState(ms.config_root, lock_timeout=0.2).transaction("impatient"):
                pytest.fail("must not get the lock")
        msg = str(err.value)
        assert msg.startswith("meta-state/.lock: meta-state is locked by pid %d on host %s since "
                              % (proc.pid, socket.gethostname()))
        assert "(holder-test) [user %s, run_id " % getpass.getuser() in msg, msg  # who holds it
        assert "]; another csis.infra run is writing this tree. Wait for it, or if " \
               "that process is gone the lock frees itself" in msg
    finally:
        proc.wait(timeout=30)


def test_sigkilled_holder_does_not_block(tmp_path):
    ms = _ms(tmp_path)
    proc = _holder(ms, 600)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    # the description of the dead holder is still in the file, but the kernel freed the lock
    assert json.loads(Path(ms.dir, ".lock").read_text())["pid"] == proc.pid
    # lock_timeout=0: one try, no waiting; it would raise if the dead holder still held it
    with MetaState(ms.config_root, lock_timeout=0).transaction("after-kill") as txn:
        txn.save("runs.yaml", {"runs": [{"run": "after-kill"}]})
    assert ms.load("runs.yaml")["runs"] == [{"run": "after-kill"}]


def test_lock_file_describes_the_holder_and_is_cleared(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction("csis.infra.site / record"):
        info = json.loads(Path(ms.dir, ".lock").read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        assert info["what"] == "csis.infra.site / record" and info["since"].endswith("Z")
    assert Path(ms.dir, ".lock").read_text() == ""


def test_nested_transaction_refused(tmp_path):
    ms = _ms(tmp_path)
    with ms.transaction():
        with pytest.raises(MetaStateError, match="already open in this thread"):
            with MetaState(ms.config_root).transaction():
                pass


def test_other_thread_waits_for_the_lock(tmp_path):
    ms = _ms(tmp_path)
    order = []
    with ms.transaction():
        def run():
            with ms.transaction():
                order.append("thread")
        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(0.3)
        order.append("main")
    thread.join(timeout=10)
    assert order == ["main", "thread"]


# ---------------------------------------------------------------------------
# secrets
# ---------------------------------------------------------------------------

FAKE_PRIVATE_KEY = "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\n"


@pytest.mark.parametrize("data,where", [
    ({"instances": {"a": {"note": "key AKIA" + "ABCDEFGHIJKLMNOP" + " used"}}}, "instances.a.note: looks like an AWS access key id"),
    ({"instances": {"a": {"user_data": FAKE_PRIVATE_KEY}}}, "instances.a.user_data: looks like a private key"),
    ({"instances": {"a": {"enrollment_token": "abc"}}}, "instances.a.enrollment_token: a non-empty value under a secret-named key"),
    ({"instances": {"a": {"db": {"Password": "hunter2"}}}}, "instances.a.db.Password: a non-empty value"),
    ({"instances": {"a": {"client_secret": "x"}}}, "instances.a.client_secret: a non-empty value"),
    ({"instances": {"a": {"env": ["X=" + "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"]}}}, "instances.a.env[0]: looks like an AWS secret access key"),
    ({"instances": {"a": {"s": "IQoJb3JpZ2luX2Vj" + "EJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQ"}}}, "instances.a.s: looks like an AWS session token"),
])
def test_secret_scanner_refuses(tmp_path, data, where):
    ms = _ms(tmp_path)
    with pytest.raises(MetaStateError) as err:
        with ms.transaction() as txn:
            txn.save("launch-params.yaml", data)
    msg = str(err.value)
    assert msg.startswith("meta-state/launch-params.yaml: refusing to write secret-shaped data")
    assert where in msg
    for value in ("hunter2", "ABCDEFGHIJKLMNOP", "MIIEowIBAAKCAQEA", "EXAMPLEKEY"):
        assert value not in msg  # never echoed
    assert not os.path.exists(ms.path("launch-params.yaml"))


def test_secret_scanner_allows_ordinary_data(tmp_path):
    ms = _ms(tmp_path)
    data = {"instances": {"a": {
        "commit": "3f786850e387550fdab836ed7e6dc881de23001b",   # sha1 hex
        "user_data_sha256": "90f8" * 16,
        "enrollment": {"enrollment": "sftd-token", "server_label": "x"},  # a value naming a token
        "token": "", "password": None, "secret_ref": {"env": ""},
        "build": "ami-0123456789abcdef0", "instance_id": "i-0123456789abcdef0",
    }}}
    with ms.transaction() as txn:
        txn.save("launch-params.yaml", data)
    assert ms.load("launch-params.yaml")["instances"]["a"]["commit"].startswith("3f78")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def test_launched_instances_joins_launch_params_and_current(tmp_path):
    ms = _ms(tmp_path)
    lp = {"instances": {
        "test2": dict(SAMPLES["launch-params.yaml"]["instances"]["test2"]),
        "planned": {"image": "base", "launched": False},
        "nostate": {"image": "base", "launched": True, "ephemeral": True},
    }}
    with ms.transaction() as txn:
        txn.save("launch-params.yaml", lp)
        txn.save("instance-state.yaml", SAMPLES["instance-state.yaml"])
    got = launched_instances(ms)
    assert list(got) == ["nostate", "test2"]
    assert got["test2"]["current"]["instance_id"] == "i-0abc"
    assert got["test2"]["name"] == "test2" and got["test2"]["mounts"][0]["storage"] == "data"
    assert got["test2"]["generation"] == {"durable": 1, "ephemeral": 0}
    assert got["nostate"]["current"] is None
    assert got["nostate"]["generation"] == {"durable": 0, "ephemeral": 0}


def test_launched_instances_of_missing_tree_is_empty(tmp_path):
    assert launched_instances(_ms(tmp_path)) == {}


# ---------------------------------------------------------------------------
# damaged and contradictory files (issue 16, defect 3): refused by every reader,
# never overwritten
# ---------------------------------------------------------------------------

def _save_all(ms, files):
    with ms.transaction("test") as txn:
        for name, data in files.items():
            txn.save(name, data)


def test_a_file_cut_short_is_refused_at_every_length(tmp_path):
    ms = _ms(tmp_path)
    _save_all(ms, {n: SAMPLES[n] for n in ("launch-params.yaml", "instance-state.yaml", "pins.yaml")})
    path = Path(ms.record_path("launch-params.yaml", "test2"))
    whole = path.read_bytes()
    for size in range(1, len(whole)):
        path.write_bytes(whole[:size])
        with pytest.raises(MetaStateError) as err:
            ms.load("launch-params.yaml")
        text = str(err.value)
        assert text.startswith("meta-state/launch-params/test2.yaml: "), (size, text)
        if size > len(HEADER):
            assert "is incomplete: it stops at byte %d without its end line" % size in text, (size, text)
        assert path.read_bytes() == whole[:size]
    path.write_bytes(whole)
    assert ms.load("launch-params.yaml") == metastate.validate("launch-params.yaml", SAMPLES["launch-params.yaml"])


def test_the_issues_truncation_to_half_is_refused_by_every_reader(tmp_path):
    """launch-params.yaml cut to half its size: load, the inventory's join, a transaction."""
    ms = _ms(tmp_path)
    _save_all(ms, {n: SAMPLES[n] for n in ("launch-params.yaml", "instance-state.yaml", "pins.yaml")})
    path = Path(ms.record_path("launch-params.yaml", "test2"))
    half = path.read_bytes()[:len(path.read_bytes()) // 2]
    path.write_bytes(half)
    expected = "meta-state/launch-params/test2.yaml: is incomplete: it stops at byte %d" % len(half)
    for read in (lambda: ms.load("launch-params.yaml"), lambda: launched_instances(ms)):
        with pytest.raises(MetaStateError, match=re.escape(expected)):
            read()
    with pytest.raises(MetaStateError, match=re.escape(expected)):
        with ms.transaction() as txn:
            txn.load("launch-params.yaml")
    assert path.read_bytes() == half


def test_a_damaged_file_is_never_overwritten_even_unread(tmp_path):
    ms = _ms(tmp_path)
    path = _write_raw(ms, "verifications.yaml", "")
    with pytest.raises(MetaStateError, match=r"^meta-state/verifications.yaml: is empty \(0 bytes\)"):
        with ms.transaction() as txn:
            txn.save("verifications.yaml", {"verifications": [{"instance": "a", "ok": True}]})
    assert path.read_bytes() == b""
    _save_all(ms, {"runs.yaml": {"runs": [{"run": "r1"}]}})
    runs = Path(ms.path("runs.yaml"))
    cut = runs.read_bytes()[:-5]
    runs.write_bytes(cut)
    with pytest.raises(MetaStateError, match=r"^meta-state/runs.yaml: is incomplete"):
        with ms.transaction() as txn:
            txn.save("runs.yaml", {"runs": []})
    assert runs.read_bytes() == cut


def test_two_files_glued_together_are_refused(tmp_path):
    ms = _ms(tmp_path)
    text = metastate.dumps({"runs": [{"run": "r1"}]})
    _write_raw(ms, "runs.yaml", text + text)
    with pytest.raises(MetaStateError, match=r"^meta-state/runs.yaml: holds more than one file's text \(2 header"):
        ms.load("runs.yaml")


def test_legacy_and_hand_written_files_need_no_end_line(tmp_path):
    ms = _ms(tmp_path)
    _write_raw(ms, "runs.yaml", metastate.LEGACY_HEADER + "runs:\n- run: r1\n")
    assert ms.load("runs.yaml")["runs"] == [{"run": "r1"}]
    _save_all(ms, {"runs.yaml": {"runs": [{"run": "r1"}, {"run": "r2"}]}})
    text = Path(ms.path("runs.yaml")).read_text(encoding="utf-8")
    assert text.startswith(HEADER) and text.endswith(metastate.FOOTER)


@pytest.mark.parametrize("files,message", [
    # an open generation without its launch record (the issue's example)
    ({"instance-state.yaml": SAMPLES["instance-state.yaml"]},
     "meta-state/instance-state.yaml: 'instances.test2.current' is an open generation (number 1, instance "
     "i-0abc) but meta-state/launch-params.yaml has no launch record of 'test2'"),
    ({"instance-state.yaml": SAMPLES["instance-state.yaml"],
      "launch-params.yaml": {"instances": {"test2": {"launched": False}}}},
     "meta-state/instance-state.yaml: 'instances.test2.current' is an open generation (number 1, instance "
     "i-0abc) but meta-state/launch-params.yaml records 'test2' as not launched"),
    # a pin, or a pending replacement, of an instance without a launch record
    ({"pins.yaml": {"instances": {"test2": "ami-1"}}},
     "meta-state/pins.yaml: 'instances.test2' pins an image but meta-state/launch-params.yaml has no launch "
     "record of 'test2'"),
    ({"pins.yaml": {"pending_replacements": {"test2": {"to": None}}},
      "launch-params.yaml": {"instances": {"test2": {"launched": False}}}},
     "meta-state/pins.yaml: 'pending_replacements.test2' asks to replace an instance "
     "meta-state/launch-params.yaml does not record as launched"),
    # the storage records and their read-model
    ({"storage-state.yaml": {"storages": {}},
      "storage.yaml": {"storages": {"data": {"current_state": "active"}}}},
     "meta-state/storage-state.yaml: has no record of storage 'data', but its read-model "
     "meta-state/storage.yaml lists it (active)"),
    ({"storage-state.yaml": {"storages": {"data": {"state": "destroyed"}}},
      "storage.yaml": {"storages": {"data": {"current_state": "active"}}}},
     "meta-state/storage-state.yaml: 'storages.data.state' is 'destroyed' but its read-model "
     "meta-state/storage.yaml says 'active'"),
    ({"storage-state.yaml": {"storages": {"data": {"state": "active"}}},
      "storage.yaml": {"storages": {}}},
     "meta-state/storage-state.yaml: 'storages.data' is recorded but missing from its read-model "
     "meta-state/storage.yaml"),
])
def test_files_that_contradict_each_other_are_refused(tmp_path, files, message):
    ms = _ms(tmp_path)
    written = {}
    for name, data in files.items():
        written[name] = _write_raw(ms, name, metastate.dumps(metastate.validate(name, data)))
    assert metastate.contradictions({n: (metastate.validate(n, files[n]) if n in files else None)
                                     for n in metastate.partners(files)}) == [message]
    subject = message.split(":")[0][len("meta-state/"):]
    with pytest.raises(MetaStateError) as err:
        ms.load(subject)
    assert str(err.value) == message + "; " + metastate.CONTRADICT
    # a writer is refused too: neither the subject nor anything else is written
    with pytest.raises(MetaStateError, match=re.escape(message)):
        with ms.transaction() as txn:
            txn.save("runs.yaml", {"runs": [{"run": "r1"}]})
            txn.load(subject)
    # and a transaction cannot create the contradiction either
    other = _ms(tmp_path / "other")
    with pytest.raises(MetaStateError, match=re.escape(message) + ": the files would contradict each other "
                       "after this change, so nothing was written"):
        _save_all(other, files)
    assert not os.path.exists(other.dir) or sorted(os.listdir(other.dir)) == [".lock"]
    assert {n: p.read_bytes() for n, p in written.items()} == {
        n: metastate.dumps(metastate.validate(n, d)).encode() for n, d in files.items()}
    assert not os.path.exists(ms.path("runs.yaml"))


@pytest.mark.parametrize("name,data,message", [
    ("instance-state.yaml", {"instances": {"a": {"generation": {"durable": 1},
                                                 "current": {"kind": "durable", "number": 2}}}},
     "meta-state/instance-state.yaml: 'instances.a.current.number' is 2 but 'generation.durable' has only "
     "reached 1: the record contradicts itself"),
    ("instance-state.yaml", {"instances": {"a": {"current": {"kind": "durable", "number": 0}}}},
     "meta-state/instance-state.yaml: 'instances.a.current.number' must be a generation number (1 or more), got 0"),
    ("instance-state.yaml", {"instances": {"a": {"current": {"kind": "spot", "number": 1}}}},
     "meta-state/instance-state.yaml: 'instances.a.current.kind' must be durable or ephemeral, got 'spot'"),
    ("launch-params.yaml", {"instances": {"a": {"launched": "yes"}}},
     "meta-state/launch-params.yaml: 'instances.a.launched' must be true or false, got string"),
    ("launch-params.yaml", {"instances": {"a": {"launched": False, "mounts": ["data"]}}},
     "meta-state/launch-params.yaml: 'instances.a.mounts[0]' must be a mapping, got string"),
    ("storage-state.yaml", {"storages": {"d": {"state": "active", "generation": 0}}},
     "meta-state/storage-state.yaml: 'storages.d.generation' must be 1 or more, got 0"),
])
def test_records_that_contradict_themselves_are_refused(tmp_path, name, data, message):
    ms = _ms(tmp_path)
    _write_raw(ms, name, "# hand-written\n" + json.dumps(data) + "\n")
    with pytest.raises(MetaStateError) as err:
        ms.load(name)
    assert str(err.value).startswith(message)


def test_a_reader_between_two_files_of_a_commit_waits_for_it(tmp_path):
    """A lock-free read can see one file of a commit new and the next still old: the reader
    looks again under a shared lock, after the commit, instead of refusing."""
    ms = _ms(tmp_path)
    _save_all(ms, {n: SAMPLES[n] for n in ("launch-params.yaml", "instance-state.yaml", "pins.yaml")})
    holder = metastate._Lock(ms.dir, 5, "test writer")
    holder.acquire()
    try:
        # mid-commit: launch-params already forgot test2, instance-state not yet
        _write_raw(ms, "launch-params.yaml", metastate.dumps({"instances": {}}))
        got = {}
        reader = threading.Thread(target=lambda: got.update(data=ms.load("instance-state.yaml")))
        reader.start()
        time.sleep(0.5)
        assert reader.is_alive() and not got  # waiting for the writer
        _write_raw(ms, "instance-state.yaml", metastate.dumps({"instances": {}}))
        _write_raw(ms, "pins.yaml", metastate.dumps(metastate.empty("pins.yaml")))
    finally:
        holder.release()
    reader.join(10)
    assert got["data"] == {"instances": {}}


def test_forget_through_the_store_keeps_the_files_consistent(tmp_path):
    """The writers change the related files together (record.close_instance_records)."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import record

    ms = _ms(tmp_path)
    _save_all(ms, {n: SAMPLES[n] for n in ("launch-params.yaml", "instance-state.yaml", "pins.yaml")})
    with ms.transaction() as txn:
        pins = txn.load_rest("pins.yaml")
        record.close_instance_records(txn, pins, "test2", "forgotten", "r9")
        txn.save_rest("pins.yaml", pins)
    assert ms.load("instance-state.yaml")["instances"]["test2"]["current"] is None
    assert launched_instances(ms) == {}


def _failing_puts(ms: MetaState, fail: Callable[[str, int], bool]) -> list:
    """Make ``ms``'s store refuse the puts ``fail(rel, nth put)`` names with ENOSPC (a full disk);
    returns the objects put, in order."""
    import errno
    real_put, seen = ms.objects.put, []

    def put(rel, payload, expect=None):
        seen.append(rel)
        if fail(rel, len(seen)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_put(rel, payload, expect)

    ms.objects.put = put
    return seen


def test_a_commit_that_fails_half_way_puts_back_what_it_wrote(tmp_path):
    """A full disk at the second record of a commit: the first record, the marker and anything else the commit wrote
    are put back, so readers see the revision before it whole, the audit trail has no record it lacks, and the next
    commit goes on from there (issue: a failed commit left half its records and a skipped revision)."""
    ms = _ms(tmp_path)
    with ms.transaction("first") as txn:
        txn.save_record("launch-params.yaml", "db", {"image": "a", "launched": False})
        txn.save_record("launch-params.yaml", "web", {"image": "a", "launched": False})
    before = (ms.revision(), ms.load("launch-params.yaml"), [d["revision"] for d in metastate.audit_trail(ms)])
    records = []
    _failing_puts(ms, lambda rel, n: rel.startswith("launch-params") and records.append(rel) is None
                  and len(records) == 3)
    with pytest.raises(MetaStateError, match=r"cannot write: No space left on device \(written before it in this "
                                             r"transaction: launch-params.yaml\); nothing of this transaction stays: "
                                             r"what it had written was put back"):
        with ms.transaction("second") as txn:
            txn.save_record("launch-params.yaml", "api", {"image": "b", "launched": False})  # a new record, removed again
            txn.save_record("launch-params.yaml", "db", {"image": "b", "launched": False})
            txn.save_record("launch-params.yaml", "web", {"image": "b", "launched": False})
    reader = _ms(tmp_path)
    assert (reader.revision(), reader.load("launch-params.yaml"),
            [d["revision"] for d in metastate.audit_trail(reader)]) == before
    assert "committing" not in (tmp_path / "cfg" / "meta-state" / "revision.yaml").read_text()
    with reader.transaction("third") as txn:
        txn.save_record("launch-params.yaml", "db", {"image": "c", "launched": False})
    assert reader.revision() == before[0] + 1
    assert [d["revision"] for d in metastate.audit_trail(reader)] == before[2] + [before[0] + 1]


def test_a_commit_whose_put_back_fails_too_says_so_and_keeps_its_marker(tmp_path):
    """The disk stays full: the put-back fails as well. The message says so and names what the records hold; the
    marker stays (the next commit takes the number after it)."""
    ms = _ms(tmp_path)
    with ms.transaction("first") as txn:
        txn.save_record("launch-params.yaml", "db", {"image": "a", "launched": False})
        txn.save_record("launch-params.yaml", "web", {"image": "a", "launched": False})
    records = []
    _failing_puts(ms, lambda rel, n: rel.startswith("launch-params") and (records.append(rel) or len(records) >= 2))
    with pytest.raises(MetaStateError, match=r"putting back what this transaction had written failed too \(No space "
                                             r"left on device\): .*revision.yaml holds the marker of revision 2"):
        with ms.transaction("second") as txn:
            txn.save_record("launch-params.yaml", "db", {"image": "b", "launched": False})
            txn.save_record("launch-params.yaml", "web", {"image": "b", "launched": False})
    assert '"committing": 2' in (tmp_path / "cfg" / "meta-state" / "revision.yaml").read_text()
    reader = _ms(tmp_path)
    with reader.transaction("third") as txn:
        txn.save_record("launch-params.yaml", "web", {"image": "c", "launched": False})
    assert reader.revision() == 3


def test_a_commit_whose_last_write_fails_leaves_no_audit_record(tmp_path):
    """The records and the audit record are written, the final revision.yaml is not: the audit record goes too (it
    would describe a revision that never was), and so do the records."""
    ms = _ms(tmp_path)
    with ms.transaction("first") as txn:
        txn.save_record("launch-params.yaml", "db", {"image": "a", "launched": False})
    before = (ms.revision(), ms.load("launch-params.yaml"))
    revisions = []
    _failing_puts(ms, lambda rel, n: rel == "revision.yaml" and (revisions.append(rel) or len(revisions) == 2))
    with pytest.raises(MetaStateError, match="nothing of this transaction stays"):
        with ms.transaction("second") as txn:
            txn.save_record("launch-params.yaml", "db", {"image": "b", "launched": False})
    reader = _ms(tmp_path)
    assert (reader.revision(), reader.load("launch-params.yaml")) == before
    assert sorted(os.listdir(tmp_path / "cfg" / "meta-state" / "audit")) == ["00000001.yaml"]


def test_a_removed_record_is_synced_into_its_directory(tmp_path, monkeypatch):
    """A record's removal is made durable as a rename is: its directory is synced after the unlink."""
    ms = _ms(tmp_path)
    with ms.transaction() as txn:
        txn.save_record("launch-params.yaml", "db", {"image": "a", "launched": False})
    calls = []
    real_unlink, real_fsync = os.unlink, os.fsync
    monkeypatch.setattr(os, "unlink", lambda p, *a, **k: (calls.append(("unlink", p)), real_unlink(p, *a, **k))[1])
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(("fsync", fd)), real_fsync(fd))[1])
    with ms.transaction() as txn:
        txn.save_record("launch-params.yaml", "db", None)
    record = [i for i, c in enumerate(calls) if c[0] == "unlink" and c[1].endswith(os.path.join("launch-params", "db.yaml"))]
    assert record and calls[record[0] + 1][0] == "fsync", calls
