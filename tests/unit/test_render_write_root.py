# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""writer.write_root: a root's generated files are replaced as one swap, and what is not generated
(a local backend's ``terraform.tfstate``, ``.terraform/``, plans, unmount receipts) moves across.
A render that fails (or is interrupted) before the swap leaves the root as it was, its run output
in it: the state of a root without a state backend lives there, and losing it loses what terraform
knows it created."""
from __future__ import annotations

import os

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.render import writer


def _root(tmp_path):
    directory = str(tmp_path / "generated" / "storage" / "aws-ebs" / "storage-generation")
    writer.write_root(directory, {"main.tf": "# one\n"})
    for rel, text in (("terraform.tfstate", '{"version": 4}'), (".terraform/terraform.tfstate", "{}"),
                      ("unmount-receipts/i__s.json", "{}")):
        path = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    return directory


def _snapshot(directory):
    out = {}
    for dirpath, _dirs, names in os.walk(directory):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as fh:
                out[os.path.relpath(path, directory)] = fh.read()
    return out


def test_a_swap_keeps_the_run_output(tmp_path):
    directory = _root(tmp_path)
    writer.write_root(directory, {"main.tf": "# two\n"})
    got = _snapshot(directory)
    assert got["main.tf"] == "# two\n" and got["terraform.tfstate"] == '{"version": 4}'
    assert got[".terraform/terraform.tfstate"] == "{}" and "unmount-receipts/i__s.json" in got
    assert [n for n in os.listdir(os.path.dirname(directory)) if n.startswith(".")] == []


@pytest.mark.parametrize("fault", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk-full", "ctrl-c"])
def test_a_failure_before_the_swap_leaves_the_root_with_its_run_output(tmp_path, monkeypatch, fault):
    directory = _root(tmp_path)
    before = _snapshot(directory)

    def fail(_path):
        raise fault

    monkeypatch.setattr(writer, "fsync_dir", fail)  # the stage's fsync, after the run output moved in
    with pytest.raises(type(fault)):
        writer.write_root(directory, {"main.tf": "# two\n"})
    assert _snapshot(directory) == before
    assert [n for n in os.listdir(os.path.dirname(directory)) if n.startswith(".")] == []  # no stage left


def test_a_failure_between_the_two_renames_puts_the_old_root_back(tmp_path, monkeypatch):
    directory = _root(tmp_path)
    before = _snapshot(directory)
    real = os.replace

    def replace(src, dst):
        if os.path.basename(src).startswith(".storage-generation.new-") and dst == directory:
            raise OSError(5, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(writer.os, "replace", replace)
    with pytest.raises(OSError):
        writer.write_root(directory, {"main.tf": "# two\n"})
    monkeypatch.setattr(writer.os, "replace", real)
    assert _snapshot(directory) == before
    assert [n for n in os.listdir(os.path.dirname(directory)) if n.startswith(".")] == []
