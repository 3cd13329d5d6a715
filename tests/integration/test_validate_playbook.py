# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Validation through the real entry point, and its promises: offline, write-free.

* ``ansible-playbook playbooks/validate.yml -e csis_config_root=<dir>`` (cwd = the
  repository) passes on the example tree and fails on a broken copy, printing every
  problem on its own line with its file and key, with a non-zero exit;
* the corpus cases marked ``playbook: true`` print exactly their problems;
* loading + validating make no network call and write nothing: run in a subprocess with
  a Python audit hook that refuses every socket connect/name lookup and every
  write-mode open, rename, removal or directory creation (the declared terraform's
  ``version -json`` still runs, for real, inside a network namespace with no network).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "bad_inputs"))
import corpus  # noqa: E402

PLAYBOOK_BIN = os.path.join(REPO, ".venv", "bin", "ansible-playbook")
PYTHON = os.path.join(REPO, ".venv", "bin", "python")


def run_playbook(root: str, overlays=(), undeclare=()) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    cmd = [PLAYBOOK_BIN, "playbooks/validate.yml", "-e", "csis_config_root=%s" % root]
    if overlays or undeclare:
        cmd += ["-e", json.dumps({"csis_overlays": list(overlays), "csis_undeclare": list(undeclare)})]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_example_tree_validates_clean_through_the_playbook(tmp_path):
    root = corpus.copy_examples(str(tmp_path / "tree"))
    before = corpus.tree_hash(root)
    res = run_playbook(root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "is valid" in res.stdout and "failed=0" in res.stdout
    # the summary is a line an operator reads, not a Python mapping
    flat = " ".join(res.stdout.split())
    assert "%s is valid: instances 2, storages 3, runtimes 1, instance builders 1, storage builders 3" % root in flat, \
        res.stdout
    assert "{" not in flat.split(" is valid: ", 1)[1].split("PLAY RECAP", 1)[0], res.stdout
    assert corpus.tree_hash(root) == before


def test_the_shipped_examples_validate_in_place():
    res = run_playbook("examples")
    assert res.returncode == 0, res.stdout + res.stderr


BROKEN = [
    {"file": "storages/storage0.yaml", "set": {"storages.2.share_mode": "2700"}},
    {"file": "instances/instances.yaml", "set": {"instances.1.image": "nope", "instances.0.storages.0.mount_point": "mnt"}},
    {"file": "cfg/storage-builders.yml", "set": {"storage_builders.1.parameters": {"size": 5}}},
    {"file": "cfg/_config.yml", "set": {"config.apply_storage": "false"}},
    {"file": "groups/groups.yaml", "set": {"groups.1.gid": "3001"}},
    {"file": "storages/storage0.yaml", "set": {"storages.1.lifecycle": {"expire_days": 0}}},
]
BROKEN_LINES = [
    "storages/storage0.yaml: storages[2] (efs-storage).share_mode: share_mode '2700': expected one of ('2770', '2775') (N15)",
    "instances/instances.yaml: instances[1] (test).image: names unknown image 'nope' (declared: ['imgfile-basic', 'imgfile-basic-dask'])",
    "instances/instances.yaml: instances[0] (test2).storages[0] (mnt_data).mount_point: mount_point 'mnt' must be an "
    "absolute path of plain names (letters, digits, '_.@+-'), without '..', spaces or quotes",
    "cfg/storage-builders.yml: storage_builders[1] (aws-ebs).parameters: 'parameters:' is not supported on builders; "
    "declare module inputs under 'variables:' instead",
    "cfg/_config.yml: config.apply_storage: found the string 'false' (quoted, so not a YAML boolean); it must be "
    "true/false or a list of builder/runtime names",
    "groups/groups.yaml: groups[1] (stofs).gid: expected a valid integer, got '3001'",
    "storages/storage0.yaml: storages[1] (default-bucket).lifecycle: storage 'default-bucket': lifecycle.expire_days "
    "must be a positive int, got 0",
]


def test_a_broken_copy_fails_listing_every_problem(tmp_path):
    root = corpus.copy_examples(str(tmp_path / "tree"))
    for mut in BROKEN:
        corpus.apply_mutation(root, mut)
    before = corpus.tree_hash(root)
    res = run_playbook(root)
    assert res.returncode != 0
    out = res.stdout + res.stderr
    lines = [ln.strip() for ln in out.splitlines()]
    for want in BROKEN_LINES:
        assert want in lines, "missing line %r in:\n%s" % (want, out)
    assert "%d problem(s) in %s" % (len(BROKEN_LINES), root) in out
    assert corpus.tree_hash(root) == before
    assert not os.path.exists(os.path.join(root, "meta-state"))


PLAYBOOK_CASES = [c for c in corpus.case_files() if corpus.load_case(c).get("playbook")]


def test_some_corpus_cases_go_through_the_playbook():
    assert len(PLAYBOOK_CASES) >= 5


@pytest.mark.parametrize("path", PLAYBOOK_CASES, ids=[os.path.basename(c)[:-5] for c in PLAYBOOK_CASES])
def test_corpus_case_through_the_playbook(path, tmp_path):
    case = corpus.load_case(path)
    if case.get("versions") not in (None, "real"):
        pytest.skip("the playbook runs the real executable check")
    root = corpus.prepare(case, str(tmp_path / "tree"))
    before = corpus.tree_hash(root)
    res = run_playbook(root, case.get("overlays") or (), case.get("undeclare") or ())
    assert res.returncode != 0
    lines = [ln.strip() for ln in (res.stdout + res.stderr).splitlines()]
    for f, k, msg in corpus.expected(case):
        assert corpus.problem_line(f, k, msg) in lines, (corpus.problem_line(f, k, msg), res.stdout)
    assert "%d problem(s)" % len(case["expect"]) in res.stdout
    assert corpus.tree_hash(root) == before


# ----------------------------------------------------------------------------- offline
GUARD = textwrap.dedent(r'''
    import os, sys, json
    blocked = []
    WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    def hook(event, args):
        if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto",
                     "socket.bind"):
            blocked.append(event)
            raise RuntimeError("network call during validation: %s %r" % (event, args))
        if event == "open":
            path, mode, flags = args
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (mode is None and flags & WRITE):
                if path != "/dev/null":
                    blocked.append(event)
                    raise RuntimeError("write during validation: %r" % (path,))
        if event in ("os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.truncate", "os.symlink",
                     "os.link", "os.chmod", "shutil.rmtree", "shutil.copyfile", "shutil.move"):
            blocked.append(event)
            raise RuntimeError("write during validation: %s %r" % (event, args))
        if event == "subprocess.Popen":
            exe, argv = args[0], list(args[1])
            if argv[1:] != ["version", "-json"]:
                raise RuntimeError("unexpected process during validation: %r" % (argv,))
    sys.addaudithook(hook)
    sys.path.insert(0, sys.argv[1])
    from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate
    from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError
    try:
        tree, meta = load_and_validate(sys.argv[2], overlays=sys.argv[3:])
        result = {"ok": True, "instances": sorted(tree.instances)}
    except ConfigError as exc:
        result = {"ok": False, "problems": [str(p) for p in exc.problems]}
    result["blocked"] = blocked
    print(json.dumps(result))
''')


def _guarded(tmp_path, root, *overlays, netns: bool = False):
    script = tmp_path / "guard.py"
    script.write_text(GUARD)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [PYTHON, str(script), os.path.join(REPO, ".venv", "collections"), root] + list(overlays)
    if netns:
        cmd = ["unshare", "-rn"] + cmd
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_validation_makes_no_network_call_and_no_write(tmp_path):
    root = corpus.copy_examples(str(tmp_path / "tree"))
    before = corpus.tree_hash(root)
    out = _guarded(tmp_path, root, "overlays/apply-all.yml")
    assert out == {"ok": True, "instances": ["test", "test2"], "blocked": []}
    assert corpus.tree_hash(root) == before


def test_a_failing_validation_makes_no_network_call_and_no_write(tmp_path):
    root = corpus.copy_examples(str(tmp_path / "tree"))
    for mut in BROKEN:
        corpus.apply_mutation(root, mut)
    before = corpus.tree_hash(root)
    out = _guarded(tmp_path, root)
    assert out["ok"] is False and out["blocked"] == []
    assert sorted(out["problems"]) == sorted(BROKEN_LINES)
    assert corpus.tree_hash(root) == before


@pytest.mark.skipif(shutil.which("unshare") is None or subprocess.run(["unshare", "-rn", "true"], check=False).returncode != 0,
                    reason="no user/network namespaces here")
def test_validation_works_without_any_network(tmp_path):
    """In a network namespace with no interface at all (terraform's own check included)."""
    root = corpus.copy_examples(str(tmp_path / "tree"))
    out = _guarded(tmp_path, root, netns=True)
    assert out == {"ok": True, "instances": ["test", "test2"], "blocked": []}
