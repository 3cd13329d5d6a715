# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The plan binding: ``<plan_file>.csis-binding.json`` ties one plan file to the content
of the root it was planned from (instead of file mtimes, the reference's weak point 5).

1. :func:`open_binding` (just BEFORE ``terraform plan``) deletes any old plan file and
   binding, then records the per-file sha256 of every file in the root that can affect
   the plan (see :func:`root_files`), their combined digest, the time and a nonce.
   A plan file that exists afterwards was therefore written after the opening.
2. The gate (:func:`~.gate.run_gate`, after the plan) refuses a plan without a binding,
   and a root whose content changed since the opening (naming the files); when the plan
   passes it records the plan file's sha256 and the verdict (:func:`record_gate`). A
   refusal clears any earlier gate record (:func:`clear_gate`).
3. :func:`verify_binding` (just BEFORE ``terraform apply <plan>``) requires a gate
   record, the same plan bytes the gate read, and the same root content; with
   ``check_state`` also the state the plan was made against (:func:`state_moved_message`):
   terraform refuses a stale plan file itself, but only at the apply, after the steps the
   role runs before it (machines stopped, archive snapshots, bucket wipes).
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import secrets
import subprocess
import zipfile
from typing import Any, Dict, Iterable, List, Mapping, Optional

from ..clock import now, parse as parse_time
from ..errors import CsisError, GateError, GateRefused
from ..fsutil import write_json_atomic
from .. import tfstate
from .receipts import RECEIPTS_DIR

BINDING_SUFFIX = ".csis-binding.json"
BINDING_VERSION = 1


_EXCLUDED_DIRS = {".terraform", RECEIPTS_DIR, "terraform.tfstate.d"}
_EXCLUDED_FILE_GLOBS = ("*.tfstate", "*.tfstate.backup", "tfplan", "tfplan.*", "*.tfplan", "*.tfplan.*",
                        "*" + BINDING_SUFFIX, "crash.log", "crash.*.log")
_KEPT_HIDDEN = {".terraform.lock.hcl"}


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _walk_files(top: str, skip: Iterable[str] = ()) -> Dict[str, str]:
    """{relative path (posix): absolute path} of the files that can affect a plan."""
    skip_real = {os.path.realpath(s) for s in skip}
    found: Dict[str, str] = {}
    seen_dirs = set()
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen_dirs:
            dirnames[:] = []
            continue
        seen_dirs.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _EXCLUDED_DIRS)
        for name in sorted(filenames):
            if name.startswith(".") and name not in _KEPT_HIDDEN:
                continue
            if any(fnmatch.fnmatchcase(name, g) for g in _EXCLUDED_FILE_GLOBS):
                continue
            full = os.path.join(dirpath, name)
            if os.path.realpath(full) in skip_real:
                continue
            if not os.path.isfile(full):
                continue
            rel = os.path.relpath(full, top).replace(os.sep, "/")
            found[rel] = full
    return found


def _module_dirs(project_path: str) -> List[str]:
    """``Dir`` of every module terraform installed for the root (``.terraform/modules/modules.json``)."""
    path = os.path.join(project_path, ".terraform", "modules", "modules.json")
    try:
        with open(path, "r", encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return []
    except (OSError, ValueError, RecursionError) as exc:
        raise GateError("cannot read %s: %s" % (path, exc))
    modules = data.get("Modules") if isinstance(data, dict) else None
    if data is not None and (not isinstance(data, dict) or not isinstance(modules, (list, type(None)))):
        raise GateError("cannot read %s: not a module list as terraform init writes it ({\"Modules\": [...]}); "
                        "run terraform init in the root again" % path)
    dirs: List[str] = []
    for m in modules or []:
        d = m.get("Dir") if isinstance(m, dict) else None
        if isinstance(d, str) and d and os.path.normpath(d) != "." and d not in dirs:
            dirs.append(d)
    return dirs


def root_files(project_path: str, plan_file: Optional[str] = None) -> Dict[str, str]:
    """{name: sha256} of every file that affects a plan of ``project_path``.

    The root's non-hidden files (``*.tf``, ``*.tf.json``, ``*.tftpl``, ``*.tfvars``,
    ``*.tfbackend.hcl``, templates, scripts...) recursively, plus ``.terraform.lock.hcl``;
    not ``.terraform/``, hidden files, plan files, bindings, local state, unmount
    receipts. Plus ``.terraform/modules/modules.json`` and the files of every module
    directory it lists (local ``../../tfmodules/x`` sources as well as downloaded
    copies), named ``module <Dir>/<file>``.
    """
    root = os.path.abspath(project_path)
    if not os.path.isdir(root):
        raise GateError("project_path %s is not a directory" % root)
    skip: List[str] = []
    if plan_file:
        pf = plan_file if os.path.isabs(plan_file) else os.path.join(root, plan_file)
        skip += [pf, pf + BINDING_SUFFIX]
    files = _walk_files(root, skip)
    out: Dict[str, str] = {}
    owner: Dict[str, str] = {}
    for rel, full in files.items():
        out[rel] = sha256_file(full)
        owner[os.path.realpath(full)] = rel
    mj = os.path.join(root, ".terraform", "modules", "modules.json")
    if os.path.isfile(mj):
        out[".terraform/modules/modules.json"] = sha256_file(mj)
    for d in _module_dirs(root):
        mdir = os.path.normpath(os.path.join(root, d))
        if not os.path.isdir(mdir):
            out["module %s" % d] = "missing"
            continue
        for rel, full in _walk_files(mdir, skip).items():
            real = os.path.realpath(full)
            if real in owner:
                continue
            name = "module %s/%s" % (d.rstrip("/"), rel)
            owner[real] = name
            out[name] = sha256_file(full)
    return out


def combine_digests(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        try:  # a name os.listdir could not decode comes back as its bytes
            h.update(name.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:  # any other lone surrogate (a module directory modules.json names)
            h.update(name.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
        h.update(str(files[name]).encode("ascii"))
        h.update(b"\n")
    return h.hexdigest()


def own_files(project_path: str) -> Dict[str, str]:
    """{relative path (posix): absolute path} of the root's own files, exactly as
    :func:`root_files` selects them (the rendered files and ``.terraform.lock.hcl``; no run
    output: plan files, bindings, local state, receipts, hidden files) but without the module
    copies. The git workspace commits these files (``workspace.py``)."""
    root = os.path.abspath(project_path)
    if not os.path.isdir(root):
        raise GateError("project_path %s is not a directory" % root)
    return _walk_files(root)


def rendered_digest(project_path: str) -> str:
    """The rendered digest of a root: :func:`combine_digests` over :func:`own_files` (name and
    sha256 of each). The git workspace compares it with what its main branch holds."""
    return combine_digests({rel: sha256_file(full) for rel, full in own_files(project_path).items()})


def root_digest(project_path: str, plan_file: Optional[str] = None) -> str:
    """sha256 over the sorted names and contents of :func:`root_files`."""
    return combine_digests(root_files(project_path, plan_file))


def describe_file_changes(old: Mapping[str, str], new: Mapping[str, str]) -> List[str]:
    """``["main.tf (modified)", "x.tf (added)", "y.tf (removed)"]``."""
    out: List[str] = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            out.append("%s (removed)" % name)
        elif name not in old:
            out.append("%s (added)" % name)
        elif old[name] != new[name]:
            out.append("%s (modified)" % name)
    return out


def plan_path_of(project_path: str, plan_file: str) -> str:
    """The absolute path of ``plan_file`` (relative to the root when relative)."""
    return os.path.normpath(plan_file if os.path.isabs(plan_file) else os.path.join(project_path, plan_file))


def binding_path(plan_path: str) -> str:
    return plan_path + BINDING_SUFFIX


def _remove(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except IsADirectoryError as exc:  # a directory where the plan file (or its binding) belongs
        raise GateError("%s: is a directory where the plan file or its binding belongs: remove it, then plan "
                        "again" % path) from exc


def read_binding(plan_path: str) -> Optional[Dict[str, Any]]:
    """The binding of ``plan_path`` or None when there is none (or it is unreadable)."""
    try:
        with open(binding_path(plan_path), "r", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("version") != BINDING_VERSION or not isinstance(data.get("opened"), dict):
        return None
    files = data["opened"].get("files")
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        return None  # not as open_binding writes it: no binding (the gate refuses the plan, names why)
    if not isinstance(data["opened"].get("time"), str) or parse_time(data["opened"]["time"]) is None:
        return None  # the floor of the unmount receipts' freshness: without it none would be checked
    return data


def open_binding(project_path: str, plan_file: str = "tfplan", check_mode: bool = False) -> Dict[str, Any]:
    """Remove the old plan and binding, record the root's content. Run just BEFORE the plan."""
    root = os.path.abspath(project_path)
    plan_path = plan_path_of(root, plan_file)
    files = root_files(root, plan_path)
    opened = {
        "time": now(),
        "nonce": secrets.token_hex(16),
        "root_digest": combine_digests(files),
        "files": files,
    }
    binding = {
        "version": BINDING_VERSION,
        "project_path": root,
        "plan_file": plan_path,
        "opened": opened,
        "gate": None,
    }
    had_plan = os.path.exists(plan_path)
    had_binding = os.path.exists(binding_path(plan_path))
    if not check_mode:
        os.makedirs(os.path.dirname(plan_path), exist_ok=True)
        _remove(plan_path)
        _remove(binding_path(plan_path))
        write_json_atomic(binding_path(plan_path), binding)
    return {
        "changed": True,
        "binding": binding_path(plan_path),
        "plan_file": plan_path,
        "removed_plan": had_plan,
        "removed_binding": had_binding,
        "root_digest": opened["root_digest"],
        "files": len(files),
        "nonce": opened["nonce"],
        "opened": opened["time"],
    }


def stale_root_message(plan_file: str, binding: Mapping[str, Any], now_files: Mapping[str, str]) -> Optional[str]:
    opened = binding["opened"]
    if combine_digests(now_files) == opened.get("root_digest"):
        return None
    changed = describe_file_changes(opened.get("files") or {}, now_files) or ["(the recorded file list is damaged)"]
    return ("STALE PLANFILE: %s is older than the root: %s changed since the plan was opened at %s"
            " -- re-run the plan" % (plan_file, ", ".join(changed), opened.get("time")))


def missing_plan_message(plan_file: str) -> str:
    return "STALE PLANFILE: %s does not exist — the plan step did not produce it" % plan_file


def binding_mismatch(plan_file: str, binding: Mapping[str, Any], root: str, plan_path: str) -> Optional[str]:
    if binding.get("project_path") != root or binding.get("plan_file") != plan_path:
        return ("STALE PLANFILE: %s has a binding for another root or plan (%s, %s)"
                % (plan_file, binding.get("project_path"), binding.get("plan_file")))
    return None


def plan_prior_state(plan_path: str) -> Optional[Dict[str, Any]]:
    """``{"lineage", "serial"}`` of the state a plan file was made against (its ``tfstate``
    entry, as terraform writes it), or None when the file does not read that way (an OpenTofu
    plan file it encrypted, say): terraform's own check at the apply then stands alone."""
    try:
        with zipfile.ZipFile(plan_path) as zf:
            doc = json.loads(zf.read("tfstate").decode("utf-8"))
    except (OSError, KeyError, ValueError, RecursionError, zipfile.BadZipFile, RuntimeError, NotImplementedError):
        return None
    serial = doc.get("serial", 0) if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(doc.get("lineage", ""), str) \
            or not isinstance(serial, int) or isinstance(serial, bool):
        return None
    return {"lineage": doc.get("lineage") or "", "serial": doc.get("serial") or 0}


def state_moved_message(plan_file: str, prior: Mapping[str, Any], current: Mapping[str, Any]) -> Optional[str]:
    """Why the plan can no longer be applied to the state as it is now (``current``: the root's
    state document), by terraform's own rule for a saved plan: the same lineage (unless the plan
    was made before any state existed) and the same serial; None when it can."""
    lineage, serial = current.get("lineage") or "", current.get("serial") or 0
    first_plan = prior["lineage"] == "" and prior["serial"] == 0
    if not first_plan and prior["lineage"] != lineage:
        return ("STALE PLANFILE: %s was planned against state lineage %s and the root's state is now %s: the "
                "state was replaced after the plan; nothing was applied -- plan again"
                % (plan_file, prior["lineage"], ("lineage " + str(lineage)) if lineage else "empty"))
    if prior["serial"] != serial:
        return ("STALE PLANFILE: %s was planned against the root's state at serial %s and the state is now at serial "
                "%s: another terraform operation changed it after the plan (terraform would refuse the plan file as "
                "stale); nothing was applied -- plan again" % (plan_file, prior["serial"], serial))
    return None


def _check_state(root: str, plan_file: str, plan_path: str, binary: str) -> str:
    """``""`` when the plan still applies to the root's state, the reason it cannot be told
    otherwise (the plan file does not say); raises GateRefused when the state moved."""
    prior = plan_prior_state(plan_path)
    if prior is None:
        return "not checked: %s does not name its state (terraform checks it at the apply)" % plan_file
    try:
        current = tfstate.read(root, binary)
    except (CsisError, OSError, subprocess.SubprocessError) as exc:
        raise GateError("the root's state could not be read to tell whether %s still applies to it: %s; nothing was "
                        "applied" % (plan_file, exc)) from exc
    msg = state_moved_message(plan_file, prior, current)
    if msg:
        raise GateRefused([msg])
    return ""


def verify_binding(project_path: str, plan_file: str = "tfplan", check_state: bool = False,
                   binary: str = "terraform") -> Dict[str, Any]:
    """Check, just BEFORE apply, that ``plan_file`` is the one the gate passed for this root as it
    is now; with ``check_state``, also that the root's state is the one the plan was made against
    (read as the record reads it, :func:`.tfstate.read`; ``binary`` for a ``state pull``)."""
    root = os.path.abspath(project_path)
    plan_path = plan_path_of(root, plan_file)
    if not os.path.isfile(plan_path):
        raise GateRefused([missing_plan_message(plan_file)])
    binding = read_binding(plan_path)
    if binding is None:
        raise GateRefused(["STALE PLANFILE: %s has no binding (%s missing or unreadable): open the binding, "
                           "plan and gate again" % (plan_file, binding_path(plan_path))])
    msg = binding_mismatch(plan_file, binding, root, plan_path)
    if msg:
        raise GateRefused([msg])
    gate = binding.get("gate")
    if not isinstance(gate, dict) or not gate.get("plan_sha256"):
        raise GateRefused(["STALE PLANFILE: %s has not passed the gate since the plan was opened at %s"
                           % (plan_file, binding["opened"].get("time"))])
    now_sha = sha256_file(plan_path)
    if now_sha != gate["plan_sha256"]:
        raise GateRefused(["STALE PLANFILE: %s changed after the gate passed it (sha256 %s at the gate, %s now)"
                           % (plan_file, gate["plan_sha256"], now_sha)])
    stale = stale_root_message(plan_file, binding, root_files(root, plan_path))
    if stale:
        raise GateRefused([stale])
    state_note = _check_state(root, plan_file, plan_path, binary) if check_state else "not asked"
    return {
        "changed": False,
        "binding": binding_path(plan_path),
        "plan_file": plan_path,
        "plan_sha256": now_sha,
        "root_digest": binding["opened"]["root_digest"],
        "nonce": binding["opened"].get("nonce"),
        "opened": binding["opened"].get("time"),
        "gated": gate.get("time"),
        "verdict": gate.get("verdict") or {},
        "summary": (gate.get("verdict") or {}).get("summary", ""),
        "state_check": state_note or "the state is the one the plan was made against",
    }


def record_plan(plan_path: str, binding: Mapping[str, Any], plan: Mapping[str, Any]) -> None:
    """Record in the binding what terraform said of the plan it wrote (``plan``: plan_sha256,
    empty, exit_code; :func:`.tfplan.make_plan`)."""
    record = dict(binding)
    record["plan"] = dict({"time": now()}, **plan)
    write_json_atomic(binding_path(plan_path), record)


def planned_empty(binding: Mapping[str, Any], plan_sha256: str) -> bool:
    """True when terraform itself said (``-detailed-exitcode`` 0) that this very plan file holds
    no changes: the binding's plan record names these bytes. Anything else is not trusted."""
    plan = binding.get("plan")
    return (isinstance(plan, dict) and plan.get("empty") is True and plan.get("exit_code") == 0
            and bool(plan_sha256) and plan.get("plan_sha256") == plan_sha256)


def record_gate(plan_path: str, binding: Mapping[str, Any], gate: Mapping[str, Any]) -> None:
    """Record in the binding that the gate passed the plan (``gate``: plan_sha256, verdict...)."""
    record = dict(binding)
    record["gate"] = dict({"time": now(), "root_digest": binding["opened"]["root_digest"]}, **gate)
    write_json_atomic(binding_path(plan_path), record)


def clear_gate(plan_path: str, binding: Mapping[str, Any]) -> None:
    """Forget an earlier gate record (a refusal): the plan must pass the gate again."""
    if binding.get("gate") is not None:
        cleared = dict(binding)
        cleared["gate"] = None
        write_json_atomic(binding_path(plan_path), cleared)
