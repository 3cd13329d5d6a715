# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Root planning for day-2 operations: follow targets from series heads, explicit upgrades,
pinned instances that stay, detaches, decommissions, ephemeral policies and the archive
transitions' tags."""
from __future__ import annotations

import datetime as dt
import os
import sys

import pytest
import yaml
from trees import edit_yaml as edit, write_meta  # noqa: E402  (tests/support)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bad_inputs"))
import corpus  # noqa: E402
from render_trees import copy_tree  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.plan import RenderOptions  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.roots import plan_roots  # noqa: E402

RT = "aws-east2-runtime"
PIN2, PIN1, HEAD = "ami-0000000000000aaa1", "ami-0000000000000bbb1", "ami-0000000000000ccc2"


def launched(name, mounts=(), ephemeral=False, image="imgfile-basic-dask"):
    return {"image": image, "build": PIN2, "builder": "open-tofu", "runtime": RT, "launched": True,
            "launched_run": "r1", "ephemeral": ephemeral, "hostname": "%s-001" % name, "mounts": list(mounts),
            "group": "coops", "identity_type": "posix", "machine_type": "t3.medium", "region": "us-east-2",
            "session": "ssm", "tags": {}}


MNT = {"builder": "aws-ebs", "device": "/dev/xvdf", "group": "coops", "mount_point": "/mnt/data",
       "public_read": False, "share_mode": "2770", "storage": "mnt_data", "type": "ebs"}


@pytest.fixture
def tree(tmp_path):
    root = copy_tree("examples", str(tmp_path))
    for n in ("meta-state",):
        p = os.path.join(root, n)
        if os.path.isdir(p):
            for f in os.listdir(p):
                os.unlink(os.path.join(p, f))
    t2 = launched("test2", [MNT])
    t1 = launched("test", image="imgfile-basic")
    t1.update(group="stofs", machine_type="t3.micro", build=PIN1)
    write_meta(root, "launch-params.yaml", {"instances": {"test2": t2, "test": t1}})
    write_meta(root, "pins.yaml", {"instances": {"test2": PIN2, "test": PIN1}, "pending_replacements": {}, "upgrades": []})
    write_meta(root, "instance-state.yaml", {"instances": {
        n: {"generation": {"durable": 1, "ephemeral": 0}, "current": {"number": 1, "kind": "durable", "instance_id": "i-%s" % n}}
        for n in ("test", "test2")}})
    write_meta(root, "storage-state.yaml", {"storages": {"mnt_data": {
        "state": "active", "generation": 1, "facts": {"builder": "aws-ebs", "type": "ebs"}}}})
    return root


def instance_root(root, heads=None, undeclare=()):
    t, meta = load_and_validate(root, undeclare=undeclare, run_version=corpus.version_stub({}))
    roots = plan_roots(t, meta, "instance-image", RenderOptions(dry_run=False, series_heads=heads or {}))
    assert len(roots) == 1
    return roots[0]


def test_pinned_instances_stay_pinned_even_with_a_newer_head(tree):
    r = instance_root(tree, heads={"imgfile-basic@%s" % RT: {"ami_id": HEAD}, "imgfile-basic-dask@%s" % RT: {"ami_id": HEAD}})
    assert r.replace == [] and r.allow_destroy == []
    assert 'ami_id = "%s"' % PIN2 in " ".join(r.files["open-tofu-instance-generation-instance-test2.tf"].split())


def test_follow_onto_a_newer_head_replaces_and_whitelists_the_attachment(tree):
    edit(tree, "instances/instances.yaml", lambda d: d["instances"][0].update(image_policy="follow"))
    r = instance_root(tree, heads={"imgfile-basic-dask@%s" % RT: {"ami_id": HEAD}})
    assert r.replace == ["module.instance_test2.aws_instance.this"]
    assert set(r.allow_destroy) == {"module.instance_test2.aws_instance.this",
                                    "module.instance_test2.aws_volume_attachment.this"}
    tf = " ".join(r.files["open-tofu-instance-generation-instance-test2.tf"].split())
    assert 'ami_id = "%s"' % HEAD in tf
    info = r.instances["test2"]
    assert info["replacing"] == "follow" and info["launch_params"]["hostname"] == "test2-002"
    # until the apply replaces it, the machine stands on its pin: what verify_instance.yml checks it against
    assert info["verify"]["expected_build"] == PIN2
    # the head equal to the pin: nothing moves
    r = instance_root(tree, heads={"imgfile-basic-dask@%s" % RT: {"ami_id": PIN2}})
    assert r.replace == []


def test_a_pending_upgrade_replaces_onto_its_target_or_the_head(tree):
    write_meta(tree, "pins.yaml", {"instances": {"test2": PIN2, "test": PIN1}, "upgrades": [],
                                   "pending_replacements": {"test": {"to": None, "run": "r2"}}})
    r = instance_root(tree, heads={"imgfile-basic@%s" % RT: {"ami_id": HEAD}})
    assert r.replace == ["module.instance_test.aws_instance.this"]
    assert 'ami_id = "%s"' % HEAD in " ".join(r.files["open-tofu-instance-generation-instance-test.tf"].split())
    assert r.instances["test"]["launch_params"]["hostname"] == "test-002"
    write_meta(tree, "pins.yaml", {"instances": {"test2": PIN2, "test": PIN1}, "upgrades": [],
                                   "pending_replacements": {"test": {"to": "ami-0000000000000ddd3", "run": "r2"}}})
    r = instance_root(tree, heads={"imgfile-basic@%s" % RT: {"ami_id": HEAD}})
    assert 'ami_id = "ami-0000000000000ddd3"' in " ".join(r.files["open-tofu-instance-generation-instance-test.tf"].split())


def test_a_dropped_mount_is_a_detach_needing_an_unmount(tree):
    edit(tree, "instances/instances.yaml", lambda d: d["instances"][0].pop("storages"))
    r = instance_root(tree)
    assert r.require_unmounted == ["test2:mnt_data"]
    assert r.allow_destroy == ['module.instance_test2.aws_volume_attachment.this["mnt_data"]']
    assert r.unmounts == [{"instance": "test2", "storage": "mnt_data", "mount_point": "/mnt/data", "type": "ebs"}]


def _not_launched(root, name):
    """Meta-state as before the instance's first launch (the other instance stays launched)."""
    def drop(doc, *path):
        for key in path:
            doc = doc[key]
        doc.pop(name, None)
    for f, path in (("launch-params.yaml", ("instances",)), ("pins.yaml", ("instances",)),
                    ("instance-state.yaml", ("instances",))):
        with open(os.path.join(root, "meta-state", f), encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
        drop(doc, *path)
        write_meta(root, f, doc)


def test_removing_the_first_of_two_ebs_mounts_keeps_the_seconds_device(tree):
    """The one in-place change of a launched instance is a mount removal (N26). Devices follow the
    launch's record, not the declaration's order: dropping the first of two EBS mounts leaves the
    second on its recorded /dev/xvdg (not moved to /dev/xvdf, which would replace its attachment),
    and a new mount of another machine takes the first device none of its mounts holds."""
    more = dict(MNT, storage="mnt_more", mount_point="/mnt/more", device="/dev/xvdg")
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"].append(
        {"name": "mnt_more", "mount_point": "/mnt/more", "groups": ["coops"], "state": "active"}))
    edit(tree, "instances/instances.yaml", lambda d: d["instances"][0]["storages"].append(
        {"name": "mnt_more", "mount_point": "/mnt/more"}))
    params = yaml.safe_load(open(os.path.join(tree, "meta-state", "launch-params.yaml"), encoding="utf-8"))
    params["instances"]["test2"] = launched("test2", [MNT, more])
    write_meta(tree, "launch-params.yaml", params)
    write_meta(tree, "storage-state.yaml", {"storages": {
        s: {"state": "active", "generation": 1, "facts": {"builder": "aws-ebs", "type": "ebs"}}
        for s in ("mnt_data", "mnt_more")}})
    edit(tree, "instances/instances.yaml", lambda d: d["instances"][0].update(
        storages=[{"name": "mnt_more", "mount_point": "/mnt/more"}]))
    r = instance_root(tree)   # validates: no N26 problem
    assert r.require_unmounted == ["test2:mnt_data"]
    assert [m["device"] for m in r.instances["test2"]["launch_params"]["mounts"]] == ["/dev/xvdg"]
    tf = " ".join(r.files["open-tofu-instance-generation-instance-test2.tf"].split())
    assert '"/dev/xvdg"' in tf and '"/dev/xvdf"' not in tf
    # a machine not launched yet: its mounts take the devices in order
    _not_launched(tree, "test2")
    edit(tree, "instances/instances.yaml", lambda d: d["instances"][0].update(
        storages=[{"name": "mnt_more", "mount_point": "/mnt/more"}, {"name": "mnt_data", "mount_point": "/mnt/data"}]))
    r = instance_root(tree)
    assert [(m["storage"], m["device"]) for m in r.instances["test2"]["launch_params"]["mounts"]] == \
        [("mnt_more", "/dev/xvdf"), ("mnt_data", "/dev/xvdg")]


def test_more_ebs_mounts_than_device_names_are_refused(tree):
    names = ["vol%02d" % i for i in range(22)]
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"].extend(
        {"name": n, "mount_point": "/mnt/%s" % n, "groups": ["coops"]} for n in names))
    edit(tree, "instances/instances.yaml", lambda d: d["instances"][0].update(
        storages=[{"name": n, "mount_point": "/mnt/%s" % n} for n in names]))
    _not_launched(tree, "test2")
    with pytest.raises(Exception) as exc:
        instance_root(tree)
    assert "instance 'test2' mounts 22 EBS volumes; at most 21 fit its device names (/dev/xvdf to /dev/xvdz)" \
        in str(exc.value)


def test_undeclaring_every_instance_leaves_an_instance_less_root(tree):
    r = instance_root(tree, undeclare=["test", "test2"])
    assert sorted(r.decommission) == ["test", "test2"]
    assert set(r.allow_destroy) == {"module.instance_test", "module.instance_test2", "aws_security_group.csis_instances"}
    assert not [f for f in r.files if "-instance-generation-instance-" in f]


def _ephemeral(tree, verdict_age_s=None, ok=False, teardown_after="30m"):
    def f(d):
        d["instances"].append({"name": "eph", "image": "imgfile-basic", "ephemeral": True,
                               "teardown_after": teardown_after})
    edit(tree, "instances/instances.yaml", f)
    if verdict_age_s is not None:
        t = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=verdict_age_s)).replace(microsecond=0)
        write_meta(tree, "verifications.yaml", {"verifications": [
            {"instance": "eph", "ok": ok, "time": t.isoformat().replace("+00:00", "Z"), "checks": []}]})
        lp = yaml.safe_load(open(os.path.join(tree, "meta-state/launch-params.yaml")))
        e = launched("eph", ephemeral=True, image="imgfile-basic")
        e.update(group="stofs", machine_type="t3.micro", build="unbound")
        lp["instances"]["eph"] = e
        write_meta(tree, "launch-params.yaml", lp)
    return instance_root(tree)


def test_ephemeral_count_and_policies(tree):
    r = _ephemeral(tree)
    assert r.ephemeral == ["eph"]
    assert "count = var.ephemeral_present ? 1 : 0" in " ".join(r.files["open-tofu-instance-generation-instance-eph.tf"].split())
    assert 'variable "ephemeral_present"' in r.files["open-tofu-instance-generation.tf"]
    info = r.instances["eph"]
    assert info["on_failure"] == "keep" and info["teardown_after"] == "30m" and info["skip_verify"] is False
    assert info["verify"]["marker"] == "/var/lib/csis/launch-applied"


def test_teardown_after_elapsed_skips_the_verification(tree):
    assert _ephemeral(tree, verdict_age_s=3600).instances["eph"]["skip_verify"] is True


def test_teardown_after_not_elapsed_or_a_passing_verdict_re_verifies(tmp_path, tree):
    assert _ephemeral(tree, verdict_age_s=60).instances["eph"]["skip_verify"] is False


def test_archive_transitions_carry_the_trees_tag(tree):
    edit(tree, "instances/instances.yaml", lambda d: d["instances"][0].pop("storages"))
    write_meta(tree, "launch-params.yaml", {"instances": {}})
    write_meta(tree, "instance-state.yaml", {"instances": {}})  # the records of one instance go together
    write_meta(tree, "pins.yaml", {"instances": {}, "pending_replacements": {}, "upgrades": []})
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"][0].update(state="archived"))
    t, meta = load_and_validate(tree, run_version=corpus.version_stub({}))
    (ebs,) = [r for r in plan_roots(t, meta, "storage", RenderOptions()) if r.builder == "aws-ebs"]
    (snap,) = ebs.transitions_before
    assert snap["action"] == "snapshot" and snap["tags"] == {"csis_config": "csis-example"}
    assert ebs.allow_destroy == ["module.storage_mnt_data"]
    # the snapshot is labelled with the volume's cost tags (the hierarchy's, the builder's), never its Name
    assert snap["cost_tags"] == {"BillingCode": "CSIS-0001", "Environment": "Development", "Owner": "coastal-ops",
                                 "Project": "MyProject", "Stage": "development", "csis_config": "csis-example"}


@pytest.mark.parametrize("key,value", [("share_mode", "2775"), ("public_read", True)])
def test_a_mounted_storages_share_mode_or_public_read_is_immutable_after_launch(tree, key, value):
    """A launched instance recorded its mounts with the storage's share_mode and public_read (the launch
    script made the group's subtree with that mode, an EFS mount names the access point those make): a
    change is refused (N26), naming the mount and the key, as the reference manual's validator does."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError

    load_and_validate(tree)  # as recorded: valid
    edit(tree, "storages/storage0.yaml",
         lambda d: next(s for s in d["storages"] if s["name"] == "mnt_data").update({key: value}))
    with pytest.raises(ConfigError) as refused:
        load_and_validate(tree)
    (problem,) = [str(p) for p in refused.value.problems if "(N26)" in str(p)]
    assert "instance 'test2' was launched (run r1)" in problem and "mounts[mnt_data] changed: %s" % key in problem


def test_validate_and_render_run_the_same_rules(tree):
    """N26 (launch parameters are immutable) is part of the one validation: csis_validate
    reports it, and csis_render refuses with exactly the same problems."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError
    from ansible_collections.csis.infra.plugins.module_utils.csis.render.pipeline import render

    edit(tree, "instances/instances.yaml", lambda d: d["instances"][0].update(image="imgfile-basic"))
    with pytest.raises(ConfigError) as validated:
        load_and_validate(tree)
    with pytest.raises(ConfigError) as rendered:
        render(tree, ["instance-image"], check_mode=True, prepare=False)
    assert [str(p) for p in validated.value.problems] == [str(p) for p in rendered.value.problems]
    assert any("launch parameters are immutable" in str(p) and "(N26)" in str(p) for p in validated.value.problems)


def test_a_series_head_lookup_that_cannot_reach_ec2_names_the_images_and_the_way_out(tree, monkeypatch):
    """A dry run of the instance-image lifecycle looks up the series head of every followed image
    (describe_images); offline, or with no EC2 access, its failure says which image needs it and how
    to render without looking."""
    import socket

    from ansible_collections.csis.infra.plugins.modules import csis_series_heads

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there: connection refused
    edit(tree, "instances/instances.yaml", lambda d: d["instances"][0].update(image_policy="follow"))
    edit(tree, "cfg/runtime-builders.yml",
         lambda d: d["runtime_builders"][0].update(endpoints={"url": "http://127.0.0.1:%d" % port}))
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "CSIS_AWS_MAX_ATTEMPTS": "1", "CSIS_AWS_CONNECT_TIMEOUT": "2"}.items():
        monkeypatch.setenv(key, value)

    class Failed(Exception):
        pass

    class Module:
        failed = None

        def fail_json(self, **kw):
            self.failed = kw
            raise Failed()

    module = Module()
    with pytest.raises(Failed):
        csis_series_heads._run(module, {"config_root": tree, "overlays": [], "undeclare": [], "instances": []})
    assert module.failed["msg"].startswith(
        "series heads: describe_images failed for image 'imgfile-basic-dask' on runtime '%s' (an instance follows the "
        "image's series or awaits an upgrade, so the render names its newest AMI; -e csis_resolve_series_heads=false "
        "renders without looking): " % RT), module.failed
    assert "127.0.0.1:%d" % port in module.failed["msg"], module.failed


def _files_under(root):
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def test_check_mode_renders_a_previewed_upgrade_marker_and_writes_nothing(tree):
    """upgrade_instance.yml --check: csis_upgrade writes no marker, so the render gets the marker it
    would leave (preview_upgrades) and shows the replacement; the tree is left as it was."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError
    from ansible_collections.csis.infra.plugins.module_utils.csis.render.pipeline import render

    heads = {"imgfile-basic@%s" % RT: {"ami_id": HEAD}}
    before = _files_under(tree)
    plain = render(tree, ["instance-image"], check_mode=True, want_diff=True, series_heads=heads)
    assert plain["roots"][0]["replace"] == []
    out = render(tree, ["instance-image"], check_mode=True, want_diff=True, series_heads=heads,
                 preview_upgrades={"test": {"to": None, "from": PIN1, "run": "r2"}})
    (root,) = out["roots"]
    assert root["replace"] == ["module.instance_test.aws_instance.this"]
    assert "module.instance_test.aws_instance.this" in root["allow_destroy"]
    assert any("-replace=module.instance_test.aws_instance.this" in c for c in root["deferred"])
    assert root["instances"]["test"]["replacing"] == "upgrade"
    assert root["instances"]["test"]["launch_params"]["hostname"] == "test-002"
    shown = "".join(d.get("after", "") for d in out["diff"])
    assert 'ami_id = "%s"' % HEAD in " ".join(shown.split())
    assert _files_under(tree) == before
    # refused as csis_upgrade refuses the marker itself, every problem at once
    with pytest.raises(ConfigError) as err:
        render(tree, ["instance-image"], check_mode=True, series_heads=heads,
               preview_upgrades={"nope": {"to": None}, "test2": {"to": "ami-../x"}})
    text = str(err.value)
    assert "preview_upgrades: nope: instance 'nope' is not launched" in text
    assert "preview_upgrades: test2.to: 'ami-../x' is not an AMI id" in text
    assert _files_under(tree) == before


def test_an_efs_mount_is_verified_where_its_access_point_puts_the_groups_directory(tree):
    """Through its group's access point an EFS mount's root is the group's directory (checked at the
    mount point); through the public access point (a public_read storage of other groups) it is the
    filesystem's root, with no directory of the instance's group to check."""
    _not_launched(tree, "test2")
    edit(tree, "instances/instances.yaml", lambda d: d["instances"][0]["storages"].append(
        {"name": "efs-storage", "mount_point": "/mnt/efs"}))
    r = instance_root(tree)
    (efs,) = [x for x in r.instances["test2"]["verify"]["mounts"] if x["type"] == "efs"]
    assert efs["group"] == "coops" and efs["group_root"] is True and efs["share_mode"] == "2775"
    tf = " ".join(r.files["open-tofu-instance-generation-instance-test2.tf"].split())
    assert 'access_point_ids["coops"]' in tf
    edit(tree, "storages/storage0.yaml", lambda d: d["storages"][2].update(groups=["stofs"], public_read=True))
    r = instance_root(tree)
    (efs,) = [x for x in r.instances["test2"]["verify"]["mounts"] if x["type"] == "efs"]
    assert efs["group"] is None and efs["gid"] is None and "group_root" not in efs
    tf = " ".join(r.files["open-tofu-instance-generation-instance-test2.tf"].split())
    assert "public_read_access_point_id" in tf
