# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The unmount receipt: the one definition of its place, its format and when it counts.

A receipt is ``<receipts dir>/<instance>__<storage>.json`` (the receipts dir of a root is
its ``unmount-receipts/``), written atomically by ``csis_unmount`` (:func:`write_receipt`)
and read by the gate (:func:`check_receipts`): a JSON object whose ``instance`` and
``storage`` name the pair, whose ``ok`` is ``true`` and whose ``time`` is when it was
written (plus how: ``method``, ``mount_point``, ``runtime``, ``run``, ``exit_status``,
``output``...). It counts only if it is ok and, when the gate asks, not older than the
plan's binding.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, List, Mapping, Optional

from ..clock import now, parse as parse_time
from ..errors import GateError
from ..fsutil import write_json_atomic

#: the directory of a root that holds its receipts
RECEIPTS_DIR = "unmount-receipts"

_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+=-]*$")


def check_plain_name(kind: str, name: str) -> None:
    """Raise ValueError unless ``name`` is a plain name (it becomes part of a file name)."""
    if (not name or "/" in name or "\\" in name or ".." in name or os.sep in name
            or (os.altsep and os.altsep in name) or not _PLAIN_NAME.match(name)):
        raise ValueError("%s name %r is not a plain name" % (kind, name))


def receipt_path(receipts_dir: str, instance: str, storage: str) -> str:
    """Where the receipt of ``instance:storage`` is; ValueError for a name that is not plain."""
    check_plain_name("instance", instance)
    check_plain_name("storage", storage)
    return os.path.join(receipts_dir, "%s__%s.json" % (instance, storage))


def new_receipt(instance: str, storage: str, ok: bool, **details: Any) -> dict:
    """A receipt of ``instance:storage`` written now."""
    return dict(details, instance=instance, storage=storage, ok=bool(ok), time=now())


def write_receipt(path: str, receipt: Mapping[str, Any]) -> None:
    """Write ``receipt`` at ``path`` atomically (the directory is made when missing)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, dict(receipt))


def receipt_problem(path: str, instance: str, storage: str, not_before: Optional[str] = None) -> Optional[str]:
    """Why the receipt at ``path`` does not count for ``instance:storage`` (None: it counts)."""
    floor = parse_time(not_before) if not_before else None
    if not_before and floor is None:  # a floor that does not read would check nothing: refused
        return "the plan's time %r does not read as a time: no receipt can be shown to be newer" % (not_before,)
    try:
        with open(path, "r", encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return "no %s" % path
    except (OSError, ValueError, RecursionError) as exc:
        return "%s is unreadable or not JSON (%s)" % (path, exc.__class__.__name__)
    if not isinstance(data, dict):
        return "%s is not a JSON object" % path
    if data.get("instance") != instance or data.get("storage") != storage:
        return "%s is for %s:%s" % (path, data.get("instance"), data.get("storage"))
    if data.get("ok") is not True:
        return "%s says ok: %s" % (path, json.dumps(data.get("ok")))
    if floor is not None:
        t = parse_time(data.get("time"))
        if t is None:
            return "%s has no valid time" % path
        if t.replace(microsecond=0) < floor.replace(microsecond=0):
            return "%s is from %s, before this plan was opened (%s)" % (path, data.get("time"), not_before)
    return None


def check_receipts(require_unmounted: Iterable[str], receipts_dir: str,
                   not_before: Optional[str] = None) -> List[str]:
    """Refusal lines for every ``instance:storage`` without a receipt that counts.

    With ``not_before`` (ISO time, the binding's opening) the receipt's ``time`` must be at
    or after it, so a receipt left by an earlier run does not count.
    """
    problems: List[str] = []
    for spec in require_unmounted or ():
        if not isinstance(spec, str) or spec.count(":") != 1:
            raise GateError("require_unmounted entry %r is not <instance>:<storage>" % (spec,))
        instance, storage = spec.split(":")
        try:
            path = receipt_path(receipts_dir, instance, storage)
        except ValueError as exc:
            raise GateError("require_unmounted %r: %s" % (spec, exc))
        why = receipt_problem(path, instance, storage, not_before)
        if why is not None:
            problems.append("DETACH NOT UNMOUNTED: %s:%s has no successful unmount receipt (%s; unmount storage "
                            "first, or confirm it was never mounted)" % (instance, storage, why))
    return problems
