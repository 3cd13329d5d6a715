# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Unmount a storage from a launched instance before its attachment is destroyed, and
write the receipt the gate asks for (``unmount-receipts/<instance>__<storage>.json``).

The machine is addressed by what ``meta-state/instance-state.yaml`` records of it (what
terraform created), never by a ``Name`` tag. The session mechanism is the runtime's:
``ssm`` runs ``AWS-RunShellScript`` on the recorded instance id through boto3 with the
runtime's region, profile and endpoint; ``ssh`` runs the script with the system OpenSSH
client on the recorded private or public IP (the runtime's ``ssh`` settings: user, key
file, port, known_hosts; host keys checked, batch mode, bounded in time), through
``sudo -n`` unless the user is root; ``none`` is refused (unmount by hand, then confirm).
``confirm`` records the operator's word (the machine is gone, or the storage was never
mounted) without any remote call.

The unmount is deliberately not forceful: processes holding the mount are listed, not
killed, and there is no lazy unmount; a busy mount fails the step and nothing is applied.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from .. import aws
from ..config.names import SSH_PATH_RE, SSH_USER_RE, mount_point_ok
from ..errors import CsisError
from ..state.store import MetaState
from .receipts import new_receipt, receipt_path, write_receipt

OUTPUT_MAX = 2000
#: a host name given explicitly (``host=``); a recorded address must be an IP address
_HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?\Z")
#: the settings of ``aws.ssh`` and their defaults (config/models.py ``SshSession``)
SSH_DEFAULTS: Dict[str, Any] = {"port": 22, "address": "private_ip", "known_hosts_file": None,
                                "host_key_checking": "strict", "connect_timeout": 10, "config_file": None}
SSH_ADDRESSES = ("private_ip", "public_ip")
#: ``host_key_checking`` -> OpenSSH's ``StrictHostKeyChecking``
SSH_HOST_KEY_CHECKING = {"strict": "yes", "accept-new": "accept-new"}


class UnmountError(CsisError):
    pass


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def unmount_script(mount_point: str, force: bool = False) -> List[str]:
    """The shell lines run on the machine (as root under SSM)."""
    if not mount_point_ok(mount_point):
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
        # the line of this mount point alone: its second field compared as a string (a pattern would
        # read '.' and '+' in /mnt/data.1 as regular expression and take /mnt/data-1's line too)
        'if awk -v mp="$MP" \'$2 != mp\' /etc/fstab > /etc/fstab.csis-unmount; then',
        '  cat /etc/fstab.csis-unmount > /etc/fstab',
        "fi",
        "rm -f /etc/fstab.csis-unmount",
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


# --------------------------------------------------------------------------- ssh
def ssh_settings(access: Mapping[str, Any]) -> Dict[str, Any]:
    """The runtime's ``ssh`` settings from ``access`` (a rendered root's ``aws`` entry), checked
    again here (the module takes them from a playbook): nothing that could become an ssh option."""
    raw = access.get("ssh")
    if not isinstance(raw, Mapping) or not raw:
        raise UnmountError("the runtime's session mechanism is 'ssh' but its access carries no ssh settings (the runtime's "
                           "'ssh:' block in cfg/runtime-builders.yml: user, private_key_file, ...; render again)")
    unknown = sorted(set(raw) - set(SSH_DEFAULTS) - {"user", "private_key_file"})
    if unknown:
        raise UnmountError("ssh settings: unknown key(s) %s" % ", ".join(unknown))
    out = dict(SSH_DEFAULTS)
    out.update({k: v for k, v in raw.items() if v is not None})
    problems = []
    if not isinstance(out.get("user"), str) or not SSH_USER_RE.match(out["user"]):
        problems.append("ssh.user %r is not a login name" % (out.get("user"),))
    for key in ("private_key_file", "known_hosts_file", "config_file"):
        v = out.get(key)
        plain = isinstance(v, str) and SSH_PATH_RE.match(v) and ".." not in v.split("/")
        if (v is not None or key == "private_key_file") and not plain:
            problems.append("ssh.%s %r is not a plain file path" % (key, v))
    for key, low, high in (("port", 1, 65535), ("connect_timeout", 1, 300)):
        v = out.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
            problems.append("ssh.%s %r must be a whole number %d-%d" % (key, v, low, high))
    if out.get("address") not in SSH_ADDRESSES:
        problems.append("ssh.address %r must be one of %s" % (out.get("address"), ", ".join(SSH_ADDRESSES)))
    if out.get("host_key_checking") not in SSH_HOST_KEY_CHECKING:
        problems.append("ssh.host_key_checking %r must be one of %s" % (out.get("host_key_checking"),
                                                                        ", ".join(SSH_HOST_KEY_CHECKING)))
    if problems:
        raise UnmountError("ssh settings refused: %s" % "; ".join(problems))
    return out


def ssh_file(config_root: str, path: str) -> str:
    """A file named by the ssh settings: ``~/...`` in the controller user's home, a relative
    path under the configuration root."""
    if path.startswith("~/"):
        return os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(os.path.abspath(config_root), path)


def recorded_address(config_root: str, instance: str, address: str = "private_ip") -> Optional[str]:
    """The ``private_ip`` or ``public_ip`` recorded for the open generation of ``instance``."""
    rec = (MetaState(config_root).load("instance-state.yaml").get("instances") or {}).get(instance) or {}
    value = (rec.get("current") or {}).get(address)
    return value if isinstance(value, str) and value else None


def check_host(host: str, recorded: bool) -> str:
    """An IP address (a recorded one must be), or a plain host name given explicitly."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        if recorded or not isinstance(host, str) or not _HOST_NAME.match(host):
            raise UnmountError("host %r is not %s" % (host, "an IP address" if recorded else "an IP address or a plain host name"))
        return host


def ssh_remote_command(user: str) -> str:
    """What the login runs: the script on stdin, as root (``sudo -n`` unless the user is root)."""
    return "sh -s" if user == "root" else "sudo -n sh -s"


def ssh_argv(settings: Mapping[str, Any], host: str, config_root: str, binary: str = "ssh") -> List[str]:
    """The OpenSSH client's command line: batch mode, only the named key, host keys checked
    (``StrictHostKeyChecking=yes``, or ``accept-new`` when the settings say so), no forwarding,
    no multiplexing, the connect timeout; ``--`` before the host."""
    argv = [binary, "-F", ssh_file(config_root, settings["config_file"]) if settings.get("config_file") else "none",
            "-T", "-x", "-a", "-i", ssh_file(config_root, settings["private_key_file"]),
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
            "-o", "PreferredAuthentications=publickey", "-o", "ConnectTimeout=%d" % settings["connect_timeout"],
            "-o", "StrictHostKeyChecking=%s" % SSH_HOST_KEY_CHECKING[settings["host_key_checking"]],
            "-o", "ControlMaster=no", "-o", "ControlPath=none", "-o", "ClearAllForwardings=yes"]
    if settings.get("known_hosts_file"):
        argv += ["-o", "UserKnownHostsFile=%s" % ssh_file(config_root, settings["known_hosts_file"]),
                 "-o", "GlobalKnownHostsFile=/dev/null"]
    return argv + ["-p", str(settings["port"]), "-l", settings["user"], "--", host, ssh_remote_command(settings["user"])]


def _text(data: Any) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data or ""


def ssh_run(settings: Mapping[str, Any], host: str, commands: List[str], config_root: str,
            timeout: int = 300) -> Dict[str, Any]:
    """Run ``commands`` (sent on stdin to ``sh -s``) on ``host`` with the OpenSSH client; the
    whole session is bounded by ``timeout`` seconds (then ssh and its process group are killed).
    ``status``: ``Success`` (exit 0), ``Failed`` (the script's exit status), ``Error`` (ssh
    itself failed: exit 255) or ``TimedOut``."""
    binary = shutil.which("ssh")
    if binary is None:
        raise UnmountError("the OpenSSH client (ssh) is not installed on the controller (PATH)")
    argv = ssh_argv(settings, host, config_root, binary)
    script = "\n".join(commands) + "\n"
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: a timeout kills all of it
    try:
        out, _err = proc.communicate(script.encode("utf-8"), timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, _err = proc.communicate()
        text = _text(out or exc.output)
        text += "\nssh to %s did not finish within %d s (the timeout): killed; the unmount may still be running there" % (
            host, timeout)
        return {"status": "TimedOut", "exit_status": None, "output": text[-OUTPUT_MAX:]}
    rc = proc.returncode
    status = "Success" if rc == 0 else ("Error" if rc == 255 or rc < 0 else "Failed")
    return {"status": status, "exit_status": rc, "output": _text(out)[-OUTPUT_MAX:]}


def _tail(text: str, limit: int = 500) -> str:
    """The end of ``text`` (at most ``limit`` characters), from the start of a line."""
    text = text.strip()
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    return cut[cut.index("\n") + 1:] if "\n" in cut else cut


def _ssh_hint(res: Mapping[str, Any], settings: Mapping[str, Any], host: str, config_root: str) -> str:
    out = res.get("output") or ""
    if "Host key verification failed" in out:
        where = (ssh_file(config_root, settings["known_hosts_file"]) if settings.get("known_hosts_file")
                 else "the controller's known_hosts files")
        checking = SSH_HOST_KEY_CHECKING[settings["host_key_checking"]]
        if "has changed" in out or "HOST IDENTIFICATION HAS CHANGED" in out:
            return (" -- ssh refused the host key of %s: it differs from the one in %s (StrictHostKeyChecking=%s); a "
                    "replaced machine or someone in between: check the key against the machine's console output before "
                    "replacing the line" % (host, where, checking))
        return (" -- ssh refused the host key of %s: it is not in %s (StrictHostKeyChecking=%s); add the machine's key "
                "there (checked against its console output), or set the runtime's ssh.host_key_checking: accept-new to "
                "record a first-seen key" % (host, where, checking))
    if res.get("status") == "Error":
        return " -- ssh itself failed (exit 255: connection, authentication or host key; see its message)"
    return ""


# --------------------------------------------------------------------------- the step
def _refused(mount_point: str, instance: str, why: str) -> UnmountError:
    return UnmountError("unmount of %s on %s: %s; unmount it by hand and record it with confirm: true "
                        "(-e csis_unmount_mode=confirm)" % (mount_point, instance, why))


def unmount(config_root: str, instance: str, storage: str, mount_point: str, receipts_dir: str, *,
            access: Mapping[str, Any], runtime: Optional[str] = None, confirm: bool = False,
            confirmed_by: Optional[str] = None, force: bool = False, timeout: int = 300, run_id: Optional[str] = None,
            instance_id: Optional[str] = None, host: Optional[str] = None, client: Any = None) -> Dict[str, Any]:
    """Unmount (or record the operator's confirmation) and write the receipt. Returns it.

    The session is the runtime's mechanism (``access["session_mechanism"]``): ``ssm`` on the
    recorded instance id (``instance_id`` overrides it), ``ssh`` on the recorded address the
    ``ssh`` settings name (``host`` overrides it). A failed unmount writes a receipt with
    ``ok: false`` (the gate refuses it) and raises.
    """
    path = unmount_receipt_path(receipts_dir, instance, storage)
    base: Dict[str, Any] = {"mount_point": mount_point, "runtime": runtime, "run": run_id}
    if confirm:
        receipt = new_receipt(instance, storage, True, method="operator-confirmation", exit_status=None, output="",
                              confirmed_by=confirmed_by or os.environ.get("USER") or "unknown", **base)
        write_receipt(path, receipt)
        return dict(receipt, path=path)
    mechanism = access.get("session_mechanism") or "ssm"
    if mechanism == "ssm":
        return _unmount_ssm(config_root, instance, storage, mount_point, path, base, access=access, force=force,
                            timeout=timeout, instance_id=instance_id, client=client)
    if mechanism == "ssh":
        return _unmount_ssh(config_root, instance, storage, mount_point, path, base, access=access, force=force,
                            timeout=timeout, host=host)
    if mechanism == "none":
        raise _refused(mount_point, instance, "the runtime's session mechanism is 'none' (csis.infra has no session to "
                                              "its machines)")
    raise _refused(mount_point, instance, "the runtime's session mechanism %r is not one csis_unmount runs over "
                                          "(ssm, ssh)" % (mechanism,))


def _unmount_ssm(config_root: str, instance: str, storage: str, mount_point: str, path: str, base: Dict[str, Any], *,
                 access: Mapping[str, Any], force: bool, timeout: int, instance_id: Optional[str],
                 client: Any) -> Dict[str, Any]:
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


def _unmount_ssh(config_root: str, instance: str, storage: str, mount_point: str, path: str, base: Dict[str, Any], *,
                 access: Mapping[str, Any], force: bool, timeout: int, host: Optional[str]) -> Dict[str, Any]:
    try:
        settings = ssh_settings(access)
    except UnmountError as exc:
        raise _refused(mount_point, instance, str(exc))
    if host is None:
        found = recorded_address(config_root, instance, settings["address"])
        if not found:
            raise UnmountError(
                "unmount of %s on %s: meta-state/instance-state.yaml records no %s for %s (instances.%s.current.%s: never "
                "launched, already gone, no such address, or recorded before csis.infra recorded it -- the next apply of "
                "its root records it); set the runtime's ssh.address, or if the machine is gone record it with confirm: true"
                % (mount_point, instance, settings["address"], instance, instance, settings["address"]))
        host = check_host(found, recorded=True)
    else:
        host = check_host(host, recorded=False)
    key = ssh_file(config_root, settings["private_key_file"])
    if not os.path.isfile(key):
        raise UnmountError("unmount of %s on %s: the runtime's ssh.private_key_file %s is not a file" % (mount_point, instance, key))
    for name in ("known_hosts_file", "config_file"):
        named = settings.get(name)
        if named and not os.path.isfile(ssh_file(config_root, named)) and not (
                name == "known_hosts_file" and settings["host_key_checking"] == "accept-new"):
            raise UnmountError("unmount of %s on %s: the runtime's ssh.%s %s is not a file%s" % (
                mount_point, instance, name, ssh_file(config_root, named),
                " (host_key_checking: strict checks the machine's key against it)" if name == "known_hosts_file" else ""))
    script = unmount_script(mount_point, force=force)
    iid = recorded_instance_id(config_root, instance)
    try:
        res = ssh_run(settings, host, script, config_root, timeout=timeout)
    except (OSError, UnmountError) as exc:
        res = {"status": "Error", "exit_status": None, "output": str(exc)[-OUTPUT_MAX:]}
    ok = res["status"] == "Success"
    details: Dict[str, Any] = {"instance_id": iid} if iid else {}
    receipt = new_receipt(instance, storage, ok, method="session", session="ssh", host=host, user=settings["user"],
                          port=settings["port"], exit_status=res["exit_status"], output=res["output"], **dict(base, **details))
    write_receipt(path, receipt)
    if not ok:
        raise UnmountError("unmount of %s on %s over ssh (%s@%s:%d) failed (exit %s, %s): %s%s"
                           % (mount_point, instance, settings["user"], host, settings["port"], res["exit_status"],
                              res["status"], _tail(res["output"]), _ssh_hint(res, settings, host, config_root)))
    return dict(receipt, path=path)
