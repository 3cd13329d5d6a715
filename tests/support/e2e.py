# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Helpers for the end-to-end lifecycle tests, the AWX (ansible-runner) tests and the
lifecycle-overhead benchmark.

* :func:`copy_example_tree` copies ``examples/`` without what a run produces
  (``generated/``, ``meta-state/``, ``state/``).
* :func:`make_ebs_tree` is the same tree cut down to ONE EBS volume and no instance,
  with its own state key (so several trees share one moto server and state bucket).
* :func:`run_playbook` / :func:`start_playbook` run ``ansible-playbook`` from the
  repository root (so ``ansible.cfg`` applies) against a local endpoint.
* :func:`meta_state_digest` hashes every meta-state file (byte-identity checks).
* :func:`recap` parses the PLAY RECAP.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")
VENV_BIN = os.path.join(REPO, ".venv", "bin")
PLAYBOOK_BIN = os.path.join(VENV_BIN, "ansible-playbook")
APPLY_ALL = "overlays/apply-all.yml"
RUN_OUTPUTS = ("generated", "meta-state", "state")
#: the storage root of the one-EBS tree (:func:`make_ebs_tree`), relative to its config root
EBS_ROOT = os.path.join("generated", "storage", "aws-ebs", "storage-generation")
# environment a run must not inherit from the machine (or from a test that set it)
_SCRUB = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
          "TF_CLI_ARGS", "TF_CLI_ARGS_plan", "TF_CLI_ARGS_apply", "TF_CLI_ARGS_init", "TF_LOG")


def needs_terraform() -> List[Any]:
    """The ``pytestmark`` of an end-to-end file: ``integration``, and skipped (saying why) without
    terraform on PATH or the project venv's ansible-playbook."""
    import shutil

    import pytest

    return [pytest.mark.integration,
            pytest.mark.skipif(shutil.which("terraform") is None or not os.path.exists(PLAYBOOK_BIN),
                               reason="needs terraform on PATH and the project venv")]


def copy_example_tree(parent: str, name: str = "examples") -> str:
    """``<parent>/<name>``: a copy of ``examples/`` as a user would start from it; returns the config root.
    (The example sets no ``module_source_base``: its roots call the collection's own modules,
    copied into ``generated/.modules/`` by csis_render.)
    """
    from trees import copy_as_shipped

    dst = os.path.join(parent, name)
    copy_as_shipped(EXAMPLES, dst)
    return dst


def make_ebs_tree(parent: str, state_key: str, name: str = "examples", size: int = 100,
                  tree_id: Optional[str] = None) -> str:
    """The example tree with only the EBS storage ``mnt_data`` (no instance, no EFS, no S3).

    ``state_key`` replaces the S3 backend's key prefix (``statefiles/<state_key>``) so the
    tree's roots never share state with another tree on the same endpoint. ``tree_id`` (default:
    ``state_key``) replaces the tree's ``id`` (``csis-example``), so its resources carry a
    ``csis_config`` tag of their own: a test that counts volumes by name or scans for foreign
    resources sees only its tree's. ``csis-example`` is the README's demo tree's alone
    (``test_lifecycle_e2e.py`` runs the drift report on it: any other resource with that tag would
    be reported foreign there).
    """
    root = copy_example_tree(parent, name)
    from trees import replace_text

    replace_text(os.path.join(root, "cfg", "_config.yml"), "\nid: csis-example\n", "\nid: %s\n" % (tree_id or state_key))
    write_yaml(os.path.join(root, "storages", "storage0.yaml"), {"storages": [
        {"name": "mnt_data", "mount_point": "/mnt/data", "is_default": True, "groups": ["coops"],
         "state": "active"},
    ]})
    write_yaml(os.path.join(root, "instances", "instances.yaml"), {"instances": []})
    replace_text(os.path.join(root, "cfg", "state-backends.yml"), "key: statefiles/csis-example",
                 "key: statefiles/%s" % state_key)
    builders = os.path.join(root, "cfg", "storage-builders.yml")
    text = open(builders, encoding="utf-8").read()
    text = re.sub(r"(\n    size: )100\n", r"\g<1>%d\n" % size, text)
    open(builders, "w", encoding="utf-8").write(text)
    return root


def vault_runtime_keys(root: str, password_file: str, key_id: str, secret_key: str) -> None:
    """Give the tree's runtime static credentials as ``!vault`` values of cfg/runtime-builders.yml
    (``ansible-vault encrypt_string`` with ``password_file``), in place of its ``profile_name: null``."""
    lines: List[str] = []
    for name, value in (("access_key_id", key_id), ("secret_access_key", secret_key)):
        out = subprocess.run([os.path.join(VENV_BIN, "ansible-vault"), "encrypt_string", "--vault-password-file",
                              password_file, "--name", name, value], capture_output=True, text=True, check=True).stdout
        lines += ["      " + line for line in out.strip().splitlines()]
    path = os.path.join(root, "cfg", "runtime-builders.yml")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    assert text.count("      profile_name: null\n") == 1
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text.replace("      profile_name: null\n", "\n".join(lines) + "\n"))


def s3_backend_block(url: str, bucket: str, key: str, region: str = "us-east-2", extra: str = "") -> str:
    """A ``terraform`` block with an S3 backend (lock file) on the moto server at ``url``;
    ``extra``: more backend settings, one per line."""
    return """terraform {
  backend "s3" {
    bucket                      = %s
    key                         = %s
    region                      = %s
    use_lockfile                = true
    use_path_style              = true
    skip_credentials_validation = true
    skip_requesting_account_id  = true
    skip_metadata_api_check     = true
    skip_region_validation      = true
    skip_s3_checksum            = true
    endpoints = {
      s3  = %s
      sts = %s
    }
%s  }
}
""" % (json.dumps(bucket), json.dumps(key), json.dumps(region), json.dumps(url), json.dumps(url),
       "".join("    %s\n" % line for line in extra.splitlines()))


def write_yaml(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)


def read_yaml(path: str) -> Any:
    with open(path, "r", encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def set_storage_builder_size(config_root: str, builder: str, size: int) -> None:
    path = os.path.join(config_root, "cfg", "storage-builders.yml")
    doc = read_yaml(path)
    for b in doc["storage_builders"]:
        if b["name"] == builder:
            b["size"] = size
    write_yaml(path, doc)


# ------------------------------------------------------------------ meta-state
def meta_state_digest(config_root: str, with_state_dir: bool = False) -> Dict[str, str]:
    """{relative path: sha256} of every meta-state record file, in every subdirectory (lock files
    excluded: they hold no record, only the last lock holder's description; the audit trail
    and the plan receipts excluded: they are history (who asked for and who approved which
    plan), which a refused or failed run extends, not records of what exists)."""
    out: Dict[str, str] = {}
    dirs = ["meta-state"] + (["state"] if with_state_dir else [])
    for d in dirs:
        base = os.path.join(config_root, d)
        if not os.path.isdir(base):
            continue
        for dirpath, dirs, files in os.walk(base):
            if dirpath == base and d == "meta-state":
                # the audit trail (audit/, revision.yaml) is append-only history, not records:
                # a refused or failed run adds its event there and changes no record
                dirs[:] = [x for x in dirs if x not in ("audit", "plan-receipts")]
                files = [f for f in files if f != "revision.yaml"]
            for f in files:
                if f.startswith(".") and f.endswith("lock"):
                    continue
                p = os.path.join(dirpath, f)
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, config_root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def meta(config_root: str, name: str) -> Dict[str, Any]:
    """The records of meta-state file ``name``, read through the store (any layout)."""
    from trees import read_meta

    return read_meta(config_root, name)


# ------------------------------------------------------------------ ansible-playbook
def run_env(endpoint_env: Mapping[str, str], extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update(endpoint_env)
    env.update({"ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "PYTHONUNBUFFERED": "1",
                "PATH": VENV_BIN + os.pathsep + env.get("PATH", "")})
    env.update(extra or {})
    return env


def playbook_argv(playbook: str, config_root: str, overlays: Sequence[str] = (), dry_run: Optional[bool] = False,
                  auto_approve: bool = True, extra_vars: Optional[Mapping[str, Any]] = None,
                  args: Sequence[str] = ()) -> List[str]:
    ev: Dict[str, Any] = {"csis_config_root": config_root, "csis_overlays": list(overlays)}
    if dry_run is not None:  # None: the playbooks' default (a dry run)
        ev["csis_dry_run"] = dry_run
    if auto_approve:
        ev["csis_auto_approve"] = True
    ev.update(extra_vars or {})
    path = playbook if os.path.isabs(playbook) else os.path.join(REPO, "playbooks", playbook)
    return [PLAYBOOK_BIN, path, "-e", json.dumps(ev)] + list(args)


class Run:
    def __init__(self, argv: List[str], rc: int, out: str, seconds: float):
        self.argv, self.rc, self.out, self.seconds = argv, rc, out, seconds

    def __repr__(self) -> str:
        return "<Run rc=%d %.0fs>" % (self.rc, self.seconds)

    def tail(self, n: int = 120) -> str:
        return "\n".join(self.out.splitlines()[-n:])


def run_playbook(playbook: str, config_root: str, endpoint_env: Mapping[str, str], *,
                 overlays: Sequence[str] = (), dry_run: Optional[bool] = False, auto_approve: bool = True,
                 extra_vars: Optional[Mapping[str, Any]] = None, env: Optional[Mapping[str, str]] = None,
                 args: Sequence[str] = (), timeout: float = 1800, log: Optional[str] = None) -> Run:
    """Run one playbook to the end (stdin is not a terminal); returns rc, output and duration."""
    argv = playbook_argv(playbook, config_root, overlays, dry_run, auto_approve, extra_vars, args)
    return run_to_end(argv, run_env(endpoint_env, env), timeout, log)


def run_to_end(argv: List[str], env: Mapping[str, str], timeout: float, log: Optional[str]) -> Run:
    """Run ``argv`` from the repository root with no standard input; keep its output (in ``log`` too).

    Past ``timeout`` the whole run is killed (:func:`kill_tree`: ansible-playbook and the workers
    it forked, which would otherwise live on, e.g. in a wait), its output so far is kept in ``log``,
    and ``subprocess.TimeoutExpired`` is raised."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=dict(env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    expired = False
    try:
        raw, _err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        expired = True
        kill_tree(proc.pid)
        try:  # a process outside the tree that still holds the pipe must not hang the test
            raw, _err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.wait()
            raw = b"(its output could not be read: a process outside the run holds its pipe)\n"
    out = raw.decode("utf-8", "replace")
    if log:
        with open(log, "w", encoding="utf-8") as fh:
            fh.write(out)
    if expired:
        raise subprocess.TimeoutExpired(argv, timeout, output=raw)
    return Run(argv, proc.returncode, out, time.monotonic() - t0)


def run_demo(demo_dir: str, endpoint_env: Mapping[str, str], aws_dir: str, timeout: float = 1800,
             log: Optional[str] = None) -> Run:
    """The README's ``scripts/demo``, as a user runs it, with its copy of the example tree in
    ``demo_dir`` and the local endpoint whose bookkeeping is ``aws_dir`` (the test session's
    server: ``local-aws up`` re-uses a running one)."""
    argv = [os.path.join(REPO, "scripts", "demo")]
    extra = {"CSIS_DEMO_DIR": demo_dir, "CSIS_LOCAL_AWS_DIR": aws_dir}
    return run_to_end(argv, run_env(endpoint_env, extra), timeout, log)


def checkout_fingerprint() -> Dict[str, Any]:
    """What a run must never change in the checkout: ``git status`` (tracked and untracked,
    not ignored) and every file under ``examples/``, ignored ones included."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                            capture_output=True, text=True, check=False).stdout
    files: Dict[str, str] = {}
    for dirpath, _dirs, names in os.walk(EXAMPLES):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as fh:
                files[os.path.relpath(p, REPO)] = hashlib.sha256(fh.read()).hexdigest()
    return {"git_status": sorted(status.splitlines()), "examples": files}


def ansible_dirs_in(tmp: str) -> Dict[str, str]:
    """Ansible's async, remote and local temporary directories under ``tmp`` (environment
    variables): what a killed run leaves there stays in the test's directory, not in ``~/.ansible``
    or ``~/.ansible_async``."""
    return {"ANSIBLE_ASYNC_DIR": os.path.join(tmp, "async"), "ANSIBLE_REMOTE_TMP": os.path.join(tmp, "remote"),
            "ANSIBLE_LOCAL_TEMP": os.path.join(tmp, "local")}


def start_playbook(playbook: str, config_root: str, endpoint_env: Mapping[str, str], log: str, *,
                   overlays: Sequence[str] = (), extra_vars: Optional[Mapping[str, Any]] = None,
                   env: Optional[Mapping[str, str]] = None) -> subprocess.Popen:
    """Start a run in its own process group (so the whole run can be killed at once).

    Its ``TMPDIR`` is a ``tmp`` directory beside ``log`` (unless ``env`` gives one): a run killed
    with SIGKILL leaves there, in the test's own directory, what its processes could not remove
    (the apply module's unpacked payload, the provider's plugin sockets). Ansible's own
    directories go there too, not into the user's home: ``ANSIBLE_ASYNC_DIR`` (``tmp/async``: the
    results file of an async apply killed with the run), ``ANSIBLE_REMOTE_TMP`` (``tmp/remote``:
    a killed async job's ``async_wrapper.py`` and module payload) and ``ANSIBLE_LOCAL_TEMP``
    (``tmp/local``: a killed controller's payload cache)."""
    argv = playbook_argv(playbook, config_root, overlays, False, True, extra_vars)
    tmp = os.path.join(os.path.dirname(os.path.abspath(log)), "tmp")
    os.makedirs(tmp, exist_ok=True)
    fh = open(log, "wb")
    own = dict(ansible_dirs_in(tmp), TMPDIR=tmp)
    return subprocess.Popen(argv, cwd=REPO, env=run_env(endpoint_env, dict(own, **(env or {}))),
                            stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _proc_table() -> Dict[int, Dict[str, Any]]:
    table: Dict[int, Dict[str, Any]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid, "r", encoding="utf-8", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
            cwd = os.readlink("/proc/%s/cwd" % pid)
        except (OSError, IndexError, ValueError):
            continue
        table[int(pid)] = {"pid": int(pid), "ppid": int(fields[1]), "argv": argv, "cwd": cwd}
    return table


def tree_processes(root_pid: int, table: Optional[Dict[int, Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """The live processes descending from ``root_pid`` (itself included).

    A whole tree, not a process group: ansible's local connection starts each module in
    a new session, so terraform does not share ansible-playbook's process group."""
    table = _proc_table() if table is None else table
    keep = {root_pid} if root_pid in table else set()
    grew = True
    while grew:
        grew = False
        for pid, p in table.items():
            if pid not in keep and p["ppid"] in keep:
                keep.add(pid)
                grew = True
    return [table[p] for p in sorted(keep)]


def run_processes(root_pid: int, dirs: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """The processes of a run: its tree, plus, for ``dirs``, the daemonised trees working there.
    The async apply is daemonised by Ansible: async_wrapper, the module, csis-tf-supervise and
    terraform are no descendants of ansible-playbook; terraform and its supervisor work in the
    root, and the module above them starts the next supervisor (``output -json``) if it lives."""
    table = _proc_table()
    procs = tree_processes(root_pid, table)
    if not dirs:
        return procs
    real = {os.path.realpath(d) for d in dirs}
    mine = set()
    pid = os.getpid()
    while pid in table:  # this test process and its ancestors are never part of a run
        mine.add(pid)
        pid = table[pid]["ppid"]
    tops = set()
    for p in table.values():
        if os.path.realpath(p["cwd"]) not in real:
            continue
        top = p["pid"]
        while True:  # up through the Ansible processes above it (async_wrapper, the module)
            parent = table.get(table.get(top, {}).get("ppid", 0))
            if not parent or parent["pid"] in mine or not any("ansible" in a.lower() for a in parent["argv"]):
                break
            top = parent["pid"]
        tops.add(top)
    seen = {p["pid"] for p in procs}
    for top in sorted(tops):
        procs += [p for p in tree_processes(top, table) if p["pid"] not in seen and p["pid"] not in mine]
        seen = {p["pid"] for p in procs}
    return procs


def kill_tree(root_pid: int, dirs: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """SIGSTOP then SIGKILL every process of the run (stopped first so none can fork or re-parent
    away); ``dirs``: as :func:`run_processes`."""
    killed: Dict[int, Dict[str, Any]] = {}
    for _round in range(10):  # again while a process forked between the look and the stop
        procs = [p for p in run_processes(root_pid, dirs) if p["pid"] not in killed]
        if not procs:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in procs:
                try:
                    os.kill(p["pid"], sig)
                except OSError:
                    pass
            if sig == signal.SIGSTOP:  # stopped: none can fork now; take the whole picture again
                more = {p["pid"]: p for p in run_processes(root_pid, dirs)}
                procs = list({**{p["pid"]: p for p in procs}, **more}.values())
        killed.update({p["pid"]: p for p in procs})
        time.sleep(0.05)
    return list(killed.values())


def processes_left(root_pid: int, dirs: Sequence[str] = (), timeout: float = 60) -> List[Dict[str, Any]]:
    """The processes of a killed run (:func:`run_processes`) still there after the kernel had up
    to ``timeout`` seconds to tear them down ([] once all are gone). A process killed with SIGKILL
    shows for a moment while it exits: the provider's 700 MB address space takes a while to
    free on a loaded machine (its command line already empty, its parent init)."""
    deadline = time.monotonic() + timeout
    left = run_processes(root_pid, dirs)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = run_processes(root_pid, dirs)
    return left


def kill_tree_when(proc: subprocess.Popen, predicate, timeout: float = 1200,
                   poll: float = 0.2, dirs: Sequence[str] = ()) -> Optional[Dict[str, Any]]:
    """SIGKILL the whole run (``proc``, every descendant, and with ``dirs`` the processes working
    there: :func:`run_processes`) as soon as one of them satisfies ``predicate``. Returns the
    matching process, or None if the run ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for p in run_processes(proc.pid, dirs):
            if predicate(p):
                kill_tree(proc.pid, dirs)
                proc.wait()
                return p
        time.sleep(poll)
    if proc.poll() is None:
        kill_tree(proc.pid, dirs)
        proc.wait()
    return None


def is_terraform_apply(p: Mapping[str, Any]) -> bool:
    argv = p["argv"]
    return bool(argv) and os.path.basename(argv[0]) in ("terraform", "tofu") and "apply" in argv[1:3]


_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+"
                    r"skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)", re.M)


def recap(out: str) -> Dict[str, Dict[str, int]]:
    """{host: {ok, changed, unreachable, failed, skipped, rescued, ignored}} summed over every PLAY RECAP."""
    res: Dict[str, Dict[str, int]] = {}
    for m in _RECAP.finditer(out):
        keys = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")
        cur = res.setdefault(m.group(1), {k: 0 for k in keys})
        for k, v in zip(keys, m.groups()[1:]):
            cur[k] += int(v)
    return res


def plan_summaries(out: str) -> Dict[str, str]:
    """{root key: 'Plan: ...'} from the role's 'Plan summary' messages (the first line of the
    message, the change lines follow it)."""
    return {m.group(1): m.group(2) for m in re.finditer(r"(?:msg: |^\s*- )'?([\w.-]+): (Plan: [^'\n]*)", out, re.M)}


def changed_tasks(out: str) -> List[str]:
    """'TASK name -> host' for every task that reported changed."""
    found, task = [], None
    for line in out.splitlines():
        m = re.match(r"^TASK \[(.*)\] \*+", line)
        if m:
            task = m.group(1)
        m = re.match(r"^changed: \[([^\]]+)\]", line)
        if m and task:
            found.append("%s -> %s" % (task, m.group(1)))
    return found


def terraform_in(root_dir: str, endpoint_env: Mapping[str, str], *args: str) -> str:
    """Run ``terraform <args>`` in a rendered root (already initialised by a run) against the
    endpoint, with the environment the collection gives terraform there (``terraform.run``'s:
    the CLI configuration and the root's endpoint environment; its whole stdout, which
    ``terraform.run`` cuts to its last 4000 characters). A failure raises with terraform's own message."""
    # tests/conftest.py put the collection on sys.path; imported here so this module loads without it
    from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import terraform_env
    res = subprocess.run(["terraform", *args], cwd=root_dir, env=terraform_env(run_env(endpoint_env), root=root_dir),
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise AssertionError("terraform %s in %s failed (exit %d): %s"
                             % (" ".join(args), root_dir, res.returncode, res.stderr.strip()[-2000:]))
    return res.stdout


def tf_state_pull(root_dir: str, endpoint_env: Mapping[str, str]) -> Dict[str, Any]:
    """``terraform state pull`` of a rendered root (already initialised by a run)."""
    return json.loads(terraform_in(root_dir, endpoint_env, "state", "pull") or "{}")


def state_ids(state: Mapping[str, Any], rtype: str) -> List[str]:
    return [i["attributes"]["id"] for r in state.get("resources") or [] if r.get("type") == rtype
            and r.get("mode") == "managed" for i in r.get("instances") or []]


def run_playbook_at_prompt(playbook: str, config_root: str, endpoint_env: Mapping[str, str], at_prompt,
                           answer: str = "yes", *, overlays: Sequence[str] = (),
                           extra_vars: Optional[Mapping[str, Any]] = None, timeout: float = 1800,
                           prompt: str = "Type 'yes' to apply them", log: Optional[str] = None) -> Run:
    """Run a playbook WITHOUT csis_auto_approve on a pseudo-terminal (as an operator would):
    when the approval prompt shows, call ``at_prompt()`` (e.g. turn an apply flag off), then
    type ``answer``. The approval is the pause between the gate and csis_apply_check."""
    import pty
    import select
    import termios  # noqa: F401  (POSIX only)

    argv = playbook_argv(playbook, config_root, overlays, False, False, extra_vars)
    master, slave = pty.openpty()

    def _ctty() -> None:
        os.setsid()
        import fcntl
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=run_env(endpoint_env, {"TERM": "dumb"}), stdin=slave,
                            stdout=slave, stderr=slave, preexec_fn=_ctty, close_fds=True)
    os.close(slave)
    buf = b""
    answered = False
    answered_at, answered_len, resent = 0.0, 0, 0
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _w, _x = select.select([master], [], [], 0.5)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                buf += chunk
                if not answered and prompt.encode() in buf:
                    answered = True
                    at_prompt()
                    # ansible prints the prompt, then sets the terminal up and flushes its
                    # input (termios.tcflush): an answer typed in between is lost. Type it
                    # after a moment, and again while nothing new has been printed.
                    time.sleep(1.0)
                    os.write(master, answer.encode() + b"\r")
                    answered_at, answered_len, resent = time.monotonic(), len(buf), 0
                elif answered and resent < 6 and len(buf) - answered_len > len(answer) + 8:
                    resent = 6  # ansible went on: the answer was taken
            elif proc.poll() is not None:
                break
            elif answered and resent < 6 and time.monotonic() - answered_at > 5:
                os.write(master, answer.encode() + b"\r")
                answered_at, resent = time.monotonic(), resent + 1
        else:
            os.killpg(proc.pid, signal.SIGKILL)
    finally:
        rc = proc.wait()
        os.close(master)
    out = buf.decode("utf-8", "replace").replace("\r\n", "\n")
    if log:
        with open(log, "w", encoding="utf-8") as fh:
            fh.write(out)
    return Run(argv, rc, out, time.monotonic() - t0)


def processes(predicate) -> List[Dict[str, Any]]:
    """Every live process of the machine (pid, ppid, argv, cwd) that satisfies ``predicate``:
    unlike :func:`tree_processes`, this finds processes a killed run left behind (re-parented,
    in sessions of their own)."""
    return [p for p in _proc_table().values() if predicate(p)]
