# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The plan gate and the plan binding.

The gate reads a saved plan as JSON (``terraform show -json <plan>``), refuses every
destroy (including both kinds of replacement) that no whitelist entry covers, refuses
detaches without a successful unmount receipt, and refuses stale or missing plans.

Plan binding (instead of file mtimes, the reference's weak point 5)
-------------------------------------------------------------------
``<plan_file>.csis-binding.json`` ties one plan file to the content of the root it
was planned from:

1. :func:`open_binding` (just BEFORE ``terraform plan``) deletes any old plan file and
   binding, then records the per-file sha256 of every file in the root that can affect
   the plan (see :func:`root_files`), their combined digest, the time and a nonce.
   A plan file that exists afterwards was therefore written after the opening.
2. :func:`run_gate` (after the plan) refuses a plan without a binding, and a root whose
   content changed since the opening (naming the files); when the plan passes it records
   the plan file's sha256 and the verdict in the binding. A refusal clears any earlier
   gate record.
3. :func:`verify_binding` (just BEFORE ``terraform apply <plan>``) requires a gate
   record, the same plan bytes the gate read, and the same root content.

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import datetime as _dt
import fnmatch
import hashlib
import json
import os
import re
import secrets
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .fsutil import write_json_atomic
from .hcl import string as hcl_string

from .tfcli import terraform_env

__all__ = [
    "BINDING_SUFFIX",
    "GateError",
    "GateRefused",
    "PlanVerdict",
    "parse_address",
    "format_address",
    "address_covered_by",
    "evaluate_plan",
    "check_receipts",
    "root_files",
    "root_digest",
    "describe_file_changes",
    "binding_path",
    "read_binding",
    "open_binding",
    "verify_binding",
    "show_plan_json",
    "run_gate",
    "plan_diff",
    "plan_content_digest",
]

BINDING_SUFFIX = ".csis-binding.json"
BINDING_VERSION = 1


class GateError(Exception):
    """The gate could not do its work (bad input, terraform failed)."""


class GateRefused(Exception):
    """The gate, or a binding check, refuses: ``messages`` are the refusal lines."""

    def __init__(self, messages: Sequence[str], result: Optional[Dict[str, Any]] = None):
        self.messages = list(messages)
        self.result = dict(result or {})
        super().__init__("\n".join(self.messages))


# --------------------------------------------------------------------------------------
# Addresses
# --------------------------------------------------------------------------------------

# A token is ("name", str), ("key", str) for ["k"], or ("index", int) for [0].
Token = Tuple[str, Any]

_NAME_STOP = set('.[]"')


def _decode_quoted(text: str, start: int, address: str) -> Tuple[str, int]:
    """Decode an HCL-quoted string starting after the opening quote; return (value, index after closing quote)."""
    out: List[str] = []
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\":
            if i + 1 >= n:
                break
            e = text[i + 1]
            simple = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}
            if e in simple:
                out.append(simple[e])
                i += 2
                continue
            if e in ("u", "U"):
                width = 4 if e == "u" else 8
                hexdigits = text[i + 2:i + 2 + width]
                if len(hexdigits) != width or not all(h in "0123456789abcdefABCDEF" for h in hexdigits):
                    raise ValueError("bad \\%s escape in address %r" % (e, address))
                out.append(chr(int(hexdigits, 16)))
                i += 2 + width
                continue
            raise ValueError("bad escape \\%s in address %r" % (e, address))
        # HCL template escapes: "$${" is a literal "${", "%%{" a literal "%{"
        if c in "$%" and text.startswith(c + c + "{", i):
            out.append(c + "{")
            i += 3
            continue
        out.append(c)
        i += 1
    raise ValueError("unterminated quoted key in address %r" % address)


def parse_address(address: str) -> Tuple[Token, ...]:
    """Split a terraform address into whole segments.

    ``module.a["k.x"].module.b.aws_instance.this[0]`` ->
    ``(name module)(name a)(key k.x)(name module)(name b)(name aws_instance)(name this)(index 0)``.
    Quoted keys may contain dots, brackets and escaped quotes.
    """
    if not isinstance(address, str) or not address.strip():
        raise ValueError("empty address")
    text = address.strip()
    tokens: List[Token] = []
    i = 0
    n = len(text)
    expect_name = True
    while i < n:
        if expect_name:
            j = i
            while j < n and text[j] not in _NAME_STOP:
                j += 1
            if j == i:
                raise ValueError("expected a name at position %d in address %r" % (i, address))
            tokens.append(("name", text[i:j]))
            i = j
            expect_name = False
            continue
        c = text[i]
        if c == ".":
            i += 1
            expect_name = True
            if i >= n:
                raise ValueError("address %r ends with a dot" % address)
            continue
        if c == "[":
            if i + 1 < n and text[i + 1] == '"':
                value, j = _decode_quoted(text, i + 2, address)
                if j >= n or text[j] != "]":
                    raise ValueError("expected ] after quoted key in address %r" % address)
                tokens.append(("key", value))
                i = j + 1
                continue
            j = text.find("]", i)
            if j < 0:
                raise ValueError("unterminated [ in address %r" % address)
            inner = text[i + 1:j]
            if not re.fullmatch(r"[0-9]+", inner):
                raise ValueError("index %r is neither a number nor a quoted key in address %r" % (inner, address))
            tokens.append(("index", int(inner)))
            i = j + 1
            continue
        raise ValueError("unexpected %r at position %d in address %r" % (c, i, address))
    return tuple(tokens)


_quote_key = hcl_string  # an address key is spelled as an HCL string


def format_address(tokens: Iterable[Token]) -> str:
    """Inverse of :func:`parse_address` (canonical spelling)."""
    parts: List[str] = []
    for kind, value in tokens:
        if kind == "name":
            parts.append(("." if parts else "") + value)
        elif kind == "key":
            parts.append("[" + _quote_key(value) + "]")
        else:
            parts.append("[%d]" % value)
    return "".join(parts)


def address_covered_by(address: str, entries: Iterable[str]) -> Optional[str]:
    """The whitelist entry whose segments are a prefix of ``address``'s, else None.

    ``module.instance_test`` covers ``module.instance_test.aws_instance.this``,
    ``module.instance_test["x"].aws_instance.this`` and ``module.instance_test[0]...``
    but never ``module.instance_test2...``. An exact entry covers itself.
    """
    return Whitelist(entries).covering(address)


class Whitelist:
    """Whitelist entries parsed once; a lookup costs one set probe per address segment."""

    def __init__(self, entries: Iterable[str]) -> None:
        self._by_tokens: Dict[Tuple[Token, ...], str] = {}
        for entry in entries:
            self._by_tokens.setdefault(parse_address(entry), entry)

    def covering(self, address: str) -> Optional[str]:
        addr = parse_address(address)
        for n in range(1, len(addr) + 1):
            hit = self._by_tokens.get(addr[:n])
            if hit is not None:
                return hit
        return None


# --------------------------------------------------------------------------------------
# Plan evaluation
# --------------------------------------------------------------------------------------

KNOWN_ACTIONS = {"no-op", "create", "read", "update", "delete", "forget"}


@dataclass
class PlanVerdict:
    creates: List[str] = field(default_factory=list)
    updates: List[str] = field(default_factory=list)
    deletes: List[str] = field(default_factory=list)      # pure destroys
    replaces: List[str] = field(default_factory=list)     # delete+create in either order
    forgets: List[str] = field(default_factory=list)      # removed from state, object kept
    whitelisted: List[Dict[str, str]] = field(default_factory=list)
    violations: List[str] = field(default_factory=list)
    details: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def adds(self) -> int:
        return len(self.creates) + len(self.replaces)

    @property
    def changes(self) -> int:
        return len(self.updates)

    @property
    def destroys(self) -> int:
        return len(self.deletes) + len(self.replaces)

    def summary(self) -> str:
        text = "Plan: %d to add, %d to change, %d to destroy" % (self.adds, self.changes, self.destroys)
        if self.replaces:
            text += " (%d replacement%s)" % (len(self.replaces), "" if len(self.replaces) == 1 else "s")
        extra: List[str] = []
        if self.forgets:
            extra.append("%d to forget (removed from state, not destroyed)" % len(self.forgets))
        if self.whitelisted:
            by: List[str] = []
            for w in self.whitelisted:
                if w["entry"] not in by:
                    by.append(w["entry"])
            n = len(self.whitelisted)
            extra.append("%d destroy%s whitelisted by %s" % (n, "" if n == 1 else "s", ", ".join(by)))
        destroy_violations = [v for v in self.violations if v.startswith("DESTROY NOT WHITELISTED")]
        if destroy_violations:
            n = len(destroy_violations)
            extra.append("%d destroy%s NOT whitelisted" % (n, "" if n == 1 else "s"))
        if extra:
            text += "; " + "; ".join(extra)
        return text

    def as_result(self) -> Dict[str, Any]:
        return {
            "adds": self.adds,
            "changes": self.changes,
            "destroys": self.destroys,
            "replacements": len(self.replaces),
            "forgets": len(self.forgets),
            "addresses": {
                "create": list(self.creates),
                "update": list(self.updates),
                "delete": list(self.deletes),
                "replace": list(self.replaces),
                "forget": list(self.forgets),
            },
            "whitelisted": [dict(w) for w in self.whitelisted],
            "violations": list(self.violations),
            "summary": self.summary(),
        }


def evaluate_plan(plan: Mapping[str, Any], allow_destroy: Iterable[str] = ()) -> PlanVerdict:
    """Classify ``plan["resource_changes"]`` and check every destroy against ``allow_destroy``."""
    if not isinstance(plan, Mapping) or "format_version" not in plan:
        raise GateError("not a terraform plan in JSON (no format_version): pass the output of `show -json <plan>`")
    if plan.get("errored"):
        raise GateError("the plan is marked errored: terraform could not finish planning")
    entries = list(allow_destroy or ())
    for e in entries:
        try:
            parse_address(e)
        except ValueError as exc:
            raise GateError("allow_destroy entry %r is not a terraform address: %s" % (e, exc))
    whitelist = Whitelist(entries)
    verdict = PlanVerdict()
    for rc in plan.get("resource_changes") or []:
        if not isinstance(rc, Mapping):
            raise GateError("resource_changes holds a non-object: %r" % (rc,))
        address = rc.get("address")
        change = rc.get("change") or {}
        actions = list(change.get("actions") or [])
        if not isinstance(address, str) or not address:
            raise GateError("a resource change has no address: %r" % (rc,))
        deposed = rc.get("deposed")
        shown = address + (" (deposed object %s)" % deposed if deposed else "")
        unknown = [a for a in actions if a not in KNOWN_ACTIONS]
        if unknown or not actions:
            verdict.violations.append(
                "PLAN ACTION NOT UNDERSTOOD: %s has actions %s; refusing" % (shown, json.dumps(actions)))
            continue
        acts = set(actions)
        kind: Optional[str] = None
        if "delete" in acts:
            kind = "replace" if "create" in acts else "delete"
        elif "forget" in acts:
            kind = "forget"
            if "create" in acts:  # create-then-forget (lifecycle destroy = false + replace)
                verdict.creates.append(shown)
        elif "create" in acts:
            kind = "create"
        elif "update" in acts:
            kind = "update"
        else:  # read / no-op
            continue
        {"create": verdict.creates, "update": verdict.updates, "delete": verdict.deletes,
         "replace": verdict.replaces, "forget": verdict.forgets}[kind].append(shown)
        detail = {"address": shown, "actions": actions, "kind": kind}
        if rc.get("action_reason"):
            detail["action_reason"] = rc.get("action_reason")
        verdict.details.append(detail)
        if kind in ("delete", "replace"):
            try:
                entry = whitelist.covering(address)
            except ValueError as exc:
                raise GateError("cannot parse plan address %r: %s" % (address, exc))
            if entry is None:
                verdict.violations.append("DESTROY NOT WHITELISTED: %s" % shown)
            else:
                verdict.whitelisted.append({"address": shown, "entry": entry, "kind": kind})
    return verdict


def plan_content_digest(plan: Mapping[str, Any]) -> str:
    """sha256 over what the plan would do: every resource change that is not a no-op, with
    its address, actions and before/after values (unknowns and sensitivity marks included).

    Two plans with equal digests make the same changes; the AWX approval binds the apply job
    to the plan job's digest (a plan that creates the same address with other values differs)."""
    changes = []
    for rc in plan.get("resource_changes") or []:
        change = rc.get("change") or {}
        actions = list(change.get("actions") or [])
        if actions == ["no-op"]:
            continue
        changes.append({k: v for k, v in (
            ("address", rc.get("address")), ("deposed", rc.get("deposed")), ("actions", actions),
            ("before", change.get("before")), ("after", change.get("after")),
            ("after_unknown", change.get("after_unknown")), ("before_sensitive", change.get("before_sensitive")),
            ("after_sensitive", change.get("after_sensitive"))) if v is not None})
    changes.sort(key=lambda c: (str(c.get("address")), str(c.get("deposed") or "")))
    blob = json.dumps(changes, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def plan_diff(verdict: PlanVerdict) -> Dict[str, str]:
    """``before``/``after`` text for Ansible's diff mode (one line per touched address)."""
    before: List[str] = []
    after: List[str] = []
    for d in verdict.details:
        a, kind = d["address"], d["kind"]
        if kind == "create":
            after.append("%s (created)" % a)
        elif kind == "update":
            before.append(a)
            after.append("%s (updated in place)" % a)
        elif kind == "delete":
            before.append(a)
        elif kind == "replace":
            before.append(a)
            after.append("%s (replaced: %s)" % (a, " then ".join(d["actions"])))
        elif kind == "forget":
            before.append(a)
            after.append("%s (forgotten: left in place, no longer managed)" % a)
    return {
        "before_header": "resources touched by the plan (now)",
        "after_header": "resources after the plan (%s)" % verdict.summary(),
        "before": "".join(x + "\n" for x in sorted(before)),
        "after": "".join(x + "\n" for x in sorted(after)),
    }


# --------------------------------------------------------------------------------------
# Unmount receipts
# --------------------------------------------------------------------------------------

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+=-]*$")


def _check_name(kind: str, name: str, spec: str) -> None:
    if (not name or "/" in name or "\\" in name or ".." in name or os.sep in name
            or (os.altsep and os.altsep in name) or not _SAFE_NAME.match(name)):
        raise GateError("require_unmounted %r: %s name %r is not a plain name" % (spec, kind, name))


def _parse_time(value: Any) -> Optional[_dt.datetime]:
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        t = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t


def check_receipts(require_unmounted: Iterable[str], receipts_dir: str,
                   not_before: Optional[str] = None) -> List[str]:
    """Refusal lines for every ``instance:storage`` without a successful unmount receipt.

    A receipt is ``<receipts_dir>/<instance>__<storage>.json``: valid JSON, an object
    whose ``instance``/``storage`` match and whose ``ok`` is ``true``. With
    ``not_before`` (ISO time, the binding's opening) the receipt's ``time`` must be at or
    after it, so a receipt left by an earlier run does not count.
    """
    problems: List[str] = []
    floor = _parse_time(not_before) if not_before else None
    for spec in require_unmounted or ():
        if not isinstance(spec, str) or spec.count(":") != 1:
            raise GateError("require_unmounted entry %r is not <instance>:<storage>" % (spec,))
        instance, storage = spec.split(":")
        _check_name("instance", instance, spec)
        _check_name("storage", storage, spec)
        head = "DETACH NOT UNMOUNTED: %s:%s has no successful unmount receipt" % (instance, storage)
        path = os.path.join(receipts_dir, "%s__%s.json" % (instance, storage))
        why = None
        try:
            with open(path, "r", encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            why = "no %s" % path
            data = None
        except (OSError, ValueError) as exc:
            why = "%s is unreadable or not JSON (%s)" % (path, exc.__class__.__name__)
            data = None
        if why is None:
            if not isinstance(data, dict):
                why = "%s is not a JSON object" % path
            elif data.get("instance") != instance or data.get("storage") != storage:
                why = "%s is for %s:%s" % (path, data.get("instance"), data.get("storage"))
            elif data.get("ok") is not True:
                why = "%s says ok: %s" % (path, json.dumps(data.get("ok")))
            elif floor is not None:
                t = _parse_time(data.get("time"))
                if t is None:
                    why = "%s has no valid time" % path
                elif t.replace(microsecond=0) < floor.replace(microsecond=0):
                    why = "%s is from %s, before this plan was opened (%s)" % (
                        path, data.get("time"), not_before)
        if why is not None:
            problems.append("%s (%s; unmount storage first, or confirm it was never mounted)" % (head, why))
    return problems


# --------------------------------------------------------------------------------------
# Root digest
# --------------------------------------------------------------------------------------

_EXCLUDED_DIRS = {".terraform", "unmount-receipts", "terraform.tfstate.d"}
_EXCLUDED_FILE_GLOBS = ("*.tfstate", "*.tfstate.backup", "tfplan", "tfplan.*", "*.tfplan", "*.tfplan.*",
                        "*" + BINDING_SUFFIX, "crash.log", "crash.*.log")
_KEPT_HIDDEN = {".terraform.lock.hcl"}


def _sha256_file(path: str) -> str:
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
    except (OSError, ValueError) as exc:
        raise GateError("cannot read %s: %s" % (path, exc))
    dirs: List[str] = []
    for m in (data or {}).get("Modules") or []:
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
        out[rel] = _sha256_file(full)
        owner[os.path.realpath(full)] = rel
    mj = os.path.join(root, ".terraform", "modules", "modules.json")
    if os.path.isfile(mj):
        out[".terraform/modules/modules.json"] = _sha256_file(mj)
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
            out[name] = _sha256_file(full)
    return out


def _combine(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
        h.update(str(files[name]).encode("ascii"))
        h.update(b"\n")
    return h.hexdigest()


def root_digest(project_path: str, plan_file: Optional[str] = None) -> str:
    """sha256 over the sorted names and contents of :func:`root_files`."""
    return _combine(root_files(project_path, plan_file))


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


# --------------------------------------------------------------------------------------
# Binding file
# --------------------------------------------------------------------------------------

def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _abs_plan(project_path: str, plan_file: str) -> str:
    return os.path.normpath(plan_file if os.path.isabs(plan_file) else os.path.join(project_path, plan_file))


def binding_path(plan_path: str) -> str:
    return plan_path + BINDING_SUFFIX


_atomic_write_json = write_json_atomic


def _remove(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def read_binding(plan_path: str) -> Optional[Dict[str, Any]]:
    """The binding of ``plan_path`` or None when there is none (or it is unreadable)."""
    try:
        with open(binding_path(plan_path), "r", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != BINDING_VERSION or not isinstance(data.get("opened"), dict):
        return None
    return data


def open_binding(project_path: str, plan_file: str = "tfplan", check_mode: bool = False) -> Dict[str, Any]:
    """Remove the old plan and binding, record the root's content. Run just BEFORE the plan."""
    root = os.path.abspath(project_path)
    plan_path = _abs_plan(root, plan_file)
    files = root_files(root, plan_path)
    opened = {
        "time": _now(),
        "nonce": secrets.token_hex(16),
        "root_digest": _combine(files),
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
        _atomic_write_json(binding_path(plan_path), binding)
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


def _stale_root_message(plan_file: str, binding: Mapping[str, Any], now_files: Mapping[str, str]) -> Optional[str]:
    opened = binding["opened"]
    if _combine(now_files) == opened.get("root_digest"):
        return None
    changed = describe_file_changes(opened.get("files") or {}, now_files) or ["(the recorded file list is damaged)"]
    return ("STALE PLANFILE: %s is older than the root: %s changed since the plan was opened at %s"
            " -- re-run the plan" % (plan_file, ", ".join(changed), opened.get("time")))


def _check_binding_matches(plan_file: str, binding: Mapping[str, Any], root: str, plan_path: str) -> Optional[str]:
    if binding.get("project_path") != root or binding.get("plan_file") != plan_path:
        return ("STALE PLANFILE: %s has a binding for another root or plan (%s, %s)"
                % (plan_file, binding.get("project_path"), binding.get("plan_file")))
    return None


def verify_binding(project_path: str, plan_file: str = "tfplan") -> Dict[str, Any]:
    """Check, just BEFORE apply, that ``plan_file`` is the one the gate passed for this root as it is now."""
    root = os.path.abspath(project_path)
    plan_path = _abs_plan(root, plan_file)
    if not os.path.isfile(plan_path):
        raise GateRefused(["STALE PLANFILE: %s does not exist — the plan step did not produce it" % plan_file])
    binding = read_binding(plan_path)
    if binding is None:
        raise GateRefused(["STALE PLANFILE: %s has no binding (%s missing or unreadable): open the binding, "
                           "plan and gate again" % (plan_file, binding_path(plan_path))])
    msg = _check_binding_matches(plan_file, binding, root, plan_path)
    if msg:
        raise GateRefused([msg])
    gate = binding.get("gate")
    if not isinstance(gate, dict) or not gate.get("plan_sha256"):
        raise GateRefused(["STALE PLANFILE: %s has not passed the gate since the plan was opened at %s"
                           % (plan_file, binding["opened"].get("time"))])
    now_sha = _sha256_file(plan_path)
    if now_sha != gate["plan_sha256"]:
        raise GateRefused(["STALE PLANFILE: %s changed after the gate passed it (sha256 %s at the gate, %s now)"
                           % (plan_file, gate["plan_sha256"], now_sha)])
    stale = _stale_root_message(plan_file, binding, root_files(root, plan_path))
    if stale:
        raise GateRefused([stale])
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
    }


# --------------------------------------------------------------------------------------
# The gate
# --------------------------------------------------------------------------------------

def show_plan_json(plan_path: str, project_path: str, binary_path: str = "terraform",
                   env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """``<binary_path> show -json <plan_path>`` run in ``project_path`` with the collection's CLI config."""
    run_env = terraform_env(env)
    try:
        proc = subprocess.run([binary_path, "show", "-json", "-no-color", plan_path], cwd=project_path,
                              env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    except OSError as exc:
        raise GateError("cannot run %s: %s" % (binary_path, exc))
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()[-2000:]
        raise GateError("%s show -json %s failed (exit %d): %s" % (binary_path, plan_path, proc.returncode, err))
    try:
        return json.loads(proc.stdout.decode("utf-8"))
    except ValueError as exc:
        raise GateError("%s show -json %s printed no JSON: %s" % (binary_path, plan_path, exc))


def run_gate(project_path: Optional[str] = None, plan_file: Optional[str] = None, *,
             plan_json: Optional[str] = None, binary_path: str = "terraform",
             allow_destroy: Iterable[str] = (), require_unmounted: Iterable[str] = (),
             receipts_dir: Optional[str] = None, receipts_since_binding: bool = True,
             check_mode: bool = False, env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """Evaluate a plan; return the verdict or raise :class:`GateRefused` / :class:`GateError`.

    With ``plan_file`` (the real path) the plan must exist and carry an open binding
    whose root content is unchanged; a pass records the plan's sha256 and the verdict
    in the binding (not in check mode), a refusal clears any earlier gate record.
    With ``plan_json`` (offline: an already-rendered ``show -json`` file) only the
    destroy and receipt checks run and no binding is involved.
    """
    allow = list(allow_destroy or ())
    required = list(require_unmounted or ())
    if bool(plan_file) == bool(plan_json):
        raise GateError("pass exactly one of plan_file or plan_json")
    root = os.path.abspath(project_path) if project_path else None
    result: Dict[str, Any] = {"changed": False}

    if plan_json:
        rdir = receipts_dir or os.path.join(root or os.getcwd(), "unmount-receipts")
        problems = check_receipts(required, rdir)
        try:
            with open(plan_json, "r", encoding="utf-8") as fh:
                plan = json.load(fh)
        except (OSError, ValueError) as exc:
            raise GateError("cannot read plan JSON %s: %s" % (plan_json, exc))
        verdict = evaluate_plan(plan, allow)
        result.update(verdict.as_result())
        result["diff"] = plan_diff(verdict)
        result["plan_digest"] = plan_content_digest(plan)
        problems += verdict.violations
        if problems:
            result["violations"] = problems
            raise GateRefused(problems, result)
        return result

    if root is None:
        raise GateError("project_path is required with plan_file")
    plan_path = _abs_plan(root, plan_file)  # type: ignore[arg-type]
    result["plan_file"] = plan_path
    result["binding"] = binding_path(plan_path)
    binding = read_binding(plan_path)

    def refuse(messages: List[str]) -> None:
        if binding is not None and not check_mode and binding.get("gate") is not None:
            cleared = dict(binding)
            cleared["gate"] = None
            _atomic_write_json(binding_path(plan_path), cleared)
        result["violations"] = messages
        raise GateRefused(messages, result)

    if not os.path.isfile(plan_path):
        refuse(["STALE PLANFILE: %s does not exist — the plan step did not produce it" % plan_file])
    if binding is None:
        refuse(["STALE PLANFILE: %s has no binding (%s missing or unreadable): csis_plan_binding "
                "state=opened must run just before the plan" % (plan_file, binding_path(plan_path))])
    assert binding is not None
    msg = _check_binding_matches(plan_file, binding, root, plan_path)  # type: ignore[arg-type]
    if msg:
        refuse([msg])
    rdir = receipts_dir or os.path.join(root, "unmount-receipts")
    problems = check_receipts(required, rdir,
                              binding["opened"].get("time") if receipts_since_binding else None)
    stale = _stale_root_message(plan_file, binding, root_files(root, plan_path))  # type: ignore[arg-type]
    if stale:
        refuse(problems + [stale])
    sha_before = _sha256_file(plan_path)
    plan = show_plan_json(plan_path, root, binary_path, env)
    sha_after = _sha256_file(plan_path)
    if sha_before != sha_after:
        refuse(problems + ["STALE PLANFILE: %s changed while the gate read it" % plan_file])
    verdict = evaluate_plan(plan, allow)
    result.update(verdict.as_result())
    result["diff"] = plan_diff(verdict)
    result["plan_sha256"] = sha_after
    result["plan_digest"] = plan_content_digest(plan)
    problems += verdict.violations
    if problems:
        refuse(problems)
    if not check_mode:
        record = dict(binding)
        record["gate"] = {
            "time": _now(),
            "plan_sha256": sha_after,
            "root_digest": binding["opened"]["root_digest"],
            "allow_destroy": allow,
            "require_unmounted": required,
            "verdict": verdict.as_result(),
        }
        _atomic_write_json(binding_path(plan_path), record)
    return result
