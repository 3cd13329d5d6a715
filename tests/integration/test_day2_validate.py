# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Illegal storage transitions are refused at validate, before anything runs: a real
(``csis_dry_run=false``) storage run with apply flags on stops at the render role with the
manual's messages, renders nothing, plans nothing and leaves meta-state byte-identical.
The full table is covered in tests/unit/test_state_machine.py."""
from __future__ import annotations

import os

import pytest
import yaml

from day2_trees import Runner, make_tree, meta_bytes, text

pytestmark = pytest.mark.integration


def test_illegal_transitions_are_refused_before_anything_runs(moto_endpoint, tmp_path):
    root = make_tree(str(tmp_path), "csis-h8-val", [
        {"name": "mnt_data", "mount_point": "/mnt/data", "groups": ["coops"], "state": "archived"},
        {"name": "gone", "type": "aws-ebs", "state": "active"},
        {"name": "plainb", "type": "aws-s3", "bucket_name": "csis-h8-val-plain", "state": "archived"},
    ], [{"name": "test2", "image": "imgfile-basic-dask"}])
    os.makedirs(os.path.join(root, "meta-state"))
    with open(os.path.join(root, "meta-state/storage-state.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump({"storages": {
            "mnt_data": {"state": "active", "generation": 1, "facts": {"builder": "aws-ebs", "type": "ebs"}},
            "gone": {"state": "destroyed", "generation": 1, "facts": {"builder": "aws-ebs", "type": "ebs"}},
            "plainb": {"state": "active", "generation": 1, "facts": {"builder": "aws-s3", "type": "s3"}}}}, fh)
    with open(os.path.join(root, "meta-state/launch-params.yaml"), "w", encoding="utf-8") as fh:
        # test2 no longer declares the mount, but its launched record still has it (reality)
        yaml.safe_dump({"instances": {"test2": {"launched": True, "image": "imgfile-basic-dask", "mounts": [
            {"storage": "mnt_data", "type": "ebs", "builder": "aws-ebs", "mount_point": "/mnt/data",
             "device": "/dev/xvdf", "group": "coops", "share_mode": "2770", "public_read": False}]}}}, fh)
    # "gone": destroyed -> active is legal (a new generation); make it illegal instead: destroyed -> archived
    with open(os.path.join(root, "storages/storage0.yaml"), encoding="utf-8") as fh:
        st = yaml.safe_load(fh)
    st["storages"][1]["state"] = "archived"
    with open(os.path.join(root, "storages/storage0.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(st, fh, sort_keys=False)
    before = meta_bytes(root)
    res = Runner(root, moto_endpoint).play("storage.yml")
    assert res.returncode != 0
    out = text(res)
    assert "storage 'mnt_data' cannot move active -> archived while attached by ['test2'] " \
           "(detach in one run, transition in the next; N21)" in out
    assert "storage 'gone': transition destroyed -> archived is not legal" in out
    assert "storage 'plainb' (tf-aws-s3) requests archived, which its builder does not realize" in out
    assert "nothing was written" in out
    assert not os.path.exists(os.path.join(root, "generated", "storage"))
    assert meta_bytes(root) == before
    assert "Plan to a plan file" not in res.stdout
