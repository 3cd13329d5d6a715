# -*- coding: utf-8 -*-
"""``playbooks/graph.yml`` through real ansible-playbook on a copy of ``examples/``: it
writes generated/graph.dot and graph.svg (and graph.png), the SVG names every object of
the tree, nothing outside ``generated/`` changes, and a second run changes nothing.
Check mode writes nothing. No endpoint and no terraform: the picture needs neither."""
from __future__ import annotations

import hashlib
import os
import xml.etree.ElementTree as ET

import pytest

import e2e

pytestmark = pytest.mark.integration

SVG_NS = "{http://www.w3.org/2000/svg}"


def _tree_hash(root):
    """sha256 of every file of the tree outside generated/."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        if dirpath == root:
            dirs[:] = [d for d in dirs if d != "generated"]
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _objects(root):
    from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree

    tree = load_tree(root)
    names = list(tree.hierarchy) + list(tree.runtimes) + list(tree.group_builders) + list(tree.storage_builders)
    names += list(tree.instance_builders) + list(tree.groups) + list(tree.storages) + list(tree.instances)
    return names


def test_graph_playbook_draws_every_object_of_the_example_tree(tmp_path):
    root = e2e.copy_example_tree(str(tmp_path))
    before = _tree_hash(root)
    names = _objects(root)
    assert len(names) == 15

    check = e2e.run_playbook("graph.yml", root, {}, dry_run=None, auto_approve=False, args=["--check"], timeout=300)
    assert check.rc == 0, check.tail()
    assert not os.path.exists(os.path.join(root, "generated"))

    run = e2e.run_playbook("graph.yml", root, {}, dry_run=None, auto_approve=False, timeout=300)
    assert run.rc == 0, run.tail()
    gen = os.path.join(root, "generated")
    for name in ("graph.dot", "graph.svg"):
        assert os.path.join(gen, name) in run.out  # the playbook prints where the files are
    svg = ET.parse(os.path.join(gen, "graph.svg")).getroot()
    assert svg.tag == SVG_NS + "svg"
    texts = [el.text for el in svg.iter(SVG_NS + "text")]
    missing = [n for n in names if n not in texts]
    assert not missing, (missing, texts)
    assert "mount /mnt/data" in texts and texts.count("remote state (instance-image)") == 2
    assert texts.count("declared") == len(names)  # nothing applied in this copy
    if os.path.exists(os.path.join(gen, "graph.png")):
        with open(os.path.join(gen, "graph.png"), "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert _tree_hash(root) == before

    again = e2e.run_playbook("graph.yml", root, {}, dry_run=None, auto_approve=False, timeout=300)
    assert again.rc == 0, again.tail()
    assert e2e.recap(again.out)["localhost"]["changed"] == 0
