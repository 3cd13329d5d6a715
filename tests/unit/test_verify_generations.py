# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Which machine and which build a verification verdict is about.

* A verdict is about the AMI EC2 reports the machine booted (the post-bake tests ran on it), and
  its post-bake result goes to ``image-tests.yaml`` under that build: never under a build the
  machine did not boot, such as the target of an upgrade not applied yet.
* ``verify_instance.yml`` checks a standing machine with a pending upgrade against its pin (the
  build it booted), not against the upgrade's target (what the next apply boots).
* A verdict names the machine (its instance id): ``teardown_after`` and the state query's note
  about a standing ephemeral use only the verdicts of the generation standing now.
"""
from __future__ import annotations

import datetime as dt
import os
import sys

import pytest
from trees import copy_as_shipped, edit_yaml as edit, write_meta  # noqa: E402  (tests/support)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bad_inputs"))
import corpus  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.plan import RenderOptions  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.roots import plan_roots  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.state import verify  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.state.expectations import expectations  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState  # noqa: E402

RT = "aws-east2-runtime"
OLD, NEW = "ami-0000000000000aaa1", "ami-0000000000000bbb2"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch_record(name, ephemeral=False, build=OLD):
    return {"image": "imgfile-basic", "build": build, "builder": "open-tofu", "runtime": RT, "launched": True,
            "launched_run": "r1", "ephemeral": ephemeral, "hostname": "%s-001" % name, "mounts": [],
            "group": "stofs", "identity_type": "posix", "machine_type": "t3.micro", "region": "us-east-2",
            "session": "ssm", "tags": {}}


@pytest.fixture
def tree(tmp_path):
    """The example tree with one instance, ``test`` (no storages), and no meta-state."""
    root = copy_as_shipped(os.path.join(REPO, "examples"), str(tmp_path / "tree"))
    edit(root, "instances/instances.yaml", lambda x: x.update(instances=[i for i in x["instances"] if i["name"] == "test"]))
    return root


def instance_root(root):
    t, meta = load_and_validate(root, run_version=corpus.version_stub({}))
    (r,) = plan_roots(t, meta, "instance-image", RenderOptions(dry_run=True))
    return r


class FakeEC2:
    def __init__(self, booted, state="running"):
        self.booted, self.state = booted, state

    def describe_instances(self, InstanceIds):
        return {"Reservations": [{"Instances": [{"InstanceId": InstanceIds[0], "ImageId": self.booted,
                                                 "State": {"Name": self.state}}]}]}


class Module:
    check_mode = False

    def __init__(self):
        self.warnings = []

    def warn(self, msg):
        self.warnings.append(msg)

    def fail_json(self, **kw):
        raise AssertionError(kw)


def record_verification(monkeypatch, root, booted, **params):
    """csis_record_verification's run (its _verify) against an EC2 that reports ``booted``."""
    from ansible_collections.csis.infra.plugins.modules import csis_record_verification as mod

    real = verify.booted_image_check
    monkeypatch.setattr(mod, "root_access", lambda *a, **k: {})
    monkeypatch.setattr(mod, "booted_image_check",
                        lambda access, iid, expected, pattern: real(access, iid, expected, pattern, client=FakeEC2(booted)))
    p = {"config_root": root, "instance": "test", "aws": {}, "secrets": None, "on_machine": None, "error": None,
         "runtime": RT, "expected_build": None, "name_pattern": None, "check_booted_image": True, "ephemeral": False,
         "run_id": "v1", "record": True, "fail_on_failure": False}
    p.update(params)
    return mod._verify(Module(), p)


PASSED = {"checks": [{"name": "startup scripts", "ok": True, "detail": "present"},
                     {"name": "test: test -x /usr/bin/env", "ok": True, "detail": "exit 0"}]}


def standing_with_an_upgrade(root):
    """``test`` launched on OLD (pinned), an upgrade to NEW asked for and not applied yet."""
    write_meta(root, "launch-params.yaml", {"instances": {"test": launch_record("test")}})
    write_meta(root, "instance-state.yaml", {"instances": {"test": {
        "generation": {"durable": 1, "ephemeral": 0}, "history": [],
        "current": {"number": 1, "kind": "durable", "instance_id": "i-0abc", "ami_id": OLD, "private_ip": "10.0.0.5"}}}})
    write_meta(root, "pins.yaml", {"instances": {"test": OLD}, "upgrades": [],
                                   "pending_replacements": {"test": {"to": NEW, "from": OLD, "run": "r2"}}})


# --------------------------------------------------------------------------- the build a verdict is about
def test_a_standing_machine_with_a_pending_upgrade_is_verified_against_its_pin(tree, monkeypatch):
    """verify_instance.yml between upgrade_instance.yml and the apply: the machine still runs its pin.
    Its passing tests are OLD's, and nothing is recorded about NEW, which never booted."""
    standing_with_an_upgrade(tree)
    r = instance_root(tree)
    assert r.replace == ["module.instance_test.aws_instance.this"]  # the apply would boot NEW
    assert 'ami_id = "%s"' % NEW in " ".join(r.files["open-tofu-instance-generation-instance-test.tf"].split())
    spec = r.instances["test"]["verify"]
    assert spec["expected_build"] == OLD
    res = record_verification(monkeypatch, tree, OLD, on_machine=PASSED, expected_build=spec["expected_build"])
    assert res["ok"] is True, res["verdict"]["checks"]
    assert (res["verdict"]["build"], res["verdict"]["instance_id"]) == (OLD, "i-0abc")
    builds = MetaState(tree).load("image-tests.yaml")["builds"]
    assert list(builds) == [OLD] and builds[OLD]["last_ok"] is True


def test_a_verdict_is_recorded_under_the_build_ec2_reports_booted_never_the_expected_one(tree, monkeypatch):
    """Whatever the caller expected (here NEW, as a render before the fix handed it), tests that ran
    on a machine that booted OLD are evidence about OLD: the booted-image check fails, and neither the
    failed verdict nor the post-bake result is recorded against NEW (require_released_builds reads both)."""
    standing_with_an_upgrade(tree)
    res = record_verification(monkeypatch, tree, OLD, on_machine=PASSED, expected_build=NEW)
    assert res["ok"] is False and "expected the pinned build %s" % NEW in res["message"]
    assert res["verdict"]["build"] == OLD
    assert list(MetaState(tree).load("image-tests.yaml")["builds"]) == [OLD]
    assert [v["build"] for v in MetaState(tree).load("verifications.yaml")["verifications"]] == [OLD]
    t, meta = load_and_validate(tree, run_version=corpus.version_stub({}))
    assert NEW not in (meta.get("image-tests.yaml") or {}).get("builds", {})


def test_without_the_ec2_lookup_the_verdict_is_about_the_expected_build():
    on = {"checks": [{"name": "test: true", "ok": True, "detail": "exit 0"}]}
    assert verify.verified_build(None, OLD) == OLD
    assert verify.verified_build({"name": "booted image", "ok": False, "detail": "x", "booted": NEW}, OLD) == NEW
    assert verify.verified_build({"name": "booted image", "ok": False, "detail": "describe_instances: boom"}, OLD) == OLD
    v = verify.combine("test", on, None, runtime=RT, build=OLD, run="r", ephemeral=False, instance_id="i-1")
    assert (v["build"], v["instance_id"]) == (OLD, "i-1")
    booted = verify.booted_image_check({}, "i-2", OLD, client=FakeEC2(OLD))
    assert verify.combine("test", on, booted, runtime=RT, build=OLD, run="r", ephemeral=False)["instance_id"] == "i-2"


def test_a_machine_not_standing_or_without_a_pending_upgrade_keeps_the_renders_build(tree):
    standing_with_an_upgrade(tree)
    write_meta(tree, "pins.yaml", {"instances": {"test": OLD}, "upgrades": [], "pending_replacements": {}})
    assert instance_root(tree).instances["test"]["verify"]["expected_build"] == OLD


# --------------------------------------------------------------------------- whose verdict
def ephemeral_tree(root, verdicts, current_id="i-0gen2"):
    """``test`` ephemeral with teardown_after 30m, generation 2 standing (``current_id``), and ``verdicts``."""
    edit(root, "instances/instances.yaml", lambda x: x["instances"][0].update(ephemeral=True, teardown_after="30m"))
    write_meta(root, "launch-params.yaml", {"instances": {"test": dict(launch_record("test", ephemeral=True),
                                                                       build="unbound", hostname="test-002",
                                                                       launched_run="rB")}})
    current = {"number": 2, "kind": "ephemeral", "opened_run": "rB"}
    if current_id:
        current["instance_id"] = current_id
    write_meta(root, "instance-state.yaml", {"instances": {"test": {
        "generation": {"durable": 0, "ephemeral": 2}, "current": current,
        "history": [{"number": 1, "kind": "ephemeral", "instance_id": "i-0gen1", "why": "ephemeral", "closed_run": "rA"}]}}})
    write_meta(root, "verifications.yaml", {"verifications": verdicts})


def failed(age_s=3600, **kw):
    t = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=age_s)).replace(microsecond=0)
    return dict({"instance": "test", "runtime": RT, "build": OLD, "run": "rA", "ephemeral": True,
                 "time": t.isoformat().replace("+00:00", "Z"), "ok": False,
                 "checks": [{"name": "startup scripts", "ok": False, "detail": "marker missing"}], "evidence": []}, **kw)


@pytest.mark.parametrize("verdicts", [
    [failed(instance_id="i-0gen1")],    # generation 1 failed and was torn down
    [failed()],                         # a verdict written before verdicts named the machine
    [failed(instance_id="i-0gen2", age_s=60), failed(instance_id="i-0gen1")],  # its own, not elapsed yet
], ids=["earlier-generation", "no-instance-id", "own-not-elapsed"])
def test_teardown_after_never_tears_down_a_generation_on_another_ones_verdict(tree, verdicts):
    """Generation 2, launched by a run stopped before it verified it, has no verdict of its own: it is
    verified, not torn down on generation 1's failed verdict."""
    ephemeral_tree(tree, verdicts)
    info = instance_root(tree).instances["test"]
    assert (info["skip_verify"], info.get("skip_reason")) == (False, None)


def test_teardown_after_tears_down_on_the_standing_generations_own_failed_verdict(tree):
    ephemeral_tree(tree, [failed(instance_id="i-0gen2"), failed(instance_id="i-0gen1", age_s=10)])
    info = instance_root(tree).instances["test"]
    assert info["skip_verify"] is True and "teardown_after elapsed since its failed verification" in info["skip_reason"]
    # a generation whose instance id is not recorded: the name's last verdict, as before
    ephemeral_tree(tree, [failed()], current_id=None)
    assert instance_root(tree).instances["test"]["skip_verify"] is True


def test_verdict_of_matches_the_generation():
    vs = [{"instance": "a", "instance_id": "i-1", "ok": False, "n": 1}, {"instance": "a", "ok": True, "n": 2},
          {"instance": "b", "instance_id": "i-2", "ok": True, "n": 3}, "junk"]
    assert verify.verdict_of(vs, "a", "i-1")["n"] == 1
    assert verify.verdict_of(vs, "a", "i-9") is None
    assert verify.verdict_of(vs, "a", None)["n"] == 2
    assert verify.verdict_of(vs, "c", None) is None


def test_the_state_querys_standing_note_cites_only_the_standing_generations_verdict(tree):
    ephemeral_tree(tree, [failed(instance_id="i-0gen1")])
    from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree
    meta = {n: MetaState(tree).load(n) for n in ("launch-params.yaml", "instance-state.yaml", "pins.yaml",
                                                 "verifications.yaml")}
    assert expectations(load_tree(tree), meta)["instances"]["test"]["verification"] == {}
    meta["verifications.yaml"]["verifications"].append(failed(instance_id="i-0gen2"))
    assert expectations(load_tree(tree), meta)["instances"]["test"]["verification"]["failed"] == \
        "startup scripts: marker missing"
