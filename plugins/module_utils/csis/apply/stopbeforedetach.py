# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Stop a machine before an apply detaches its EBS volumes and destroys it.

terraform destroys each ``aws_volume_attachment`` of an instance module before its
``aws_instance`` (tfmodules/aws_instance/main.tf): a DetachVolume on a running machine whose
filesystem is mounted. On AWS the volume can then stay ``busy`` (the attachment's delete
timeout fails the apply halfway) or, forced, lose unflushed writes. A decommission, a
replacement (an upgrade, a ``follow`` onto a new image head: ``-replace``) and an ephemeral
teardown all do that. The role stops such a machine (EC2 StopInstances, then waits until it is
``stopped``: its OS unmounted the filesystems cleanly) after the gate, the approval, the apply
check and the plan-binding check, right before the apply.

:func:`machines_to_stop` says which (pure: the gate's addresses and the root's state);
:func:`stop_machines` stops them and waits. Plain Python: no Ansible import.
"""
from __future__ import annotations

import re
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

from .. import aws
from ..errors import CsisError
from ..state.record import resources
from .. import tfstate

#: ``<module path>.aws_instance.this`` (the module path of an instance module: ``module.instance_<label>``,
#: ``module.instance_<label>[0]`` for an ephemeral one); a deposed object (`` (deposed object …)``) does not match
INSTANCE_ADDRESS = re.compile(r"^(?P<module>module\..+)\.aws_instance\.this$")
#: EC2 states in which a machine is not stopped by this step (nothing to stop, or already going down)
SKIP_STATES = ("stopped", "shutting-down", "terminated")


class StopError(CsisError):
    """A StopInstances that failed, or a machine that did not reach ``stopped`` in time."""


def _destroyed(addresses: Optional[Mapping[str, Any]]) -> List[str]:
    """The addresses the plan destroys: its pure destroys and its replacements."""
    out: List[str] = []
    for kind in ("delete", "replace"):
        out += [str(a) for a in (addresses or {}).get(kind) or []]
    return out


def _names(instances: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    """{instance module address: instance name} of a rendered root's ``instances``."""
    return {str(info.get("address")): str(name) for name, info in (instances or {}).items()
            if isinstance(info, Mapping) and info.get("address")}


def machines_to_stop(addresses: Optional[Mapping[str, Any]], state: Mapping[str, Any],
                     instances: Optional[Mapping[str, Any]] = None) -> List[Dict[str, Any]]:
    """The machines to stop before the apply: every ``<module>.aws_instance.this`` the plan
    destroys or replaces (``addresses``: the gate's, with ``delete`` and ``replace`` lists) whose
    module's ``aws_volume_attachment`` resources the plan destroys or replaces too.

    One entry each, in the order of the plan's addresses: ``address`` (the instance module's),
    ``name`` (the instance's, from the rendered root's ``instances``; else the address),
    ``instance_id`` (the id the root's terraform ``state`` records for it; None when it holds
    none), ``attachments`` (the attachment addresses the plan destroys). A machine whose
    attachments the plan keeps (no EBS, or only the instance changes) is not in it."""
    gone = _destroyed(addresses)
    names = _names(instances)
    ids: Dict[str, Optional[str]] = {}
    for r in resources(state):
        if r["type"] == "aws_instance" and r["name"] == "this" and r["module"]:
            ids.setdefault(r["module"], r["attributes"].get("id") or None)
    out: List[Dict[str, Any]] = []
    seen = set()
    for address in gone:
        m = INSTANCE_ADDRESS.match(address)
        if not m or m.group("module") in seen:
            continue
        module = m.group("module")
        attachments = [a for a in gone if a.startswith(module + ".aws_volume_attachment.")]
        if not attachments:
            continue
        seen.add(module)
        bare = re.sub(r"\[[^\]]*\]$", "", module)  # an ephemeral module's [0]: the root names it without
        out.append({"address": module, "name": names.get(module) or names.get(bare) or module,
                    "instance_id": ids.get(module), "attachments": attachments})
    return out


def _label(m: Mapping[str, Any]) -> str:
    return "instance %s (%s)" % (m["name"], m.get("instance_id") or "no id in the state")


def _state_of(ec2: Any, instance_id: str) -> Optional[str]:
    """The machine's EC2 state name, or None when EC2 does not know it."""
    try:
        resp = ec2.describe_instances(InstanceIds=[instance_id])
    except Exception as exc:  # pylint: disable=broad-except
        if aws.is_absent("ec2", exc):
            return None
        raise
    for res in resp.get("Reservations") or []:
        for inst in res.get("Instances") or []:
            if inst.get("InstanceId") == instance_id:
                return str((inst.get("State") or {}).get("Name") or "")
    return None


def survey(machines: Iterable[Mapping[str, Any]], ec2: Any) -> List[Dict[str, Any]]:
    """Each machine with ``state`` (EC2's, None when not found) and ``action``: ``stop``, or
    ``skip`` with ``reason``. Reads only."""
    out: List[Dict[str, Any]] = []
    for m in machines:
        entry = dict(m)
        iid = m.get("instance_id")
        if not iid:
            entry.update(state=None, action="skip", reason="the root's terraform state records no instance id")
        else:
            try:
                st = _state_of(ec2, iid)
            except Exception as exc:  # pylint: disable=broad-except
                raise StopError("%s: cannot read its EC2 state before the apply: %s; nothing applied"
                                % (_label(m), aws.error_text(exc)))
            entry["state"] = st
            if st is None:
                entry.update(action="skip", reason="EC2 does not know it (not found)")
            elif st in SKIP_STATES:
                entry.update(action="skip", reason="already %s" % st)
            elif st == "stopping":
                entry["action"] = "wait"  # stopping already: waited for, not asked again
            else:
                entry["action"] = "stop"
        out.append(entry)
    return out


def stop_machines(machines: Iterable[Mapping[str, Any]], access: Mapping[str, Any], timeout: float = 600.0,
                  check: bool = False, interval: float = 5.0,
                  sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> Dict[str, Any]:
    """Stop ``machines`` (:func:`machines_to_stop`) through boto3 (``access``: :func:`.aws.root_access`)
    and wait until each is ``stopped``, ``timeout`` seconds in all.

    ``{"stopped": [...], "skipped": [...], "would_stop": [...] (check mode)}``, each entry a machine
    with its ``state`` (and a skip's ``reason``). A machine already stopped, shutting down or
    terminated, or that EC2 does not know, is skipped; one already stopping is waited for; ``check`` stops nothing. A
    StopInstances error or a machine not ``stopped`` in time raises :class:`StopError` naming it. A machine
    still launching (``pending``, which StopInstances refuses) is waited for until it runs, then stopped."""
    machines = list(machines)
    out: Dict[str, Any] = {"stopped": [], "skipped": [], "would_stop": []}
    if not machines:
        return out
    ec2 = aws.client("ec2", access)
    surveyed = survey(machines, ec2)
    out["skipped"] = [m for m in surveyed if m["action"] == "skip"]
    todo = [m for m in surveyed if m["action"] == "stop"]
    if check:
        out["would_stop"] = [m for m in surveyed if m["action"] in ("stop", "wait")]
        return out
    deadline = clock() + float(timeout)
    asked: List[str] = []

    def ask(m: Mapping[str, Any]) -> None:
        try:
            ec2.stop_instances(InstanceIds=[m["instance_id"]])
        except Exception as exc:  # pylint: disable=broad-except
            also = (" (stop already asked of %s)" % ", ".join(asked)) if asked else ""
            raise StopError("%s: StopInstances failed before the apply: %s; nothing applied%s"
                            % (_label(m), aws.error_text(exc), also))
        asked.append(m["instance_id"])

    for m in todo:
        if m["state"] != "pending":
            ask(m)
    # one wait for both: a machine still launching (``pending``: StopInstances refuses it,
    # IncorrectInstanceState) is stopped once it runs; every machine asked, or stopping already,
    # until EC2 says ``stopped``; all within the same timeout
    waiting = [m for m in surveyed if m["action"] in ("stop", "wait")]
    while waiting:
        left = []
        for m in waiting:
            launching = m["state"] == "pending"
            try:
                st = _state_of(ec2, m["instance_id"])
            except Exception as exc:  # pylint: disable=broad-except
                raise StopError("%s: cannot read its EC2 state while waiting for it to %s: %s; nothing applied"
                                % (_label(m), "finish launching" if launching else "stop", aws.error_text(exc)))
            if st == "pending" or st == "stopping" or (st == "running" and not launching):
                left.append(dict(m, state=st))
            elif st == "running":  # launched: now it can be stopped
                ask(m)
                left.append(dict(m, state=st))
            elif st == "stopped" and not launching:
                out["stopped"].append(dict(m, state=st))
            else:  # stopped or gone by other hands: nothing of ours to wait for
                out["skipped"].append(dict(m, state=st, action="skip", reason=(
                    ("already %s" % st if st else "gone while launching (not found)") if launching
                    else "gone while stopping (%s)" % (st or "not found"))))
        waiting = left
        if not waiting:
            break
        remaining = deadline - clock()
        if remaining <= 0:
            still = [m for m in waiting if m["state"] == "pending"]
            if still:
                also = (" (stop already asked of %s)" % ", ".join(asked)) if asked else ""
                raise StopError("%s still launching ('pending') %gs after the stop began: StopInstances cannot stop it "
                                "yet; nothing applied%s: run again once it runs, or raise the stop timeout"
                                % ("; ".join(_label(m) for m in still), float(timeout), also))
            raise StopError("%s did not reach 'stopped' within %gs of StopInstances; nothing applied: run again once "
                            "it is stopped, or raise the stop timeout"
                            % ("; ".join("%s (EC2 says %s)" % (_label(m), m["state"]) for m in waiting), float(timeout)))
        sleep(min(float(interval), remaining))
    return out


def stop_before_detach(root: Mapping[str, Any], addresses: Optional[Mapping[str, Any]], reveal: Any = None,
                       timeout: float = 600.0, check: bool = False, state: Optional[Mapping[str, Any]] = None,
                       interval: float = 5.0) -> Dict[str, Any]:
    """:func:`machines_to_stop` of a rendered root (its ``instances``; its terraform state read
    from its ``directory``, unless given), then :func:`stop_machines` reached as the root's runtime
    (``aws.root_access``: its static keys revealed by ``reveal``). Adds ``machines`` (the selection)."""
    if not _destroyed(addresses) or not any(INSTANCE_ADDRESS.match(a) for a in _destroyed(addresses)):
        return {"machines": [], "stopped": [], "skipped": [], "would_stop": []}
    st = state if state is not None else tfstate.read(root["directory"], root.get("binary_path") or "terraform")
    machines = machines_to_stop(addresses, st, root.get("instances"))
    if not machines:
        return {"machines": [], "stopped": [], "skipped": [], "would_stop": []}
    access = aws.root_access(root.get("aws") or {}, root.get("secrets"), reveal, "root '%s'" % root.get("key", "?"))
    res = stop_machines(machines, access, timeout=timeout, check=check, interval=interval)
    res["machines"] = machines
    return res
