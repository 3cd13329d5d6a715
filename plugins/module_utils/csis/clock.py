# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The one spelling of a time in csis.infra's records: UTC, whole seconds, ISO 8601 with ``Z``
(``2026-01-01T12:00:00Z``); the configuration's durations (``'30m'``, ``'2h'``); an age as a
message says it. Standard library only (it also runs on the managed machines)."""
from __future__ import annotations

import datetime as _dt
import re
from typing import Any, Optional

DURATION_RE = re.compile(r"^(\d+)\s*([smhdw])\Z")


def now() -> str:
    """The current time as csis.infra records it."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse(value: Any) -> Optional[_dt.datetime]:
    """A recorded time as an aware datetime (a naive one is read as UTC); None when it is not one."""
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


def age_text(seconds: float) -> str:
    """``seconds`` as a person reads an age (a lock's, a receipt's): 45 s, 12 min, 3 h 05 min, 2 d 04 h."""
    whole = max(0, int(seconds))
    if whole < 120:
        return "%d s" % whole
    minutes, hours = whole // 60, whole // 3600
    if hours < 2:
        return "%d min" % minutes
    if hours < 48:
        return "%d h %02d min" % (hours, minutes % 60)
    return "%d d %02d h" % (hours // 24, hours % 24)


def parse_duration(value: str) -> int:
    """'30m', '2h', '1d' -> seconds. Raises ValueError."""
    m = DURATION_RE.match(value.strip()) if isinstance(value, str) else None
    if not m or int(m.group(1)) <= 0:
        raise ValueError("duration %r must look like '30m', '2h', '1d' or '1w' (a positive number and a unit)" % (value,))
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
