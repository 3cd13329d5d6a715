# -*- coding: utf-8 -*-
"""The git workspace (plugins/module_utils/csis/apply/workspace.py) with real git: a bare
repository in tmp as the remote, merges made with git itself in a clone of it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from urllib.parse import quote

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.apply import binding
from ansible_collections.csis.infra.plugins.module_utils.csis.apply import workspace as ws
from ansible_collections.csis.infra.plugins.module_utils.csis.config import models as m

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

ROOT = "storage-aws-ebs"
ADD = "Plan: 1 to add, 0 to change, 0 to destroy"
WHERE = dict(root=ROOT, lifecycle="storage", builder="aws-ebs")
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_TERMINAL_PROMPT": "0"}


def git(*args, cwd):
    env = dict(os.environ, **GIT_ENV)
    return subprocess.run(["git"] + list(args), cwd=cwd, env=env, check=True, capture_output=True, text=True,
                          timeout=60).stdout.strip()


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


@pytest.fixture()
def env(tmp_path):
    """A tree (cfg/_config.yml with workspace:), a rendered root with run output beside its
    files, and a bare repository whose main branch holds a README."""
    bare = tmp_path / "ws.git"
    git("init", "-q", "--bare", str(bare), cwd=str(tmp_path))
    seed = tmp_path / "seed"
    git("clone", "-q", str(bare), str(seed), cwd=str(tmp_path))
    write(str(seed / "README.md"), "the workspace\n")
    git("add", "README.md", cwd=str(seed))
    git("commit", "-q", "-m", "start", cwd=str(seed))
    git("push", "-q", "origin", "HEAD:refs/heads/main", cwd=str(seed))
    tree = tmp_path / "tree"
    write(str(tree / "cfg" / "_config.yml"), "config: {}\nworkspace:\n  repo: ../ws.git\n  require_merge: true\n")
    proj = tree / "generated" / "storage" / "aws-ebs" / "storage-generation"
    write(str(proj / "main.tf"), 'resource "aws_ebs_volume" "this" {\n  size = 100\n}\n')
    write(str(proj / "backend.tfbackend.hcl"), 'bucket = "b"\n')
    write(str(proj / ".terraform.lock.hcl"), "# lock\n")
    # run output: never committed, never part of the rendered digest
    write(str(proj / "tfplan"), "plan bytes")
    write(str(proj / "tfplan.csis-binding.json"), "{}")
    write(str(proj / ".terraform" / "terraform.tfstate"), "{}")
    write(str(proj / "unmount-receipts" / "i__s.json"), "{}")
    write(str(proj / ".apply.log"), "log")
    return dict(tmp=tmp_path, bare=str(bare), tree=str(tree), proj=str(proj), repo="../ws.git")


def commit(e, summary=ADD, destroys=0, **kw):
    return ws.commit_root(e["tree"], e["repo"], project_path=e["proj"], summary=summary, destroys=destroys,
                          plan_digest=kw.pop("plan_digest", "d" * 64), run_id=kw.pop("run_id", "run-1"), **WHERE, **kw)


def merged(e, destroys=0):
    return ws.check_merged(e["tree"], e["repo"], project_path=e["proj"], destroys=destroys, **WHERE)


def bare_ref(e, branch):
    res = subprocess.run(["git", "rev-parse", "-q", "--verify", "refs/heads/" + branch], cwd=e["bare"],
                         capture_output=True, text=True, timeout=60, check=False)
    return res.stdout.strip() if res.returncode == 0 else None


def merge_in_clone(e, branch):
    """What a reviewer does: merge the root's branch into main with git, push main."""
    clone = str(e["tmp"] / ("merge-" + branch))
    git("clone", "-q", "-b", "main", e["bare"], clone, cwd=str(e["tmp"]))
    git("merge", "-q", "--no-ff", "-m", "merge " + branch, "origin/" + branch, cwd=clone)
    git("push", "-q", "origin", "main", cwd=clone)


# ------------------------------------------------------------------ names
def test_branch_names_follow_the_plan_and_refuse_what_git_refs_cannot_hold():
    assert ws.branch_name(ROOT) == "update_storage-aws-ebs"
    assert ws.branch_name(ROOT, destroys=2) == "delete_storage-aws-ebs"
    assert ws.workspace_path("storage", "aws-ebs") == "storage/aws-ebs"
    for bad in ("", "a b", "-x", "x..y", "x.lock", "a/b", "x~1", "x^", "x:y", "x@{1}", ".hidden", "x\n"):
        with pytest.raises(ws.WorkspaceError, match="cannot name a git branch"):
            ws.branch_name(bad)
    with pytest.raises(ws.WorkspaceError):
        ws.workspace_path("storage", "../etc")
    for good in ("update_" + ROOT, "delete_" + ROOT):
        subprocess.run(["git", "check-ref-format", "refs/heads/" + good], check=True, timeout=60)


def test_urls_are_masked_and_paths_resolved_from_the_config_root(tmp_path):
    assert ws.mask_url("fetch https://bob:s3cr3t@git.example.org/ws.git failed") == \
        "fetch https://***@git.example.org/ws.git failed"
    assert ws.mask_url("ssh://tok@h/x and https://h/y") == "ssh://***@h/x and https://h/y"
    assert ws.mask_url("git@github.com:org/ws.git") == "git@github.com:org/ws.git"  # a user name, no secret
    assert ws.resolve_repo("../ws.git", str(tmp_path / "tree")) == str(tmp_path / "ws.git")
    assert ws.resolve_repo("git@github.com:org/ws.git", "/x") == "git@github.com:org/ws.git"
    assert ws.resolve_repo("https://h/ws.git", "/x") == "https://h/ws.git"


def test_a_failing_remote_never_shows_its_credentials(tmp_path):
    tree = tmp_path / "tree"
    proj = tmp_path / "root"
    write(str(proj / "main.tf"), "# x\n")
    with pytest.raises(ws.WorkspaceError) as err:
        ws.commit_root(str(tree), "http://bob:s3cr3t@127.0.0.1:9/ws.git", project_path=str(proj), summary=ADD, **WHERE)
    text = str(err.value)
    assert "s3cr3t" not in text and "bob" not in text
    assert text.startswith("git fetch") and "http://127.0.0.1:9/ws.git" in text  # git never had them
    # the URL is not stored in the clone either
    with open(os.path.join(str(tree), "generated", ".workspace", ROOT, ".git", "config"), encoding="utf-8") as fh:
        assert "s3cr3t" not in fh.read()


def test_a_token_in_an_http_url_never_reaches_a_command_line_nor_a_credential_store(env, monkeypatch):
    """Against a real smart-HTTP git server with basic authentication: the commit's fetch and
    push and the merge check's fetch authenticate with the URL's user and token (percent-encoded
    in the URL, as a token may need), while no process on the machine has the token on its
    command line (``ps``), and the user's own credential helper (``store``) is never handed it."""
    from git_http import GitHTTPServer, command_lines_holding  # tests/support

    e, token = env, "ghp_T0k@n:with/odd%chars"
    home = e["tmp"] / "home"
    write(str(home / ".gitconfig"), "[credential]\n\thelper = store\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")  # the operator's own: kept, ours come after it
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "http.lowSpeedTime")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "60")
    bare, extra = ws.split_credentials("https://bot:%s@git.example.org:8443/ws.git" % quote(token, safe=""))
    assert bare == "https://git.example.org:8443/ws.git" and extra["CSIS_GIT_PASSWORD"] == token
    assert extra["GIT_CONFIG_COUNT"] == "3" and extra["GIT_CONFIG_KEY_2"] == "credential.https://git.example.org:8443.helper"
    assert token not in " ".join(v for k, v in extra.items() if k != "CSIS_GIT_PASSWORD")
    for plain in ("../ws.git", "git@github.com:org/ws.git", "ssh://tok@h/x", "https://h/ws.git"):
        assert ws.split_credentials(plain) == (plain, {})
    # a user name alone (a token given as the user name): given as the user name, with an empty password
    bare, extra = ws.split_credentials("https://tok%2Den@h/ws.git")
    assert bare == "https://h/ws.git" and (extra["CSIS_GIT_USERNAME"], extra["CSIS_GIT_PASSWORD"]) == ("tok-en", "")
    with GitHTTPServer(str(e["tmp"]), "bot", token) as srv:
        url = srv.url("ws.git", "bot:" + quote(token, safe=""))
        res = ws.commit_root(e["tree"], url, project_path=e["proj"], summary=ADD, **WHERE)
        assert res["pushed"] and bare_ref(e, "update_storage-aws-ebs") == res["commit"]
        assert res["repo"] == srv.url("ws.git", "***") and token not in json.dumps(res)
        merge_in_clone(e, "update_storage-aws-ebs")
        assert ws.check_merged(e["tree"], url, project_path=e["proj"], **WHERE)["digest"]
        with pytest.raises(ws.WorkspaceError) as err:  # a wrong token: refused by the server, and not shown
            ws.commit_root(e["tree"], srv.url("ws.git", "bot:wrong-" + token[:3]), project_path=e["proj"],
                           summary="other", **WHERE)
        assert "wrong" not in str(err.value) and "Authentication failed" in str(err.value), str(err.value)
    methods = [r[0] for r in srv.requests if r[2]]
    assert "POST" in methods and any("git-receive-pack" in r[1] for r in srv.requests if r[2]), srv.requests
    assert srv.exposed == [] and command_lines_holding(token) == []
    assert not (home / ".git-credentials").exists()
    with open(os.path.join(e["tree"], "generated", ".workspace", ROOT, ".git", "config"), encoding="utf-8") as fh:
        assert token not in fh.read()


def test_a_token_given_as_the_user_name_never_reaches_a_command_line(env, monkeypatch):
    """``https://<token>@host/ws.git`` (the token as the user name, no password): git authenticates
    as it would with that URL on its command line (the name with an empty password), while no
    process shows the token (git's ``remote-http`` helper gets the URL as an argument), and the
    user's credential helper stores nothing."""
    from git_http import GitHTTPServer, command_lines_holding  # tests/support

    e, token = env, "ghp_UserN4meTok3n%d" % os.getpid()
    home = e["tmp"] / "home"
    write(str(home / ".gitconfig"), "[credential]\n\thelper = store\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_CONFIG_COUNT", raising=False)
    with GitHTTPServer(str(e["tmp"]), token, "") as srv:
        srv.password = token  # what must appear on no command line
        url = srv.url("ws.git", token)
        res = ws.commit_root(e["tree"], url, project_path=e["proj"], summary=ADD, **WHERE)
        assert res["pushed"] and bare_ref(e, "update_storage-aws-ebs") == res["commit"]
        assert token not in json.dumps(res)
        merge_in_clone(e, "update_storage-aws-ebs")
        assert ws.check_merged(e["tree"], url, project_path=e["proj"], **WHERE)["digest"]
    assert any(r[2] and "git-receive-pack" in r[1] for r in srv.requests), srv.requests
    assert srv.exposed == [] and command_lines_holding(token) == []
    assert not (home / ".git-credentials").exists()
    with open(os.path.join(e["tree"], "generated", ".workspace", ROOT, ".git", "config"), encoding="utf-8") as fh:
        assert token not in fh.read()


def test_the_setting_is_strict():
    assert m.ConfigFile.model_validate({"workspace": {"repo": "x.git"}}).workspace.require_merge is False
    for bad in ({"repo": ""}, {"repo": "--upload-pack=touch /tmp/p"}, {"repo": "ext::sh -c x"},
                {"repo": "x", "require_merg": True}, {"repo": "x", "main_branch": "a..b"}, {}):
        with pytest.raises(ValueError):
            m.ConfigFile.model_validate({"workspace": bad})


def test_a_refused_repository_url_never_shows_its_credentials(tmp_path):
    """The validator's message and the setting's (read at commit time) mask the URL's userinfo, as
    every other workspace message does; pydantic's own message would echo the token."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError

    bad = "https://bot:ghp_SECRETTOKEN123@git.example.org/ws.git\n"
    with pytest.raises(ValueError) as err:
        m.ConfigFile.model_validate({"workspace": {"repo": bad}})
    (error,) = err.value.errors(include_url=False)
    assert "ghp_SECRETTOKEN123" not in error["msg"] and "https://***@git.example.org" in error["msg"], error["msg"]
    tree = tmp_path / "tree"
    write(str(tree / "cfg" / "_config.yml"), "config:\n  id: t\nworkspace:\n  repo: %s\n" % json.dumps(bad))
    with pytest.raises(ConfigError) as cerr:
        ws.setting(str(tree))
    text = str(cerr.value)
    assert "ghp_SECRETTOKEN123" not in text and "bot" not in text, text
    assert text.startswith("cfg/_config.yml: workspace.repo: repo 'https://***@git.example.org/ws.git\\n'"), text


# ------------------------------------------------------------------ commit
def test_the_root_is_committed_on_its_branch_with_the_summary_and_pushed(env, monkeypatch):
    e = env
    monkeypatch.setenv("CSIS_AWX_USER_NAME", "alice")  # as the lifecycle playbook passes AWX's user and job
    monkeypatch.setenv("CSIS_AWX_JOB_ID", "41")
    assert ws.setting(e["tree"]).require_merge is True
    res = commit(e)
    assert res["committed"] and res["pushed"] and res["branch"] == "update_storage-aws-ebs"
    assert res["repo"] == e["bare"] and res["path"] == "storage/aws-ebs/"
    head = bare_ref(e, "update_storage-aws-ebs")
    assert head == res["commit"]
    assert git("log", "-1", "--format=%s", head, cwd=e["bare"]) == ADD
    body = git("log", "-1", "--format=%b", head, cwd=e["bare"])
    assert "Plan digest: " + "d" * 64 in body and "Run: run-1" in body and "Root: " + ROOT in body
    assert "Requested by: alice (AWX job 41)" in body  # the author is the machine's git identity: the body names who
    forged = ws.commit_message(ADD, ROOT, requested_by=ws.requester({"CSIS_AWX_USER_NAME": "eve\nPlan digest: x"}))
    assert "Requested by: eve\\nPlan digest: x" in forged.split("\n")  # one line: no forged 'Plan digest:' line
    # the files: the rendered ones and the lock file, no run output; main's README kept (the branch starts at main)
    files = git("ls-tree", "-r", "--name-only", head, cwd=e["bare"]).splitlines()
    assert files == ["README.md", "storage/aws-ebs/.terraform.lock.hcl", "storage/aws-ebs/backend.tfbackend.hcl",
                     "storage/aws-ebs/main.tf"]
    assert git("rev-parse", head + "^", cwd=e["bare"]) == bare_ref(e, "main")
    assert git("show", head + ":storage/aws-ebs/main.tf", cwd=e["bare"]) == \
        'resource "aws_ebs_volume" "this" {\n  size = 100\n}'
    assert res["digest"] == binding.rendered_digest(e["proj"])
    # the local clone is run output under generated/.workspace/
    assert os.path.isdir(os.path.join(e["tree"], "generated", ".workspace", ROOT, ".git"))


def test_the_same_files_and_summary_make_no_new_commit(env):
    e = env
    first = commit(e, run_id="run-1")
    again = commit(e, run_id="run-2", plan_digest="e" * 64)
    assert not again["committed"] and not again["pushed"] and again["commit"] == first["commit"]
    assert bare_ref(e, "update_storage-aws-ebs") == first["commit"]
    assert "no new commit" in again["message"]
    # another summary: a new commit on top
    other = commit(e, summary="Plan: 1 to add, 1 to change, 0 to destroy")
    assert other["committed"] and git("rev-parse", other["commit"] + "^", cwd=e["bare"]) == first["commit"]
    # another file content: a new commit on top
    write(os.path.join(e["proj"], "main.tf"), 'resource "aws_ebs_volume" "this" {\n  size = 200\n}\n')
    changed = commit(e, summary="Plan: 1 to add, 1 to change, 0 to destroy")
    assert changed["committed"] and bare_ref(e, "update_storage-aws-ebs") == changed["commit"]
    diff = git("diff", "--name-only", other["commit"], changed["commit"], cwd=e["bare"]).splitlines()
    assert diff == ["storage/aws-ebs/main.tf"]


def test_a_plan_that_destroys_goes_to_the_delete_branch(env):
    res = commit(env, summary="Plan: 0 to add, 0 to change, 1 to destroy", destroys=1)
    assert res["branch"] == "delete_storage-aws-ebs" and bare_ref(env, "delete_storage-aws-ebs") == res["commit"]
    assert bare_ref(env, "update_storage-aws-ebs") is None


def test_check_mode_reports_and_pushes_nothing(env):
    res = commit(env, check_mode=True)
    assert res["committed"] and not res["pushed"] and res["commit"] is None
    assert res["message"].startswith("storage-aws-ebs: would commit storage/aws-ebs/ to branch update_storage-aws-ebs")
    assert bare_ref(env, "update_storage-aws-ebs") is None


# ------------------------------------------------------------------ merge = approval
def test_only_what_is_merged_on_main_is_approved(env):
    e = env
    commit(e)
    with pytest.raises(ws.WorkspaceRefused) as err:
        merged(e)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("storage-aws-ebs: not approved in the git workspace")
    assert "main holds no storage/aws-ebs/" in text
    assert "merge branch update_storage-aws-ebs into main of %s" % e["bare"] in text

    merge_in_clone(e, "update_storage-aws-ebs")
    ok = merged(e)
    assert ok["digest"] == binding.rendered_digest(e["proj"]) and ok["main_commit"] == bare_ref(e, "main")
    assert "approved by merge" in ok["message"]
    assert ok["merged_by"] == "t <t@example.org>" and ok["merge_commit"] == bare_ref(e, "main")

    # run output beside the root changes nothing; a changed rendered file is no longer approved
    write(os.path.join(e["proj"], "tfplan"), "another plan")
    assert merged(e)["digest"] == ok["digest"]
    write(os.path.join(e["proj"], "main.tf"), 'resource "aws_ebs_volume" "this" {\n  size = 300\n}\n')
    with pytest.raises(ws.WorkspaceRefused, match=r"main holds storage/aws-ebs/ with digest %s\)" % ok["digest"][:12]):
        merged(e)
    # the destroy case names the delete branch
    with pytest.raises(ws.WorkspaceRefused, match="merge branch delete_storage-aws-ebs into main"):
        merged(e, destroys=1)


def test_who_merged_is_the_merge_commits_author_and_nobody_after_a_fast_forward(env):
    """A later commit on main that does not touch the root does not change who merged it; a
    fast-forward leaves no merge commit, and git records nobody who merged (not the render's author)."""
    e = env
    commit(e)
    merge_in_clone(e, "update_storage-aws-ebs")
    merge = bare_ref(e, "main")
    clone = str(e["tmp"] / "later")
    git("clone", "-q", "-b", "main", e["bare"], clone, cwd=str(e["tmp"]))
    write(os.path.join(clone, "README"), "unrelated\n")
    git("add", "README", cwd=clone)
    git("-c", "user.name=other", "-c", "user.email=o@example.org", "commit", "-q", "-m", "unrelated", cwd=clone)
    git("push", "-q", "origin", "main", cwd=clone)
    ok = merged(e)
    assert ok["main_commit"] == bare_ref(e, "main") != merge
    assert ok["merge_commit"] == merge and ok["merged_by"] == "t <t@example.org>"


def test_a_fast_forward_records_nobody_as_having_merged(env):
    e = env
    res = commit(e)
    clone = str(e["tmp"] / "ff")
    git("clone", "-q", "-b", "main", e["bare"], clone, cwd=str(e["tmp"]))
    git("merge", "-q", "--ff-only", "origin/update_storage-aws-ebs", cwd=clone)
    git("push", "-q", "origin", "main", cwd=clone)
    ok = merged(e)
    assert ok["merge_commit"] == res["commit"] == bare_ref(e, "main") and ok["merged_by"] is None


def test_a_workspace_without_a_main_branch_approves_nothing(tmp_path):
    bare = tmp_path / "empty.git"
    git("init", "-q", "--bare", str(bare), cwd=str(tmp_path))
    proj = tmp_path / "root"
    write(str(proj / "main.tf"), "# x\n")
    res = ws.commit_root(str(tmp_path / "tree"), str(bare), project_path=str(proj), summary=ADD, **WHERE)
    assert res["pushed"] and git("ls-tree", "-r", "--name-only", res["commit"], cwd=str(bare)) == "storage/aws-ebs/main.tf"
    with pytest.raises(ws.WorkspaceRefused, match=r"\(there is no branch main\)"):
        ws.check_merged(str(tmp_path / "tree"), str(bare), project_path=str(proj), **WHERE)


# ------------------------------------------------------------------ the render result
def test_render_hands_the_roots_the_workspace_settings_with_the_repository_masked(tmp_path):
    import render_trees as rt  # tests/support (on sys.path: tests/conftest.py)
    from ansible_collections.csis.infra.plugins.module_utils.csis.render import pipeline

    root = rt.copy_tree("examples", str(tmp_path))
    assert pipeline.render(root, ["storage"], dry_run=True, prepare=False)["workspace"] is None
    with open(os.path.join(root, "cfg", "_config.yml"), "a", encoding="utf-8") as fh:
        fh.write("workspace:\n  repo: https://bot:s3cr3t@git.example.org/ws.git\n  require_merge: true\n")
    res = pipeline.render(root, ["storage"], dry_run=True, prepare=False)
    assert res["workspace"] == {"repo": "https://***@git.example.org/ws.git", "require_merge": True, "main_branch": "main"}
    assert ws.setting(root).repo == "https://bot:s3cr3t@git.example.org/ws.git"
