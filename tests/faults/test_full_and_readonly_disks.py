# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Issue 14, item 3: full and read-only disks, on real small filesystems.

* ``meta-state/`` on a full tmpfs: a transaction fails with the file and ``No space left on
  device``, the old file stays byte-identical, no temporary file is left, the lock is free,
  and the same write goes through once there is room (library level, through the store's
  transaction: the one path every writer takes). A real ``storage.yml`` on such a tree stops
  at its preflight, before anything is rendered or planned.
* A read-only config root (a read-only bind mount: as root, ``chmod`` stops nothing): a real
  run stops at the preflight naming the meta-state directory and ``Read-only file system``;
  the store and the render (a dry run has no preflight probe) fail with one message naming
  the path; nothing is written.

(The truncated and garbage meta-state files are tests/integration/test_day2_instances.py
and tests/unit/test_metastate.py; this file adds only what a real filesystem brings.)

Mounting needs root (CAP_SYS_ADMIN): elsewhere these tests skip, saying so.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.pipeline import render  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState  # noqa: E402

FILLER = ".filler"  # hidden: no meta-state reader lists it


def _mount(argv):
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@contextlib.contextmanager
def tmpfs(path, size="256k"):
    os.makedirs(path, exist_ok=True)
    res = _mount(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "tmpfs", path]) if shutil.which("mount") else None
    if res is None or res.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (%s): a full filesystem needs root (CAP_SYS_ADMIN)"
                    % ((res.stderr.strip() if res else "") or "no mount command"))
    try:
        yield path
    finally:
        _mount(["umount", "-l", path])


@contextlib.contextmanager
def read_only(path):
    """``path`` bind-mounted read-only over itself."""
    res = _mount(["mount", "--bind", path, path]) if shutil.which("mount") else None
    if res is None or res.returncode != 0:
        pytest.skip("cannot bind-mount here (%s): a read-only config root needs root (CAP_SYS_ADMIN)"
                    % ((res.stderr.strip() if res else "") or "no mount command"))
    try:
        ro = _mount(["mount", "-o", "remount,bind,ro", path])
        if ro.returncode != 0:
            pytest.skip("cannot remount the bind mount read-only: %s" % ro.stderr.strip())
        yield path
    finally:
        _mount(["umount", "-l", path])


def fill(directory, leave=0):
    """Fill the filesystem of ``directory``, then give back ``leave`` bytes."""
    path = os.path.join(directory, FILLER)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == 28, exc
    finally:
        os.close(fd)
    if leave:
        os.truncate(path, max(0, os.path.getsize(path) - leave))
    return path


def snapshot(directory):
    out = {}
    for dirpath, _dirs, files in os.walk(directory):
        for f in files:
            if f != FILLER:
                p = os.path.join(dirpath, f)
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, directory)] = fh.read()
    return out


BIG = {"runs": [{"run": "r%04d" % i, "what": "x" * 60} for i in range(2000)]}   # ~150 kB of YAML


@pytest.mark.parametrize("leave", [0, 16384], ids=["no-room-at-all", "room-for-the-marker-only"])
def test_a_full_meta_state_filesystem_fails_the_write_atomically(tmp_path, leave):
    root = str(tmp_path / "tree")
    with tmpfs(os.path.join(root, "meta-state")) as meta_dir:
        ms = MetaState(root)
        with ms.transaction("first") as txn:
            txn.save("runs.yaml", {"runs": [{"run": "r1"}]})
        before = snapshot(meta_dir)
        filler = fill(meta_dir, leave)
        with pytest.raises(CsisError) as err:
            with ms.transaction("too big") as txn:
                txn.save("runs.yaml", BIG)
        msg = str(err.value)
        if leave:
            # the lock and the revision marker fit, the records do not: the message names their file
            assert msg.startswith("meta-state/runs.yaml: cannot write: No space left on device"), msg
        else:
            # not even the lock holder's description fits
            assert msg == "meta-state/.lock: cannot write: No space left on device (nothing was written)", msg
        after = snapshot(meta_dir)
        assert after.get("runs.yaml") == before["runs.yaml"]                       # the old file, whole
        assert not [f for f in os.listdir(meta_dir) if f.endswith(".tmp")]       # no temporary left
        assert ms.load("runs.yaml") == {"runs": [{"run": "r1"}]}
        os.unlink(filler)                                                        # room again
        with MetaState(root, lock_timeout=0).transaction("again") as txn:       # the lock is free
            txn.save("runs.yaml", BIG)
        assert ms.load("runs.yaml") == BIG


def _tree(parent):
    """A one-EBS tree (no run needed: these runs stop at the preflight, before terraform)."""
    return e2e.make_ebs_tree(parent, "disks-%s" % uuid.uuid4().hex[:8])


@pytest.mark.integration
@pytest.mark.skipif(not os.path.exists(e2e.PLAYBOOK_BIN), reason="needs the project venv")
def test_a_real_run_on_a_full_meta_state_stops_before_rendering(moto_endpoint, tmp_path):
    ep = moto_endpoint
    root = _tree(str(tmp_path))
    with tmpfs(os.path.join(root, "meta-state")) as meta_dir:
        with MetaState(root).transaction("seed") as txn:
            txn.save("runs.yaml", {"runs": [{"run": "r1"}]})
        before = snapshot(meta_dir)
        fill(meta_dir)
        run = e2e.run_playbook("storage.yml", root, ep.env, overlays=[ep.overlay_path, e2e.APPLY_ALL],
                               log=str(tmp_path / "full.log"))
        after = snapshot(meta_dir)
    assert run.rc != 0
    flat = " ".join(run.out.split())
    assert "meta-state: the directory %s cannot be written: No space left on device" % meta_dir in flat, run.tail()
    assert "TASK [csis.infra.render : Render the storage roots]" not in run.out
    assert not os.path.exists(os.path.join(root, "generated", "storage"))
    assert after == before


@pytest.mark.integration
@pytest.mark.skipif(not os.path.exists(e2e.PLAYBOOK_BIN), reason="needs the project venv")
def test_a_read_only_config_root_is_refused_naming_it(moto_endpoint, tmp_path):
    ep = moto_endpoint
    root = _tree(str(tmp_path))
    with MetaState(root).transaction("seed") as txn:
        txn.save("runs.yaml", {"runs": [{"run": "r1"}]})
    meta_dir = os.path.join(root, "meta-state")
    before = snapshot(root)
    with read_only(root):
        with pytest.raises(OSError):
            open(os.path.join(root, "probe"), "w").close()                # really read-only, even for root
        run = e2e.run_playbook("storage.yml", root, ep.env, overlays=[ep.overlay_path, e2e.APPLY_ALL],
                               log=str(tmp_path / "ro.log"))
        with pytest.raises(CsisError) as err:
            with MetaState(root).transaction("library") as txn:
                txn.save("runs.yaml", {"runs": [{"run": "r2"}]})
        # a dry run renders (and writes generated/) without the preflight's probe: one message too
        with pytest.raises(CsisError) as rendered:
            render(root, ["storage"], dry_run=True, overlays=[ep.overlay_path], prepare=False)
    assert run.rc != 0
    flat = " ".join(run.out.split())
    assert "meta-state: the directory %s cannot be written: Read-only file system" % meta_dir in flat, run.tail()
    assert "TASK [csis.infra.render : Render the storage roots]" not in run.out
    assert str(err.value).startswith("meta-state/"), err.value
    assert "Read-only file system" in str(err.value), err.value
    assert str(rendered.value) == "%s: cannot render there: Read-only file system" % os.path.join(root, "generated")
    assert snapshot(root) == before
