# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""``module_defaults: {group/csis.infra.csis: {config_root: ...}}`` reaches the modules.

A real ``ansible-playbook`` run on a copy of ``examples/`` (never ``examples/`` itself):
``csis.infra.csis_validate`` and ``csis.infra.csis_apply_check`` get their ``config_root``
from the action group declared in ``meta/runtime.yml`` and nowhere else; without the
defaults the same task fails for the missing option, so it is the group that supplied it.
"""
from __future__ import annotations

import hashlib
import os
import subprocess

import pytest
from trees import EXAMPLES, copy_as_shipped

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK_BIN = os.path.join(REPO, ".venv", "bin", "ansible-playbook")

PLAY = """\
- name: csis.infra modules take config_root from the action group
  hosts: localhost
  gather_facts: false
  module_defaults:
    group/csis.infra.csis:
      config_root: "{{ tree }}"
  tasks:
    - name: Validate without naming the tree
      csis.infra.csis_validate:
      register: validated

    - name: Re-read the apply flags without naming the tree
      csis.infra.csis_apply_check:
        lifecycle: storage
        root: no-such-builder
      register: flags
      ignore_errors: true

    - name: Both modules read the tree given by module_defaults
      ansible.builtin.assert:
        that:
          - validated is succeeded
          - validated.problems == []
          - validated.summary.instances == 2
          - flags is succeeded or (tree ~ '/cfg/_config.yml') in flags.msg
"""

NO_DEFAULTS = """\
- name: The same task without module_defaults
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Validate without naming the tree
      csis.infra.csis_validate:
"""


def _tree_hash(root: str) -> str:
    digest = hashlib.sha256()
    for directory, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(directory, name)
            digest.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as handle:
                digest.update(handle.read())
    return digest.hexdigest()


def _play(tmp_path, text: str, tree: str) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    playbook.write_text(text, encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([PLAYBOOK_BIN, str(playbook), "-e", "tree=%s" % tree],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_module_defaults_of_the_group_set_config_root(tmp_path):
    tree = copy_as_shipped(EXAMPLES, str(tmp_path / "tree"))
    before = _tree_hash(tree)
    examples_before = _tree_hash(EXAMPLES)
    res = _play(tmp_path, PLAY, tree)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "failed=0" in res.stdout
    assert _tree_hash(tree) == before, "validation wrote into the tree"
    assert _tree_hash(EXAMPLES) == examples_before, "the run touched examples/"


def test_without_the_defaults_config_root_is_missing(tmp_path):
    tree = copy_as_shipped(EXAMPLES, str(tmp_path / "tree"))
    res = _play(tmp_path, NO_DEFAULTS, tree)
    assert res.returncode != 0
    assert "config_root" in res.stdout + res.stderr
