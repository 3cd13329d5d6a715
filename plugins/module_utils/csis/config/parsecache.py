# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What a large configuration file parsed to, kept by its content.

PyYAML builds a document in Python even when libyaml scans it: a 10,000-instance
``instances/instances.yaml`` costs seconds on every load, and a lifecycle run loads the tree
in several module processes. A file of :data:`MIN_BYTES` or more that parsed cleanly to plain
JSON data (string keys; strings, numbers, booleans, null; no ``!vault`` value, no date) is
kept as JSON under its text's SHA-256, so the next load of the same bytes is one
``json.loads``. The key is the content itself, so an edited file is never served stale, and
an entry can only hold what that exact text parsed to. Everything here is best effort:
an unreadable, damaged or unwritable cache is a miss, never an error.

Where: ``$CSIS_CONFIG_CACHE``, else ``$XDG_CACHE_HOME/csis.infra/config`` (``~/.cache``),
mode 0700; ``CSIS_CONFIG_CACHE=off`` turns it off. Derived data: safe to delete.

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional

from ..fsutil import user_cache, write_atomic

#: files smaller than this parse in milliseconds: not worth an entry
MIN_BYTES = 256 * 1024
_FORMAT = 1


def directory() -> Optional[str]:
    """The cache directory, None when turned off."""
    explicit = os.environ.get("CSIS_CONFIG_CACHE", "")
    if explicit.lower() == "off":
        return None
    return explicit or user_cache("config")


def _entry(text: str) -> Optional[str]:
    where = directory()
    if where is None or len(text) < MIN_BYTES:
        return None
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return os.path.join(where, "%s.json" % digest)


def get(text: str) -> Optional[Any]:
    """What ``text`` parsed to when it was last kept, or None."""
    path = _entry(text)
    if path is None:
        return None
    try:
        with open(path, "r", encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or "data" not in doc:
        return None
    return doc["data"]


def put(text: str, data: Any) -> None:
    """Keep what ``text`` parsed to, when it is plain JSON data (anything else is not kept)."""
    path = _entry(text)
    if path is None:
        return
    try:
        blob = json.dumps({"format": _FORMAT, "data": data}, allow_nan=False, separators=(",", ":"))
        if json.loads(blob)["data"] != data:  # int keys, tuples...: JSON would not give them back
            return
    except (TypeError, ValueError, RecursionError):  # a date, a !vault value, NaN
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomic(path, blob.encode("utf-8"), mode=0o600)
    except OSError:
        return
