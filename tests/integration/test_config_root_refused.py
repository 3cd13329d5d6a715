# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A mistyped, missing or empty ``csis_config_root`` is refused before anything is written
(real ``ansible-playbook``; the runs stop before any terraform or AWS call).

Before the fix a dry or real run of ``storage.yml`` created ``<root>/meta-state/`` (the run
lock's and the preflight's directory) in whatever directory it was given, and then said
"nothing was written"; an empty value was the current directory (``realpath`` of ""), where the
README's commands run: the checkout."""
from __future__ import annotations

import os
import subprocess

import pytest

import e2e

pytestmark = pytest.mark.integration


def run(cwd, root, *extra):
    argv = [e2e.PLAYBOOK_BIN, os.path.join(e2e.REPO, "playbooks", "storage.yml"), "-e", "csis_config_root=" + root]
    for x in extra:
        argv += ["-e", x]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(e2e.REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run(argv, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=300, check=False)
    return res.returncode, " ".join((res.stdout + res.stderr).split())


@pytest.mark.parametrize("dry_run", ["true", "false"])
def test_a_root_that_is_no_tree_is_refused_and_nothing_is_created(tmp_path, dry_run):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    missing = tmp_path / "no-such-tree"
    rc, out = run(cwd, str(missing), "csis_dry_run=" + dry_run)
    assert rc != 0
    assert "%s: the configuration root does not exist or is not a directory (check csis_config_root); " \
           "nothing was written" % missing in out, out
    assert not missing.exists()

    plain = tmp_path / "plain"  # a directory, but no cfg/_config.yml
    plain.mkdir()
    rc, out = run(cwd, str(plain), "csis_dry_run=" + dry_run)
    assert rc != 0
    assert "%s: not a configuration tree: it has no cfg/_config.yml (check csis_config_root)" % plain in out, out
    assert os.listdir(str(plain)) == []

    rc, out = run(cwd, "", "csis_dry_run=" + dry_run)
    assert rc != 0
    assert "csis_config_root is empty: give the directory of the configuration tree" in out, out
    assert os.listdir(str(cwd)) == []
