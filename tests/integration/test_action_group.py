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
import re
import subprocess
from types import SimpleNamespace

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

# the second play of the same run (one ansible-playbook run, each costs seconds of CPU): its
# failure is registered instead of ending the run, and checked by an assert that prints the
# failure's message (an assert runs in the controller: no module process, unlike a copy of the
# result to a file); the assert's own failure is ignored, so the first test still sees the
# run succeed, and the second finds no "without the defaults: ..." line
NO_DEFAULTS = """\
- name: The same task without module_defaults
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Validate without naming the tree
      csis.infra.csis_validate:
      register: no_defaults
      ignore_errors: true

    - name: The task failed for the missing option
      ansible.builtin.assert:
        that:
          - no_defaults is failed
          - "'config_root' in no_defaults.msg"
        success_msg: "without the defaults: {{ no_defaults.msg }}"
      ignore_errors: true
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


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """PLAY then NO_DEFAULTS, in one ansible-playbook run on a copy of examples/, with the
    hashes of the copy and of examples/ from before the run."""
    base = tmp_path_factory.mktemp("action_group")
    tree = copy_as_shipped(EXAMPLES, str(base / "tree"))
    before = _tree_hash(tree)
    examples_before = _tree_hash(EXAMPLES)
    playbook = base / "play.yml"
    playbook.write_text(PLAY + "\n" + NO_DEFAULTS, encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run([PLAYBOOK_BIN, str(playbook), "-e", "tree=%s" % tree],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    return SimpleNamespace(tree=tree, res=res, before=before, examples_before=examples_before)


def test_module_defaults_of_the_group_set_config_root(played):
    res = played.res
    assert res.returncode == 0, res.stdout + res.stderr
    # NO_DEFAULTS' failure (and its assert's, if any) counts as ignored, not failed
    assert "failed=0" in res.stdout
    assert _tree_hash(played.tree) == played.before, "validation wrote into the tree"
    assert _tree_hash(EXAMPLES) == played.examples_before, "the run touched examples/"


def test_without_the_defaults_config_root_is_missing(played):
    # NO_DEFAULTS' assert printed the failure's message: the task failed, naming config_root
    assert re.search(r"without the defaults: .*config_root", played.res.stdout), played.res.stdout + played.res.stderr
