# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What the loader reads as a tree's files (config/loader.py file_problem): only regular files,
and only inside the tree. A symbolic link out of the tree (to ``/etc/shadow``, another team's
files) is not read: its lines would come back as "unknown key" problems in the job output. A
named pipe would block the read for ever, a device (``/dev/zero``) never end it. Every such file
gets one problem naming it; the rest of the tree loads."""
from __future__ import annotations

import os

import pytest
from trees import EXAMPLES, copy_as_shipped

from ansible_collections.csis.infra.plugins.module_utils.csis.config import loader


def problems_of(root, overlays=()):
    _tree, problems = loader.load_tree_partial(root, overlays)
    return {(p.file, p.message) for p in problems}


@pytest.fixture()
def tree(tmp_path):
    return copy_as_shipped(EXAMPLES, str(tmp_path / "tree"))


def test_a_link_out_of_the_tree_is_not_read_and_its_content_never_shown(tree, tmp_path):
    outside = tmp_path / "outside.yaml"
    outside.write_text("root:*:20228:0:99999:7::: x\nhunter2: y\n", encoding="utf-8")
    os.symlink(str(outside), os.path.join(tree, "groups", "more.yaml"))
    found = problems_of(tree)
    assert found == {("groups/more.yaml", "is a symbolic link to %s, outside the configuration root: not read "
                                          "(a tree's files must be inside it)" % outside)}, found
    assert "hunter2" not in repr(found) and "20228" not in repr(found)


def test_a_link_inside_the_tree_is_read(tree):
    os.rename(os.path.join(tree, "groups", "groups.yaml"), os.path.join(tree, "groups", "shared.data"))
    os.symlink(os.path.join("..", "groups", "shared.data"), os.path.join(tree, "groups", "groups.yaml"))
    assert problems_of(tree) == set()


def test_a_pipe_a_device_and_a_directory_are_refused_by_name(tree):
    os.mkfifo(os.path.join(tree, "groups", "fifo.yaml"))
    os.symlink("/dev/zero", os.path.join(tree, "images", "zero.yaml"))
    os.mkdir(os.path.join(tree, "storages", "dir.yaml"))
    found = problems_of(tree)
    assert found == {("groups/fifo.yaml", "is a named pipe, not a regular file: not read"),
                     ("images/zero.yaml", "is a character device, not a regular file: not read"),
                     ("storages/dir.yaml", "is a directory, not a regular file: not read")}, found


def test_an_overlay_that_is_a_directory_is_named_as_such(tree, tmp_path):
    found = problems_of(tree, [str(tmp_path)])
    assert found == {(str(tmp_path), "is a directory, not a regular file: not read")}, found
    # an overlay outside the tree is fine (the demo's overlay lives beside the endpoint)
    ov = tmp_path / "ov.yml"
    ov.write_text("config: {apply_storage: true}\n", encoding="utf-8")
    assert problems_of(tree, [str(ov)]) == set()


def test_a_yaml_file_in_cfg_that_csis_reads_not_is_refused_never_ignored(tree):
    """The reference's cfg/os-builders.yml (its capability gate), a misnamed .yaml, a stray file:
    each would be silently ignored, so each is one problem naming it; other names are not read."""
    cfg = os.path.join(tree, "cfg")
    for name, text in (("os-builders.yml", "os_builders: []\n"), ("executables.yaml", "executables: []\n"),
                       ("notes.yml", "x: 1\n"), ("runtime-builders.yml.bak", "junk"), ("README.md", "# cfg\n")):
        with open(os.path.join(cfg, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    found = problems_of(tree)
    assert {f for f, _m in found} == {"cfg/os-builders.yml", "cfg/executables.yaml", "cfg/notes.yml"}, found
    msg = dict(found)
    assert msg["cfg/os-builders.yml"].startswith("declares the reference's OS builders (base images and their "
                                                 "storage_types), which csis.infra has no equivalent of")
    assert msg["cfg/executables.yaml"] == ("csis.infra reads cfg/executables.yml (ending in .yml), not .yaml, so this "
                                           "file would be ignored: rename it")
    assert msg["cfg/notes.yml"].startswith("is not a csis.infra configuration file: csis.infra reads no such file "
                                           "(cfg/ holds _config.yml, executables.yml, ")


def test_a_file_name_with_a_newline_or_an_escape_prints_as_one_line(tree):
    """A problem is one line: a name cannot forge another problem's line or drive the terminal."""
    for name in ("c\nstorages: all good.yaml", "e\x1b[2Jf.yaml"):
        with open(os.path.join(tree, "storages", name), "w", encoding="utf-8") as fh:
            fh.write("x: 1\n")
    _tree, problems = loader.load_tree_partial(tree)
    lines = sorted(str(p) for p in problems)
    assert lines == ["storages/c\\nstorages: all good.yaml: x: unknown key 'x' (allowed here: storages)",
                     "storages/e\\x1b[2Jf.yaml: x: unknown key 'x' (allowed here: storages)"], lines


def test_only_yaml_and_yml_files_of_a_kind_directory_are_read(tree):
    """docs/configuration.md: groups/, images/, storages/, instances/ read ``*.yaml`` and ``*.yml``.
    Another file there (a rendered ``notes.yaml.html``, an ``x.yhtml``) is not read: it would come back
    as "unknown key" problems, or worse, declare storages nobody meant to."""
    for name in ("notes.yaml.html", "x.yhtml"):
        with open(os.path.join(tree, "storages", name), "w", encoding="utf-8") as fh:
            fh.write("storages:\n  - {name: stray, type: aws-ebs, size: 1}\n")
    assert problems_of(tree) == set()
    assert "stray" not in loader.load_tree_partial(tree)[0].storages
