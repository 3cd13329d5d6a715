# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Unmount a storage from a launched instance before its attachment is destroyed, and
write the receipt the gate asks for (``unmount-receipts/<instance>__<storage>.json``).

The machine is addressed by the instance id recorded in ``meta-state/instance-state.yaml``
(what terraform created), never by a ``Name`` tag. The session mechanism is the runtime's:
``ssm`` runs ``AWS-RunShellScript`` through boto3 with the runtime's region, profile and
endpoint. ``confirm`` records the operator's word (the machine is gone, or the storage was
never mounted) without any remote call.

The unmount is deliberately not forceful: processes holding the mount are listed, not
killed, and there is no lazy unmount; a busy mount fails the step and nothing is planned.
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from .. import aws
from ..errors import CsisError
from ..state.store import MetaState
from .receipts import new_receipt, receipt_path, write_receipt

OUTPUT_MAX = 2000
_MOUNT_POINT = re.compile(r"^/[A-Za-z0-9_.@+/-]*$")


class UnmountError(CsisError):
    pass


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def unmount_script(mount_point: str, force: bool = False) -> List[str]:
    """The shell lines run on the machine (as root under SSM)."""
    if not _MOUNT_POINT.match(mount_point or "") or ".." in mount_point or mount_point == "/":
        raise UnmountError("mount point %r is not an absolute path of plain names" % (mount_point,))
    mp = _q(mount_point)
    lines = ["set -u", "MP=%s" % mp, 'if mountpoint -q "$MP"; then', "  sync"]
    if force:
        lines.append('  fuser -km "$MP" || true; sleep 1')
    lines += [
        '  if ! umount "$MP"; then',
        '    echo "busy: $MP is held by:"; fuser -vm "$MP" 2>&1 || true',
        '    exit 1',
        "  fi",
        "fi",
        'sed -i "\\| $MP |d" /etc/fstab',
        'rmdir "$MP" 2>/dev/null || true',
        'if mountpoint -q "$MP"; then echo "still mounted: $MP"; exit 1; fi',
        'echo "unmounted: $MP"',
    ]
    return lines


def recorded_instance_id(config_root: str, instance: str) -> Optional[str]:
    rec = (MetaState(config_root).load("instance-state.yaml").get("instances") or {}).get(instance) or {}
    cur = rec.get("current") or {}
    iid = cur.get("instance_id")
    return iid if isinstance(iid, str) and iid.startswith("i-") else None


def unmount_receipt_path(receipts_dir: str, instance: str, storage: str) -> str:
    """Where the receipt of ``instance:storage`` goes (:func:`~.receipts.receipt_path`)."""
    try:
        return receipt_path(receipts_dir, instance, storage)
    except ValueError as exc:
        raise UnmountError(str(exc))


def ssm_run(access: Mapping[str, Any], instance_id: str, commands: List[str], timeout: int = 300,
            poll: float = 2.0, client: Any = None, sleep: Callable[[float], None] = time.sleep) -> Dict[str, Any]:
    """Run ``commands`` with ``AWS-RunShellScript`` on ``instance_id``; wait for the result."""
    if client is None:
        client = aws.client("ssm", access)
    resp = client.send_command(InstanceIds=[instance_id], DocumentName="AWS-RunShellScript",
                               Comment="csis.infra unmount", TimeoutSeconds=max(30, int(timeout)),
                               Parameters={"commands": commands, "executionTimeout": [str(int(timeout))]})
    cid = resp["Command"]["CommandId"]
    deadline = time.monotonic() + timeout + 60
    inv: Dict[str, Any] = {}
    while True:
        try:
            inv = client.get_command_invocation(CommandId=cid, InstanceId=instance_id)
        except Exception as exc:  # InvocationDoesNotExist right after send_command
            if "InvocationDoesNotExist" not in str(exc):
                raise
            inv = {"Status": "Pending"}
        if inv.get("Status") in ("Success", "Failed", "Cancelled", "TimedOut", "Cancelling"):
            break
        if time.monotonic() > deadline:
            inv = dict(inv, Status="TimedOut")
            break
        sleep(poll)
    out = (inv.get("StandardOutputContent") or "") + (inv.get("StandardErrorContent") or "")
    return {"command_id": cid, "status": inv.get("Status"), "exit_status": inv.get("ResponseCode"),
            "output": out[-OUTPUT_MAX:]}


def unmount(config_root: str, instance: str, storage: str, mount_point: str, receipts_dir: str, *,
            access: Mapping[str, Any], runtime: Optional[str] = None, confirm: bool = False,
            confirmed_by: Optional[str] = None, force: bool = False, timeout: int = 300, run_id: Optional[str] = None,
            instance_id: Optional[str] = None, client: Any = None) -> Dict[str, Any]:
    """Unmount (or record the operator's confirmation) and write the receipt. Returns it.

    A failed unmount writes a receipt with ``ok: false`` (the gate refuses it) and raises.
    """
    path = unmount_receipt_path(receipts_dir, instance, storage)
    base: Dict[str, Any] = {"mount_point": mount_point, "runtime": runtime, "run": run_id}
    if confirm:
        receipt = new_receipt(instance, storage, True, method="operator-confirmation", exit_status=None, output="",
                              confirmed_by=confirmed_by or os.environ.get("USER") or "unknown", **base)
        write_receipt(path, receipt)
        return dict(receipt, path=path)
    mechanism = access.get("session_mechanism") or "ssm"
    if mechanism != "ssm":
        raise UnmountError("unmount of %s on %s: the runtime's session mechanism is %r; csis_unmount runs over ssm only "
                           "-- unmount over your own session and record it with confirm: true" % (mount_point, instance, mechanism))
    iid = instance_id or recorded_instance_id(config_root, instance)
    if not iid:
        raise UnmountError("unmount of %s on %s: meta-state/instance-state.yaml records no instance id for %s (never "
                           "launched, or already gone); if the machine is gone, record it with confirm: true"
                           % (mount_point, instance, instance))
    script = unmount_script(mount_point, force=force)
    try:
        res = ssm_run(access, iid, script, timeout=timeout, client=client)
    except Exception as exc:
        res = {"command_id": None, "status": "Error", "exit_status": None, "output": str(exc)[-OUTPUT_MAX:]}
    ok = res["status"] == "Success" and res["exit_status"] in (0, None)
    receipt = new_receipt(instance, storage, ok, method="session", session="ssm", instance_id=iid,
                          command_id=res["command_id"], exit_status=res["exit_status"], output=res["output"], **base)
    write_receipt(path, receipt)
    if not ok:
        raise UnmountError("unmount of %s on %s failed (exit %s, %s): %s"
                           % (mount_point, instance, res["exit_status"], res["status"], res["output"].strip()[-500:]))
    return dict(receipt, path=path)
