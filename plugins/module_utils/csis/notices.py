# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What happened on the way that the task should show, though nothing failed (an expired
meta-state lock broken: its holder was killed).

The library adds a notice where it happens (:func:`notice`); every module's run
(``module.call_run``) shows the notices of its run as warnings (:func:`drain`), so a writer deep
in a transaction need not return them through every caller. Plain Python: importable without
Ansible.
"""
from __future__ import annotations

from typing import List

_PENDING: List[str] = []


def notice(text: str) -> None:
    """Show ``text`` as a warning of the task that is running."""
    if text not in _PENDING:
        _PENDING.append(text)


def drain() -> List[str]:
    """The notices added since the last drain (each once), and forget them."""
    out = list(_PENDING)
    del _PENDING[:]
    return out
