# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A leftover errored.tfstate is reported before a plan, with what to do (issue 16, defect 5)."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.apply import errored, statelock


def _state(serial=7, lineage="0f7c-lineage", instances=2):
    return {"version": 4, "serial": serial, "lineage": lineage, "resources": [
        {"mode": "managed", "type": "aws_ebs_volume", "name": "this", "instances": [{}] * instances},
        {"mode": "data", "type": "aws_vpc", "name": "x", "instances": [{}]}]}


def test_no_errored_state_is_nothing_to_report(tmp_path):
    assert errored.errored_state(str(tmp_path)) is None
    errored.check_errored_state(str(tmp_path))


def test_errored_state_is_described_and_refused_with_the_push_command(tmp_path):
    (tmp_path / "errored.tfstate").write_text(json.dumps(_state()), encoding="utf-8")
    info = errored.errored_state(str(tmp_path))
    assert (info["serial"], info["lineage"], info["resources"]) == (7, "0f7c-lineage", 2)
    with pytest.raises(errored.ErroredStateError) as err:
        errored.check_errored_state(str(tmp_path), "tofu")
    text = str(err.value)
    assert text.startswith("%s: terraform left errored.tfstate (written " % tmp_path)
    assert "serial 7, lineage 0f7c-lineage, 2 managed resource instance(s)" in text
    assert "Push it first: tofu -chdir=%s state push errored.tfstate, then remove %s" % (
        tmp_path, os.path.join(str(tmp_path), "errored.tfstate")) in text


def test_an_unreadable_errored_state_is_still_reported(tmp_path):
    (tmp_path / "errored.tfstate").write_text("{not json", encoding="utf-8")
    with pytest.raises(errored.ErroredStateError, match=r"\(written [0-9T:-]+Z, not readable\)"):
        errored.check_errored_state(str(tmp_path))


def test_the_state_lock_check_before_a_plan_refuses_it(tmp_path):
    """csis_state_lock runs after init and before the plan of every root (roles/tofu_root)."""
    (tmp_path / "errored.tfstate").write_text(json.dumps(_state()), encoding="utf-8")
    with pytest.raises(errored.ErroredStateError, match="state push errored.tfstate"):
        statelock.check_and_release(str(tmp_path))
    (tmp_path / "errored.tfstate").unlink()
    assert statelock.check_and_release(str(tmp_path))["msg"] == "no S3 lockfile backend: nothing to check"
