# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The git workspace (``workspace:`` of cfg/_config.yml): merge is approval.

* :func:`commit_root` (``csis_workspace state=committed``, after the gate) commits a root's
  own files (:func:`.binding.own_files`: the rendered files, no run output) under
  ``<lifecycle>/<builder>/`` on branch ``update_<root>`` (``delete_<root>`` when the plan
  destroys anything), the gate's summary as the subject, the plan digest and the run id in
  the body, and pushes the branch. The same files and summary make no new commit.
* :func:`check_merged` (``state=merged``, before the approval) refuses a root whose rendered
  digest (:func:`.binding.rendered_digest`) differs from what the main branch holds there.

The git CLI, through :func:`_git` only: a timeout on every call, no prompt
(``GIT_TERMINAL_PROMPT=0``), no ``ext::`` transport (a command line in disguise), no hooks.
The repository URL is never stored in the clone's configuration (every fetch and push
names it) and every message masks the userinfo of a URL (:func:`mask_url`). Credentials in an
``http(s)://user:token@host/...`` URL never reach git's command line (where ``ps`` shows them to
every user of the machine): git is given the URL without them, and a credential helper scoped to
that host answers from its environment (:func:`split_credentials`); no other helper (a
``credential.helper=store`` of the user's) sees or stores them.
The local clone of each root is ``generated/.workspace/<root>/`` (run output).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import unquote

from ..config import models as m
from ..config.loader import CONFIG_REL, parse_model, read_yaml
from ..config.models import mask_url
from ..errors import ConfigError, CsisError, Problem, printable
from . import binding

WORKSPACE_DIR = os.path.join("generated", ".workspace")
GIT_TIMEOUT = 300
COMMITTER = ("csis.infra", "csis.infra@localhost")
_REMOTE_REFS = "refs/remotes/origin/"
_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")


class WorkspaceError(CsisError):
    """The workspace could not be used (bad name, git failed or timed out)."""


class WorkspaceRefused(CsisError):
    """The root's rendered files are not what the workspace's main branch holds (not approved)."""


# ----------------------------------------------------------------------------- names
def _component(value: str, what: str) -> str:
    if not isinstance(value, str) or not _COMPONENT.match(value) or ".." in value or value.endswith((".lock", ".")):
        raise WorkspaceError("%s %r cannot name a git branch or workspace folder (letters, digits, '.', '_', '-'; "
                             "starting with a letter or digit)" % (what, value))
    return value


def branch_name(root: str, destroys: int = 0) -> str:
    """``delete_<root>`` for a plan that destroys anything, else ``update_<root>``."""
    return ("delete_" if destroys > 0 else "update_") + _component(root, "root")


def workspace_path(lifecycle: str, builder: str) -> str:
    """Where a root's files go in the workspace: ``<lifecycle>/<builder>``."""
    return "%s/%s" % (_component(lifecycle, "lifecycle"), _component(builder, "builder"))


def is_url(repo: str) -> bool:
    """A URL (``scheme://...``) or scp-like address (``user@host:path``) rather than a local path."""
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*://", repo) or re.match(r"^[^/:]+@[^/:]+:", repo))


def resolve_repo(repo: str, config_root: str) -> str:
    """The repository git is given: a URL as is, a path relative to the configuration root made absolute."""
    if is_url(repo):
        return repo
    return os.path.normpath(os.path.join(os.path.abspath(config_root), os.path.expanduser(repo)))


def setting(config_root: str) -> Optional[m.WorkspaceSetting]:
    """The tree's ``workspace:`` (cfg/_config.yml only: an overlay cannot set it), or None."""
    problems: List[Any] = []
    raw = read_yaml(os.path.join(os.path.abspath(config_root), CONFIG_REL), CONFIG_REL, problems, None)
    if problems:
        raise ConfigError(problems)
    ws = (raw or {}).get("workspace")
    if ws is None:
        return None
    # through the loader's messages (file and key, the URL's userinfo masked), never pydantic's own,
    # which would echo the repository URL with its token
    parsed = parse_model(m.ConfigFile, {"workspace": ws}, CONFIG_REL, problems)
    if problems or parsed is None or parsed.workspace is None:
        raise ConfigError(problems or [Problem(CONFIG_REL, "workspace", "does not validate")])
    return parsed.workspace


# ----------------------------------------------------------------------------- git
#: ``http(s)://[user[:password]@]host[:port]`` and the rest of the URL
_HTTP_USERINFO = re.compile(r"^(?P<scheme>https?)://(?:(?P<userinfo>[^/@?#]*)@)?(?P<host>[^/?#]*)(?P<rest>.*)\Z",
                            re.S | re.I)
#: the helper git runs (``sh -c``) for ``credential fill``: answers ``get`` from the environment,
#: so the secret is never an argument of any process (printf is the shell's own)
_HELPER = ('!f() { test "$1" = get || exit 0; printf \'username=%s\\npassword=%s\\n\' '
           '"$CSIS_GIT_USERNAME" "$CSIS_GIT_PASSWORD"; }; f')


def split_credentials(url: str, environ: Optional[Mapping[str, str]] = None) -> Tuple[str, Dict[str, str]]:
    """``url`` for git's command line (never a secret), and the environment that gives git its
    credentials.

    An ``http(s)`` URL with userinfo (``https://bot:token@host/ws.git``, or a user name alone,
    ``https://<token>@host/ws.git``, a common way to give a token) becomes the URL without it, plus
    ``GIT_CONFIG_*`` variables that (1) empty the list of credential helpers and (2) set, for that
    scheme and host only, a helper answering with the user name and password (percent-decoded, as
    git would; an empty password for a user name alone, which is what git sends for such a URL)
    from ``CSIS_GIT_USERNAME``/``CSIS_GIT_PASSWORD``. git runs its ``remote-http`` helper with the
    URL as an argument, so anything left in the URL would be on a command line. Variables the
    operator set (``GIT_CONFIG_COUNT`` and its keys, from ``environ``) stay, before these. Any other
    URL (a path, ``ssh://``, ``user@host:path``, an http(s) URL without userinfo, whose credentials
    the operator's own helpers give) is returned as it is."""
    found = _HTTP_USERINFO.match(url)
    if not found or not found.group("userinfo"):
        return url, {}
    user, _sep, password = found.group("userinfo").partition(":")
    base = "%s://%s" % (found.group("scheme"), found.group("host"))
    environ = os.environ if environ is None else environ
    try:
        n = max(0, int(environ.get("GIT_CONFIG_COUNT") or 0))
    except ValueError:
        n = 0
    return base + found.group("rest"), {
        "GIT_CONFIG_COUNT": str(n + 2),
        "GIT_CONFIG_KEY_%d" % n: "credential.helper", "GIT_CONFIG_VALUE_%d" % n: "",
        "GIT_CONFIG_KEY_%d" % (n + 1): "credential.%s.helper" % base, "GIT_CONFIG_VALUE_%d" % (n + 1): _HELPER,
        "CSIS_GIT_USERNAME": unquote(user), "CSIS_GIT_PASSWORD": unquote(password),
    }


def _remote(args: Sequence[str], refspec: str, cwd: str, url: str) -> subprocess.CompletedProcess:
    """``git <args> -- <url> <refspec>``, the URL's credentials given through the environment
    (:func:`split_credentials`), never on the command line."""
    bare, env = split_credentials(url)
    return _git(list(args) + ["--", bare, refspec], cwd, env=env)


def _git(args: Sequence[str], cwd: str, *, env: Optional[Mapping[str, str]] = None, data: Optional[bytes] = None,
         check: bool = True, timeout: int = GIT_TIMEOUT) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_NAMESPACE"):
        full.pop(k, None)
    for k in ("CSIS_GIT_USERNAME", "CSIS_GIT_PASSWORD"):
        full.pop(k, None)  # only the credentials this call is given (split_credentials)
    full.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "GIT_ASKPASS": "",
                 "SSH_ASKPASS": "", "GCM_INTERACTIVE": "never"})
    full.update(env or {})
    argv = ["git", "-c", "core.hooksPath=/dev/null", "-c", "protocol.ext.allow=never"] + list(args)
    try:
        res = subprocess.run(argv, cwd=cwd, env=full, input=data, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise WorkspaceError("git %s timed out after %ds" % (mask_url(" ".join(args[:2])), timeout))
    except OSError as exc:
        raise WorkspaceError("cannot run git: %s" % exc)
    if check and res.returncode != 0:
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()
        shown = mask_url(" ".join(a for a in args if not a.startswith("+")))
        raise WorkspaceError("git %s failed (exit %d): %s" % (shown, res.returncode, mask_url(" / ".join(err[-3:]))))
    return res


def _out(args: Sequence[str], cwd: str, **kw: Any) -> str:
    return _git(args, cwd, **kw).stdout.decode("utf-8", "surrogateescape").strip()


def _rev(clone: str, ref: str) -> Optional[str]:
    res = _git(["rev-parse", "-q", "--verify", ref + "^{commit}"], clone, check=False)
    return res.stdout.decode().strip() if res.returncode == 0 else None


def _clone(config_root: str, root: str, url: str) -> str:
    """``generated/.workspace/<root>/``: a repository holding the remote's branches as
    ``origin/*`` (fetched now; the URL is not stored)."""
    clone = os.path.join(os.path.abspath(config_root), WORKSPACE_DIR, _component(root, "root"))
    if not os.path.isdir(os.path.join(clone, ".git")):
        os.makedirs(clone, exist_ok=True)
        _git(["init", "-q", clone], os.path.dirname(clone))
    _remote(["fetch", "-q", "--prune", "--no-tags"], "+refs/heads/*:" + _REMOTE_REFS + "*", clone, url)
    return clone


def _subject(clone: str, commit: str) -> str:
    return _out(["log", "-1", "--format=%s", commit], clone)


def _tree_of(clone: str, commit: Optional[str]) -> Optional[str]:
    return _out(["rev-parse", commit + "^{tree}"], clone) if commit else None


def _build_tree(clone: str, base: Optional[str], prefix: str, files: Mapping[str, str]) -> str:
    """The tree of ``base`` with ``prefix/`` replaced by ``files`` ({rel: absolute path})."""
    index = os.path.join(clone, ".git", "csis-index")
    if os.path.exists(index):
        os.unlink(index)
    env = {"GIT_INDEX_FILE": index}
    try:
        _git(["read-tree", base] if base else ["read-tree", "--empty"], clone, env=env)
        _git(["rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", prefix], clone, env=env)
        names = sorted(files)
        for rel in names:
            if any(c in rel for c in "\n\r\0\\"):
                raise WorkspaceError("file name %r cannot go into the workspace" % rel)
        if names:
            blobs = _out(["hash-object", "-w", "--no-filters", "--stdin-paths"], clone,
                         data="".join(files[r] + "\n" for r in names).encode("utf-8", "surrogateescape")).split()
            info = "".join("%s %s\t%s/%s\n" % ("100755" if os.access(files[r], os.X_OK) else "100644", blob, prefix, r)
                           for r, blob in zip(names, blobs))
            _git(["update-index", "--add", "--index-info"], clone, env=env, data=info.encode("utf-8", "surrogateescape"))
        return _out(["write-tree"], clone, env=env)
    finally:
        if os.path.exists(index):
            os.unlink(index)


def _author_config(clone: str) -> List[str]:
    """``-c user.name/-c user.email`` when git has no identity configured."""
    out: List[str] = []
    for key, value in zip(("user.name", "user.email"), COMMITTER):
        if _git(["config", "--get", key], clone, check=False).returncode != 0:
            out += ["-c", "%s=%s" % (key, value)]
    return out


def requester(environ: Optional[Mapping[str, str]] = None) -> str:
    """Who asked for the plan, as the commit names it: the AWX user the run passed (and its job),
    else the OS user (the meta-state audit trail's ``who``)."""
    from ..state.backends import requester as name, who
    job = who(environ).get("awx_job_id")
    return name(environ) + (" (AWX job %s)" % job if job else "")  # commit_message keeps it on one line


def commit_message(summary: str, root: str, plan_digest: str = "", run_id: str = "", digest: str = "",
                   requested_by: str = "") -> str:
    """The gate's summary as the subject; the root, the rendered digest, the plan digest, the run id
    and who requested the plan in the body (the reviewer sees whose change it is; the author is
    the machine's git identity)."""
    subject = " ".join((summary or "").split()) or "%s: rendered root" % root
    body = ["Root: %s" % root]
    if digest:
        body.append("Rendered digest: %s" % digest)
    if plan_digest:
        body.append("Plan digest: %s" % plan_digest)
    if run_id:
        body.append("Run: %s" % run_id)
    if requested_by:
        body.append("Requested by: %s" % requested_by)
    # each value on its own line: a run id (csis_run_id) holding a newline cannot forge another line
    return "%s\n\n%s\n" % (printable(subject), "\n".join(printable(line) for line in body))


# ----------------------------------------------------------------------------- the two states
def commit_root(config_root: str, repo: str, *, root: str, lifecycle: str, builder: str, project_path: str,
                destroys: int = 0, summary: str = "", plan_digest: str = "", run_id: str = "",
                main_branch: str = "main", check_mode: bool = False) -> Dict[str, Any]:
    """Commit the root's own files to its branch and push it (see the module docstring).

    Returns ``branch``, ``path``, ``digest`` (rendered), ``committed`` (a new commit was made,
    or would be in check mode), ``pushed``, ``commit`` (the branch's head afterwards; None in
    check mode when a commit would be made) and ``message`` (one line)."""
    branch = branch_name(root, destroys)
    prefix = workspace_path(lifecycle, builder)
    url = resolve_repo(repo, config_root)
    files = binding.own_files(project_path)
    digest = binding.rendered_digest(project_path)
    clone = _clone(config_root, root, url)
    head = _rev(clone, _REMOTE_REFS + branch)
    main = _rev(clone, _REMOTE_REFS + main_branch)
    base = head or main
    tree = _build_tree(clone, base, prefix, files)
    subject = commit_message(summary, root).split("\n", 1)[0]
    out = dict(branch=branch, path=prefix + "/", digest=digest, repo=mask_url(url), committed=False, pushed=False,
               commit=head)
    if head and tree == _tree_of(clone, head) and _subject(clone, head) == subject:
        out["message"] = "%s: branch %s already holds these files with this summary (no new commit)" % (root, branch)
        return out
    if not head and main and tree == _tree_of(clone, main):
        out.update(commit=main, message="%s: %s of %s already holds these files (nothing to commit)"
                   % (root, main_branch, mask_url(url)))
        return out
    out["committed"] = True
    if check_mode:
        out.update(commit=None, message="%s: would commit %s to branch %s of %s (%s) and push it"
                   % (root, prefix + "/", branch, mask_url(url), subject))
        return out
    parents = ["-p", base] if base else []
    commit = _out(_author_config(clone) + ["commit-tree", tree] + parents + ["-F", "-"], clone,
                  data=commit_message(summary, root, plan_digest, run_id, digest, requester()).encode("utf-8"))
    _remote(["push", "-q"], "%s:refs/heads/%s" % (commit, branch), clone, url)
    _git(["update-ref", _REMOTE_REFS + branch, commit], clone)
    out.update(commit=commit, pushed=True, message="%s: committed %s to branch %s of %s (%s) and pushed it"
               % (root, prefix + "/", branch, mask_url(url), subject))
    return out


def _digest_at(clone: str, commit: str, prefix: str) -> Optional[str]:
    """The rendered digest of ``prefix/`` in ``commit`` (None when it holds no such folder): its
    files are written to a scratch folder and hashed by :func:`.binding.rendered_digest`."""
    raw = _git(["ls-tree", "-r", "-z", "--full-tree", commit, "--", prefix + "/"], clone).stdout
    entries = [e for e in raw.decode("utf-8", "surrogateescape").split("\0") if e]
    if not entries:
        return None
    scratch = tempfile.mkdtemp(prefix="csis-merged-", dir=os.path.join(clone, ".git"))
    try:
        for e in entries:
            meta, path = e.split("\t", 1)
            mode, kind, sha = meta.split()
            if kind != "blob" or not path.startswith(prefix + "/"):
                continue
            rel = path[len(prefix) + 1:]
            if ".." in rel.split("/"):
                continue
            dst = os.path.join(scratch, *rel.split("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "wb") as fh:
                fh.write(_git(["cat-file", "blob", sha], clone).stdout)
        return binding.rendered_digest(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check_merged(config_root: str, repo: str, *, root: str, lifecycle: str, builder: str, project_path: str,
                 destroys: int = 0, main_branch: str = "main") -> Dict[str, Any]:
    """Refuse (:class:`WorkspaceRefused`, one line naming the root, the branch to merge and the
    repository) unless ``main_branch`` holds exactly the root's rendered files under
    ``<lifecycle>/<builder>/``. Returns ``digest``, ``main_commit``, ``merge_commit`` (the commit
    on main's first-parent line that brought the root's files), ``merged_by`` (that commit's author
    when it is a merge; None after a fast-forward, which records no merger), ``path``, ``branch``."""
    branch = branch_name(root, destroys)
    prefix = workspace_path(lifecycle, builder)
    url = resolve_repo(repo, config_root)
    want = binding.rendered_digest(project_path)
    clone = _clone(config_root, root, url)
    main = _rev(clone, _REMOTE_REFS + main_branch)
    have = _digest_at(clone, main, prefix) if main else None
    if have != want:
        found = ("there is no branch %s" % main_branch if not main else
                 "%s holds no %s/" % (main_branch, prefix) if have is None else
                 "%s holds %s/ with digest %s" % (main_branch, prefix, have[:12]))
        raise WorkspaceRefused("%s: not approved in the git workspace: the rendered root (digest %s) is not merged "
                               "(%s); merge branch %s into %s of %s, then run again"
                               % (root, want[:12], found, branch, main_branch, mask_url(url)))
    # who merged: the commit on main's first-parent line that last changed the root's files is the
    # merge that brought them; a merge commit's author is who merged (a forge's web page authors it
    # as the person who pressed merge). A fast-forward (or a rebase) leaves no merge commit: the
    # commit is the render's own, and git records nobody who merged
    landed = _git(["log", "-1", "--first-parent", "--format=%H%x00%P%x00%an <%ae>", main, "--", prefix], clone,
                  check=False).stdout.decode("utf-8", "replace").strip().split("\x00")
    merge_commit = landed[0] if len(landed) == 3 and landed[0] else main
    merged_by = printable(landed[2])[:200] if len(landed) == 3 and len(landed[1].split()) > 1 else None
    return dict(branch=branch, path=prefix + "/", digest=want, main_commit=main, repo=mask_url(url),
                merge_commit=merge_commit, merged_by=merged_by or None,
                message="%s: %s of %s holds the rendered root (digest %s): approved by merge"
                % (root, main_branch, mask_url(url), want[:12]))
