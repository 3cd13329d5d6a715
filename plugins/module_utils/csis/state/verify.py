# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Verify a launched instance the way the manual says.

Two halves:

* :func:`verify_on_machine` runs ON the machine (``csis.infra.csis_verify_instance``, through
  whatever connection Ansible uses for the host: SSM or SSH in production, ``local`` in
  tests). It checks the completion marker, every declared mount at its mount point with
  its group subtree's group and mode, and the image's post-bake test commands. Standard
  library only.
* :func:`booted_image_check` runs on the controller: the machine's booted AMI, read from
  EC2 by the instance id terraform recorded, against the pinned (or expected) build.

:func:`combine` joins both into the verdict ``meta-state/verifications.yaml`` records.

File-system root. ``fs_root`` (default ``/``) is where the checks look. With ``/`` a mount
is a real mount point (``os.path.ismount``, or a ``findmnt`` target). With another root
(tests, or a chroot/image inspection) the root stands in for ``/``: a mount counts as
present when ``<fs_root>/proc/mounts`` (the format of ``/proc/mounts``:
``<source> <target> <fstype> <options> 0 0``) lists its mount point as a target and
``<fs_root><mount point>`` is a directory.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from .. import aws
from ..clock import now

MARKER = "/var/lib/csis/launch-applied"
EVIDENCE_MAX = 20
DETAIL_MAX = 500


def _under(fs_root: str, path: str) -> str:
    return os.path.join(fs_root, path.lstrip("/")) if fs_root not in ("", "/") else path


def _unescape_mount(text: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal
    return (text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\"))


def mount_targets(fs_root: str) -> Set[str]:
    """Mount targets seen from ``fs_root`` (see the module docstring)."""
    if fs_root in ("", "/"):
        found: Set[str] = set()
        findmnt = shutil.which("findmnt")
        if findmnt:
            # a mount point with a name that is no UTF-8 (some other mount on the machine) is read as
            # its bytes, never as an error that would make the machine look unreachable
            res = subprocess.run([findmnt, "-rn", "-o", "TARGET"], capture_output=True, text=True, check=False,
                                 errors="surrogateescape")
            if res.returncode == 0:
                found |= {_unescape_mount(x.strip().replace("\\x20", " ")) for x in res.stdout.splitlines() if x.strip()}
        try:
            with open("/proc/mounts", "r", encoding="utf-8", errors="surrogateescape") as fh:
                found |= {_unescape_mount(line.split()[1]) for line in fh if len(line.split()) >= 2}
        except OSError:
            pass
        return found
    path = os.path.join(fs_root, "proc", "mounts")
    try:
        with open(path, "r", encoding="utf-8", errors="surrogateescape") as fh:
            return {_unescape_mount(line.split()[1]) for line in fh if len(line.split()) >= 2}
    except OSError:
        return set()


def _check(name: str, ok: bool, detail: str) -> Dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail[:DETAIL_MAX]}


def check_marker(fs_root: str, marker: str = MARKER) -> Dict[str, Any]:
    p = _under(fs_root, marker)
    if os.path.isfile(p):
        try:
            with open(p, "r", encoding="utf-8", errors="replace") as fh:
                stamp = fh.read(100).strip()
        except OSError:
            stamp = ""
        return _check("startup scripts", True, "%s present%s" % (marker, " (%s)" % stamp if stamp else ""))
    return _check("startup scripts", False, "%s is missing: the launch script did not complete (see "
                                            "/var/log/csis-launch.log)" % marker)


def check_mount(fs_root: str, mount: Mapping[str, Any], targets: Set[str]) -> List[Dict[str, Any]]:
    """One check for the mount itself and one for the group's directory (when a group owns it):
    the subtree ``<mount point>/<group>`` the launch script made on an EBS volume, or with
    ``group_root`` (an EFS mount through its group's access point, whose root is the group's
    directory) the mount point itself."""
    out: List[Dict[str, Any]] = []
    mp = str(mount["mount_point"])
    name = "mount %s (%s)" % (mp, mount.get("storage", "?"))
    local = _under(fs_root, mp)
    if fs_root in ("", "/"):
        present = os.path.ismount(mp) or mp in targets
    else:
        present = mp in targets and os.path.isdir(local)
    if not present:
        out.append(_check(name, False, "%s is not mounted" % mp))
        return out
    out.append(_check(name, True, "%s is mounted" % mp))
    group = mount.get("group")
    if group:
        if mount.get("group_root"):
            sub, shown = local, mp
            gname = "group directory %s (%s)" % (mp, group)
        else:
            sub, shown = os.path.join(local, str(group)), "%s/%s" % (mp.rstrip("/"), group)
            gname = "group subtree %s" % shown
        try:
            st = os.stat(sub)
        except OSError as exc:
            out.append(_check(gname, False, "%s: %s" % (shown, exc.strerror or exc)))
            return out
        problems = []
        if not stat.S_ISDIR(st.st_mode):
            problems.append("not a directory")
        want_gid = mount.get("gid")
        if want_gid not in (None, "") and st.st_gid != int(want_gid):
            problems.append("group is gid %d, expected %s (%s)" % (st.st_gid, want_gid, group))
        want_mode = mount.get("mode") or mount.get("share_mode")
        if want_mode:
            have = stat.S_IMODE(st.st_mode)
            if have != int(str(want_mode), 8):
                problems.append("mode is %04o, expected %s" % (have, want_mode))
        out.append(_check(gname, not problems, "; ".join(problems) if problems else
                          "gid %d, mode %04o" % (st.st_gid, stat.S_IMODE(st.st_mode))))
    return out


def run_test(command: str, fs_root: str, timeout: int) -> Dict[str, Any]:
    env = dict(os.environ)
    env["CSIS_FS_ROOT"] = fs_root or "/"
    try:
        res = subprocess.run(["/bin/sh", "-c", command], cwd=fs_root or "/", capture_output=True, text=True,
                             timeout=timeout, env=env, check=False)
        out = (res.stdout + res.stderr).strip()
        return _check("test: %s" % command, res.returncode == 0,
                      "exit %d%s" % (res.returncode, (": " + out[-300:]) if out else ""))
    except subprocess.TimeoutExpired:
        return _check("test: %s" % command, False, "timed out after %ds" % timeout)
    except OSError as exc:
        return _check("test: %s" % command, False, str(exc))


def verify_on_machine(fs_root: str = "/", marker: str = MARKER, mounts: Iterable[Mapping[str, Any]] = (),
                      tests: Iterable[str] = (), test_timeout: int = 300) -> Dict[str, Any]:
    """The on-machine checks; ``{ok, checks: [{name, ok, detail}], evidence}``."""
    fs_root = fs_root or "/"
    checks: List[Dict[str, Any]] = []
    if fs_root != "/" and not os.path.isdir(fs_root):
        checks.append(_check("file-system root", False, "%s is not a directory" % fs_root))
        return {"ok": False, "checks": checks, "evidence": [], "fs_root": fs_root, "time": now()}
    checks.append(check_marker(fs_root, marker))
    targets = mount_targets(fs_root)
    for mnt in mounts:
        if mnt.get("type") == "s3":
            continue  # s3 storages are not mounted
        checks.extend(check_mount(fs_root, mnt, targets))
    for cmd in tests:
        checks.append(run_test(str(cmd), fs_root, test_timeout))
    evidence = sorted(t for t in targets if t.startswith("/mnt") or any(t == m.get("mount_point") for m in mounts))
    return {"ok": all(c["ok"] for c in checks), "checks": checks, "evidence": evidence[:EVIDENCE_MAX],
            "fs_root": fs_root, "time": now()}


# --------------------------------------------------------------------------- controller side
def booted_image_check(access: Mapping[str, Any], instance_id: Optional[str], expected: Optional[str],
                       name_pattern: Optional[str] = None, client: Any = None) -> Dict[str, Any]:
    """The machine's booted AMI (EC2, by the recorded instance id) against the expected build.

    With no expected build (an unpinned machine) the booted image must be a self-owned
    AMI whose name starts with the image's ``name_pattern``.
    """
    if not instance_id:
        return _check("booted image", False, "no instance id recorded for the machine")
    if client is None:
        client = aws.client("ec2", access)
    try:
        res = client.describe_instances(InstanceIds=[instance_id])
    except Exception as exc:
        return _check("booted image", False, "describe_instances %s: %s" % (instance_id, exc))
    insts = [i for r in res.get("Reservations") or [] for i in r.get("Instances") or []]
    if not insts:
        return _check("booted image", False, "%s not found" % instance_id)
    booted = insts[0].get("ImageId")
    state = (insts[0].get("State") or {}).get("Name")
    seen = {"booted": booted, "state": state, "instance_id": instance_id}
    if expected:
        ok = booted == expected
        return dict(_check("booted image", ok, "%s booted %s%s (%s)" % (
            instance_id, booted, "" if ok else ", expected the pinned build %s" % expected, state)), **seen)
    if name_pattern:
        try:
            imgs = client.describe_images(ImageIds=[booted]).get("Images") or []
        except Exception as exc:
            return dict(_check("booted image", False, "describe_images %s: %s" % (booted, exc)), **seen)
        iname = imgs[0].get("Name", "") if imgs else ""
        ok = bool(iname) and iname.startswith(name_pattern)
        return dict(_check("booted image", ok, "%s booted %s (%s)%s" % (
            instance_id, booted, iname or "unknown image",
            "" if ok else ", which is not a build of the image (name pattern %s)" % name_pattern)), **seen)
    return dict(_check("booted image", True, "%s booted %s (no pinned build to compare)" % (instance_id, booted)), **seen)


#: EC2 states of a machine its operator stopped: it cannot be checked, and that is no failed build
STOPPED = ("stopping", "stopped")


def skipped_as_stopped(instance: str, error: Optional[str], booted: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The reference's ``verify <name>: SKIPPED -- the machine is stopped ...`` when the machine could not be
    reached (``error``) and EC2 says it is stopped (``booted``, :func:`booted_image_check`'s): then nothing is
    recorded, since a failed verdict would hold its build's release back and start an ephemeral's
    ``teardown_after`` clock. None otherwise."""
    if error and booted and booted.get("state") in STOPPED:
        return "verify %s: SKIPPED -- the machine is stopped (EC2 says %s is %s); nothing recorded; start it and verify again" % (
            instance, booted.get("instance_id"), booted["state"])
    return None


def verified_build(booted: Optional[Mapping[str, Any]], expected: Optional[str]) -> Optional[str]:
    """The build a verdict is about: the AMI EC2 reports the machine booted (``booted``,
    :func:`booted_image_check`'s), which is what the on-machine checks and the post-bake tests ran
    on; ``expected`` only when EC2 was not asked or did not answer. Never the build the machine
    was expected to boot when EC2 says it booted another: a verdict of a machine that runs the old
    build (a pending upgrade not applied yet) is no evidence about the new one."""
    return (booted or {}).get("booted") or expected


def combine(instance: str, on_machine: Optional[Mapping[str, Any]], booted: Optional[Mapping[str, Any]], *,
            runtime: Optional[str], build: Optional[str], run: Optional[str], ephemeral: bool,
            error: Optional[str] = None, instance_id: Optional[str] = None) -> Dict[str, Any]:
    """The record appended to ``verifications.yaml``. ``build``: what the verdict is about
    (:func:`verified_build`); ``instance_id``: the machine verified (the generation standing when
    it ran; :func:`verdict_of` matches a verdict to a generation by it)."""
    checks: List[Dict[str, Any]] = []
    if error:
        checks.append(_check("reach the machine", False, error))
    evidence: List[Any] = []
    if on_machine:
        found, evidence = _machine_verdict(on_machine)
        checks.extend(found)
    elif not error:
        checks.append(_check("reach the machine", False, "no on-machine verdict"))
    if booted:
        checks.append({"name": booted["name"], "ok": bool(booted["ok"]), "detail": booted["detail"]})
    ok = bool(checks) and all(c["ok"] for c in checks)
    return {"instance": instance, "instance_id": instance_id or (booted or {}).get("instance_id"), "runtime": runtime,
            "build": build, "run": run, "ephemeral": bool(ephemeral), "time": now(), "ok": ok, "checks": checks,
            "evidence": evidence[:EVIDENCE_MAX]}


def verdict_of(verdicts: Iterable[Any], instance: str, instance_id: Optional[str]) -> Optional[Mapping[str, Any]]:
    """The last verdict of ``verdicts`` (``verifications.yaml``'s, oldest first) about the machine of
    ``instance`` that is ``instance_id`` (its standing generation): a verdict of an earlier generation
    (another instance id), or one that names no instance id (written before verdicts recorded it), is
    not this machine's. Without ``instance_id`` (a generation whose id is not recorded) the last
    verdict of the name counts, as nothing tells the generations apart. None: no verdict of it."""
    for v in reversed(list(verdicts or [])):
        if isinstance(v, Mapping) and v.get("instance") == instance:
            if not instance_id or v.get("instance_id") == instance_id:
                return v
    return None


def _machine_verdict(on_machine: Any) -> Tuple[List[Dict[str, Any]], List[Any]]:
    """(the checks, the evidence) of csis_verify_instance's result, as they are recorded. A verdict
    not in its shape (a check that is no ``{name: <string>, ok: true|false}``, ``ok: "False"``
    above all, which ``bool`` would read as passed) is one failed check saying what is wrong:
    never a pass, never a traceback."""
    def refused(what: str) -> Tuple[List[Dict[str, Any]], List[Any]]:
        return [_check("on-machine verdict", False, ("not understood: %s" % what)[:DETAIL_MAX])], []

    if not isinstance(on_machine, Mapping):
        return refused("a %s, not a mapping" % type(on_machine).__name__)
    # absent or null is none; any other value must be a list ({}, "" or false is not understood)
    raw = [] if on_machine.get("checks") is None else on_machine["checks"]
    evidence = [] if on_machine.get("evidence") is None else on_machine["evidence"]
    if not isinstance(raw, list):
        return refused("'checks' is a %s, not a list" % type(raw).__name__)
    if not isinstance(evidence, list):
        return refused("'evidence' is a %s, not a list" % type(evidence).__name__)
    checks = []
    for index, c in enumerate(raw):
        if not isinstance(c, Mapping) or not isinstance(c.get("name"), str) or not isinstance(c.get("ok"), bool):
            return refused("checks[%d] is not {name: <string>, ok: true|false, detail}: %r" % (index, c))
        checks.append({"name": c["name"], "ok": c["ok"], "detail": str(c.get("detail", ""))[:DETAIL_MAX]})
    return checks, evidence


def failure_message(verdict: Mapping[str, Any]) -> str:
    bad = ["%s: %s" % (c["name"], c["detail"]) for c in verdict.get("checks") or [] if not c.get("ok")]
    return "instance %s failed verification: %s" % (verdict.get("instance"), "; ".join(bad) or "no checks ran")
