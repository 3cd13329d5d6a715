# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Malformed inputs to the library's readers (found by an audit): each is one error of the
library's own (which the modules turn into one message) or a reading that holds, never a raw
Python exception out of a module."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis import tfstate
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.binding import root_digest
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.gate import run_gate
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import GateError
from ansible_collections.csis.infra.plugins.module_utils.csis.render import writer
from ansible_collections.csis.infra.plugins.module_utils.csis.state import verify


def test_a_plan_nested_deeper_than_any_schema_is_refused_by_the_gate(tmp_path):
    change = {"address": "x.y", "mode": "managed", "type": "x", "name": "y",
              "change": {"actions": ["update"], "before": {}, "after": {"policy": "p"}, "after_sensitive": "DEEP"}}
    path = tmp_path / "plan.json"  # 700 levels: json reads them, a walk of two frames a level does not
    text = json.dumps({"format_version": "1.2", "resource_changes": [change]})
    path.write_text(text.replace('"DEEP"', '{"policy": %s}' % ("[" * 700 + "true" + "]" * 700)))
    with pytest.raises(GateError, match="nested too deeply to be read; refusing"):
        run_gate(plan_json=str(path))


@pytest.mark.parametrize("modules", [[1], "x", {"Modules": 5}, {"Modules": {"Dir": "."}}])
def test_a_module_list_not_as_init_writes_it_is_one_gate_error(tmp_path, modules):
    (tmp_path / "main.tf").write_text("# root\n")
    (tmp_path / ".terraform" / "modules").mkdir(parents=True)
    (tmp_path / ".terraform" / "modules" / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(GateError, match="not a module list as terraform init writes it"):
        root_digest(str(tmp_path))


def test_a_module_directory_with_a_lone_surrogate_is_digested(tmp_path):
    (tmp_path / "main.tf").write_text("# root\n")
    (tmp_path / ".terraform" / "modules").mkdir(parents=True)
    (tmp_path / ".terraform" / "modules" / "modules.json").write_text(json.dumps({"Modules": [{"Dir": "\ud800"}]}))
    assert len(root_digest(str(tmp_path))) == 64


def test_terraform_state_readers_take_nesting_and_bytes_as_not_terraform_s(tmp_path):
    data = tmp_path / ".terraform"
    data.mkdir()
    (data / "terraform.tfstate").write_text(json.dumps({"backend": {"type": "local", "config": {}}}))
    (data / "environment").write_bytes(b"ws-\xff\xfe")
    assert tfstate.backend_of(str(tmp_path)) is None  # terraform reads it, and says what is wrong
    (data / "environment").unlink()
    assert tfstate.backend_of(str(tmp_path))["workspace"] == "default"
    (data / "terraform.tfstate").write_text("[" * 100000 + "]" * 100000)
    assert tfstate.backend_of(str(tmp_path)) is None
    assert tfstate._parse(("[" * 100000 + "]" * 100000).encode()) is None


def test_a_rendered_root_edited_by_hand_is_compared_not_a_crash(tmp_path):
    d = tmp_path / "root"
    d.mkdir()
    (d / "main.tf").write_bytes(b"# edited \xff by hand\n")
    (d / writer.MANIFEST).write_text("[1]")
    res = writer.compare(str(d), {"main.tf": "# rendered\n"}, want_diff=True)
    assert res.changed and res.modified == ["main.tf"]
    writer.write_root(str(d), {"main.tf": "# rendered\n"})
    assert (d / "main.tf").read_text() == "# rendered\n"


def test_a_mount_with_a_name_that_is_no_utf8_is_read_as_its_bytes(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "mounts").write_bytes(b"/dev/a /mnt/d\xe9ta xfs rw 0 0\n/dev/b /mnt/data xfs rw 0 0\n")
    found = verify.mount_targets(str(tmp_path))
    assert "/mnt/data" in found and os.fsencode("/mnt/d\udce9ta") == b"/mnt/d\xe9ta" and "/mnt/d\udce9ta" in found


def test_an_audit_record_holding_no_plain_data_is_refused_where_it_is_read(tmp_path):
    """history.yml's reader: a ``!!binary`` value in an audit record would break its JSON output."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import (
        FOOTER, HEADER, MetaState, MetaStateError, audit_trail)

    root = str(tmp_path)
    with MetaState(root).transaction("t") as txn:
        txn.save("runs.yaml", {"runs": [{"run": "r1"}]})
    path = os.path.join(root, "meta-state", "audit", "00000001.yaml")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    assert text.startswith(HEADER) and text.endswith(FOOTER)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text.replace("what: t\n", "what: t\nextra: !!binary aGVsbG8=\n"))
    with pytest.raises(MetaStateError, match=r"^meta-state/audit/00000001.yaml: 'extra' holds a bytes; meta-state "
                                             r"holds only plain data; "):
        audit_trail(MetaState(root))


def test_an_errored_state_with_odd_shapes_is_still_described(tmp_path):
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply.errored import errored_state

    (tmp_path / "errored.tfstate").write_text(json.dumps({"serial": 3, "resources": [
        {"mode": "managed", "instances": 5}, {"mode": "managed", "instances": [{}, {}]}, "x"]}))
    info = errored_state(str(tmp_path))
    assert info["serial"] == 3 and info["resources"] == 2
