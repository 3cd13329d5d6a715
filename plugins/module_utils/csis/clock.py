# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The one spelling of a time in csis.infra's records: UTC, whole seconds, ISO 8601 with ``Z``
(``2026-01-01T12:00:00Z``). Standard library only (it also runs on the managed machines)."""
from __future__ import annotations

import datetime as _dt
from typing import Any, Optional


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
