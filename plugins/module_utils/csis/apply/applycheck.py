# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The execution-time apply guard (``apply-check``).

Just before an apply, re-read ``cfg/_config.yml`` and each overlay's ``config:``
mapping as they are NOW (plain ``yaml.safe_load``, no model), and refuse unless the
lifecycle's apply flag allows the root.

Flag per lifecycle:

* ``storage`` -> ``apply_storage``;
* ``instance-image`` (alias ``instances``) -> ``apply_instances``;
* ``identity`` -> ``apply_identity`` when any file sets it, else allowed iff
  ``apply_storage`` or ``apply_instances`` allows the root.

``apply_runtime`` only narrows (storage and instance-image): a flag that is off NOW
stays off whatever ``apply_runtime`` says (the reference's weak point 4).

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..config.flags import apply_flag_allows, describe_flag, narrow_by_apply_runtime, parse_apply_flag
from ..errors import CsisError
from ..yamlio import VALUE_ERRORS, shape_problem, yaml

__all__ = ["ApplyCheckRefused", "LIFECYCLE_KEYS", "find_config_root", "effective_config", "check_apply"]

CONFIG_REL = os.path.join("cfg", "_config.yml")

LIFECYCLE_KEYS = {
    "storage": "apply_storage",
    "instance-image": "apply_instances",
    "instances": "apply_instances",
    "identity": "apply_identity",
}
_NARROWED = {"storage", "instance-image", "instances"}


class ApplyCheckRefused(CsisError):
    """The apply must not happen; the message says why."""


@dataclass
class _Value:
    raw: Any
    source: str
    present: bool


def find_config_root(start: Optional[str] = None) -> Optional[str]:
    """The nearest directory at or above ``start`` (default cwd) holding ``cfg/_config.yml``."""
    cur = os.path.abspath(start or os.getcwd())
    while True:
        if os.path.isfile(os.path.join(cur, CONFIG_REL)):
            return cur
        parent = os.path.dirname(cur)
        if parent == cur:
            return None
        cur = parent


def _load_config_mapping(path: str, required: bool) -> Dict[str, Any]:
    try:
        with open(path, "r", encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        raise ApplyCheckRefused("apply-check: %s is not valid YAML (%s); refusing to apply"
                                % (path, str(exc).replace("\n", " ")))
    except OSError as exc:
        raise ApplyCheckRefused("apply-check: cannot read %s (%s); refusing to apply" % (path, exc.strerror))
    except VALUE_ERRORS as exc:
        # not UTF-8 (UnicodeDecodeError), or a tagged value PyYAML cannot build (`!!int x`)
        raise ApplyCheckRefused("apply-check: %s cannot be read (%s); refusing to apply"
                                % (path, str(exc).replace("\n", " ") or type(exc).__name__))
    shape = shape_problem(doc)
    if shape:
        raise ApplyCheckRefused("apply-check: %s cannot be read (%s); refusing to apply" % (path, shape))
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ApplyCheckRefused("apply-check: %s is not a mapping; refusing to apply" % path)
    if "config" not in doc:
        if required:
            raise ApplyCheckRefused("apply-check: %s has no config: mapping; refusing to apply" % path)
        return {}
    cfg = doc.get("config")
    if cfg is None:
        return {}
    if not isinstance(cfg, dict):
        raise ApplyCheckRefused("apply-check: %s: config is not a mapping; refusing to apply" % path)
    return cfg


def effective_config(config_root: str, overlays: Sequence[str] = ()) -> Tuple[Dict[str, _Value], List[str]]:
    """{key: value with the file it came from} after applying overlays in order (later wins)."""
    main = os.path.join(config_root, CONFIG_REL)
    values: Dict[str, _Value] = {}
    for k, v in _load_config_mapping(main, required=True).items():
        values[str(k)] = _Value(v, main, True)
    read = [main]
    for ov in overlays or ():
        path = ov if os.path.isabs(ov) else os.path.join(config_root, ov)
        path = os.path.normpath(path)
        if not os.path.isfile(path):
            raise ApplyCheckRefused("apply-check: overlay %s is gone; refusing to apply" % path)
        for k, v in _load_config_mapping(path, required=False).items():
            values[str(k)] = _Value(v, path, True)
        read.append(path)
    return values, read


def _flag(values: Dict[str, _Value], key: str, main: str):
    v = values.get(key) or _Value(None, main, False)
    try:
        flag = parse_apply_flag(v.raw, "%s: config.%s" % (v.source, key))
    except ValueError as exc:
        raise ApplyCheckRefused("apply-check: %s; refusing to apply" % exc)
    return flag, v


def check_apply(lifecycle: str, root: Optional[str] = None, root_alias: Sequence[str] = (),
                overlays: Sequence[str] = (), apply_runtime: Optional[str] = None,
                config_root: Optional[str] = None, search_from: Optional[str] = None) -> Dict[str, Any]:
    """Return ``{allowed: True, flag, source, key, ...}`` or raise :class:`ApplyCheckRefused`."""
    if lifecycle not in LIFECYCLE_KEYS:
        raise ApplyCheckRefused("apply-check: unknown lifecycle %r (expected one of %s); refusing to apply"
                                % (lifecycle, ", ".join(sorted(LIFECYCLE_KEYS))))
    if config_root:
        croot = os.path.abspath(config_root)
        if not os.path.isfile(os.path.join(croot, CONFIG_REL)):
            raise ApplyCheckRefused("apply-check: no %s in %s; refusing to apply" % (CONFIG_REL, croot))
    else:
        found = find_config_root(search_from)
        if found is None:
            raise ApplyCheckRefused(
                "apply-check: no cfg/_config.yml found from the working directory up; refusing to apply")
        croot = found
    main = os.path.join(croot, CONFIG_REL)
    values, read = effective_config(croot, overlays)
    aliases = [a for a in (root_alias or ()) if a]
    for_root = " for root '%s'" % root if root else ""
    narrow = apply_runtime if (apply_runtime and lifecycle in _NARROWED) else None
    key = LIFECYCLE_KEYS[lifecycle]

    def verdict(flag, v: _Value) -> Tuple[bool, Any]:
        eff = narrow_by_apply_runtime(flag, narrow)
        return apply_flag_allows(eff, root, aliases), eff

    def shown(flag, v: _Value) -> str:
        return describe_flag(flag) + ("" if v.present else " (not set)")

    base = {"lifecycle": lifecycle, "key": key, "config_root": croot, "files_read": read,
            "root": root, "root_alias": aliases, "apply_runtime": narrow}

    # apply_identity unset, or null in the file that sets it last: what the render's may_apply does
    # (config.models keeps that null as unset), so a root the render let through is judged alike
    if lifecycle == "identity" and (key not in values or values[key].raw is None):
        unset = ("apply_identity is not set" if key not in values
                 else "apply_identity is null (not set) in %s" % values[key].source)
        parts = []
        for k in ("apply_storage", "apply_instances"):
            flag, v = _flag(values, k, main)
            ok, _eff = verdict(flag, v)
            if ok:
                out = dict(base)
                out.update(allowed=True, flag=flag, source=v.source, key=k,
                           msg="%s; %s allows root '%s'; proceeding." % (unset, k, root))
                return out
            parts.append("%s is %s NOW in %s" % (k, shown(flag, v), v.source))
        raise ApplyCheckRefused("%s and %s%s -- not applying." % (unset, " and ".join(parts), for_root))

    flag, v = _flag(values, key, main)
    ok, _eff = verdict(flag, v)
    if not ok:
        note = ""
        if narrow and flag is not False and flag != []:
            note = " (narrowed by apply_runtime '%s')" % narrow
        raise ApplyCheckRefused("%s is %s NOW in %s%s%s -- not applying."
                                % (key, shown(flag, v), v.source, for_root, note))
    out = dict(base)
    out.update(allowed=True, flag=flag, source=v.source,
               msg="%s allows root '%s'; proceeding." % (key, root) if root else "%s is on; proceeding." % key)
    return out
