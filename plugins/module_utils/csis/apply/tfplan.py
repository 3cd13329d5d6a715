# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The plan step: open the binding, run ``terraform plan -out`` once, record what terraform said.

One terraform process per plan (``plan -input=false -detailed-exitcode -out=<plan>``), where
``community.general.terraform state=planned`` ran five (``version``, ``validate``, ``workspace
list``, ``plan``, ``output``). The root was validated when it was rendered, the collection
uses no workspaces and the plan's outputs are read by nobody.

``-detailed-exitcode`` tells an empty plan (exit 0) from one with changes (exit 2). The binding
(:mod:`.binding`) records that answer with the plan file's sha256; the gate trusts "empty" only
for those very bytes and then needs no ``show -json`` (a second provider start). Any other
plan goes through ``show -json`` as before.

With ``release_stale_lock`` the plan first does what ``csis_state_lock`` does
(:func:`.statelock.check_and_release`: refuse a root holding ``errored.tfstate``, release an S3
state lock whose holder on this machine is gone, refuse any other lock): the role's plan of
every root, in the same process (one module start per root less).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import CsisError
from ..terraform import TerraformError, terraform_env
from .applycheck import LIFECYCLE_KEYS
from .binding import open_binding, plan_path_of, read_binding, record_plan, sha256_file
from .statelock import check_and_release

_SUMMARY = re.compile(r"^(Plan: .*|No changes\..*)$", re.M)
#: where each of terraform's error diagnostics starts (``-no-color``), and what a
#: ``data "terraform_remote_state"`` without a stored state says
_ERROR = re.compile(r"^Error: ", re.M)
_NO_REMOTE_STATE = "Unable to find remote state"
_REMOTE_STATE_REF = re.compile(r"\bdata\.terraform_remote_state\.([A-Za-z0-9_-]+)")


class UpstreamNotApplied(TerraformError):
    """The plan failed only because roots this one reads have no state yet: they were never
    applied. ``labels``: their ``data "terraform_remote_state"`` names; ``roots``: their keys."""

    def __init__(self, message: str, labels: Sequence[str], roots: Sequence[str]) -> None:
        super().__init__(message)
        self.labels = list(labels)
        self.roots = list(roots)


def unapplied_upstreams(stderr: str) -> List[str]:
    """The ``terraform_remote_state`` data sources terraform found no state for, in its order,
    when those are the plan's only errors (``Error: Unable to find remote state`` ... ``with
    data.terraform_remote_state.<label>``); [] when any other error is among them (that one is
    the failure to show) or none is."""
    parts = _ERROR.split(stderr or "")[1:]
    labels: List[str] = []
    for part in parts:
        ref = _REMOTE_STATE_REF.search(part)
        if not part.startswith(_NO_REMOTE_STATE) or ref is None:
            return []
        if ref.group(1) not in labels:
            labels.append(ref.group(1))
    return labels


def upstream_message(root: str, labels: Sequence[str], reads: Mapping[str, str]) -> Tuple[List[str], str]:
    """The keys of the roots behind ``labels`` (``reads``: label -> root key, csis_render's
    ``roots[].reads``; a label it does not know stands for itself), and what to tell the operator."""
    roots = [reads.get(label, label) for label in labels]
    flags = sorted({"config.%s" % LIFECYCLE_KEYS[r.split("-", 1)[0]] for r in roots if r.split("-", 1)[0] in LIFECYCLE_KEYS})
    named = ", ".join("%s (data.terraform_remote_state.%s)" % (r, label) for r, label in zip(roots, labels))
    return roots, ("%s: this root reads the state of %s, and no state is stored for %s in its backend: %s never "
                   "applied. A root reads another's outputs only after that root's first apply. Apply %s first "
                   "(a real run of its lifecycle with its apply flag on%s, e.g. site.yml with "
                   "overlays/apply-all.yml), then plan this root again"
                   % (root, named, "it" if len(roots) == 1 else "them", "that root was" if len(roots) == 1 else "those roots were",
                      "it" if len(roots) == 1 else "them", (": " + ", ".join(flags)) if flags else ""))


def var_args(variables: Optional[Mapping[str, Any]]) -> List[str]:
    """``-var name=value`` pairs: strings as they are, booleans as ``true``/``false``, numbers,
    lists and maps as JSON (which terraform reads as HCL expressions)."""
    out: List[str] = []
    for name, value in sorted((variables or {}).items()):
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = value
        else:
            text = json.dumps(value, sort_keys=True)
        out += ["-var", "%s=%s" % (name, text)]
    return out


def plan_argv(binary: str, plan_path: str, variables: Optional[Mapping[str, Any]] = None,
              replace: Sequence[str] = ()) -> List[str]:
    return ([binary, "plan", "-input=false", "-no-color", "-detailed-exitcode", "-out=%s" % plan_path]
            + ["-replace=%s" % a for a in replace] + var_args(variables))


def summary_of(stdout: str, empty: bool) -> str:
    """terraform's own one-line summary (``Plan: 1 to add, ...`` / ``No changes. ...``)."""
    found = _SUMMARY.findall(stdout or "")
    if found:
        return found[-1].strip()
    return "No changes." if empty else "changes planned"


def run_bounded(argv: Sequence[str], cwd: str, env: Mapping[str, str], timeout: Optional[float],
                what: str, umask: int = -1) -> subprocess.CompletedProcess:
    """Run ``argv``; past ``timeout`` seconds stop it as terraform wants to be stopped (SIGINT:
    it releases its state lock), then SIGKILL 30 s later, and raise :class:`TerraformError`.
    ``umask``: the process's (-1: this one's)."""
    try:
        proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, umask=umask)
    except OSError as exc:
        raise TerraformError("%s: cannot run %s: %s" % (cwd, argv[0], exc)) from exc
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise TerraformError("%s: %s did not finish within %s s (csis_tf_timeout) and was stopped: %s"
                             % (cwd, what, timeout, (err or out or "").strip()[-1500:]))
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def make_plan(project_path: str, plan_file: str = "tfplan", binary_path: str = "terraform", *,
              variables: Optional[Mapping[str, Any]] = None, replace: Sequence[str] = (),
              env: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
              check_mode: bool = False, release_stale_lock: bool = False,
              real_binary: Optional[str] = None, reads: Optional[Mapping[str, str]] = None,
              skip_unapplied: bool = False, force_unlock: Optional[Sequence[str]] = ()) -> Dict[str, Any]:
    """Open the plan binding, plan to ``plan_file``, record terraform's answer in the binding.

    ``release_stale_lock``: first :func:`.statelock.check_and_release` (with ``real_binary``, the
    terraform binary itself when ``binary_path`` is a wrapper: it runs the force-unlock and the
    messages name it); its result is returned as ``state_lock``, and a lock it refuses raises
    :class:`.statelock.StateLockError` before anything is planned. In check mode (no terraform
    runs) the lock is not looked at. ``force_unlock``: the lock IDs the operator names as left by
    runs that are gone (``check_and_release``'s ``confirmed_gone``).

    Raises :class:`TerraformError` when terraform fails (exit 1), times out or cannot start;
    the binding then records no plan and the gate refuses whatever plan file is there. When the
    plan failed only because roots this one reads were never applied, the error is
    :class:`UpstreamNotApplied`, naming them by ``reads`` (label -> root key); with
    ``skip_unapplied`` (a root this run does not apply) that is no failure: the result says
    ``waiting_for`` those roots, with no plan (``changes`` None, the binding records none).
    ``waiting_for`` is [] otherwise.
    In check mode nothing is written and terraform does not run.
    """
    root = os.path.abspath(project_path)
    lock = (check_and_release(root, real_binary or binary_path, env=env, confirmed_gone=force_unlock)
            if release_stale_lock and not check_mode else None)
    try:
        return _plan_to_file(root, plan_file, binary_path, variables, replace, env, timeout, check_mode, reads,
                             skip_unapplied, lock)
    except CsisError as exc:
        if lock and lock.get("released"):  # the failure's message (and its audit record) keeps the release
            exc.args = ("%s (before this plan, %s)" % (exc, lock["msg"]),)
        raise


def _plan_to_file(root: str, plan_file: str, binary_path: str, variables: Optional[Mapping[str, Any]],
                  replace: Sequence[str], env: Optional[Mapping[str, str]], timeout: Optional[float], check_mode: bool,
                  reads: Optional[Mapping[str, str]], skip_unapplied: bool,
                  lock: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    plan_path = plan_path_of(root, plan_file)
    opened = open_binding(root, plan_file, check_mode=check_mode)
    argv = plan_argv(binary_path, plan_path, variables, replace)
    result: Dict[str, Any] = {"changed": not check_mode, "plan_file": plan_path, "binding": opened["binding"],
                              "cmd": " ".join([os.path.basename(binary_path)] + argv[1:])}
    if lock is not None:
        result["state_lock"] = lock
    if check_mode:
        result.update(changes=None, summary="(check mode: not planned)", waiting_for=[])
        return result
    t0 = time.monotonic()
    # a plan file holds the prior state and what data sources read (a remote state's outputs, an
    # SSM parameter) in clear: the owner's only, from its first byte (terraform creates it as the
    # umask allows), and still if it was there before with wider permissions (kept by a truncation)
    proc = run_bounded(argv, root, terraform_env(env if env is not None else os.environ, root=root), timeout, "terraform plan",
                       umask=0o077)
    seconds = round(time.monotonic() - t0, 2)
    if os.path.isfile(plan_path):
        os.chmod(plan_path, 0o600)
    if proc.returncode not in (0, 2) or not os.path.isfile(plan_path):
        err = (proc.stderr or proc.stdout or "").strip()[-3000:]
        labels = unapplied_upstreams(proc.stderr) if proc.returncode == 1 else []
        if labels:
            roots, msg = upstream_message(root, labels, reads or {})
            if not skip_unapplied:
                raise UpstreamNotApplied(msg, labels, roots)
            result.update(changes=None, waiting_for=roots, msg=msg, seconds=seconds,
                          summary="not planned: it reads %s, never applied" % ", ".join(roots))
            return result
        raise TerraformError("%s: terraform plan failed (exit %d): %s" % (root, proc.returncode, err))
    empty = proc.returncode == 0
    sha = sha256_file(plan_path)
    binding = read_binding(plan_path)
    if binding is not None:
        record_plan(plan_path, binding, {"plan_sha256": sha, "empty": empty, "exit_code": proc.returncode})
    result.update(changes=not empty, summary=summary_of(proc.stdout, empty), plan_sha256=sha, waiting_for=[],
                  seconds=seconds, stdout=proc.stdout[-4000:], stderr=proc.stderr[-2000:])
    return result
