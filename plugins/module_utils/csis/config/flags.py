# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Apply flags (``config.apply_storage``, ``config.apply_instances``, ...).

An apply flag is either a YAML boolean or a list of builder/runtime names. Nothing
else is accepted: a quoted ``"false"`` or ``"no"`` is refused instead of becoming a
one-name list that counts as "on" (the reference system's weak point 19).

``null`` (an empty key) means ``false``.

Plain Python: importable without Ansible.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Tuple, Union

__all__ = [
    "ApplyFlag",
    "RuntimeNarrowed",
    "parse_apply_flag",
    "apply_flag_allows",
    "narrow_by_apply_runtime",
    "describe_flag",
]


@dataclass(frozen=True)
class RuntimeNarrowed:
    """A list flag narrowed to one runtime that the list itself does not name.

    Allows a root only when its runtime (one of its aliases) is ``runtime`` AND the
    root or one of its aliases is in ``names``. A plain list cannot express that
    conjunction, so :func:`narrow_by_apply_runtime` returns this for that case.
    """

    runtime: str
    names: Tuple[str, ...]


ApplyFlag = Union[bool, List[str], RuntimeNarrowed]


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return type(value).__name__


def _shown(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return text


def parse_apply_flag(value: Any, where: str) -> Union[bool, List[str]]:
    """Return ``value`` as ``bool`` or ``list[str]``; raise ``ValueError`` otherwise.

    ``where`` names the file and key for the message, for example
    ``cfg/_config.yml: config.apply_storage``.
    """
    expected = "it must be true/false or a list of builder/runtime names"
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)):
        names: List[str] = []
        for i, item in enumerate(value):
            if not isinstance(item, str) or isinstance(item, bool):
                raise ValueError(
                    "%s: item %d is %s %s; %s" % (where, i, _type_name(item), _shown(item), expected))
            if not item.strip():
                raise ValueError("%s: item %d is an empty string; %s" % (where, i, expected))
            if item != item.strip():
                raise ValueError(
                    "%s: item %d %s has surrounding whitespace; %s" % (where, i, _shown(item), expected))
            names.append(item)
        return names
    if isinstance(value, str):
        raise ValueError(
            "%s: found the string %s (quoted, so not a YAML boolean); %s"
            % (where, _shown(value), expected))
    raise ValueError("%s: found %s %s; %s" % (where, _type_name(value), _shown(value), expected))


def apply_flag_allows(flag: ApplyFlag, root: Optional[str], aliases: Iterable[str] = ()) -> bool:
    """Whether ``flag`` allows the root named ``root`` (a builder) with ``aliases``.

    ``bool`` -> itself; list -> ``root`` or any alias is listed (an empty list allows
    nothing); :class:`RuntimeNarrowed` -> the runtime is the root or one of its
    aliases and the root or an alias is in its names.
    """
    if isinstance(flag, bool):
        return flag
    keys = set(a for a in aliases if isinstance(a, str) and a)
    if root:
        keys.add(root)
    if isinstance(flag, RuntimeNarrowed):
        return flag.runtime in keys and any(n in keys for n in flag.names)
    if isinstance(flag, (list, tuple)):
        return any(n in keys for n in flag)
    raise ValueError("not an apply flag: %s %s" % (_type_name(flag), _shown(flag)))


def narrow_by_apply_runtime(flag: ApplyFlag, apply_runtime: Optional[str]) -> ApplyFlag:
    """Narrow ``flag`` to the roots of one runtime. Never widens.

    * no ``apply_runtime`` -> ``flag`` unchanged;
    * ``False`` (or an empty list) -> unchanged (off stays off);
    * ``True`` -> ``[apply_runtime]``;
    * a list naming ``apply_runtime`` -> ``[apply_runtime]`` (every root of that
      runtime was already allowed through the runtime's name);
    * a list not naming it -> :class:`RuntimeNarrowed` (roots whose runtime is
      ``apply_runtime`` AND that the list allows).
    """
    if apply_runtime is None or apply_runtime == "":
        return flag
    if not isinstance(apply_runtime, str):
        raise ValueError("apply_runtime must be a string, found %s" % _type_name(apply_runtime))
    if isinstance(flag, bool):
        return [apply_runtime] if flag else False
    if isinstance(flag, RuntimeNarrowed):
        if flag.runtime == apply_runtime:
            return flag
        return []  # two different runtimes: nothing is in both
    if isinstance(flag, (list, tuple)):
        if not flag:
            return []
        if apply_runtime in flag:
            return [apply_runtime]
        return RuntimeNarrowed(runtime=apply_runtime, names=tuple(flag))
    raise ValueError("not an apply flag: %s %s" % (_type_name(flag), _shown(flag)))


def describe_flag(flag: Any) -> str:
    """Render a flag the way messages show it: ``false``, ``true``, ``["a", "b"]``."""
    if isinstance(flag, bool):
        return "true" if flag else "false"
    if flag is None:
        return "null"
    if isinstance(flag, RuntimeNarrowed):
        return "%s narrowed to runtime %r" % (describe_flag(list(flag.names)), flag.runtime)
    if isinstance(flag, (list, tuple)):
        return "[" + ", ".join('"%s"' % str(n).replace('"', '\\"') for n in flag) + "]"
    return repr(flag)
