# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""``csis_series_heads`` (the render role's step before an instance-image render) against the
session's moto server: a pending upgrade's ``to`` build, looked up when the marker was left, is
looked up again, so one deregistered since fails before anything is rendered (the replacement
is delete-then-create: applied onto an AMI that is gone it would terminate the machine and
never launch its successor). No terraform, no playbook: the module's function, the real EC2
answers; the role's wiring of the step runs in test_day2_instances.py.
"""
from __future__ import annotations

import pytest

from day2_trees import make_tree, register_ami

from ansible_collections.csis.infra.plugins.module_utils.csis.state import record
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState
from ansible_collections.csis.infra.plugins.modules import csis_series_heads

pytestmark = pytest.mark.integration

TAG = "csis-heads-recheck"
PATTERN = "h8heads-basic-pckr"


class Failed(Exception):
    pass


class Module:
    failed = None
    check_mode = False

    def fail_json(self, **kw):
        self.failed = kw
        raise Failed()


def test_a_pending_upgrades_build_deregistered_since_the_marker_stops_the_render(tmp_path, moto_endpoint, monkeypatch):
    for key, value in moto_endpoint.env.items():
        monkeypatch.setenv(key, value)
    ami = register_ami(moto_endpoint, PATTERN + "-1")
    target = register_ami(moto_endpoint, PATTERN + "-2")
    root = make_tree(str(tmp_path), TAG, [], [{"name": "test", "image": "imgfile-basic"}],
                     images=[{"name": "imgfile-basic", "group": "stofs", "name_pattern": PATTERN, "storage_types": ["efs"],
                              "runtimes": ["aws-east2-runtime"]}])
    with MetaState(root).transaction("test: a launched instance") as txn:
        txn.save("launch-params.yaml", {"instances": {"test": {"launched": True, "ephemeral": False, "build": ami}}})
        txn.save("pins.yaml", {"instances": {"test": ami}, "pending_replacements": {}, "upgrades": []})
    record.mark_upgrade(root, "test", "r1", to=target)
    params = {"config_root": root, "overlays": [moto_endpoint.overlay_path], "undeclare": [], "instances": []}

    heads = csis_series_heads._run(Module(), params)["series_heads"]
    assert heads["imgfile-basic@aws-east2-runtime"]["ami_id"] == target  # the build is there: the render goes on

    moto_endpoint.client("ec2").deregister_image(ImageId=target)
    module = Module()
    with pytest.raises(Failed):
        csis_series_heads._run(module, params)
    assert module.failed["msg"] == (
        "the pending upgrade of test: instance 'test': there is no AMI %s on runtime aws-east2-runtime (region "
        "us-east-2): replaced onto it, the machine would be terminated and its successor never launched; nothing "
        "rendered: cancel the upgrade (playbooks/upgrade_instance.yml -e instance=test -e cancel=true) or leave it "
        "again onto another build" % target), module.failed
    moto_endpoint.client("ec2").deregister_image(ImageId=ami)
