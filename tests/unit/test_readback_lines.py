# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The lines of summary.yml's "What exists" (state/readback.py ``summary_lines``): text an
operator reads, never a Python list or mapping."""
from __future__ import annotations

from ansible_collections.csis.infra.plugins.module_utils.csis.state.readback import summary_lines


def _summary(**over):
    s = {"instances": [{"name": "test2", "instance_id": "i-1", "state": "running", "private_ip": "10.0.0.7",
                        "ami": "ami-1", "volumes": [{"volume_id": "vol-1", "device": "/dev/xvdf"}]}],
         "volumes": [{"name": "mnt_data", "volume_id": "vol-1", "size": 100, "zone": "us-east-2a", "state": "in-use",
                      "attached_to": ["i-1"]}],
         "filesystems": [{"name": "efs-storage", "file_system_id": "fs-1", "access_points": ["/coops", "/stofs"],
                          "mount_targets": 2}],
         "buckets": [{"storage": "default-bucket", "bucket": "b-1", "lifecycle_rules": 1,
                      "tags": {"team": "devops", "Owner": "coastal-ops", "csis_config": "t"}}]}
    s.update(over)
    return s


def test_each_resource_is_one_plain_line():
    assert summary_lines(_summary()) == [
        "instance test2 (i-1, running, 10.0.0.7, ami-1): vol-1 at /dev/xvdf",
        "volume mnt_data (vol-1, 100 GiB, us-east-2a, in-use) attached to i-1",
        "filesystem efs-storage (fs-1): access points /coops, /stofs, 2 mount target(s)",
        "bucket b-1 (storage default-bucket): 1 lifecycle rule(s), tags Owner=coastal-ops, csis_config=t, team=devops",
    ]


def test_none_is_said_in_words():
    lines = summary_lines(_summary(
        filesystems=[{"name": "efs", "file_system_id": "fs-2", "access_points": [], "mount_targets": 0}],
        buckets=[{"storage": "s", "bucket": "b-2", "lifecycle_rules": 0, "tags": {}},
                 {"storage": "t", "bucket": "b-3", "error": "AccessDenied"}]))
    assert lines[2:] == ["filesystem efs (fs-2): no access points, 0 mount target(s)",
                         "bucket b-2 (storage s): 0 lifecycle rule(s), no tags",
                         "bucket b-3 (storage t): unavailable: AccessDenied"]
    for line in lines:
        assert "{" not in line and "[" not in line, line
