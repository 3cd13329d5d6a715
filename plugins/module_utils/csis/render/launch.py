# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Launch parameters of an instance and its launch script (user data template).

:func:`compute_launch_params` derives, from validated configuration and meta-state
only, what a machine is launched with; they are recorded in
``meta-state/launch-params.yaml`` after the apply that launched it and are immutable
afterwards (:func:`immutability_problems`), except for a mount removal (a detach) or
a sanctioned replacement.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any, Dict, List, Mapping, Optional

from ..config import models as m
from ..config.loader import Tree
from ..errors import Problem
from .hcl import template_literal

EBS_DEVICES = ["/dev/xvd%s" % c for c in "fghijklmnopqrstuvwxyz"]
MARKER = "/var/lib/csis/launch-applied"
#: keys that may differ from the record without a replacement
#: the keys of a recorded mount that a launched instance keeps (the launch script made the mount point, the
#: group's subtree with its mode; an EFS mount names the group's access point, which its storage root replaces
#: when share_mode changes)
MOUNT_KEYS = ("mount_point", "type", "builder", "device", "group", "share_mode", "public_read")
MUTABLE_KEYS = {"run", "user_data_sha256", "launched", "launched_run", "build", "machine_type", "tags",
                "hostname", "alias", "description", "region"}


def efs_through_public(st: m.Storage, group: Optional[str]) -> bool:
    """Whether an instance of ``group`` mounts EFS storage ``st`` through its public access point
    (the filesystem's root, mounted read-only) rather than its group's (the directory ``/<group>``,
    created with the group's gid and the storage's share_mode): a public_read storage the group is
    not a member of. The instance roots choose the access point by it, the launch script the mount."""
    return bool(st.public_read) and (not group or group not in st.groups)


def generation_number(meta: Mapping[str, Any], name: str, ephemeral: bool, replacing: bool = False) -> int:
    """The generation the machine will be: the standing one, else the next of its counter."""
    rec = ((meta.get("instance-state.yaml") or {}).get("instances") or {}).get(name) or {}
    cur = rec.get("current")
    kind = "ephemeral" if ephemeral else "durable"
    if cur and cur.get("kind", "durable") == kind and not replacing:
        return int(cur.get("number") or 1)
    counters = rec.get("generation") or {}
    return int(counters.get(kind) or 0) + 1


#: the longest hostname a machine is given: a hostname label's 63 characters (RFC 1123)
HOSTNAME_MAX = 63
#: a hostname systemd's ``hostnamectl set-hostname`` keeps as the static one: letters, digits and
#: hyphens ("LDH", RFC 5890), labels neither starting nor ending with a hyphen, single dots between
#: them. An instance name may hold ``_`` and ``.`` (configuration NAME_RE); ``web_1-001`` is refused
#: by hostnamectl, and the launch script's fallback (``hostname``) lasts only until the next boot.
HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\Z")


def hostname_fix(name: str) -> str:
    """A name whose canonical hostname hostnamectl takes: every run of other characters one hyphen."""
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") or "instance"


def canonical_hostname(meta: Mapping[str, Any], name: str, ephemeral: bool, replacing: bool = False) -> str:
    """``<name>-NNN``: the machine's hostname, NNN its generation (:func:`generation_number`)."""
    return "%s-%03d" % (name, generation_number(meta, name, ephemeral, replacing))


def recorded_devices(meta: Mapping[str, Any], name: str) -> Dict[str, str]:
    """``{storage: device}`` of the instance's recorded EBS mounts (its launch parameters)."""
    rec = ((meta.get("launch-params.yaml") or {}).get("instances") or {}).get(name)
    mounts = rec.get("mounts") if isinstance(rec, dict) else None
    return {x["storage"]: x["device"] for x in mounts or []
            if isinstance(x, dict) and isinstance(x.get("storage"), str) and x.get("device") in EBS_DEVICES}


def pinned_build(meta: Mapping[str, Any], name: str) -> Optional[str]:
    pins = (meta.get("pins.yaml") or {}).get("instances") or {}
    v = pins.get(name)
    return v if isinstance(v, str) and v.startswith("ami-") else None


def pending_replacement(meta: Mapping[str, Any], name: str) -> bool:
    return name in ((meta.get("pins.yaml") or {}).get("pending_replacements") or {})


def pending_target(meta: Mapping[str, Any], name: str) -> Optional[str]:
    """The build an explicit upgrade asked for (``to`` of the pending marker), if any."""
    entry = ((meta.get("pins.yaml") or {}).get("pending_replacements") or {}).get(name)
    to = entry.get("to") if isinstance(entry, dict) else entry
    return to if isinstance(to, str) and to.startswith("ami-") else None


def follow_target(meta: Mapping[str, Any], inst: m.Instance, img: Optional[m.Image],
                  head: Optional[str] = None) -> Optional[str]:
    """The build a ``follow`` instance moves to: the image's series head (``head``, resolved
    from the runtime by csis_series_heads; else the image's declared ``ami_id``) when the
    instance is pinned to another build; None when nothing moves. ``pinned`` never moves."""
    if inst.image_policy != "follow" or img is None:
        return None
    target = head or img.ami_id
    if not target:
        return None
    pin = pinned_build(meta, inst.name)
    return target if pin and pin != target else None


def compute_launch_params(tree: Tree, meta: Mapping[str, Any], inst: m.Instance,
                          replacing: bool = False, user_data: bool = True) -> Dict[str, Any]:
    """The instance's launch parameters as a launch now would record them. ``user_data=False``
    leaves out ``user_data_sha256`` (the launch script is not built): what the immutability
    check compares needs no script, since the key is mutable (:data:`MUTABLE_KEYS`)."""
    builder = tree.instance_builder_for(inst)
    rt = tree.builder_runtime(builder) if builder else None
    img = tree.image_of(inst)
    group = img.group if img else None
    mounts: List[Dict[str, Any]] = []
    # an EBS mount keeps the device its launch recorded: removing the first of two mounts (the one
    # in-place change, N26) must not move the second to the first's device, which would replace its
    # attachment; a mount without a recorded device takes the first one no mount of it holds
    recorded = recorded_devices(meta, inst.name)
    taken = {recorded[mp.name] for mp in inst.storages if mp.name in recorded}
    for mp in inst.storages:
        st = tree.storages[mp.name]
        sb = tree.storage_builder_for(st)
        kind = tree.kind_of(sb)
        entry: Dict[str, Any] = {
            "storage": st.name, "type": kind["capability"], "builder": sb.name, "mount_point": mp.mount_point,
            "group": group, "share_mode": st.share_mode, "public_read": st.public_read,
        }
        if kind["capability"] == "ebs":
            device = recorded.get(st.name) or next((d for d in EBS_DEVICES if d not in taken), None)
            taken.add(device)
            entry["device"] = device  # None past /dev/xvdz: validation refuses so many (config/validate.py)
        elif kind["capability"] == "efs" and efs_through_public(st, group):
            entry["read_only"] = True  # through the public access point: mounted read-only
        mounts.append(entry)
    ephemeral = inst.ephemeral
    params: Dict[str, Any] = {
        "image": inst.image,
        "build": pinned_build(meta, inst.name) or "unbound",
        "machine_type": inst.machine_type or (rt.default_machine_type if rt else ""),
        "group": group,
        "identity_type": "posix" if group else None,
        "mounts": mounts,
        "session": rt.session_mechanism if rt else None,
        "hostname": canonical_hostname(meta, inst.name, ephemeral, replacing),
        "ephemeral": ephemeral,
        "runtime": rt.name if rt else None,
        "builder": builder.name if builder else None,
        "region": rt.region if rt else None,
        "tags": dict(inst.tags),
    }
    if inst.userdata:
        params["userdata"] = inst.userdata
    if user_data:
        params["user_data_sha256"] = hashlib.sha256(user_data_template(params).encode("utf-8")).hexdigest()
    return params


def _q(text: str) -> str:
    """Single-quote for the shell (values are validated plain names/paths; quote anyway)."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _fstab_entry(mp: str, entry: str) -> List[str]:
    """The script lines that make ``entry`` the one fstab line of mount point ``mp``: any other
    line whose second field is ``mp`` (an image's own entry, a commented one, this script's from an
    earlier run) goes first, compared as a string, as the unmount removes it
    (:func:`.unmount.unmount_script`). ``entry`` is double-quoted shell (it holds ``$UUID``...)."""
    return [
        "touch /etc/fstab",
        "awk -v mp=%s '$2 != mp' /etc/fstab > /etc/fstab.csis-launch" % _q(mp),
        "cat /etc/fstab.csis-launch > /etc/fstab",
        "rm -f /etc/fstab.csis-launch",
        'echo "%s" >> /etc/fstab' % entry,
    ]


#: how long the launch script waits for an EBS volume's device (polled every 2 s)
DEVICE_WAIT_SECONDS = 300
#: an EBS volume's fstab options (the comment at its fstab line says why each)
EBS_MOUNT_OPTIONS = "defaults,nofail,x-systemd.before=local-fs.target"


def user_data_template(params: Mapping[str, Any]) -> str:
    """The launch script as a ``templatefile`` template.

    Template variables: ``group_gid`` (number or ""), ``ebs`` (storage -> {volume_id,
    device_name}), ``efs`` (storage -> {file_system_id, access_point_id}) and
    ``enrollment_token_b64`` (base64 of the token, or ""). Every configuration string is
    template-escaped, so it lands in the script as the literal text it was.
    """
    host = params["hostname"]
    L: List[str] = [
        "#!/usr/bin/env bash",
        "# csis.infra launch script for %s (generated; do not edit)" % template_literal(host),
        "# Every step must succeed: the completion marker %s is written last." % MARKER,
        "set -euo pipefail",
        "exec > >(tee -a /var/log/csis-launch.log) 2>&1",
        "csis_fail() { echo \"csis-launch: $*\" >&2; exit 1; }",
        # a failing command names itself in the log (set -e ends the script without a word)
        "trap 'echo \"csis-launch: line $LINENO: $BASH_COMMAND failed\" >&2' ERR",
        # a marker an image built from a launched machine carries is not this machine's
        "rm -f %s" % MARKER,
        "hostnamectl set-hostname %s 2>/dev/null || hostname %s" % (_q(host), _q(host)),
    ]
    L += [
        "",
        '%{ if enrollment_token_b64 != "" }',
        # the manual's sftd enrollment: the machine is reached at its private address (a public
        # one sftd might pick up is never advertised: the reference's finding 26), the token,
        # then sftd restarted to enroll with it. Before the mounts: a machine whose mount fails
        # (no completion marker) can still be logged in to, to see why
        "# sftd enrollment: advertise the private address, write the token, restart sftd",
        "SFT_ADDR=\"$(hostname -I 2>/dev/null | awk '{print $1}')\" || SFT_ADDR=''",
        'if [ -n "$SFT_ADDR" ]; then',
        "  install -d -m 0755 /etc/sft",
        "  touch /etc/sft/sftd.yaml",
        "  sed -i '/^AccessAddress:/d' /etc/sft/sftd.yaml",
        '  echo "AccessAddress: $SFT_ADDR" >> /etc/sft/sftd.yaml',
        "fi",
        "install -d -m 0700 /var/lib/sftd",
        "(umask 077 && printf '%s' '${enrollment_token_b64}' | base64 -d > /var/lib/sftd/enrollment.token)",
        "if command -v systemctl >/dev/null 2>&1; then",
        '  systemctl restart sftd || echo "csis-launch: sftd did not restart (is it installed?); it enrolls with '
        'the token when it starts" >&2',
        "fi",
        "%{ endif }",
        "",
    ]
    if params.get("group"):
        L.append('GID="${group_gid}"')
    for mnt in params.get("mounts") or []:
        mp = mnt["mount_point"]
        s = template_literal(mnt["storage"])
        L.append("")
        L.append("# mount %s (%s) at %s" % (s, mnt["type"], mp))
        if mnt["type"] == "ebs":
            L += [
                "mkdir -p %s" % _q(mp),
                'DEV="${ebs["%s"].device_name}"' % s,
                'VOL="${ebs["%s"].volume_id}"' % s,
                'BYID="/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_$${VOL//-/}"',
                # up to 300 s: terraform attaches the volume only once the instance runs (its
                # attachments wait for it), while cloud-init may already run this script
                "for _ in $(seq 1 %d); do" % (DEVICE_WAIT_SECONDS // 2),
                '  if [ -e "$BYID" ]; then DEV="$(readlink -f "$BYID")"; break; fi',
                '  if [ -e "$DEV" ]; then break; fi',
                "  sleep 2",
                "done",
                '[ -e "$DEV" ] || csis_fail "device for volume $VOL did not appear within %d s (tried ${ebs["%s"].device_name} and $BYID)"'
                % (DEVICE_WAIT_SECONDS, s),
                # a new volume is formatted; one with a filesystem (a restored archive) is mounted as
                # it is; one with a partition table or another signature but no filesystem is refused
                # (blkid exits 2 when it finds no signature: no filesystem type then)
                'FSTYPE="$(blkid -o value -s TYPE "$DEV")" || FSTYPE=\'\'',
                'if [ -z "$FSTYPE" ]; then',
                '  blkid "$DEV" >/dev/null 2>&1 && csis_fail "volume $VOL ($DEV) holds no filesystem but a partition '
                'table or another signature: not formatting it"',
                '  mkfs -t xfs "$DEV"',
                '  FSTYPE=xfs',
                'fi',
                'UUID="$(blkid -s UUID -o value "$DEV")" || UUID=\'\'',
                '[ -n "$UUID" ] || csis_fail "volume $VOL ($DEV) has no filesystem UUID"',
                # nofail: a volume missing at a later boot does not stop the boot; but systemd then no
                # longer orders the mount before local-fs.target, and services (after it) could start
                # writing into the bare mount point on the root disk: x-systemd.before puts the order back
                # (mount(8) ignores x-* options)
            ] + _fstab_entry(mp, "UUID=$UUID %s $FSTYPE %s 0 2" % (mp, EBS_MOUNT_OPTIONS)) + [
                "mountpoint -q %s || mount %s" % (_q(mp), _q(mp)),
                "mountpoint -q %s || csis_fail %s" % (_q(mp), _q("%s is not mounted" % mp)),
                # something else mounted there first (an image's own fstab entry, mounted at boot) is no
                # mount of the volume: the device the mount point shows must be the volume's
                '[ "$(findmnt -n -o SOURCE --mountpoint %s)" -ef "$DEV" ] || csis_fail "%s is mounted, but not '
                'from volume $VOL ($DEV)"' % (_q(mp), mp),
            ]
            if mnt.get("group"):
                sub = "%s/%s" % (mp, mnt["group"])
                L += [
                    "mkdir -p %s" % _q(sub),
                    'chgrp "$GID" %s' % _q(sub),
                    "chmod %s %s" % (mnt["share_mode"], _q(sub)),
                ]
        elif mnt["type"] == "efs":
            L += [
                # fstab type efs (tls, accesspoint=) is amazon-efs-utils' mount helper: the image's to provide
                "command -v mount.efs >/dev/null 2>&1 || csis_fail %s" % _q(
                    "%s: amazon-efs-utils (mount.efs) is not installed in the image; the EFS mounts need it" % mp),
                "mkdir -p %s" % _q(mp),
                'EFS_ID="${efs["%s"].file_system_id}"' % s,
                'EFS_AP="${efs["%s"].access_point_id}"' % s,
            ] + _fstab_entry(mp, "$EFS_ID:/ %s efs _netdev,tls,accesspoint=$EFS_AP,%snofail 0 0"
                             % (mp, "ro," if mnt.get("read_only") else "")) + [
                "mountpoint -q %s || mount %s" % (_q(mp), _q(mp)),
                "mountpoint -q %s || csis_fail %s" % (_q(mp), _q("%s is not mounted" % mp)),
            ]
        else:
            L.append("# s3 storages are not mounted: reach the bucket with the AWS CLI or SDK")
    if params.get("userdata"):
        L += ["", "# the instance's own userdata"]
        L.append(template_literal(params["userdata"].rstrip("\n")))
    L += ["", "mkdir -p /var/lib/csis", "date -u +%FT%TZ > " + MARKER, ""]
    return "\n".join(L)


def immutability_problems(tree: Tree, meta: Mapping[str, Any],
                          computed: Mapping[str, Mapping[str, Any]],
                          replacing: Mapping[str, bool]) -> List[Problem]:
    """N26: a launched instance's recorded parameters may change only by a mount removal
    or a sanctioned replacement."""
    out: List[Problem] = []
    recs = (meta.get("launch-params.yaml") or {}).get("instances") or {}
    for name, new in computed.items():
        old = recs.get(name)
        if not isinstance(old, dict) or not old.get("launched") or replacing.get(name):
            continue
        changed: List[str] = []
        for k in sorted(set(old) | set(new)):
            if k in MUTABLE_KEYS or k == "mounts":
                continue
            if old.get(k) != new.get(k):
                changed.append(k)
        old_m = {x.get("storage"): x for x in old.get("mounts") or [] if isinstance(x, dict)}
        new_m = {x.get("storage"): x for x in new.get("mounts") or []}
        for s, x in new_m.items():
            if s not in old_m:
                changed.append("mounts[%s] added" % s)
            else:
                # a key the record has (records written before a key was recorded are not refused for it)
                keys = [k for k in MOUNT_KEYS if k in old_m[s] and old_m[s].get(k) != x.get(k)]
                if keys:
                    changed.append("mounts[%s] changed: %s" % (s, ", ".join(keys)))
        if changed:
            f, k = tree.at("instance", name)
            out.append(Problem(f, k,
                               "instance '%s' was launched (run %s) and its launch parameters changed (%s); launch parameters "
                               "are immutable after launch -- replace the instance (upgrade instance, or decommission and "
                               "redeclare) (N26)" % (name, old.get("launched_run", "?"), ", ".join(changed))))
    return out
