# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The launch script's EBS lines decide, by what ``blkid`` finds on the volume, whether to format it.

The lines are taken as rendered (the example tree's golden launch script, from the ``FSTYPE=``
line to the fstab line) and run by bash with ``DEV`` on an image file, the machine's real
``blkid``, and ``mkfs`` and ``/etc/fstab`` stood in for (a stub that records the call and
writes an XFS-like signature nowhere; the fstab line goes to a scratch file):

- a new volume (no signature) is formatted as xfs;
- a volume holding a filesystem (a restored archive, here ext4) is not formatted, and its fstab
  line names that filesystem's type and UUID, the one line of its mount point (the image's own,
  a commented one and an earlier run's give way; other mount points' lines stay);
- a volume with a partition table and no filesystem is refused by name, never formatted, and
  no ``UUID=`` line without a UUID is written (it used to be, for good).
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(REPO, "tests", "golden", "examples", "instance-image", "open-tofu", "instance-generation",
                      "user-data-test2.sh.tftpl")

pytestmark = pytest.mark.skipif(not shutil.which("blkid", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"),
                                reason="blkid (util-linux) is not installed")


def _lines():
    with open(GOLDEN, encoding="utf-8") as fh:
        text = fh.read().splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith('FSTYPE="$(blkid'))
    end = next(i for i, line in enumerate(text) if i > start and line.startswith("echo ") and ">> /etc/fstab" in line)
    block = "\n".join(text[start:end + 1])
    assert "${" not in block.replace("$${", ""), "the lines hold a template variable: " + block
    return block.replace("/etc/fstab.csis-launch", '"$FSTAB.csis-launch"').replace("/etc/fstab", '"$FSTAB"')


def _run(tmp_path, image, fstab=""):
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "mkfs").write_text('#!/bin/sh\necho "$*" >> "$CALLS"\n', encoding="utf-8")
    (stub / "mkfs").chmod(0o755)
    script = "\n".join([
        "set -euo pipefail",
        'csis_fail() { echo "csis-launch: $*" >&2; exit 1; }',
        'VOL=vol-0abc', 'DEV="%s"' % image, _lines(), 'echo "FSTYPE=$FSTYPE"'])
    env = dict(os.environ, PATH="%s:%s:/usr/sbin:/sbin" % (stub, os.environ.get("PATH", "")),
               FSTAB=str(tmp_path / "fstab"), CALLS=str(tmp_path / "calls"))
    (tmp_path / "fstab").write_text(fstab, encoding="utf-8")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60, check=False)
    calls = (tmp_path / "calls").read_text(encoding="utf-8") if (tmp_path / "calls").exists() else ""
    return proc, calls, (tmp_path / "fstab").read_text(encoding="utf-8")


def _image(tmp_path, name):
    path = tmp_path / name
    with open(path, "wb") as fh:
        fh.truncate(8 * 1024 * 1024)
    return path


def test_a_new_volume_is_formatted_as_xfs(tmp_path):
    proc, calls, fstab = _run(tmp_path, _image(tmp_path, "blank.img"))
    # the stub wrote no filesystem, so the UUID check refuses to write a line without one
    assert calls.strip() == "-t xfs %s" % (tmp_path / "blank.img")
    assert proc.returncode == 1 and "has no filesystem UUID" in proc.stderr and fstab == ""


def test_a_volume_with_a_partition_table_is_refused_and_never_formatted(tmp_path):
    img = _image(tmp_path, "mbr.img")
    with open(img, "r+b") as fh:  # an MBR: one Linux partition entry and the boot signature
        fh.seek(446)
        fh.write(bytes([0x00, 0, 2, 0, 0x83, 0, 0, 0]) + (2048).to_bytes(4, "little") + (8192).to_bytes(4, "little"))
        fh.seek(510)
        fh.write(b"\x55\xaa")
    proc, calls, fstab = _run(tmp_path, img)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "csis-launch: volume vol-0abc (%s) holds no filesystem but a partition table or another signature: " \
           "not formatting it" % img in proc.stderr
    assert calls == "" and fstab == ""


@pytest.mark.skipif(not shutil.which("mkfs.ext4", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"),
                    reason="mkfs.ext4 (e2fsprogs) is not installed")
def test_a_volume_holding_a_filesystem_is_mounted_with_its_own_type(tmp_path):
    img = _image(tmp_path, "ext4.img")
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True, capture_output=True,
                   env=dict(os.environ, PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"))
    uuid = subprocess.run(["blkid", "-s", "UUID", "-o", "value", str(img)], check=True, capture_output=True, text=True,
                          env=dict(os.environ, PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")).stdout.strip()
    # the image's own line for the mount point, a commented one and one from an earlier run give way
    # to the volume's; another mount point's lines stay (/mnt/data.1 is no pattern matching /mnt/data1)
    before = ("LABEL=root / xfs defaults 0 0\n/dev/sdz /mnt/data xfs defaults 0 2\n#UUID=old /mnt/data xfs 0 2\n"
              "/dev/sdy /mnt/data1 xfs defaults 0 2\nUUID=%s /mnt/data ext4 defaults,nofail 0 2\n" % uuid)
    proc, calls, fstab = _run(tmp_path, img, before)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls == "" and "FSTYPE=ext4" in proc.stdout
    assert fstab == ("LABEL=root / xfs defaults 0 0\n/dev/sdy /mnt/data1 xfs defaults 0 2\n"
                     "UUID=%s /mnt/data ext4 defaults,nofail,x-systemd.before=local-fs.target 0 2\n" % uuid)
    assert not (tmp_path / "fstab.csis-launch").exists()


GENERATOR = "/usr/lib/systemd/system-generators/systemd-fstab-generator"


@pytest.mark.skipif(not os.access(GENERATOR, os.X_OK), reason="systemd's fstab generator is not installed")
def test_systemd_orders_the_volume_s_mount_before_local_filesystems_and_boots_without_it(tmp_path):
    """What systemd makes of the volume's fstab line at a later boot (its real fstab generator on
    the line the script writes): the mount is ordered before local-fs.target, so services, which
    start after it, never write into the bare mount point on the root disk while the volume is
    still to be mounted; and it is only wanted, not required, by local-fs.target (nofail): a
    volume missing at boot does not stop the boot. Without x-systemd.before the generator leaves a
    nofail mount unordered (the line the script wrote before)."""
    img = _image(tmp_path, "blank-for-uuid.img")
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=False, capture_output=True,
                   env=dict(os.environ, PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"))
    proc, _calls, fstab = _run(tmp_path, img)
    line = fstab.strip()
    if proc.returncode != 0:  # no mkfs.ext4 here: the line as the script writes it, with a UUID
        line = 'UUID=0b3e6f3c-1111-2222-3333-444455556666 /mnt/data xfs %s 0 2' % _lines().split(
            "/mnt/data $FSTYPE ", 1)[1].split(" ", 1)[0]
    old = "UUID=0b3e6f3c-1111-2222-3333-444455556667 /mnt/old xfs defaults,nofail 0 2"
    (tmp_path / "boot-fstab").write_text(line + "\n" + old + "\n", encoding="utf-8")
    out = tmp_path / "units"
    out.mkdir()
    gen = subprocess.run([GENERATOR, str(out), str(out), str(out)], capture_output=True, text=True, timeout=60,
                         check=False, env=dict(os.environ, SYSTEMD_FSTAB=str(tmp_path / "boot-fstab"),
                                               SYSTEMD_PROC_CMDLINE="", SYSTEMD_IN_INITRD="0"))
    assert gen.returncode == 0, gen.stdout + gen.stderr
    unit = (out / "mnt-data.mount").read_text(encoding="utf-8").splitlines()
    assert "Before=local-fs.target" in unit and "Where=/mnt/data" in unit, unit
    assert (out / "local-fs.target.wants" / "mnt-data.mount").exists()
    assert not (out / "local-fs.target.requires").exists()
    # the old line: a nofail mount systemd does not order before the local file systems
    assert "Before=local-fs.target" not in (out / "mnt-old.mount").read_text(encoding="utf-8").splitlines()
