# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""``upgrade_instance.yml -e cancel=true`` (real ansible-playbook, no network): the pending
replacement marker an upgrade left (a dry or apply-less run keeps it, and every later real run
would replace the instance) is removed, the change log says so, and no lifecycle runs. Before,
no playbook or module could remove it; forget.yml drops the whole launch record. ``--check`` runs
to its end, says which marker a real run would remove, and changes nothing."""
from __future__ import annotations

import os
import subprocess

import pytest
from trees import EXAMPLES, copy_as_shipped, read_meta, write_meta

import e2e

pytestmark = pytest.mark.integration


def play(root, *extra):
    argv = [e2e.PLAYBOOK_BIN, os.path.join(e2e.REPO, "playbooks", "upgrade_instance.yml"),
            "-e", "csis_config_root=" + root, "-e", "instance=test2"]
    for x in extra:
        argv += [x] if x.startswith("--") else ["-e", x]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(e2e.REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run(argv, cwd=e2e.REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    return res.returncode, " ".join((res.stdout + res.stderr).split())


def test_a_pending_upgrade_is_cancelled_and_no_lifecycle_runs(tmp_path):
    root = copy_as_shipped(EXAMPLES, str(tmp_path / "tree"))
    write_meta(root, "launch-params.yaml", {"instances": {"test2": {"launched": True, "ephemeral": False}}})
    write_meta(root, "pins.yaml", {"instances": {"test2": "ami-1"}, "pending_replacements": {},
                                   "upgrades": []})
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import record
    record.mark_upgrade(root, "test2", "r1", to="ami-2")
    before = e2e.meta_state_digest(root)

    # check mode: the playbook runs to its end, says the marker is left alone, and changes nothing
    rc, out = play(root, "cancel=true", "--check")
    assert rc == 0, out
    assert "test2: check mode: the marker is not removed; a real run would cancel the replacement onto ami-2 from ami-1, " \
           "asked by " in out, out
    assert "{" not in out.split("a real run would cancel", 1)[1].split("TASK", 1)[0], out  # words, not a Python dict
    assert e2e.meta_state_digest(root) == before

    rc, out = play(root, "cancel=true")
    assert rc == 0, out
    assert "test2: upgrade cancelled (the marker" in out and "ami-2" in out, out
    assert "skipping: no hosts matched" in out  # the lifecycle's plays: nothing rendered, no root
    assert not os.path.exists(os.path.join(root, "generated"))
    pins = read_meta(root, "pins.yaml")
    assert pins["pending_replacements"] == {} and pins["upgrades"][-1]["op"] == "upgrade-cancelled"

    rc, out = play(root, "cancel=true")
    assert rc == 0 and "test2: no pending replacement to cancel" in out, out
    # a mistyped name is no "nothing to cancel": the operator believes the upgrade is cancelled
    argv_rc, out = play(root, "cancel=true", "instance=tset2")
    assert argv_rc != 0, out
    assert "instance 'tset2' is not in meta-state/launch-params.yaml: it was never launched, so it has no upgrade to " \
           "cancel (a mistyped name?)" in out, out
    assert read_meta(root, "pins.yaml") == pins
