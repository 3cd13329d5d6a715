# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Write planned roots to disk atomically and prepare them (``fmt -check``, ``init``,
``validate`` through :mod:`..terraform`).

A root directory is replaced as a whole: the new files are staged in a sibling
directory (already in ``terraform fmt`` form), compared with what is in place, and swapped in with two
renames (a killed render leaves the old root, or the new one plus ``.<phase>.old``
that the next render removes; never a mix). Files csis.infra did not generate
(``.terraform/``, the lock file, local state, plan files, receipts) are carried over.
"""
from __future__ import annotations

import concurrent.futures
import difflib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from .. import terraform
from ..errors import CsisError
from ..fsutil import fsync_dir
from . import bundled_modules
from .plan import VENDORED_MODULES

MANIFEST = ".csis-manifest.json"


class EmitError(CsisError):
    pass


@dataclass
class EmitResult:
    directory: str
    changed: bool
    added: List[str] = field(default_factory=list)
    removed: List[str] = field(default_factory=list)
    modified: List[str] = field(default_factory=list)
    diff: List[Dict[str, str]] = field(default_factory=list)
    commands: List[Dict[str, Any]] = field(default_factory=list)


def _read(path: str) -> Optional[str]:
    # a generated file edited by hand into bytes that are no UTF-8 reads as what differs from the
    # rendered text (the render writes the root anew), not as an error
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _manifest(directory: str) -> List[str]:
    text = _read(os.path.join(directory, MANIFEST))
    if not text:
        return []
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return []
    files = data.get("files") if isinstance(data, dict) else None  # not as the render writes it: no list
    return [f for f in files if isinstance(f, str) and "/" not in f and not f.startswith(".")] if isinstance(files, list) else []


def manifest_text(files: Mapping[str, str]) -> str:
    """What :func:`write_root` writes as the root's :data:`MANIFEST` for ``files``."""
    return json.dumps({"generated_by": "csis.infra", "files": sorted(files)}, indent=1, sort_keys=True) + "\n"


def compare(directory: str, files: Mapping[str, str], want_diff: bool,
            seen: Optional[Dict[str, Optional[str]]] = None) -> EmitResult:
    """How ``files`` differ from what ``directory`` holds. ``seen`` (filled when given): each
    file read here, by name (None: not there), and the manifest's names under ``MANIFEST``'s own
    key as a list, for :func:`before` to take instead of reading them again."""
    old_files = _manifest(directory)
    if seen is not None:
        seen[MANIFEST + "/names"] = old_files  # type: ignore[assignment]
    res = EmitResult(directory=directory, changed=False)
    for n in sorted(files):
        cur = _read(os.path.join(directory, n))
        if seen is not None:
            seen[n] = cur
        if cur is None:
            res.added.append(n)
        elif cur != files[n]:
            res.modified.append(n)
        if want_diff and cur != files[n]:
            res.diff.append({"before_header": os.path.join(directory, n), "after_header": os.path.join(directory, n),
                             "before": cur or "", "after": files[n]})
    for n in old_files:
        if n not in files:
            res.removed.append(n)
            if want_diff:
                res.diff.append({"before_header": os.path.join(directory, n), "after_header": "/dev/null",
                                 "before": _read(os.path.join(directory, n)) or "", "after": ""})
    if not os.path.isdir(directory) or not os.path.exists(os.path.join(directory, MANIFEST)):
        res.changed = True
        if want_diff and not (res.added or res.modified or res.removed):  # the one file written there
            path = os.path.join(directory, MANIFEST)
            res.diff.append({"before_header": path, "after_header": path, "before": "", "after": manifest_text(files)})
    res.changed = res.changed or bool(res.added or res.removed or res.modified)
    return res


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_root(directory: str, files: Mapping[str, str]) -> None:
    """Replace ``directory``'s generated files by ``files`` as one swap."""
    parent = os.path.dirname(directory.rstrip("/"))
    base = os.path.basename(directory.rstrip("/"))
    os.makedirs(parent, exist_ok=True)
    old = os.path.join(parent, "." + base + ".old")
    if os.path.isdir(old):
        if not os.path.isdir(directory):
            os.replace(old, directory)  # a swap was interrupted after the first rename
        else:
            shutil.rmtree(old)
    stage = tempfile.mkdtemp(prefix="." + base + ".new-", dir=parent)
    moved: List[str] = []  # the root's run output, in the stage until the swap
    swapped = False
    try:
        for n, text in files.items():
            with open(os.path.join(stage, n), "w", encoding="utf-8") as fh:
                fh.write(text)
        # every file is durable before the swap; fsync them in parallel (one fsync per file
        # in a row was the hot spot of rendering 1,000 instances)
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, max(1, len(files)))) as pool:
            list(pool.map(_fsync_file, [os.path.join(stage, n) for n in files]))
        with open(os.path.join(stage, MANIFEST), "w", encoding="utf-8") as fh:
            fh.write(manifest_text(files))
        if os.path.isdir(directory):
            generated = set(_manifest(directory)) | {MANIFEST}
            for n in os.listdir(directory):
                if n in generated or n in files:
                    continue
                os.replace(os.path.join(directory, n), os.path.join(stage, n))  # .terraform, state, plans ...
                moved.append(n)
        fsync_dir(stage)
        if os.path.isdir(directory):
            os.replace(directory, old)
            os.replace(stage, directory)
            swapped = True
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(stage, directory)
            swapped = True
        fsync_dir(parent)
    except BaseException:
        # a failure (or Ctrl-C) before the swap: the root keeps its files and gets its run output
        # (a local state, .terraform/, plans) back; the stage is removed only once nothing of it
        # is left there (else it stays beside the root, named by the error's path)
        if not swapped and _put_back(directory, old, stage, moved):
            shutil.rmtree(stage, ignore_errors=True)
        raise


@dataclass
class Before:
    """A root's generated files as they were before a render wrote it (:func:`before`), for
    :func:`restore` when the render then fails: ``existed`` (the directory), ``files`` (name ->
    text; ``None`` for a file that was not there)."""
    directory: str
    existed: bool
    files: Dict[str, Optional[str]]
    #: the nearest of the directory's parents that was there (those below it are removed with it)
    kept: str


def before(directory: str, files: Mapping[str, str], seen: Optional[Mapping[str, Any]] = None) -> Before:
    """What :func:`write_root` of ``files`` is about to replace in ``directory``; ``seen``: what
    :func:`compare` read of it just before (not read again)."""
    seen = seen or {}
    listed = seen.get(MANIFEST + "/names")
    names = set(files) | set(listed if listed is not None else _manifest(directory)) | {MANIFEST}
    kept = os.path.dirname(directory.rstrip("/"))
    while kept and not os.path.isdir(kept) and os.path.dirname(kept) != kept:
        kept = os.path.dirname(kept)
    return Before(directory, os.path.isdir(directory),
                  {n: seen[n] if n in seen else _read(os.path.join(directory, n)) for n in names}, kept)


def restore(was: Before) -> None:
    """Put a root back as :func:`before` found it: its generated files (in one swap, its run
    output carried over, as :func:`write_root` does), or no directory at all when there was
    none. Its prepare stamp goes: whatever this render's init did in the root, the next render
    initialises and validates it again."""
    d = was.directory
    if not was.existed:
        shutil.rmtree(d, ignore_errors=True)
        if os.path.exists(d):
            raise OSError(errno.ENOTEMPTY, "cannot be removed", d)
        parent = os.path.dirname(d.rstrip("/"))
        while parent != was.kept and parent.startswith(was.kept + os.sep):  # the folders made for it, if empty
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = os.path.dirname(parent)
        return
    if was.files.get(MANIFEST) is not None:
        write_root(d, {n: t for n, t in was.files.items() if n != MANIFEST and t is not None})
    else:  # a directory the render had not written before: file by file
        for n, text in was.files.items():
            path = os.path.join(d, n)
            if text is None:
                if os.path.lexists(path):
                    os.unlink(path)
            else:
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(text)
    if os.path.lexists(os.path.join(d, STAMP)):
        os.unlink(os.path.join(d, STAMP))


def _put_back(directory: str, old: str, stage: str, moved: Sequence[str]) -> bool:
    """Undo an unfinished swap of :func:`write_root`: the old root back in place, the entries
    moved into the stage back into it. False when any could not be moved back."""
    try:
        if not os.path.isdir(directory) and os.path.isdir(old):
            os.replace(old, directory)
    except OSError:
        return False
    whole = True
    for n in moved:
        try:
            os.replace(os.path.join(stage, n), os.path.join(directory, n))
        except OSError:
            whole = False
    return whole


def _tree_present(directory: str) -> Set[str]:
    """The files under ``directory`` (relative paths with ``/``; hidden directories left out)."""
    present: Set[str] = set()
    for base, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        present.update(os.path.relpath(os.path.join(base, n), directory).replace(os.sep, "/") for n in names)
    return present


def _tree_differs(directory: str, files: Mapping[str, str]) -> bool:
    """Whether ``directory`` holds other than exactly ``files`` (relative paths with ``/``)."""
    if not os.path.isdir(directory):
        return True
    return _tree_present(directory) != set(files) or any(
        _read(os.path.join(directory, *rel.split("/"))) != text for rel, text in files.items())


def tree_diff(directory: str, files: Mapping[str, str]) -> List[Dict[str, str]]:
    """What :func:`write_tree` would change in ``directory``, one diff entry per file (in the
    shape of :func:`compare`'s: added, changed and removed files)."""
    present = _tree_present(directory) if os.path.isdir(directory) else set()
    out: List[Dict[str, str]] = []
    for rel in sorted(present | set(files)):
        path = os.path.join(directory, *rel.split("/"))
        cur = _read(path) if rel in present else None
        new = files.get(rel)
        if cur != new:
            out.append({"before_header": path, "after_header": path if new is not None else "/dev/null",
                        "before": cur or "", "after": new or ""})
    return out


def write_tree(directory: str, files: Mapping[str, str], check_mode: bool = False) -> bool:
    """Make ``directory`` hold exactly ``files`` (``"<sub>/<name>"`` -> text); return whether it
    changed. Written only when it differs, staged in a sibling and swapped in with renames:
    a reader (terraform init in another root) sees the old tree or the new one, never a mix."""
    if not _tree_differs(directory, files):
        return False
    if check_mode:
        return True
    parent = os.path.dirname(directory.rstrip("/"))
    base = os.path.basename(directory.rstrip("/"))
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix="." + base + ".new-", dir=parent)
    old = tempfile.mkdtemp(prefix="." + base + ".old-", dir=parent)
    try:
        for rel, text in files.items():
            path = os.path.join(stage, *rel.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        for sub in sorted({os.path.dirname(os.path.join(stage, *rel.split("/"))) for rel in files}):
            fsync_dir(sub)
        if os.path.isdir(directory):
            os.replace(directory, os.path.join(old, base))
        try:
            os.replace(stage, directory)
        except OSError:
            # another render put its copy in place meanwhile: keep it when it is the same
            if _tree_differs(directory, files):
                raise
        fsync_dir(parent)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return True


def vendor_modules(config_root: str, check_mode: bool = False,
                   diff: Optional[List[Dict[str, str]]] = None) -> Dict[str, Any]:
    """Put the collection's terraform modules (:mod:`.bundled_modules`) into the tree's
    ``generated/.modules/<version>/``, where roots rendered without ``module_source_base``
    call them by relative paths. Rewritten only when they differ; other versions are kept
    (roots of another lifecycle may still call them until re-rendered). With ``diff`` (a
    list), what changes is appended to it first (:func:`tree_diff`)."""
    directory = os.path.join(config_root, VENDORED_MODULES)
    if diff is not None:
        diff.extend(tree_diff(directory, bundled_modules.FILES))
    changed = write_tree(directory, bundled_modules.FILES, check_mode=check_mode)
    return {"directory": directory, "version": bundled_modules.VERSION, "changed": changed}


STAMP = os.path.join(".terraform", "csis-prepared.json")


def _module_dirs(plan_dir: str) -> List[str]:
    """Local module directories a root calls (from the generated files' ``source`` lines)."""
    out = set()
    for n in _manifest(plan_dir):
        if not n.endswith(".tf"):
            continue
        for line in (_read(os.path.join(plan_dir, n)) or "").splitlines():
            line = line.strip()
            if line.startswith("source") and "=" in line:
                src = line.split("=", 1)[1].strip().strip('"')
                if src.startswith("."):
                    out.add(os.path.normpath(os.path.join(plan_dir, src)))
    return sorted(out)


def _module_dir_digest(h: Any, d: str) -> None:
    for base, dirs, names in os.walk(d):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        for n in sorted(names):
            p = os.path.join(base, n)
            h.update(p.encode() + b"\0" + (_read(p) or "").encode() + b"\0")


def _module_dirs_digest(h: Any, plan_dir: str) -> None:
    for d in _module_dirs(plan_dir):
        _module_dir_digest(h, d)


def prepare_key(plan_dir: str, binary: str, dry_run: bool) -> str:
    """What a successful fmt/init/validate depended on: the root's files, the modules it
    calls, the binary and the kind of init."""
    h = hashlib.sha256()
    h.update(("%s|%s|" % (binary, dry_run)).encode())
    for n in sorted(_manifest(plan_dir)):
        h.update(n.encode() + b"\0" + (_read(os.path.join(plan_dir, n)) or "").encode() + b"\0")
    _module_dirs_digest(h, plan_dir)
    return h.hexdigest()


#: a top-level block's first line in a generated (fmt-formatted) file
_BLOCK = re.compile(r'^(terraform|provider|module|resource|data)\b[^\n]*\{$')
#: the lines of a ``module`` block that ``terraform init`` reads (its own arguments: fmt indents them by two)
_MODULE_INIT_LINE = re.compile(r'^  (source|version) *=')


def init_inputs(plan_dir: str) -> List[str]:
    """The parts of a root's generated files that ``terraform init`` depends on: every
    ``terraform`` block whole (required providers, backend), each ``module`` call's name,
    ``source`` and ``version``, and the first line of every ``provider``, ``resource`` and ``data``
    block (a resource type implies its provider). The arguments of module calls and resources,
    the variables, the launch scripts are not: a change to those needs no new ``init``."""
    out: List[str] = []
    for n in sorted(_manifest(plan_dir)):
        if not n.endswith(".tf"):
            continue
        kind = None
        for line in (_read(os.path.join(plan_dir, n)) or "").splitlines():
            if kind is None:
                m = _BLOCK.match(line)
                if m:
                    kind = m.group(1)
                    out.append("%s: %s" % (n, line))
                continue
            if line == "}":
                kind = None
            elif kind == "terraform" or (kind == "module" and _MODULE_INIT_LINE.match(line)):
                out.append("%s: %s" % (n, line))
    return out


#: a module block's first line as :func:`init_inputs` gives it (``<file>: module "<name>" {``)
_MODULE_INPUT = re.compile(r'^[^:]+: module "([^"]+)" \{$')


def init_state(plan_dir: str, binary: str, dry_run: bool, backend_file: Optional[str]) -> Dict[str, Any]:
    """What a successful ``init`` of ``plan_dir`` depends on, in three parts: ``base``, a digest of
    everything but the module calls (the binary, the kind of init, the ``terraform`` blocks, the
    provider, resource and data blocks' first lines, the backend file); ``calls``, each module
    call's ``source`` and ``version`` lines by call name; ``dirs``, a digest of each local module
    directory the root calls (:func:`init_inputs` has the lines). Stamped after the init
    (:func:`_init_holds` compares a root's state with what its ``.terraform/`` holds)."""
    h = hashlib.sha256()
    h.update(("%s|%s|" % (binary, dry_run)).encode())
    calls: Dict[str, str] = {}
    call = None
    for line in init_inputs(plan_dir):
        m = _MODULE_INPUT.match(line)
        text = line.split(": ", 1)[1]
        if m:
            call = m.group(1)
            calls[call] = ""
        elif call is not None and _MODULE_INIT_LINE.match(text):
            calls[call] += text.strip() + "\n"
        else:
            call = None
            h.update(line.encode() + b"\n")
    if backend_file:
        path = backend_file if os.path.isabs(backend_file) else os.path.join(plan_dir, backend_file)
        h.update(path.encode() + b"\0" + (_read(path) or "").encode() + b"\0")
    dirs = {}
    for d in _module_dirs(plan_dir):
        dh = hashlib.sha256()
        _module_dir_digest(dh, d)
        dirs[d] = dh.hexdigest()
    return {"base": h.hexdigest(), "calls": calls, "dirs": dirs}


def _init_holds(held: Any, now: Mapping[str, Any]) -> bool:
    """Whether a root's ``.terraform/``, initialised with ``held`` (its stamp's :func:`init_state`),
    serves a root whose state is ``now`` with no new ``init``: everything but the module calls
    is the same, and every module call and module directory ``now`` names was installed as it is
    now. A call removed since (a detach, a decommission, a cascade phase) needs no init: terraform
    ignores a module its ``modules.json`` lists and the configuration no longer calls. An older
    stamp (one digest) holds nothing: the root is initialised once more."""
    if not isinstance(held, dict) or held.get("base") != now["base"]:
        return False
    calls, dirs = held.get("calls"), held.get("dirs")
    if not isinstance(calls, dict) or not isinstance(dirs, dict):
        return False
    return (all(calls.get(name) == lines for name, lines in now["calls"].items())
            and all(dirs.get(d) == digest for d, digest in now["dirs"].items()))


UNCHANGED = "(unchanged since the last successful fmt/init/validate)"
INIT_UNCHANGED = "(init: not needed: what it reads is unchanged since the last successful init, or only module calls were removed)"


def _kind(dry_run: bool) -> str:
    return "dry" if dry_run else "real"


def _read_stamp(plan_dir: str) -> Dict[str, Any]:
    """The stamp: ``dry`` and ``real``, the prepare key of the root's last successful dry and
    real preparation (:func:`prepare_key`; each kind keeps its own, so a dry run between two real
    runs costs the second no init, nor a real run between two dry runs the second a validate),
    and ``init``, what ``.terraform/`` holds (:func:`init_state`; a digest in older stamps). An
    older stamp has one ``key`` (of either kind: the key says which) or is that key alone on a line."""
    text = (_read(os.path.join(plan_dir, STAMP)) or "").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return {"key": text} if text else {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str) or (k == "init" and isinstance(v, dict))}


def prepared_for_a_real_run(plan_dir: str) -> bool:
    """Whether a real run's render prepared the root (``init`` against its backend, or for a root
    with no backend block, its local state) and no dry run's ``init`` in the root replaced it since:
    its stamp holds a ``real`` key."""
    return bool(_read_stamp(plan_dir).get("real"))


def _stamped(stamp: Mapping[str, Any], dry_run: bool, key: str) -> bool:
    """Whether the root was prepared successfully, for this kind of run, with the inputs of ``key``."""
    return key in (stamp.get(_kind(dry_run)), stamp.get("key"))


def _write_stamp(plan_dir: str, dry: Optional[str] = None, real: Optional[str] = None,
                 init: Any = None) -> None:
    stamp = os.path.join(plan_dir, STAMP)
    os.makedirs(os.path.dirname(stamp), exist_ok=True)
    data = {k: v for k, v in (("dry", dry), ("real", real), ("init", init)) if v}
    with open(stamp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, sort_keys=True) + "\n")


def _stamp_kind(plan_dir: str, dry_run: bool, key: str, old: Mapping[str, Any], init: Any,
                keep_other: bool = True) -> None:
    """Stamp a successful preparation of this kind; the other kind's key stays when ``keep_other``
    (a real run's init leaves a dry run's validation true; a dry run's init in the root itself
    replaces what a real run's init left there, so its real key goes)."""
    other = "real" if dry_run else "dry"
    keys = {_kind(dry_run): key, other: old.get(other) if keep_other else None}
    _write_stamp(plan_dir, dry=keys["dry"], real=keys["real"], init=init)


def _drop_stamp(plan_dir: str) -> None:
    try:
        os.unlink(os.path.join(plan_dir, STAMP))
    except OSError:
        pass


def _failed(plan_dir: str, r: Mapping[str, Any]) -> EmitError:
    _drop_stamp(plan_dir)
    return EmitError("%s: '%s' failed (rc %d): %s"
                     % (plan_dir, r["cmd"], r["rc"], (r["stderr"] or r["stdout"]).strip()[-2000:]))


#: where ``terraform init`` keeps a root's backend settings (not its state: the backend holds that)
BACKEND_SETTINGS = os.path.join(".terraform", "terraform.tfstate")


def drop_torn_backend_settings(plan_dir: str) -> bool:
    """Remove ``.terraform/terraform.tfstate`` when it is not whole JSON; True when removed.

    ``terraform init`` writes that file in place, so a run killed during an init (SIGKILL, a lost
    machine) can leave it cut short, and every later ``init`` then fails with "Failed to load
    state: invalid syntax" instead of converging. It holds only the root's backend settings,
    which ``init -reconfigure`` writes again from the backend file; the state itself is in the
    backend and is not touched."""
    path = os.path.join(plan_dir, BACKEND_SETTINGS)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return False
    try:
        if isinstance(json.loads(data.decode("utf-8")), dict):
            return False
    except (ValueError, UnicodeDecodeError):
        pass
    os.remove(path)
    return True


def _init(plan_dir: str, binary: str, args: Sequence[str], extra_env: Optional[Mapping[str, str]],
          fills_cache: bool, cache_filled: Optional[threading.Event] = None) -> Dict[str, Any]:
    """``terraform init`` (``args``) in ``plan_dir``, under the plugin cache lock."""
    # a run killed during this init leaves no stamp whose init state would skip the next
    _drop_stamp(plan_dir)
    # a run killed during an earlier init may have cut the backend settings short
    drop_torn_backend_settings(plan_dir)
    # the first init of a batch may fill the shared plugin cache: alone; the others wait for
    # it, then share the lock (they only link what the cache holds)
    if cache_filled is not None and not fills_cache:
        cache_filled.wait()
    try:
        with terraform.plugin_cache_lock(exclusive=fills_cache, env=dict(os.environ, **(extra_env or {}))):
            return terraform.run(binary, args, plan_dir, extra_env)
    finally:
        if cache_filled is not None and fills_cache:
            cache_filled.set()


def prepare_root(plan_dir: str, binary: str, dry_run: bool, backend_file: Optional[str],
                 extra_env: Optional[Mapping[str, str]] = None, force: bool = False,
                 fills_cache: bool = True, cache_filled: Optional[threading.Event] = None,
                 defer_validate: bool = False) -> List[Dict[str, Any]]:
    """fmt, init, validate in one root; raises EmitError naming the failing command.

    Skipped when the same root was already prepared successfully with the same inputs
    (a stamp in ``.terraform/``), so re-rendering an unchanged tree costs no provider load.
    ``defer_validate`` (a dry run's): stop after ``fmt`` and write no stamp; :func:`prepare_roots`
    validates such roots together, which needs no init of each root, or initialises and
    validates one alone (:func:`_validate_alone`).
    """
    key = prepare_key(plan_dir, binary, dry_run)
    stamp = {} if force else _read_stamp(plan_dir)
    if _stamped(stamp, dry_run, key):
        if cache_filled is not None and fills_cache:
            cache_filled.set()
        return [{"cmd": UNCHANGED, "rc": 0, "stdout": "", "stderr": ""}]
    inow = init_state(plan_dir, binary, dry_run, backend_file)
    # the files changed, not what init reads (a module argument, a launch script), or only by
    # module calls removed: no init, and the stamp keeps what .terraform/ holds
    init_done = _init_holds(stamp.get("init"), inow)
    done = []
    for args in terraform.prepare_steps(dry_run, backend_file):
        if defer_validate and args[0] in ("init", "validate"):
            if args[0] == "init" and init_done:
                done.append({"cmd": INIT_UNCHANGED, "rc": 0, "stdout": "", "stderr": ""})
            continue
        if init_done and args[0] == "init":
            done.append({"cmd": INIT_UNCHANGED, "rc": 0, "stdout": "", "stderr": ""})
            continue
        if args[0] == "init":
            r = _init(plan_dir, binary, args, extra_env, fills_cache, cache_filled)
        else:
            r = terraform.run(binary, args, plan_dir, extra_env)
        done.append(r)
        if r["rc"] != 0:
            if cache_filled is not None and fills_cache:
                cache_filled.set()
            raise _failed(plan_dir, r)
    if cache_filled is not None and fills_cache:
        cache_filled.set()  # a deferred or unchanged init filled nothing
    if not defer_validate:
        # a dry run that initialised the root itself replaced a real run's init there
        _stamp_kind(plan_dir, dry_run, key, stamp, stamp.get("init") if init_done else inow,
                    keep_other=not dry_run or init_done)
    return done


VARIABLE_LINE = re.compile(r'^variable "([A-Za-z_][A-Za-z0-9_-]*)" \{', re.M)


def _declared_variables(plan_dir: str) -> List[str]:
    """The input variables a rendered root declares (its files are in fmt form: one
    ``variable "<name>" {`` line each)."""
    out: List[str] = []
    for n in _manifest(plan_dir):
        if n.endswith(".tf"):
            out.extend(VARIABLE_LINE.findall(_read(os.path.join(plan_dir, n)) or ""))
    return out


def validate_together(binary: str, dirs: Sequence[str],
                      extra_env: Optional[Mapping[str, str]] = None) -> Optional[Dict[str, Any]]:
    """``validate`` many roots in ONE terraform process: a temporary root outside the tree,
    initialised once (the roots need no init of their own), calls each of them as a module
    (every input variable passed as an unknown value, as ``validate`` treats a root's own
    inputs), so the provider's checksum and schema are loaded once instead of once per root
    (most of a validate's CPU).

    Returns the validate command's result when terraform says every root is valid, else
    None: the caller then validates each root alone, for its own message (a root that only
    a root module may hold, an ``import`` block say, fails here and passes there)."""
    work = os.path.realpath(tempfile.mkdtemp(prefix="csis-validate-"))  # terraform walks ../ from the real cwd
    try:
        text = []
        for i, d in enumerate(dirs):
            names = _declared_variables(d)
            text.extend('variable "r%d_%s" {}\n' % (i, n) for n in names)
            text.append('module "root_%d" {\n  source = %s\n%s}\n' % (
                i, json.dumps(os.path.relpath(os.path.realpath(d), work)), "".join("  %s = var.r%d_%s\n" % (n, i, n) for n in names)))
        with open(os.path.join(work, "main.tf"), "w", encoding="utf-8") as fh:
            fh.write("".join(text))
        # the roots themselves are not initialised first: this init may be the one that fills the cache
        with terraform.plugin_cache_lock(exclusive=True, env=dict(os.environ, **(extra_env or {}))):
            init = terraform.run(binary, ["init", "-input=false", "-no-color", "-backend=false"], work, extra_env)
        if init["rc"] != 0:
            return None
        # exit 0: valid (the modules' "Backend configuration ignored" warnings aside)
        r = terraform.run(binary, ["validate", "-no-color"], work, extra_env)
        return r if r["rc"] == 0 else None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _backend_recorded(plan_dir: str) -> bool:
    """Whether a real run's ``init`` recorded a backend in the root's data directory."""
    try:
        data = json.loads(_read(os.path.join(plan_dir, ".terraform", "terraform.tfstate")) or "{}")
    except ValueError:
        return False
    return isinstance(data, dict) and bool(data.get("backend"))


def _validate_alone(plan_dir: str, binary: str, dry_run: bool, backend_file: Optional[str],
                    extra_env: Optional[Mapping[str, str]], initialised: bool) -> List[Dict[str, Any]]:
    """``validate`` one root (its ``init`` first unless ``initialised``), then stamp it.

    A dry run reaches no backend. In a root that a real run initialised, ``init -backend=false``
    would use the backend recorded there ("what was previously initialized": the S3 state bucket,
    with credentials), so the dry run's init and validate run in a data directory of their own
    (``TF_DATA_DIR``, removed after), and the real run's initialisation and init stamp stay."""
    old = _read_stamp(plan_dir)  # the init drops the stamp while it runs
    if dry_run and _backend_recorded(plan_dir):
        scratch = tempfile.mkdtemp(prefix="csis-dry-validate-")
        try:
            done = _init_and_validate(plan_dir, binary, dry_run, backend_file,
                                      dict(extra_env or {}, TF_DATA_DIR=scratch), False)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        # the real run's initialisation is as it was: its init state and real key stay
        _stamp_kind(plan_dir, dry_run, prepare_key(plan_dir, binary, dry_run), old, old.get("init"))
        return done
    done = _init_and_validate(plan_dir, binary, dry_run, backend_file, extra_env, initialised)
    held = old.get("init") if initialised else init_state(plan_dir, binary, dry_run, backend_file)
    _stamp_kind(plan_dir, dry_run, prepare_key(plan_dir, binary, dry_run), old, held,
                keep_other=not dry_run or initialised)
    return done


def _init_and_validate(plan_dir: str, binary: str, dry_run: bool, backend_file: Optional[str],
                       extra_env: Optional[Mapping[str, str]], initialised: bool) -> List[Dict[str, Any]]:
    """The root's ``init`` (unless ``initialised``) and ``validate``; raises EmitError naming the failing one."""
    done = []
    if not initialised:
        init = next(a for a in terraform.prepare_steps(dry_run, backend_file) if a[0] == "init")
        r = _init(plan_dir, binary, init, extra_env, fills_cache=True)
        done.append(r)
        if r["rc"] != 0:
            raise _failed(plan_dir, r)
    r = terraform.run(binary, ["validate", "-no-color"], plan_dir, extra_env)
    done.append(r)
    if r["rc"] != 0:
        raise _failed(plan_dir, r)
    return done


def prepare_roots(items: Sequence[Tuple[str, str, Optional[str]]], dry_run: bool, workers: int = 4,
                  extra_env: Optional[Mapping[str, str]] = None,
                  optional: Collection[str] = ()) -> Dict[str, List[Dict[str, Any]]]:
    """fmt/init/validate many roots in parallel: [(directory, binary, backend_file)].

    In a dry run the roots that need a ``validate`` (not stamped) are validated together, one
    terraform process per binary (:func:`validate_together`), and are not initialised one by
    one (the temporary root that calls them is, once); when that run fails, or a binary has
    one such root, each is initialised (unless an earlier init still holds) and validated
    alone, in parallel. A root already prepared with the same inputs is never validated again.

    ``optional`` (a dry run's roots of the lifecycles that follow, ``pipeline.render``'s
    ``prepare_ahead``): validated together in a run of their own beside this run's, and stamped
    only when it passes; never alone, and never an error here (their own lifecycle's render
    prepares them again and reports what fails)."""
    out: Dict[str, List[Dict[str, Any]]] = {}
    errors: List[str] = []
    optional = frozenset(optional)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        # the first root's init fills the plugin cache alone; the other roots' inits start when
        # it is done (or when the first root needed none) and share the cache lock
        first_done = threading.Event()
        backend_files = {d: bf for d, _b, bf in items}
        futs = {pool.submit(prepare_root, d, b, dry_run, bf, extra_env, False, i == 0, first_done, dry_run): (d, b)
                for i, (d, b, bf) in enumerate(items)}
        for fut in futs:  # the first root ends however it ends: never leave the others waiting
            fut.add_done_callback(lambda _f: first_done.set())
            break
        pending: Dict[str, List[str]] = {}
        for fut in concurrent.futures.as_completed(futs):
            d, b = futs[fut]
            try:
                out[d] = fut.result()
            except EmitError as exc:
                if d not in optional:
                    errors.append(str(exc))
                continue
            if dry_run and out[d][0]["cmd"] != UNCHANGED:
                pending.setdefault(b, []).append(d)
        # one validate run per binary for this run's roots, and another, beside it, for the
        # following lifecycles' (optional): the two use both cores, and a failure of the latter
        # is theirs alone
        groups: Dict[Tuple[str, bool], List[str]] = {}
        for b, dirs in pending.items():
            for d in dirs:
                groups.setdefault((b, d in optional), []).append(d)
        tfuts: Dict[Any, Tuple[str, bool, List[str]]] = {}
        vfuts: Dict[Any, str] = {}
        for (b, opt), dirs in sorted(groups.items()):
            dirs.sort()
            if len(dirs) > 1 or opt:
                tfuts[pool.submit(validate_together, b, dirs, extra_env)] = (b, opt, dirs)
            else:
                vfuts[pool.submit(_validate_alone, dirs[0], b, dry_run, backend_files[dirs[0]], extra_env,
                                  _initialised(out[dirs[0]]))] = dirs[0]
        for fut in concurrent.futures.as_completed(tfuts):
            b, opt, dirs = tfuts[fut]
            together = fut.result()
            if together is None:
                if not opt:
                    for d in dirs:
                        vfuts[pool.submit(_validate_alone, d, b, dry_run, backend_files[d], extra_env,
                                          _initialised(out[d]))] = d
                continue
            cmd = "%s validate -no-color (one run for %d root%s)" % (os.path.basename(b), len(dirs),
                                                                     "" if len(dirs) == 1 else "s")
            for d in dirs:
                # validated in a root of its own: the root's .terraform/ (a real run's init, say)
                # and what the stamp says of it are as they were
                old = _read_stamp(d)
                _stamp_kind(d, dry_run, prepare_key(d, b, dry_run), old, old.get("init"))
                out[d].append(dict(together, cmd=cmd))
        for fut in concurrent.futures.as_completed(vfuts):
            try:
                out[vfuts[fut]].extend(fut.result())
            except EmitError as exc:
                errors.append(str(exc))
    if errors:
        raise EmitError("\n".join(sorted(errors)))
    return out


def _initialised(commands: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a root's prepared commands include an init (run now, or still holding)."""
    return any(c["cmd"] == INIT_UNCHANGED or c["cmd"].split()[1:2] == ["init"] for c in commands)


def unified(diff: Mapping[str, str]) -> str:
    return "".join(difflib.unified_diff(diff["before"].splitlines(True), diff["after"].splitlines(True),
                                        diff["before_header"], diff["after_header"]))


def digest(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for n in sorted(files):
        h.update(n.encode() + b"\0" + files[n].encode() + b"\0")
    return h.hexdigest()
