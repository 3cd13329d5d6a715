# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What names look like, and the names csis.infra derives from them: plain Python, no
pydantic, so the meta-state store, the approvals and the unmount can check a name without
paying for the configuration models (``models.py`` uses these and re-exports them)."""
from __future__ import annotations

import re

#: What a name of anything (builder, runtime, instance, storage, group, image, backend,
#: executable) may look like: it becomes a directory, a terraform label, a hostname
#: part and a shell word, so nothing that could escape or inject passes.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")

#: An SSH login name: it goes on the ``ssh`` command line (``-l``), so it never starts with '-'.
SSH_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")
#: A file named to ``ssh`` (key, known_hosts, client configuration): plain path characters, an
#: optional leading ``~/``; no whitespace, quotes, '%' (ssh's tokens) or leading '-'.
SSH_PATH_RE = re.compile(r"^(~/)?[A-Za-z0-9_.+@,/][A-Za-z0-9_.+@,/=-]*\Z")

#: A mount point: an absolute path of plain names. It goes into the launch script, /etc/fstab and
#: the unmount's shell lines, so no whitespace, quote, '$' or newline passes (``\Z``, not ``$``,
#: which would also match before a final newline).
MOUNT_POINT_RE = re.compile(r"^/[A-Za-z0-9_.@+-]+(/[A-Za-z0-9_.@+-]+)*\Z")


def mount_point_ok(path: object) -> bool:
    """Whether ``path`` is a mount point csis.infra writes and unmounts: :data:`MOUNT_POINT_RE`,
    no ``.`` or ``..`` component, not ``/``."""
    return (isinstance(path, str) and bool(MOUNT_POINT_RE.match(path))
            and "/../" not in path + "/" and "/./" not in path + "/")


def label(name: str) -> str:
    """The terraform label of a name: '-' and '.' become '_' (an HCL identifier)."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if out and out[0].isdigit():
        out = "n" + out
    return out


def archive_snapshot_name(storage: str) -> str:
    """The Name of an EBS storage's archive snapshot: ``csis-<label>-archive``, the manual's
    name (``csis-mnt_data-archive``). Until 0.1.0 it was :func:`legacy_archive_snapshot_name`;
    a storage archived then keeps the name recorded in its ``facts.archive``, and the restore
    and the snapshot deletion use that recorded name."""
    return "csis-%s-archive" % label(storage)


def legacy_archive_snapshot_name(storage: str) -> str:
    """The archive snapshot name written before 0.1.0 (``csis-mnt-data-archive``: '_' -> '-')."""
    return "csis-%s-archive" % label(storage).replace("_", "-")
