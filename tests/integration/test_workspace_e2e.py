# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The git workspace end to end (issue 15, item 4): real ansible-playbook, real terraform,
the session's moto server, real git with a local bare repository as the workspace.

One EBS tree with ``workspace: {repo: <bare>, require_merge: true}``, two runs of
storage.yml: the first is refused before the apply (the branch is pushed, not merged);
after a merge made with git itself, the second applies."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.apply import binding  # noqa: E402

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("terraform") is None or shutil.which("git") is None
                       or not os.path.exists(e2e.PLAYBOOK_BIN), reason="needs terraform and git on PATH and the project venv"),
]

ADD = "Plan: 1 to add, 0 to change, 0 to destroy"
BRANCH = "update_storage-aws-ebs"
EBS_ROOT = e2e.EBS_ROOT
GIT_ENV = {"GIT_AUTHOR_NAME": "reviewer", "GIT_AUTHOR_EMAIL": "reviewer@example.org", "GIT_COMMITTER_NAME": "reviewer",
           "GIT_COMMITTER_EMAIL": "reviewer@example.org", "GIT_TERMINAL_PROMPT": "0"}


def git(*args, cwd):
    return subprocess.run(["git"] + list(args), cwd=cwd, env=dict(os.environ, **GIT_ENV), check=True,
                          capture_output=True, text=True, timeout=120).stdout.strip()


def test_merge_is_the_approval(moto_endpoint, tmp_path):
    ep, parent = moto_endpoint, str(tmp_path)
    bare = os.path.join(parent, "workspace.git")
    git("init", "-q", "--bare", bare, cwd=parent)
    seed = os.path.join(parent, "seed")
    git("clone", "-q", bare, seed, cwd=parent)
    with open(os.path.join(seed, "README.md"), "w", encoding="utf-8") as fh:
        fh.write("platform workspace\n")
    git("add", "README.md", cwd=seed)
    git("commit", "-q", "-m", "start", cwd=seed)
    git("push", "-q", "origin", "HEAD:refs/heads/main", cwd=seed)

    root = e2e.make_ebs_tree(parent, "e2e-ws-%s" % uuid.uuid4().hex[:8])
    with open(os.path.join(root, "cfg", "_config.yml"), "a", encoding="utf-8") as fh:
        fh.write("workspace:\n  repo: %s\n  require_merge: true\n" % bare)
    overlays = [ep.overlay_path, e2e.APPLY_ALL]

    # 1. refused before the apply: committed and pushed, not merged
    first = e2e.run_playbook("storage.yml", root, ep.env, overlays=overlays, log=os.path.join(parent, "ws-1.log"))
    assert first.rc != 0, first.tail()
    assert e2e.plan_summaries(first.out) == {"storage-aws-ebs": ADD}
    flat = " ".join(first.out.split())
    assert ("storage-aws-ebs: not approved in the git workspace: the rendered root (digest " in flat
            and "(main holds no storage/aws-ebs/); merge branch %s into main of %s, then run again" % (BRANCH, bare) in flat), \
        first.tail()
    assert re.search(r"TASK \[csis\.infra\.tofu_root : Commit the rendered root to its git workspace branch\][^\n]*\n"
                     r"[^\n]*\nchanged: \[csis-storage-aws-ebs\]", first.out), first.tail()
    assert "Start the apply" not in first.out and "Record the approval of this plan" not in first.out
    recorded = (e2e.meta(root, "storage-state.yaml").get("storages") or {}).get("mnt_data") or {}
    assert not (recorded.get("facts") or {}).get("volume_id"), recorded
    head = git("rev-parse", "refs/heads/" + BRANCH, cwd=bare)
    assert git("log", "-1", "--format=%s", head, cwd=bare) == ADD
    body = git("log", "-1", "--format=%b", head, cwd=bare)
    assert "Root: storage-aws-ebs" in body and "Plan digest: " in body and "Run: " in body
    files = git("ls-tree", "-r", "--name-only", head, "--", "storage/aws-ebs/", cwd=bare).splitlines()
    rendered = sorted(binding.own_files(os.path.join(root, EBS_ROOT)))
    assert files == ["storage/aws-ebs/" + f for f in rendered], (files, rendered)
    assert "storage/aws-ebs/aws-ebs-storage-generation.tf" in files and "storage/aws-ebs/.terraform.lock.hcl" in files
    assert not any(f.endswith(("tfplan", ".csis-binding.json")) or "/.terraform/" in f for f in files)

    # 2. a reviewer merges the branch with git; the re-run applies
    review = os.path.join(parent, "review")
    git("clone", "-q", "-b", "main", bare, review, cwd=parent)
    git("merge", "-q", "--no-ff", "-m", "approve storage-aws-ebs", "origin/" + BRANCH, cwd=review)
    git("push", "-q", "origin", "main", cwd=review)

    second = e2e.run_playbook("storage.yml", root, ep.env, overlays=overlays, log=os.path.join(parent, "ws-2.log"))
    assert second.rc == 0, second.tail()
    assert e2e.plan_summaries(second.out) == {"storage-aws-ebs": ADD}
    assert re.search(r"TASK \[csis\.infra\.tofu_root : The rendered root must be merged on the git workspace's main "
                     r"branch\][^\n]*\n[^\n]*\nok: \[csis-storage-aws-ebs\]", second.out), second.tail()
    assert re.search(r"TASK \[csis\.infra\.tofu_root : Commit the rendered root to its git workspace branch\][^\n]*\n"
                     r"[^\n]*\nok: \[csis-storage-aws-ebs\]", second.out), second.tail()
    # the same files and summary: no new commit on the branch
    assert git("rev-parse", "refs/heads/" + BRANCH, cwd=bare) == head
    vid = e2e.meta(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]
    vol = ep.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"][0]
    assert vol["Size"] == 100 and vol["State"] in ("available", "in-use")
    # the merge is recorded as the approval: who merged, the commit, the plan; the storage's history shows it
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import store
    merge = git("rev-parse", "refs/heads/main", cwd=bare)
    lines = [line for line in store.history_report(root, storage="mnt_data")["lines"] if "approved by merge" in line]
    assert len(lines) == 1 and "merged by reviewer <reviewer@example.org>" in lines[0] and merge[:12] in lines[0], lines
