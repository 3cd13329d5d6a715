# -*- coding: utf-8 -*-
"""The drift classification (pure), with hand-made records and reality; plus the lookups
against a fake client (absent vs unavailable), the console text and the report file."""
from __future__ import annotations

import json
import os


from ansible_collections.csis.infra.plugins.module_utils.csis.state import drift as d
from ansible_collections.csis.infra.plugins.module_utils.csis.state import lookups
from ansible_collections.csis.infra.plugins.module_utils.csis.state.expectations import expectations
from ansible_collections.csis.infra.plugins.module_utils.csis import aws
from ansible_collections.csis.infra.plugins.module_utils.csis.aws import Endpoint

TAG = "csis-example"


def st(name, rec="active", stype="ebs", declared=True, **kw):
    out = {"name": name, "declared": declared, "declared_state": "active" if declared else None,
           "recorded_state": rec, "type": stype, "builder": "aws-" + stype, "runtime": "rt",
           "volume_id": None, "file_system_id": None, "bucket": None, "archive": None, "lifecycle": None}
    out.update(kw)
    return out


def inst(name, iid="i-0aaa", pin="ami-1", ami="ami-1", pending=False, pending_to=None):
    return {"name": name, "runtime": "rt", "instance_id": iid, "recorded_ami": ami, "pin": pin,
            "pending": {"to": pending_to} if pending else None, "is_pending": pending}


def exps(storages=(), instances=()):
    return {"tag": TAG, "runtimes": ["rt"], "storages": {s["name"]: s for s in storages},
            "instances": {i["name"]: i for i in instances}}


def vol(vid, present=True, state="in-use", **kw):
    out = {"present": present, "what": "volume", "id": vid}
    if present:
        out.update(state=state, size=100, tags={"Name": "data", "csis_config": TAG})
    out.update(kw)
    return out


def lines(report):
    return [(x["drift"], x["kind"], x["name"], x["hard"]) for x in report["drift"]]


def test_everything_present_is_no_drift():
    e = exps([st("data", volume_id="vol-1"), st("b", stype="s3", bucket="bkt")], [inst("web")])
    r = d.classify(e, {"storages": {"data": vol("vol-1"), "b": {"present": True, "what": "bucket", "id": "bkt",
                                                                "state": "available", "tags": {}}},
                       "instances": {"web": {"present": True, "id": "i-0aaa", "state": "running", "ami": "ami-1"}},
                       "foreign": []}, run="r1")
    assert r["drift"] == [] and r["unavailable"] == [] and r["notes"] == []
    assert r["summary"] == {"missing": 0, "stale": 0, "foreign": 0, "changed": 0, "hard": 0, "unavailable": 0, "notes": 0}
    assert d.console_lines(r) == ["state report for run r1", "  no drift: meta-state agrees with reality"]
    assert r["reality"]["storages"]["data"]["id"] == "vol-1"


def test_recorded_active_and_absent_is_missing_hard():
    e = exps([st("data", volume_id="vol-1")])
    r = d.classify(e, {"storages": {"data": vol("vol-1", present=False)}, "instances": {}, "foreign": []}, run="r")
    assert lines(r) == [("missing", "storage", "data", True)]
    assert r["drift"][0]["detail"] == "recorded active but not found in reality (volume vol-1)"
    assert d.hard_lines(r) == ["state: missing storage data: recorded active but not found in reality (volume vol-1) "
                               "(from state-report.json; re-run 'state query' after fixing)"]
    assert d.console_lines(r)[1] == ("  missing  storage  data: recorded active but not found in reality "
                                     "(volume vol-1) [HARD]")
    assert r["summary"]["missing"] == 1 and r["summary"]["hard"] == 1


def test_archived_without_snapshot_is_missing_and_leftover_volume_is_stale():
    e = exps([st("data", rec="archived", archive="csis-data-archive")])
    r = d.classify(e, {"storages": {"data": {"present": False, "what": "archive snapshot", "id": "csis-data-archive"}},
                       "instances": {},
                       "foreign": [{"what": "volume", "id": "vol-9", "name": "data", "kind": "storage", "tags": {}}]})
    assert sorted(lines(r)) == [("missing", "storage", "data", True), ("stale", "storage", "data", False)]
    assert any("recorded archived but volume vol-9 (Name data) still exists" == x["detail"] for x in r["drift"])


def test_lookup_error_is_unavailable_never_missing():
    e = exps([st("data", volume_id="vol-1"), st("b", stype="s3", bucket="bkt")], [inst("web")])
    r = d.classify(e, {"storages": {"data": {"error": "endpoint http://x unreachable: boom", "what": "volume", "id": "vol-1"},
                                    "b": {"error": "REFUSED (AccessDenied): no", "what": "bucket", "id": "bkt"}},
                       "instances": {"web": {"error": "endpoint http://x unreachable: boom", "id": "i-0aaa"}},
                       "foreign": [], "unavailable": ["foreign volume scan (runtime rt): boom"]})
    assert r["drift"] == []
    assert r["unavailable"] == ["storage b: REFUSED (AccessDenied): no",
                                "storage data: endpoint http://x unreachable: boom",
                                "instance web: endpoint http://x unreachable: boom",
                                "foreign volume scan (runtime rt): boom"]
    assert r["reality"]["storages"]["data"]["present"] is None
    assert d.hard_lines(r) == []
    out = d.console_lines(r)
    assert "  unavailable: storage data: endpoint http://x unreachable: boom" in out
    assert out[-1] == "  no drift in what could be read (4 lookup(s) unavailable)"


def test_destroyed_but_present_is_stale():
    e = exps([st("b", rec="destroyed", stype="s3", bucket="bkt")])
    r = d.classify(e, {"storages": {"b": {"present": True, "what": "bucket", "id": "bkt", "state": "available"}},
                       "instances": {}, "foreign": []})
    assert lines(r) == [("stale", "storage", "b", False)]
    assert r["drift"][0]["detail"] == "recorded destroyed but bucket bkt still exists"


def test_destroyed_volume_found_by_name_is_stale_not_foreign():
    e = exps([st("data", rec="destroyed")])
    r = d.classify(e, {"storages": {"data": {}}, "instances": {},
                       "foreign": [{"what": "volume", "id": "vol-7", "name": "data", "kind": "storage", "tags": {}}]})
    assert lines(r) == [("stale", "storage", "data", False)]


def test_unhealthy_provider_state_is_stale():
    e = exps([st("data", volume_id="vol-1")])
    r = d.classify(e, {"storages": {"data": vol("vol-1", state="error")}, "instances": {}, "foreign": []})
    assert lines(r) == [("stale", "storage", "data", False)]
    assert r["drift"][0]["detail"] == "recorded active but volume vol-1 is error"


def test_declared_lifecycle_not_carried_is_stale():
    e = exps([st("fs", stype="efs", file_system_id="fs-1", lifecycle={"ia_days": 30}),
              st("b", stype="s3", bucket="bkt", lifecycle={"transition_days": 30, "storage_class": "STANDARD_IA"}),
              st("ok", stype="s3", bucket="bkt2", lifecycle={"transition_days": 30, "storage_class": "STANDARD_IA"})])
    rule = {"ID": "csis", "Status": "Enabled", "Filter": {"Prefix": ""},
            "Transitions": [{"Days": 30, "StorageClass": "STANDARD_IA"}]}
    r = d.classify(e, {"storages": {
        "fs": {"present": True, "what": "filesystem", "id": "fs-1", "state": "available", "lifecycle": {}},
        "b": {"present": True, "what": "bucket", "id": "bkt", "state": "available", "lifecycle": []},
        "ok": {"present": True, "what": "bucket", "id": "bkt2", "state": "available", "lifecycle": [rule]}},
        "instances": {}, "foreign": []})
    assert sorted(lines(r)) == [("stale", "storage", "b", False), ("stale", "storage", "fs", False)]
    details = {x["name"]: x["detail"] for x in r["drift"]}
    assert details["fs"] == "declared lifecycle (TransitionToIA=AFTER_30_DAYS) is not on filesystem fs-1"
    assert details["b"] == "declared lifecycle (transition to STANDARD_IA after 30 days) is not on bucket bkt"


def test_unrecorded_present_storage_is_foreign():
    e = exps([st("b", rec=None, stype="s3", bucket="bkt"), st("gone", rec=None, stype="s3", bucket="g", declared=False)])
    r = d.classify(e, {"storages": {"b": {"present": True, "what": "bucket", "id": "bkt", "state": "available"},
                                    "gone": {"present": True, "what": "bucket", "id": "g", "state": "available"}},
                       "instances": {}, "foreign": []})
    assert sorted(lines(r)) == [("foreign", "storage", "b", False), ("foreign", "storage", "gone", False)]
    details = {x["name"]: x["detail"] for x in r["drift"]}
    assert details["b"] == "bucket bkt exists but meta-state has no record of it"
    assert details["gone"].endswith("(and it is not in the YAML)")


def test_second_volume_with_same_name_is_foreign_and_managed_one_is_found_by_id():
    e = exps([st("data", volume_id="vol-managed")])
    r = d.classify(e, {"storages": {"data": vol("vol-managed")}, "instances": {},
                       "foreign": [{"what": "volume", "id": "vol-orphan", "name": "data", "kind": "storage",
                                    "tags": {"Name": "data", "csis_config": TAG}}]})
    assert lines(r) == [("foreign", "storage", "data", False)]
    assert r["drift"][0]["detail"] == ("volume vol-orphan (tagged csis_config=csis-example) exists but meta-state has "
                                       "no record of it; the managed volume of storage data is vol-managed")
    assert r["reality"]["storages"]["data"]["id"] == "vol-managed"


def test_foreign_instance_and_bucket_not_in_yaml():
    e = exps([], [inst("web")])
    r = d.classify(e, {"storages": {}, "instances": {"web": {"present": True, "state": "running", "ami": "ami-1"}},
                       "foreign": [{"what": "instance", "id": "i-0bbb", "name": "web", "kind": "instance", "tags": {}},
                                   {"what": "bucket", "id": "stray", "name": "stray", "kind": "storage", "tags": {}}]})
    assert sorted(lines(r)) == [("foreign", "instance", "web", False), ("foreign", "storage", "stray", False)]
    details = {x["name"]: x["detail"] for x in r["drift"]}
    assert details["web"].endswith("; the managed instance web is i-0aaa")
    assert details["stray"].endswith("(and it is not in the YAML)")


def test_instance_missing_terminated_stopped():
    e = exps([], [inst("a", iid="i-a"), inst("b", iid="i-b"), inst("c", iid="i-c")])
    r = d.classify(e, {"storages": {}, "foreign": [], "instances": {
        "a": {"present": False, "id": "i-a"},
        "b": {"present": False, "id": "i-b", "state": "terminated"},
        "c": {"present": True, "id": "i-c", "state": "stopped", "ami": "ami-1"}}})
    assert lines(r) == [("missing", "instance", "a", True), ("missing", "instance", "b", True),
                        ("stale", "instance", "c", False)]
    assert r["drift"][1]["detail"] == "recorded launched but instance i-b is terminated"


def test_booted_ami_differs_from_pin_is_changed_unless_pending():
    e = exps([], [inst("a", pin="ami-pin"), inst("b", pin="ami-pin", pending=True, pending_to="ami-new")])
    r = d.classify(e, {"storages": {}, "foreign": [], "instances": {
        "a": {"present": True, "state": "running", "ami": "ami-other"},
        "b": {"present": True, "state": "running", "ami": "ami-other"}}})
    assert lines(r) == [("changed", "instance", "a", False)]
    assert r["drift"][0]["detail"] == "instance i-0aaa boots ami-other but its pinned build is ami-pin"
    assert r["notes"] == ["instance b: pending replacement: boots ami-other, pinned ami-pin, to be replaced by ami-new"]
    assert r["summary"]["changed"] == 1 and r["summary"]["notes"] == 1
    assert "  note: instance b: pending replacement: boots ami-other, pinned ami-pin, to be replaced by ami-new" \
        in d.console_lines(r)


def test_another_trees_tag_is_a_note_and_no_id_is_a_note():
    e = exps([st("data", volume_id="vol-1"), st("x")], [inst("web", iid=None)])
    obs = vol("vol-1")
    obs["tags"] = {"csis_config": "other-tree"}
    r = d.classify(e, {"storages": {"data": obs, "x": {}}, "instances": {"web": {}}, "foreign": []})
    assert r["drift"] == []
    assert len(r["notes"]) == 3
    assert "csis_config=other-tree" in r["notes"][0]


# --------------------------------------------------------------------------- lookups (fake client)
class FakeErr(Exception):
    def __init__(self, code, msg="x"):
        super().__init__("An error occurred (%s): %s" % (code, msg))
        self.response = {"Error": {"Code": code, "Message": msg}}


class FakeClient:
    def __init__(self, handlers):
        self.handlers = handlers

    def __getattr__(self, op):
        def call(**kw):
            h = self.handlers.get(op)
            if h is None:
                return {}
            if isinstance(h, Exception):
                raise h
            return h(**kw) if callable(h) else h
        return call


def test_lookup_absent_vs_unavailable():
    ep = Endpoint({"region": "r", "endpoints": {}}, lambda s, a: FakeClient({
        "describe_volumes": FakeErr("InvalidVolume.NotFound"),
        "describe_file_systems": FakeErr("AccessDeniedException", "nope"),
        "get_bucket_tagging": FakeErr("NoSuchBucket"),
        "describe_instances": FakeErr("InternalError")}))
    assert lookups.lookup_volume(ep, "vol-1") == {"present": False, "what": "volume", "id": "vol-1"}
    fs = lookups.lookup_filesystem(ep, "fs-1", True)
    assert fs["error"].startswith("REFUSED (AccessDeniedException)")
    assert lookups.lookup_bucket(ep, "b", False)["present"] is False
    assert "error" in lookups.lookup_instance(ep, "i-1")


def test_bucket_without_tags_is_present_and_other_s3_errors_unavailable():
    ep = Endpoint({"region": "r"}, lambda s, a: FakeClient({
        "get_bucket_tagging": FakeErr("NoSuchTagSet"), "get_bucket_lifecycle_configuration": FakeErr("NoSuchLifecycleConfiguration")}))
    b = lookups.lookup_bucket(ep, "b", True)
    assert b["present"] is True and b["lifecycle"] == []
    ep2 = Endpoint({"region": "r"}, lambda s, a: FakeClient({"get_bucket_tagging": FakeErr("403")}))
    assert lookups.lookup_bucket(ep2, "b", False)["error"].startswith("REFUSED (403)")


def test_transport_error_marks_the_endpoint_down_and_fails_fast():
    from botocore.exceptions import EndpointConnectionError

    calls = []

    def factory(service, access):
        def boom(**kw):
            calls.append(service)
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
        return FakeClient({"describe_volumes": boom, "describe_instances": boom, "describe_snapshots": boom,
                           "describe_file_systems": boom, "list_buckets": boom, "get_bucket_tagging": boom})

    e = exps([st("data", volume_id="vol-1"), st("b", stype="s3", bucket="bkt")], [inst("web")])
    access = {"region": "r", "endpoints": {"ec2": "http://127.0.0.1:9", "s3": "http://127.0.0.1:9",
                                           "efs": "http://127.0.0.1:9"}}
    reality = lookups.observe(e, lambda rt: access, factory)
    assert calls == ["ec2"]  # one real try per endpoint url: every later lookup fails fast
    r = d.classify(e, reality)
    assert r["drift"] == []
    assert any(u.startswith("storage data: endpoint http://127.0.0.1:9 unreachable") for u in r["unavailable"])
    assert any(u.startswith("instance web: endpoint") for u in r["unavailable"])
    assert any(u.startswith("foreign volume scan (runtime rt): endpoint") for u in r["unavailable"])


def test_observe_scans_foreign_by_tag_excluding_recorded_ids():
    def factory(service, access):
        return FakeClient({
            "describe_volumes": lambda **kw: (
                {"Volumes": [{"VolumeId": "vol-1", "State": "in-use", "Size": 1, "Tags": [{"Key": "Name", "Value": "data"}]}]}
                if "VolumeIds" in kw else
                {"Volumes": [{"VolumeId": "vol-1", "State": "in-use", "Tags": []},
                             {"VolumeId": "vol-2", "State": "available", "Tags": [{"Key": "Name", "Value": "data"}]}]}),
            "describe_snapshots": {"Snapshots": []},
            "describe_instances": {"Reservations": []},
            "describe_file_systems": {"FileSystems": [{"FileSystemId": "fs-9", "LifeCycleState": "available",
                                                       "Tags": [{"Key": "csis_config", "Value": "someone-else"}]}]},
            "list_buckets": {"Buckets": [{"Name": "mine"}, {"Name": "stray"}, {"Name": "untagged"}]},
            "get_bucket_tagging": lambda Bucket: (
                {"TagSet": [{"Key": "csis_config", "Value": TAG}]} if Bucket != "untagged" else (_x for _x in ()).throw(FakeErr("NoSuchTagSet"))),
        })

    e = exps([st("data", volume_id="vol-1"), st("b", stype="s3", bucket="mine")])
    reality = lookups.observe(e, lambda rt: {"region": "r"}, factory)
    assert [(f["what"], f["id"]) for f in reality["foreign"]] == [("volume", "vol-2"), ("bucket", "stray")]
    r = d.classify(e, reality)
    assert sorted(lines(r)) == [("foreign", "storage", "data", False), ("foreign", "storage", "stray", False)]


def test_write_report_atomic_and_changed_only_on_new_findings(tmp_path):
    root = str(tmp_path)
    rep = d.classify(exps(), {"storages": {}, "instances": {}, "foreign": []}, run="r1")
    path, changed = d.write_report(root, rep)
    assert path == os.path.join(root, "generated", "state-report.json") and changed
    assert json.load(open(path))["run"] == "r1"
    rep2 = dict(rep, run="r2")
    assert d.write_report(root, rep2)[1] is False
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")]
    assert d.read_report(root)["run"] == "r2"


def test_expectations_from_the_example_tree_and_hand_made_records():
    from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree

    tree = load_tree(os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    meta = {
        "storage-state.yaml": {"storages": {
            "mnt_data": {"state": "active", "facts": {"builder": "aws-ebs", "type": "ebs", "volume_id": "vol-1"}},
            "old-data": {"state": "archived", "facts": {"builder": "aws-ebs", "type": "ebs", "archive": "csis-old-data-archive"}},
            "gone": {"state": "destroyed", "facts": {"builder": "aws-s3", "type": "s3", "bucket_name": "gone-bucket"}}}},
        "launch-params.yaml": {"instances": {
            "test2": {"launched": True, "runtime": "aws-east2-runtime"},
            "test": {"launched": False}}},
        "instance-state.yaml": {"instances": {"test2": {"current": {"instance_id": "i-1", "ami_id": "ami-1"}}}},
        "pins.yaml": {"instances": {"test2": "ami-1"}, "pending_replacements": {}, "upgrades": []},
    }
    e = expectations(tree, meta)
    assert e["tag"] == "csis-example" and e["runtimes"] == ["aws-east2-runtime"]
    s = e["storages"]
    assert sorted(s) == ["default-bucket", "efs-storage", "gone", "mnt_data", "old-data"]
    assert s["mnt_data"]["volume_id"] == "vol-1" and s["mnt_data"]["runtime"] == "aws-east2-runtime"
    assert s["default-bucket"]["bucket"] == "csis-example-default-bucket" and s["default-bucket"]["recorded_state"] is None
    assert s["default-bucket"]["lifecycle"] == {"transition_days": 30, "storage_class": "STANDARD_IA"}
    assert s["efs-storage"]["type"] == "efs" and s["efs-storage"]["lifecycle"] == {"ia_days": 30}
    assert s["old-data"]["declared"] is False and s["old-data"]["archive"] == "csis-old-data-archive"
    assert s["gone"]["bucket"] == "gone-bucket" and s["gone"]["runtime"] == "aws-east2-runtime"
    assert list(e["instances"]) == ["test2"]
    assert e["instances"]["test2"]["instance_id"] == "i-1" and e["instances"]["test2"]["pin"] == "ami-1"


def _examples_with_mnt_data(tmp_path, volume_id):
    """A copy of examples/ whose meta-state records only storage mnt_data, active on ``volume_id``."""
    import shutil

    root = str(tmp_path / "tree")
    shutil.copytree(os.path.join(os.path.dirname(__file__), "..", "..", "examples"), root,
                    ignore=shutil.ignore_patterns("generated", "meta-state", "state"))
    os.makedirs(os.path.join(root, "meta-state"))
    with open(os.path.join(root, "meta-state", "storage-state.yaml"), "w", encoding="utf-8") as fh:
        fh.write("storages:\n"
                 "  mnt_data: {state: active, facts: {builder: aws-ebs, type: ebs, volume_id: %s}}\n" % volume_id)
    return root


def test_check_recorded_storages_missing_is_hard_and_protects_the_active_ones(tmp_path):
    """Issue 16: before a root is planned, its storages recorded as existing are looked up by id."""
    root = _examples_with_mnt_data(tmp_path, "vol-gone")
    asked = []

    def factory(service, access):
        def volumes(**kw):
            asked.append(kw)
            raise FakeErr("InvalidVolume.NotFound")
        return FakeClient({"describe_volumes": volumes})

    storages = {"mnt_data": {"address": "module.storage_mnt_data", "type": "ebs"},
                "other": {"address": "module.storage_other", "type": "ebs"}}
    res = d.check_recorded_storages(root, storages, factory=factory)
    assert asked == [{"VolumeIds": ["vol-gone"]}]          # by the recorded id; no foreign scan
    assert res["checked"] == ["mnt_data"]
    assert res["hard"] == ["missing  storage  mnt_data: recorded active but not found in reality (volume vol-gone) [HARD]"]
    assert res["protect"] == ["module.storage_mnt_data.aws_ebs_volume.this"]
    # a storage of another root is not looked up
    asked.clear()
    assert d.check_recorded_storages(root, {"other": storages["other"]}, factory=factory)["checked"] == []
    assert asked == []


def test_an_archive_snapshot_is_looked_up_as_the_restore_finds_it_with_the_trees_tag():
    """Another tree's archive of a same-named storage is not this tree's: the restore's data source
    filters on csis_config, so the drift lookup does too (or that snapshot would hide a missing one)."""
    seen = []

    def snaps(**kw):
        seen.append(kw["Filters"])
        mine = {"Name": "tag:csis_config", "Values": ["tree-a"]} in kw["Filters"]
        return {"Snapshots": [{"SnapshotId": "snap-a", "State": "completed"}] if mine else []}

    ep = Endpoint({"region": "r", "endpoints": {}}, lambda s, a: FakeClient({"describe_snapshots": snaps}))
    exp = st("mnt_data", rec="archived", archive="csis-mnt_data-archive", tag="tree-a")
    assert lookups.lookup_storage(ep, exp)["id"] == "snap-a"
    assert lookups.lookup_storage(ep, dict(exp, tag="tree-b")) == {
        "present": False, "what": "archive snapshot", "id": "csis-mnt_data-archive"}
    assert seen[0] == [{"Name": "tag:Name", "Values": ["csis-mnt_data-archive"]},
                       {"Name": "tag:csis_storage", "Values": ["mnt_data"]},
                       {"Name": "tag:csis_config", "Values": ["tree-a"]}]


import pytest  # noqa: E402


@pytest.mark.parametrize("report,problem", [
    ({"drift": 5}, "'drift' is not a list"),
    ({"drift": ["missing"]}, "drift[0] is not an object"),
    ({"drift": [{"hard": True, "name": "mnt_data", "drift": "missing", "detail": "gone"}]}, "drift[0] (a HARD line) has no kind"),
])
def test_a_report_whose_drift_lines_are_not_as_the_query_writes_them_is_named(tmp_path, report, problem):
    """Every lifecycle run reads the report's HARD lines before it starts: a report edited by hand, or
    cut short, stops it with one line naming the file and what is wrong (a KeyError did)."""
    path = tmp_path / "generated" / "state-report.json"
    path.parent.mkdir()
    path.write_text(json.dumps(report))
    with pytest.raises(d.DriftError) as err:
        d.last_hard(str(tmp_path), None)
    assert str(err.value) == "%s: %s; run 'state query' again to rewrite it" % (path, problem)


def test_a_standing_ephemeral_is_reported_until_it_is_decommissioned():
    """Under on_failure: keep a failed ephemeral stands for inspection; the state query says so
    (the manual's "ephemeral instance is STANDING ..."), with its last failed verification."""
    failed = dict(inst("eph", iid="i-e"), ephemeral=True, verification={
        "ok": False, "time": "2026-12-06T10:00:00Z", "failed": "mount /mnt/data (mnt_data): /mnt/data is not mounted"})
    bare = dict(inst("eph2", iid="i-f"), ephemeral=True, verification={})
    r = d.classify(exps([], [failed, bare, inst("web")]), {"storages": {}, "foreign": [], "instances": {
        n: {"present": True, "state": "running", "ami": "ami-1"} for n in ("eph", "eph2", "web")}})
    assert lines(r) == []
    assert r["notes"] == [
        "instance eph: ephemeral instance is STANDING (instance i-e, its last verification failed at 2026-12-06T10:00:00Z: "
        "mount /mnt/data (mnt_data): /mnt/data is not mounted) until it is decommissioned: undeclare it and run "
        "instance_image.yml with the root allowed to apply",
        "instance eph2: ephemeral instance is STANDING (instance i-f) until it is decommissioned: undeclare it and run "
        "instance_image.yml with the root allowed to apply"]


def test_the_expectations_carry_an_ephemerals_last_verdict():
    class Tree:
        runtimes = {"rt": None}
        storages, instances = {}, {}

        @staticmethod
        def resource_tag():
            return {"csis_config": "t"}

    meta = {"launch-params.yaml": {"instances": {
        "eph": {"launched": True, "ephemeral": True, "runtime": "rt"},
        "web": {"launched": True, "runtime": "rt"}}},
        "instance-state.yaml": {"instances": {"eph": {"current": {"instance_id": "i-e"}}}},
        "verifications.yaml": {"verifications": [
            {"instance": "eph", "instance_id": "i-e", "ok": True, "time": "t1", "checks": []},
            {"instance": "eph", "instance_id": "i-e", "ok": False, "time": "t2",
             "checks": [{"name": "startup scripts", "ok": False, "detail": "missing"}, {"name": "x", "ok": True}]}]}}
    got = expectations(Tree(), meta)["instances"]
    assert got["eph"]["ephemeral"] is True and got["web"]["ephemeral"] is False
    assert got["eph"]["verification"] == {"ok": False, "time": "t2", "failed": "startup scripts: missing"}
    assert got["web"]["verification"] == {}
    # the standing machine is another generation than the one that failed (i-old, torn down), or the
    # verdict names no machine (written before verdicts did): not this machine's verdict
    for stale in ({"instance_id": "i-old"}, {}):
        meta["verifications.yaml"] = {"verifications": [
            dict({"instance": "eph", "ok": False, "time": "t3", "checks": [{"name": "x", "ok": False, "detail": "d"}]},
                 **stale)]}
        assert expectations(Tree(), meta)["instances"]["eph"]["verification"] == {}
    # a machine whose instance id is not recorded: the name's last verdict, as nothing tells them apart
    meta["instance-state.yaml"] = {"instances": {}}
    assert expectations(Tree(), meta)["instances"]["eph"]["verification"]["time"] == "t3"


def test_a_one_day_efs_transition_is_efs_own_name():
    """EFS calls a one-day transition AFTER_1_DAY (not AFTER_1_DAYS, which the provider refuses at
    plan): the render and the drift report's expectation use the same name."""
    assert aws.efs_transition(1) == "AFTER_1_DAY" and aws.efs_transition(7) == "AFTER_7_DAYS"
    e = exps([st("fs", stype="efs", file_system_id="fs-1", lifecycle={"ia_days": 1})])
    carried = {"present": True, "what": "filesystem", "id": "fs-1", "state": "available",
               "lifecycle": {"TransitionToIA": "AFTER_1_DAY"}}
    r = d.classify(e, {"storages": {"fs": carried}, "instances": {}, "foreign": []})
    assert lines(r) == [], r["drift"]


# --------------------------------------------------------------------------- a HARD line and its subject's lookup
def test_a_hard_line_is_kept_while_its_lookup_fails_and_cleared_when_nothing_is_left_to_look_up(tmp_path):
    """record_hard keeps a line only about what the query could not look up (an unavailable line),
    never about a subject with nothing to look up: a storage whose record forget.yml dropped (still
    declared, so still in the report) has no id any more, and keeping its line would refuse every
    run for good (docs/drift.md, "Fixing a HARD line")."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState

    root = str(tmp_path)
    data, web = st("data", volume_id="vol-1"), inst("web", iid="i-web")
    gone = d.classify(exps([data], [web]), {"storages": {"data": vol("vol-1", present=False)}, "foreign": [],
                                            "instances": {"web": {"present": False, "id": "i-web"}}}, run="q1")
    assert d.record_hard(root, gone)["changed"] is True
    held = [{k: x[k] for k in ("kind", "name", "drift", "detail")} for x in gone["drift"]]
    assert len(held) == 2
    # the endpoint down: both lines kept (present null, an unavailable line each)
    down = d.classify(exps([data], [web]), {"storages": {"data": {"error": "endpoint http://x unreachable: boom",
                                                                  "what": "volume", "id": "vol-1"}},
                                            "instances": {"web": {"error": "endpoint http://x unreachable: boom",
                                                                  "id": "i-web"}}, "foreign": []}, run="q2")
    assert sorted(down["unavailable"]) == ["instance web: endpoint http://x unreachable: boom",
                                           "storage data: endpoint http://x unreachable: boom"]
    out = d.record_hard(root, down)
    assert out["changed"] is False and sorted(out["kept"], key=lambda x: x["kind"]) == sorted(held, key=lambda x: x["kind"])
    # a runtime no longer declared cannot look it up either: kept
    norun = d.classify(exps([data], []), {"storages": {"data": {"error": "no runtime to look it up in"}},
                                          "instances": {}, "foreign": []}, run="q3")
    assert d.record_hard(root, norun)["kept"] == [held[0]]
    # forgotten: no record, no volume id; the instance's generation holds no id: nothing to look up
    forgotten = d.classify(exps([st("data", rec=None)], [inst("web", iid=None)]),
                           {"storages": {"data": {}}, "instances": {"web": {}}, "foreign": []}, run="q4")
    assert forgotten["drift"] == [] and forgotten["unavailable"] == []
    assert forgotten["reality"]["storages"]["data"]["present"] is None
    assert forgotten["reality"]["storages"]["data"]["nothing_to_look_up"] is True
    assert forgotten["reality"]["instances"]["web"]["nothing_to_look_up"] is True
    out = d.record_hard(root, forgotten)
    assert out["changed"] is True and out["kept"] == []
    assert MetaState(root).load("drift.yaml")["hard"] == []
    assert d.last_hard(root, MetaState(root).load("drift.yaml"))["messages"] == []
    # a report not written by classify (no mark) with present null still keeps its line: never on a guess
    d.record_hard(root, gone)
    bare = {"storages": {"data": {"present": None}}, "instances": {}}
    out = d.record_hard(root, {"run": "q5", "drift": [], "reality": bare})
    assert out["kept"] == [held[0]]


def test_forget_yml_clears_a_declared_storages_missing_line(tmp_path):
    """The documented fix of a volume gone for good: forget.yml -e forget_storage=<name> -e force=true,
    then the state query it runs; the storage stays declared, and the next real run must not be refused."""
    from trees import copy_as_shipped
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import ops
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState

    root = copy_as_shipped(os.path.join(os.path.dirname(__file__), "..", "..", "examples"), str(tmp_path / "tree"))
    with MetaState(root).transaction("seed") as txn:
        txn.save("storage-state.yaml", {"storages": {"mnt_data": {"state": "active", "generation": 1, "history": [],
                 "facts": {"builder": "aws-ebs", "type": "ebs", "volume_id": "vol-0aaaaaaaaaaaaaaaa"}}}})

    def factory(service, access):
        return FakeClient({"describe_volumes": FakeErr("InvalidVolume.NotFound"), "describe_snapshots": {"Snapshots": []},
                           "describe_instances": {"Reservations": []}, "describe_file_systems": {"FileSystems": []},
                           "list_buckets": {"Buckets": []}, "get_bucket_tagging": FakeErr("NoSuchBucket")})

    first = d.query(root, run="q1", factory=factory)
    assert d.hard_lines(first) and d.record_hard(root, first)["changed"] is True
    assert ops.forget_storage(root, "mnt_data", run="f1", factory=factory, force=True)["checked"] == \
        "volume vol-0aaaaaaaaaaaaaaaa is gone"
    again = d.query(root, run="q2", factory=factory)
    assert again["drift"] == [] and again["reality"]["storages"]["mnt_data"]["nothing_to_look_up"] is True
    assert d.record_hard(root, again) == {"where": "meta-state/drift.yaml", "changed": True, "revision": 4, "kept": []}
    assert d.last_hard(root, MetaState(root).load("drift.yaml"))["hard_drift"] == []


# --------------------------------------------------------------------------- a volume or filesystem being deleted
@pytest.mark.parametrize("state", ["deleting", "deleted"])
def test_a_deleting_or_deleted_volume_or_filesystem_is_missing_hard_as_a_terminated_instance(state):
    ep = Endpoint({"region": "r", "endpoints": {}}, lambda s, a: FakeClient({
        "describe_volumes": {"Volumes": [{"VolumeId": "vol-1", "State": state, "Size": 1}]},
        "describe_file_systems": {"FileSystems": [{"FileSystemId": "fs-1", "LifeCycleState": state}]},
        "describe_instances": {"Reservations": [{"Instances": [{"State": {"Name": "terminated"}}]}]}}))
    v, fs = lookups.lookup_volume(ep, "vol-1"), lookups.lookup_filesystem(ep, "fs-1", True)
    assert v == {"present": False, "what": "volume", "id": "vol-1", "state": state}
    assert fs == {"present": False, "what": "filesystem", "id": "fs-1", "state": state}
    e = exps([st("data", volume_id="vol-1"), st("fs", stype="efs", file_system_id="fs-1")], [inst("m", iid="i-1")])
    r = d.classify(e, {"storages": {"data": v, "fs": fs}, "instances": {"m": lookups.lookup_instance(ep, "i-1")},
                       "foreign": []})
    assert [d.drift_text(x) for x in r["drift"]] == [
        "missing  storage  data: recorded active but volume vol-1 is %s [HARD]" % state,
        "missing  storage  fs: recorded active but filesystem fs-1 is %s [HARD]" % state,
        "missing  instance m: recorded launched but instance i-1 is terminated [HARD]"]
    # a storage recorded destroyed whose volume is still being deleted is no leftover
    r = d.classify(exps([st("data", rec="destroyed", volume_id="vol-1")]),
                   {"storages": {"data": v}, "instances": {}, "foreign": []})
    assert r["drift"] == []


def test_the_foreign_scan_skips_volumes_being_deleted_and_instances_own_volumes():
    def factory(service, access):
        return FakeClient({
            "describe_volumes": {"Volumes": [{"VolumeId": "vol-8", "State": "deleting", "Tags": []},
                                             {"VolumeId": "vol-9", "State": "available", "Tags": []},
                                             # an instance's root volume (deleted with it, its tags): no storage
                                             {"VolumeId": "vol-7", "State": "in-use", "Tags": [],
                                              "Attachments": [{"InstanceId": "i-1", "Device": "/dev/xvda",
                                                               "DeleteOnTermination": True}]},
                                             # a data volume attached by a storage root: still scanned
                                             {"VolumeId": "vol-6", "State": "in-use", "Tags": [],
                                              "Attachments": [{"InstanceId": "i-1", "Device": "/dev/sdf",
                                                               "DeleteOnTermination": False}]},
                                             # ... also when it is deleted with the instance (not its root device)
                                             {"VolumeId": "vol-5", "State": "in-use", "Tags": [],
                                              "Attachments": [{"InstanceId": "i-1", "Device": "/dev/sdg",
                                                               "DeleteOnTermination": True}]},
                                             # the root volume of an instance the scan did not read: by DeleteOnTermination
                                             {"VolumeId": "vol-4", "State": "in-use", "Tags": [],
                                              "Attachments": [{"InstanceId": "i-2", "Device": "/dev/xvda",
                                                               "DeleteOnTermination": True}]}]},
            "describe_snapshots": {"Snapshots": []},
            "describe_instances": {"Reservations": [{"Instances": [
                {"InstanceId": "i-1", "RootDeviceName": "/dev/xvda", "State": {"Name": "running"}, "ImageId": "ami-1",
                 "Tags": [{"Key": "csis_config", "Value": TAG}]}]}]},
            "describe_file_systems": {"FileSystems": [
                {"FileSystemId": "fs-8", "LifeCycleState": "deleted", "Tags": [{"Key": "csis_config", "Value": TAG}]},
                {"FileSystemId": "fs-9", "LifeCycleState": "available", "Tags": [{"Key": "csis_config", "Value": TAG}]}]},
            "list_buckets": {"Buckets": []}})

    reality = lookups.observe(exps(), lambda rt: {"region": "r"}, factory)
    assert [(f["what"], f["id"]) for f in reality["foreign"]] == [("volume", "vol-9"), ("volume", "vol-6"),
                                                                  ("volume", "vol-5"), ("instance", "i-1"),
                                                                  ("filesystem", "fs-9")]


def test_the_storage_check_before_a_plan_stops_on_a_volume_being_deleted(tmp_path):
    """csis_storage_check classifies as the state query does: a recorded volume being deleted is
    gone (HARD), so its root is not planned (terraform would create it again, empty)."""
    root = _examples_with_mnt_data(tmp_path, "vol-going")

    def factory(service, access):
        return FakeClient({"describe_volumes": {"Volumes": [{"VolumeId": "vol-going", "State": "deleting"}]}})

    res = d.check_recorded_storages(root, {"mnt_data": {"address": "module.storage_mnt_data", "type": "ebs"}},
                                    factory=factory)
    assert res["hard"] == ["missing  storage  mnt_data: recorded active but volume vol-going is deleting [HARD]"]
    assert res["unavailable"] == []
