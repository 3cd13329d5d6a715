# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""scripts/demo-tree: the demo's copy of examples/ is kept while the local endpoint it was run
against runs, moved aside (never deleted) once that endpoint is gone, and made again. Runs the
script as scripts/demo does, on small trees in a temporary directory."""
from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "demo-tree")


def examples(tmp_path):
    src = tmp_path / "examples"
    (src / "cfg").mkdir(parents=True)
    (src / "cfg" / "config.yml").write_text("config: {}\n")
    for left_by_a_run in ("generated", "meta-state"):
        (src / left_by_a_run).mkdir()
        (src / left_by_a_run / "x").write_text("run output\n")
    return str(src)


def seed(tmp_path, vpc_id):
    path = tmp_path / "seed.json"
    path.write_text(json.dumps({"vpc_id": vpc_id, "url": "http://127.0.0.1:5055"}))
    return str(path)


def run(src, demo_dir, seed_json):
    return subprocess.run([sys.executable, SCRIPT, src, demo_dir, seed_json], capture_output=True, text=True,
                          check=False)


def test_a_copy_is_kept_while_its_endpoint_runs_and_moved_aside_once_it_is_gone(tmp_path):
    src, demo = examples(tmp_path), str(tmp_path / "demo")
    tree = os.path.join(demo, "examples")
    first = run(src, demo, seed(tmp_path, "vpc-one"))
    assert first.returncode == 0 and "copied examples/ to %s" % tree in first.stdout, first.stderr
    assert sorted(os.listdir(tree)) == ["cfg"]                   # what a run left in examples/ is not copied
    assert open(os.path.join(demo, "endpoint"), encoding="utf-8").read() == "vpc-one\n"
    os.makedirs(os.path.join(tree, "meta-state"))
    with open(os.path.join(tree, "meta-state", "storage-state.yaml"), "w", encoding="utf-8") as fh:
        fh.write("storages: {}\n")                               # the demo's own records

    again = run(src, demo, seed(tmp_path, "vpc-one"))            # the same endpoint: converge on the same copy
    assert again.returncode == 0 and "re-using %s" % tree in again.stdout
    assert os.path.isfile(os.path.join(tree, "meta-state", "storage-state.yaml"))

    gone = run(src, demo, seed(tmp_path, "vpc-two"))             # a new endpoint: its records name nothing
    assert gone.returncode == 0, gone.stderr
    aside = [n for n in os.listdir(demo) if n.startswith("examples.endpoint-gone-")]
    assert len(aside) == 1 and "gone (seeded VPC vpc-one; this one's is vpc-two)" in gone.stdout
    assert os.path.join(demo, aside[0]) in gone.stdout
    assert os.path.isfile(os.path.join(demo, aside[0], "meta-state", "storage-state.yaml"))  # nothing lost
    assert sorted(os.listdir(tree)) == ["cfg"]                   # a new copy, from examples/
    assert open(os.path.join(demo, "endpoint"), encoding="utf-8").read() == "vpc-two\n"


def test_a_copy_from_before_the_marker_is_kept(tmp_path):
    src, demo = examples(tmp_path), str(tmp_path / "demo")
    tree = os.path.join(demo, "examples")
    os.makedirs(os.path.join(tree, "meta-state"))
    res = run(src, demo, seed(tmp_path, "vpc-one"))
    assert res.returncode == 0 and "re-using" in res.stdout
    assert os.path.isdir(os.path.join(tree, "meta-state"))
    assert open(os.path.join(demo, "endpoint"), encoding="utf-8").read() == "vpc-one\n"


def test_no_seed_record_is_an_error_and_writes_nothing(tmp_path):
    src, demo = examples(tmp_path), str(tmp_path / "demo")
    res = run(src, demo, str(tmp_path / "no-seed.json"))
    assert res.returncode == 2 and "cannot tell which local endpoint runs" in res.stderr
    assert not os.path.exists(demo)
    bad = tmp_path / "bad-seed.json"
    bad.write_text(json.dumps({"url": "http://127.0.0.1:5055"}))
    res = run(src, demo, str(bad))
    assert res.returncode == 2 and "holds no vpc_id" in res.stderr and not os.path.exists(demo)
