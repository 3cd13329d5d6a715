# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The render pipeline: what csis_render does, as one library call (the module only maps
options): validate the tree (the same validation as csis_validate), plan the roots of the
lifecycles, write those that changed, prepare them."""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..apply.workspace import mask_url
from ..config.validate import load_and_validate
from ..errors import ConfigError, Problem
from ..terraform import env_overrides, takes_ephemeral_variables
from . import cascade as cascade_lib
from .plan import LIFECYCLES, RenderOptions, RootPlan
from .roots import plan_roots
from .writer import UNCHANGED, Before, EmitError, before, compare, prepare_roots, restore, vendor_modules, write_root

GENERATED_GITIGNORE = """# written by csis.infra: run output, never commit
.terraform/
*.tfstate
*.tfstate.*
tfplan
*.tfplan
*.csis-binding.json
.apply.log
unmount-receipts/
.workspace/
"""


def _os_errors_named(fn: Callable[..., Dict[str, Any]]) -> Callable[..., Dict[str, Any]]:
    """A file the render cannot write (a read-only or full config root) fails as one message
    naming the path and the reason (EmitError), not as an exception out of the module."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            where = exc.filename or (args[0] if args else kwargs.get("config_root"))
            raise EmitError("%s: cannot render there: %s" % (where, exc.strerror or exc)) from exc
    return wrapper


def _following_roots(tree: Any, meta: Dict[str, Any], lifecycles: Sequence[str], opts: RenderOptions) -> List[RootPlan]:
    """The roots of the lifecycles after the last of ``lifecycles``, as their own dry runs would
    render them; a lifecycle whose roots cannot be planned here is left out (its own run says why)."""
    last = max(LIFECYCLES.index(lc) for lc in lifecycles)
    out: List[RootPlan] = []
    for lc in LIFECYCLES[last + 1:]:
        try:
            out.extend(plan_roots(tree, meta, lc, opts))
        except (ConfigError, EmitError):
            continue
    return out


def preview(meta: Dict[str, Any], markers: Mapping[str, Any]) -> List[Problem]:
    """Put ``markers`` (instance -> pending replacement marker, check mode's preview of
    csis_upgrade) into this render's read of ``meta-state/pins.yaml``; each is refused as
    :func:`..state.record.mark_upgrade` would refuse it (an instance not launched, or ephemeral)."""
    where = "preview_upgrades"
    problems: List[Problem] = []
    launched = (meta.get("launch-params.yaml") or {}).get("instances") or {}
    pins = meta.get("pins.yaml")
    if not isinstance(pins, dict):
        pins = meta["pins.yaml"] = {"instances": {}, "pending_replacements": {}, "upgrades": []}
    pending = pins.setdefault("pending_replacements", {})
    for name, marker in sorted(markers.items()):
        rec = launched.get(name)
        to = marker.get("to") if isinstance(marker, Mapping) else None
        if not isinstance(marker, Mapping):
            problems.append(Problem(where, name, "a marker is a mapping (csis_upgrade's pending), got %s"
                                    % type(marker).__name__))
        elif to is not None and not (isinstance(to, str) and to.startswith("ami-") and to[4:].isalnum()):
            problems.append(Problem(where, "%s.to" % name, "%r is not an AMI id" % (to,)))
        elif not isinstance(rec, Mapping) or not rec.get("launched"):
            problems.append(Problem(where, name, "instance '%s' is not launched "
                                    "(meta-state/launch-params.yaml): nothing to upgrade" % name))
        elif rec.get("ephemeral"):
            problems.append(Problem(where, name, "instance '%s' is ephemeral: nothing to upgrade" % name))
        else:
            pending[name] = dict(marker)
    return problems


def _write_and_prepare(tree: Any, plans: List[RootPlan], ahead: List[RootPlan], results: List[Tuple[RootPlan, Any]],
                       written: List[Before], diffs: List[Dict[str, str]], check_mode: bool, want_diff: bool,
                       dry_run: bool, prepare: bool, workers: int,
                       extra_env: Optional[Mapping[str, str]]) -> Tuple[bool, Optional[Dict[str, Any]], Dict[str, Any]]:
    """Write the roots that changed (each one's files before it into ``written``), vendor the
    modules, prepare the roots; returns (changed, the vendored modules, the prepare commands)."""
    changed = False
    for p in plans + ahead:
        directory = os.path.join(tree.root, p.directory)
        # The emission is terraform-fmt canonical by construction (hcl.py; pinned by
        # tests/unit/test_render.py::test_emission_is_already_in_fmt_form, and `fmt -check`
        # runs in every prepared root): piping 1000s of files through `terraform fmt` here
        # cost ~2 s at 1,000 instances.
        files = dict(p.files)
        seen: Dict[str, Any] = {}
        res = compare(directory, files, want_diff, seen)
        changed = changed or res.changed
        diffs.extend(res.diff)
        if res.changed and not check_mode:
            was = before(directory, files, seen)  # what compare read of the root, not read again
            write_root(directory, files)  # puts its own root back when it fails
            written.append(was)
        results.append((p, res))
    # Without module_source_base the roots call the collection's own modules, vendored into
    # generated/.modules/<version>/ (before prepare: init reads them). An explicit base wins.
    modules: Optional[Dict[str, Any]] = None
    if plans and tree.config.module_source_base is None:
        modules = vendor_modules(tree.root, check_mode=check_mode, diff=diffs if want_diff else None)
        changed = changed or modules["changed"]
    gi = os.path.join(tree.root, "generated", ".gitignore")
    if plans and not os.path.exists(gi):
        changed = True
        if want_diff:
            diffs.append({"before_header": gi, "after_header": gi, "before": "", "after": GENERATED_GITIGNORE})
        if not check_mode:
            os.makedirs(os.path.dirname(gi), exist_ok=True)
            with open(gi, "w", encoding="utf-8") as fh:
                fh.write(GENERATED_GITIGNORE)
    commands: Dict[str, Any] = {}
    if prepare and not check_mode and plans:
        commands = prepare_roots([(os.path.join(tree.root, p.directory), p.binary, p.backend_file) for p in plans + ahead],
                                 dry_run=dry_run, workers=workers, extra_env=extra_env,
                                 optional=[os.path.join(tree.root, p.directory) for p in ahead])
    return changed, modules, commands


def _put_back(written: List[Before]) -> str:
    """Put the roots a failed render wrote back as they were (:func:`.writer.restore`); what
    to add to its message."""
    if not written:
        return ""
    left = []
    for was in reversed(written):
        try:
            restore(was)
        except OSError as exc:
            left.append("%s (%s)" % (was.directory, exc.strerror or exc))
    if left:
        return ("\n(the roots this render wrote were put back as they were, but for %s: each is a whole new "
                "root; the next render writes it again)" % "; ".join(left))
    return "\n(the %d root%s this render wrote %s put back as %s were)" % (
        len(written), "" if len(written) == 1 else "s", "was" if len(written) == 1 else "were",
        "it" if len(written) == 1 else "they")


@_os_errors_named
def render(config_root: str, lifecycles: Sequence[str], dry_run: bool = True, only_runtime: Optional[str] = None,
           apply_runtime: Optional[str] = None, overlays: Iterable[str] = (), undeclare: Iterable[str] = (),
           check_mode: bool = False, want_diff: bool = False, prepare: bool = True, workers: int = 4,
           extra_env: Optional[Mapping[str, str]] = None,
           series_heads: Optional[Mapping[str, Any]] = None,
           cascade: Optional[Mapping[str, Any]] = None, prepare_ahead: bool = False,
           only_roots: Optional[Iterable[str]] = None,
           preview_upgrades: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Validate, plan, write and prepare the roots. Raises ConfigError / EmitError.

    ``only_roots`` (root keys, ``<lifecycle>-<builder>``): write and prepare only these roots of
    the render, leave every other root's files as they are (what the record step uses to render a
    root again once its launch pinned an AMI: roles/tofu_root/tasks/record.yml). A key the render
    does not produce is refused.

    ``prepare_ahead`` (a dry run's, without a cascade): also write the roots of the lifecycles
    that follow the last of ``lifecycles`` (identity, storage, instance-image) and validate them
    in a second ``validate`` run beside this run's (:func:`.writer.prepare_roots`'s
    ``optional``), so those lifecycles' own dry runs find them stamped and validate nothing. A
    following root that cannot be rendered or validated is left to its own lifecycle's run, which
    reports it: it never fails this one.

    ``preview_upgrades`` (check mode: the module refuses it in a real run): pending replacement
    markers (instance -> marker, as :func:`..state.record.mark_upgrade` returns it) rendered as if
    meta-state held them, validated as meta-state's own are.

    ``cascade``: one phase of an environment's cascade destroy (render/cascade.py:
    ``environment``, ``phase``, ``ebs``, ``approved``), run over the declaration that phase
    changes for this run, and only the environment's roots."""
    for lc in lifecycles:
        if lc not in LIFECYCLES:
            raise ConfigError([])  # pragma: no cover - the module's choices prevent it
    scope: Dict[str, Any] = {}

    def phase(tree: Any, meta: Dict[str, Any]) -> List[Problem]:
        if cascade_lib.LIFECYCLE.get(str(cascade.get("phase"))) not in (None, *lifecycles):
            return [Problem("", "cascade.phase", "phase '%s' runs the %s lifecycle, not %s" % (
                cascade["phase"], cascade_lib.LIFECYCLE[cascade["phase"]], ", ".join(lifecycles)))]
        scope["runtimes"], scope["identity"], problems = cascade_lib.apply_phase(tree, meta, cascade)
        return problems

    def adjust(tree: Any, meta: Dict[str, Any]) -> List[Problem]:
        problems = preview(meta, preview_upgrades) if preview_upgrades else []
        return problems + (phase(tree, meta) if cascade and not problems else [])

    tree, meta = load_and_validate(config_root, overlays=overlays, undeclare=undeclare,
                                   adjust=adjust if cascade or preview_upgrades else None)
    for name in (only_runtime, apply_runtime):
        if name and tree.runtime(name) is None:
            raise ConfigError([Problem("", "", "runtime '%s' (only_runtime/apply_runtime) is not declared in cfg/runtime-builders.yml" % name)])
    binaries = {ex.binary for ex in tree.executables.values()} | {"terraform"}
    opts = RenderOptions(dry_run=dry_run, only_runtime=only_runtime, apply_runtime=apply_runtime,
                         series_heads=dict(series_heads or {}),
                         ephemeral_binaries=frozenset(b for b in binaries if takes_ephemeral_variables(b)))
    plans: List[RootPlan] = []
    for lc in lifecycles:
        plans.extend(plan_roots(tree, meta, lc, opts))
    if cascade:
        plans, refused = cascade_lib.narrow(tree, meta, plans, scope["runtimes"], scope["identity"],
                                            str(cascade.get("environment")))
        if refused:
            raise ConfigError(refused)
    if only_roots is not None:
        wanted = list(only_roots)
        keys = [p.key for p in plans]
        unknown = [k for k in wanted if k not in keys]
        if unknown:
            raise ConfigError([Problem("", "only_roots", "no root %s in this render (its roots: %s)"
                                       % (", ".join(unknown), ", ".join(keys) or "none"))])
        plans = [p for p in plans if p.key in wanted]
        prepare_ahead = False
    ahead: List[RootPlan] = []
    if prepare_ahead and dry_run and prepare and not cascade and plans:  # check mode: compared, not written
        ahead = _following_roots(tree, meta, lifecycles, opts)
    results: List[Tuple[RootPlan, Any]] = []
    diffs: List[Dict[str, str]] = []
    written: List[Before] = []
    try:
        changed, modules, commands = _write_and_prepare(
            tree, plans, ahead, results, written, diffs, check_mode=check_mode, want_diff=want_diff,
            dry_run=dry_run, prepare=prepare, workers=workers, extra_env=extra_env)
    except BaseException as exc:
        # nothing half-written: when a root fails its init or validate (or a file cannot be
        # written), the render fails and every root it wrote is put back as it was
        note = _put_back(written)
        if isinstance(exc, OSError) and exc.filename in {p.binary for p in plans + ahead}:
            raise EmitError("cannot start terraform '%s' (cfg/executables.yml binary): %s%s"
                            % (exc.filename, exc.strerror or exc, note)) from exc
        if isinstance(exc, OSError):
            raise EmitError("%s: cannot render there: %s%s" % (exc.filename or tree.root, exc.strerror or exc, note)) from exc
        if isinstance(exc, EmitError) and note:
            raise EmitError(str(exc) + note) from exc
        raise

    def done(p: RootPlan) -> List[str]:
        return [c["cmd"] for c in commands.get(os.path.join(tree.root, p.directory), [])]

    # the following roots this run wrote or validated (one unchanged since it was stamped adds nothing)
    # (check mode: the ones it would write)
    prepared_ahead = [{"key": p.key, "directory": p.directory, "changed": res.changed, "commands": done(p)}
                      for p, res in results[len(plans):] if res.changed or (commands and done(p) != [UNCHANGED])]
    roots = []
    for p, res in results[:len(plans)]:
        d = p.as_dict(tree.root)
        d.update({"changed": res.changed, "added": res.added, "removed": res.removed, "modified": res.modified,
                  "commands": done(p),
                  # init -reconfigure against the state backend done here (or by an earlier run with
                  # the same inputs: the prepare stamp), so csis.infra.tofu_root need not init again
                  "initialised": bool(prepare and not check_mode and not dry_run)})
        roots.append(d)
    return {
        "changed": changed,
        "config_root": tree.root,
        "roots": roots,
        "prepared_ahead": prepared_ahead,
        "diff": diffs,
        "tf_env": env_overrides(),
        "warnings": [w for p in plans for w in p.warnings],
        "undeclared": list(tree.undeclared),
        "modules": modules,
        # cfg/_config.yml's approvals: (csis.infra.tofu_root's csis_approval task)
        "approvals": tree.config_file.approvals.model_dump(),
        # cfg/_config.yml's workspace: (csis.infra.tofu_root's csis_workspace tasks); the module
        # reads the repository from the tree itself: the one shown here is masked
        "workspace": None if tree.config_file.workspace is None else dict(
            tree.config_file.workspace.model_dump(), repo=mask_url(tree.config_file.workspace.repo)),
    }
