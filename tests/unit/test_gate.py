# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The plan gate (apply/): classification, whitelist, receipts, plan binding."""
from __future__ import annotations

import hashlib
import json
import os
import sys

_COLL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".venv", "collections")
if os.path.normpath(_COLL) not in [os.path.normpath(p) for p in sys.path]:
    sys.path.insert(0, os.path.normpath(_COLL))

import pytest  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis import clock  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.apply import binding, gate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.binding import open_binding, root_digest, root_files, verify_binding  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.gate import run_gate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.plan_verdict import evaluate_plan, plan_content_digest  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.receipts import check_receipts  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.whitelist import address_covered_by, format_address, parse_address  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import GateError, GateRefused  # noqa: E402


def rc(address, *actions, **extra):
    d = {"address": address, "mode": "managed", "type": "x", "name": "y", "change": {"actions": list(actions)}}
    d.update(extra)
    return d


def plan(*changes, **extra):
    p = {"format_version": "1.2", "terraform_version": "1.11.4", "resource_changes": list(changes)}
    p.update(extra)
    return p


# ----------------------------------------------------------------------------- addresses
def test_parse_address_segments():
    a = 'module.a["k.x"].module.b.aws_instance.this[0]'
    assert parse_address(a) == (
        ("name", "module"), ("name", "a"), ("key", "k.x"), ("name", "module"), ("name", "b"),
        ("name", "aws_instance"), ("name", "this"), ("index", 0))
    assert format_address(parse_address(a)) == a


def test_parse_address_quoted_keys():
    a = r'module.s["a.b[\"c\"]]"].aws_s3_bucket.this'
    toks = parse_address(a)
    assert toks[2] == ("key", 'a.b["c"]]')
    assert format_address(toks) == a
    assert parse_address('x.y["$${v}"]')[2] == ("key", "${v}")
    assert parse_address('x.y["\\u00e9"]')[2] == ("key", "\u00e9")
    assert parse_address('data.aws_ami.this').__len__() == 3


@pytest.mark.parametrize("bad", ["", "a.", "a..b", "a[", 'a["x]', "a[x]", "a]b", 'a["x"]y'])
def test_parse_address_refuses(bad):
    with pytest.raises(ValueError):
        parse_address(bad)


@pytest.mark.parametrize("address, covered", [
    ("module.instance_test.aws_instance.this", True),
    ('module.instance_test["x"].aws_instance.this', True),
    ("module.instance_test[0].aws_instance.this", True),
    ("module.instance_test", True),
    ("module.instance_test2.aws_instance.this", False),
    ('module.instance_test2["x"].aws_instance.this', False),
    ("module.other.module.instance_test.aws_instance.this", False),
])
def test_whitelist_whole_segments(address, covered):
    assert (address_covered_by(address, ["module.instance_test"]) == "module.instance_test") is covered


def test_whitelist_exact_and_keyed_entries():
    assert address_covered_by("aws_security_group.csis_instances", ["aws_security_group.csis_instances"])
    assert address_covered_by("aws_security_group.csis_instances_x", ["aws_security_group.csis_instances"]) is None
    entry = 'module.s["a.b"]'
    assert address_covered_by('module.s["a.b"].aws_ebs_volume.this', [entry]) == entry
    assert address_covered_by('module.s["a"].aws_ebs_volume.this', [entry]) is None
    # a key with a dot is one segment: an entry for key "a" never covers key "a.b"
    assert address_covered_by('module.s["a.b"].x.y', ['module.s["a"]']) is None
    assert address_covered_by("aws_instance.this[1]", ["aws_instance.this[0]"]) is None


# ----------------------------------------------------------------------------- evaluate
FULL = plan(
    rc("terraform_data.new", "create"),
    rc("terraform_data.upd", "update"),
    rc("terraform_data.gone", "delete"),
    rc("terraform_data.dbc", "delete", "create"),
    rc("terraform_data.cbd", "create", "delete"),
    rc("terraform_data.kept", "forget"),
    rc("data.aws_ami.this", "read", mode="data"),
    rc("terraform_data.same", "no-op"),
    rc('module.a["k.x"].module.b.aws_instance.this[0]', "delete", "create"),
    rc("module.instance_test2.aws_instance.this", "delete"),
    rc('module.instance_test["x"].aws_instance.this', "delete"),
    rc("module.instance_test[0].aws_instance.this", "create", "delete"),
)


def test_classification_and_violations():
    v = evaluate_plan(FULL, ["module.instance_test"])
    r = v.as_result()
    assert r["addresses"]["create"] == ["terraform_data.new"]
    assert r["addresses"]["update"] == ["terraform_data.upd"]
    assert r["addresses"]["delete"] == ["terraform_data.gone", "module.instance_test2.aws_instance.this",
                                        'module.instance_test["x"].aws_instance.this']
    assert r["addresses"]["replace"] == ["terraform_data.dbc", "terraform_data.cbd",
                                         'module.a["k.x"].module.b.aws_instance.this[0]',
                                         "module.instance_test[0].aws_instance.this"]
    assert r["addresses"]["forget"] == ["terraform_data.kept"]
    assert (r["adds"], r["changes"], r["destroys"], r["replacements"], r["forgets"]) == (5, 1, 7, 4, 1)
    assert r["violations"] == [
        "DESTROY NOT WHITELISTED: terraform_data.gone",
        "DESTROY NOT WHITELISTED: terraform_data.dbc",
        "DESTROY NOT WHITELISTED: terraform_data.cbd",
        'DESTROY NOT WHITELISTED: module.a["k.x"].module.b.aws_instance.this[0]',
        "DESTROY NOT WHITELISTED: module.instance_test2.aws_instance.this",
    ]
    assert [w["address"] for w in r["whitelisted"]] == [
        'module.instance_test["x"].aws_instance.this', "module.instance_test[0].aws_instance.this"]
    assert all(w["entry"] == "module.instance_test" for w in r["whitelisted"])
    assert r["summary"] == ("Plan: 5 to add, 1 to change, 7 to destroy (4 replacements); "
                            "1 to forget (removed from state, not destroyed); "
                            "2 destroys whitelisted by module.instance_test; 5 destroys NOT whitelisted")


def test_summary_one_whitelisted():
    v = evaluate_plan(plan(rc("terraform_data.a", "create"), rc("terraform_data.b", "create"),
                           rc("module.instance_test.aws_instance.this", "delete", "create")),
                      ["module.instance_test"])
    # terraform counts a replacement as one add and one destroy
    assert v.summary() == ("Plan: 3 to add, 0 to change, 1 to destroy (1 replacement); "
                           "1 destroy whitelisted by module.instance_test")
    assert not v.violations


def test_forget_is_not_a_destroy_and_reads_ignored():
    v = evaluate_plan(plan(rc("x.a", "forget"), rc("data.x.b", "read"), rc("x.c", "create", "forget")), [])
    assert not v.violations and v.destroys == 0
    assert v.forgets == ["x.a", "x.c"] and v.creates == ["x.c"]


def test_deposed_and_unknown_actions():
    v = evaluate_plan(plan(rc("x.a", "delete", deposed="00abcd"), rc("x.b", "import")), [])
    assert v.violations == ["DESTROY NOT WHITELISTED: x.a (deposed object 00abcd)",
                            'PLAN ACTION NOT UNDERSTOOD: x.b has actions ["import"]; refusing']
    assert evaluate_plan(plan(rc("x.a", "delete", deposed="00abcd")), ["x.a"]).violations == []


def test_empty_and_bad_plans():
    assert evaluate_plan({"format_version": "1.2"}).summary() == "Plan: 0 to add, 0 to change, 0 to destroy"
    with pytest.raises(GateError):
        evaluate_plan({"values": {}})
    with pytest.raises(GateError, match="errored"):
        evaluate_plan(plan(errored=True))
    with pytest.raises(GateError, match="allow_destroy entry"):
        evaluate_plan(plan(), ["module.x["])


def test_run_gate_plan_json(tmp_path):
    pj = tmp_path / "plan.json"
    pj.write_text(json.dumps(FULL))
    with pytest.raises(GateRefused) as err:
        run_gate(plan_json=str(pj), allow_destroy=["module.instance_test"])
    assert len(err.value.messages) == 5
    assert err.value.result["destroys"] == 7
    ok = run_gate(plan_json=str(pj), allow_destroy=[
        "terraform_data", "module.a", "module.instance_test", "module.instance_test2"])
    assert ok["changed"] is False and ok["violations"] == []
    assert "terraform_data.dbc (replaced: delete then create)" in ok["diff"]["after"]
    assert "terraform_data.gone\n" in ok["diff"]["before"]


@pytest.mark.parametrize("changes,expected", [
    (5, "resource_changes must be a list of objects, got int"),
    # falsy, but not a list: not read as "no changes"
    ({}, "resource_changes must be a list of objects, got dict"),
    ("", "resource_changes must be a list of objects, got str"),
    ([{"address": "a.b", "change": "delete"}], "resource_changes[0] (a.b): change must be an object, got str"),
    ([{"address": "a.b", "change": {"actions": 5}}],
     "resource_changes[0] (a.b): change.actions must be a list of strings, got 5"),
    ([{"address": "a.b", "change": {"actions": [["delete"]]}}],
     "resource_changes[0] (a.b): change.actions must be a list of strings, got [[\"delete\"]]"),
    ([{"address": "a.b", "change": {"actions": ["update"], "replace_paths": 5}}],
     "resource_changes[0] (a.b): change.replace_paths must be a list, got int"),
    # a change without its address, or not an object: named by position, its values never shown
    # (a plan's before/after may hold a secret)
    ([{"change": {"actions": ["update"], "after": {"password": "hunter2-s3cr3t"}}}],
     "resource_changes[0] has no address (its keys: change)"),
    (["hunter2-s3cr3t"], "resource_changes[0] is a str, not an object"),
])
def test_a_malformed_plan_is_one_message_naming_the_plan(tmp_path, changes, expected):
    pj = tmp_path / "plan.json"
    pj.write_text(json.dumps({"format_version": "1.2", "resource_changes": changes}))
    with pytest.raises(GateError) as err:
        run_gate(plan_json=str(pj))
    assert str(err.value) == "%s: %s" % (pj, expected)


@pytest.mark.parametrize("doc,expected", [
    # terraform show -json of a state (no plan file): no change would ever be refused
    ({"format_version": "1.0", "terraform_version": "1.11.4", "values": {"root_module": {}}},
     "this is a state in JSON (`show -json` without a plan file), not a plan: pass the output of `show -json <plan>`"),
    # a future format, whose changes may be anywhere but resource_changes
    ({"format_version": "2.0", "planned_changes": [{"address": "a.b", "actions": ["delete"]}]},
     "plan JSON format_version '2.0' is not one this gate reads (1.x): pass the output of `show -json <plan>` of "
     "terraform or OpenTofu 1.x"),
    ({"format_version": "1.2", "errored": "false"}, "the plan's errored must be true or false, got str"),
], ids=["a-state", "format-2", "errored-a-string"])
def test_a_document_that_is_not_a_plan_the_gate_reads_is_refused(tmp_path, doc, expected):
    pj = tmp_path / "plan.json"
    pj.write_text(json.dumps(doc))
    with pytest.raises(GateError) as err:
        run_gate(plan_json=str(pj))
    assert str(err.value) == "%s: %s" % (pj, expected)


def test_a_plan_json_nested_too_deep_is_one_message(tmp_path):
    pj = tmp_path / "plan.json"
    pj.write_text('{"format_version": "1.2", "x": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(GateError, match="cannot read plan JSON %s" % pj):
        run_gate(plan_json=str(pj))


# ----------------------------------------------------------------------------- receipts
def _receipt(d, inst, sto, **data):
    d.mkdir(exist_ok=True)
    body = {"instance": inst, "storage": sto, "ok": True, "time": "2030-01-01T00:00:00Z"}
    body.update(data)
    (d / ("%s__%s.json" % (inst, sto))).write_text(json.dumps(body))


def test_receipts(tmp_path):
    d = tmp_path / "unmount-receipts"
    _receipt(d, "web", "good")
    _receipt(d, "web", "bad", ok=False)
    _receipt(d, "web", "wrong", instance="db")
    d.joinpath("web__corrupt.json").write_text("{not json")
    probs = check_receipts(["web:good", "web:missing", "web:bad", "web:corrupt", "web:wrong"], str(d))
    assert len(probs) == 4
    for p, name in zip(probs, ["missing", "bad", "corrupt", "wrong"]):
        assert p.startswith("DETACH NOT UNMOUNTED: web:%s has no successful unmount receipt" % name)
    assert check_receipts(["web:good"], str(d)) == []


def test_receipt_time_floor(tmp_path):
    d = tmp_path / "r"
    _receipt(d, "web", "old", time="2020-01-01T00:00:00Z")
    _receipt(d, "web", "new", time="2030-01-01T00:00:00+00:00")
    _receipt(d, "web", "notime", time=None)
    floor = "2025-01-01T00:00:00Z"
    probs = check_receipts(["web:old", "web:new", "web:notime"], str(d), floor)
    assert [p.split(" ")[3] for p in probs] == ["web:old", "web:notime"]
    # a floor that does not read checks nothing: every receipt is refused, saying why
    (bad,) = check_receipts(["web:new"], str(d), "yesterday")
    assert "the plan's time 'yesterday' does not read as a time" in bad, bad


@pytest.mark.parametrize("spec", ["../x:y", "a/b:c", "a:..", "a:b:c", "a", "a:", ":b", "a:b\\c"])
def test_receipt_names_validated(spec, tmp_path):
    with pytest.raises(GateError):
        check_receipts([spec], str(tmp_path))


# ----------------------------------------------------------------------------- binding
@pytest.fixture()
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    (r / "main.tf").write_text('module "m" {\n  source = "../mods/m"\n}\n')
    (r / "user_data.tftpl").write_text("#!/bin/sh\necho hi\n")
    (r / "b.tfbackend.hcl").write_text('path = "x"\n')
    (r / ".terraform.lock.hcl").write_text("# lock\n")
    (r / ".hidden").write_text("ignored\n")
    mods = tmp_path / "mods" / "m"
    mods.mkdir(parents=True)
    (mods / "main.tf").write_text('resource "terraform_data" "x" {}\n')
    (r / ".terraform" / "modules").mkdir(parents=True)
    (r / ".terraform" / "modules" / "modules.json").write_text(json.dumps(
        {"Modules": [{"Key": "", "Source": "", "Dir": "."},
                     {"Key": "m", "Source": "../mods/m", "Dir": "../mods/m"}]}))
    (r / ".terraform" / "providers.txt").write_text("ignored\n")
    return r


PLAN_BYTES = b"PK\x03\x04 fake plan bytes"
PASSING = plan(rc("terraform_data.x", "create"))
REPLACING = plan(rc("terraform_data.x", "delete", "create"))


@pytest.fixture()
def fake_show(monkeypatch):
    box = {"plan": PASSING, "calls": 0}

    def show(plan_path, project_path, binary_path="terraform", env=None):
        box["calls"] += 1
        assert os.path.isfile(plan_path)
        return box["plan"]
    monkeypatch.setattr(gate, "show_json", show)
    return box


def _plan_now(root):
    (root / "tfplan").write_bytes(PLAN_BYTES)


def test_root_files_scope(root):
    files = root_files(str(root), "tfplan")
    assert set(files) == {"main.tf", "user_data.tftpl", "b.tfbackend.hcl", ".terraform.lock.hcl",
                          ".terraform/modules/modules.json", "module ../mods/m/main.tf"}
    _plan_now(root)
    (root / "terraform.tfstate").write_text("{}")
    (root / "unmount-receipts").mkdir()
    (root / "unmount-receipts" / "a__b.json").write_text("{}")
    assert set(root_files(str(root), "tfplan")) == set(files)
    d1 = root_digest(str(root))
    (root / "vars.auto.tfvars").write_text("a = 1\n")
    assert root_digest(str(root)) != d1


def test_binding_happy_path(root, fake_show):
    opened = open_binding(str(root), "tfplan")
    assert opened["changed"] and os.path.isfile(opened["binding"])
    _plan_now(root)
    res = run_gate(str(root), "tfplan")
    assert res["plan_sha256"] and res["violations"] == []
    ver = verify_binding(str(root), "tfplan")
    assert ver["plan_sha256"] == res["plan_sha256"]
    assert ver["summary"] == "Plan: 1 to add, 0 to change, 0 to destroy"


def _zip_plan(path, tfstate):
    import zipfile
    with zipfile.ZipFile(str(path), "w") as zf:
        zf.writestr("tfplan", b"plan")
        if tfstate is not None:
            zf.writestr("tfstate", tfstate)


@pytest.mark.parametrize("tfstate", [None, b"{not json", b"[]", b'{"serial": "7", "lineage": "x"}',
                                     b'{"serial": true, "lineage": "x"}', b'{"serial": 1, "lineage": 5}'])
def test_a_plan_file_that_does_not_name_its_state_is_not_state_checked(root, fake_show, tfstate):
    """PLAN_BYTES (no zip), a zip without tfstate, or one whose state does not read: terraform
    checks it at the apply; the binding says it did not."""
    open_binding(str(root), "tfplan")
    _zip_plan(root / "tfplan", tfstate)
    run_gate(str(root), "tfplan")
    assert binding.plan_prior_state(str(root / "tfplan")) is None
    ver = verify_binding(str(root), "tfplan", check_state=True)
    assert ver["state_check"] == "not checked: tfplan does not name its state (terraform checks it at the apply)"


@pytest.mark.parametrize("prior,current,stale", [
    ({"lineage": "", "serial": 0}, {"resources": []}, None),                          # first plan, still no state
    ({"lineage": "", "serial": 0}, {"lineage": "L", "serial": 1}, "serial 0 and the state is now at serial 1"),
    ({"lineage": "L", "serial": 4}, {"lineage": "L", "serial": 4}, None),
    ({"lineage": "L", "serial": 4}, {"lineage": "L", "serial": 5}, "serial 4 and the state is now at serial 5"),
    ({"lineage": "L", "serial": 4}, {"lineage": "M", "serial": 4}, "lineage L and the root's state is now lineage M"),
    ({"lineage": "L", "serial": 4}, {"resources": []}, "lineage L and the root's state is now empty"),
])
def test_the_state_check_is_terraforms_rule_for_a_saved_plan(prior, current, stale):
    msg = binding.state_moved_message("tfplan", prior, current)
    if stale is None:
        assert msg is None
    else:
        assert msg.startswith("STALE PLANFILE: tfplan was planned against ") and stale in msg and msg.endswith("plan again")


def test_a_state_that_cannot_be_read_stops_the_check(root, fake_show, monkeypatch):
    open_binding(str(root), "tfplan")
    _zip_plan(root / "tfplan", b'{"version": 4, "serial": 3, "lineage": "L"}')
    run_gate(str(root), "tfplan")

    def unreadable(directory, binary="terraform"):
        raise binding.tfstate.terraform.TerraformError("%s: 'state pull' failed (rc 1): backend down" % directory)
    monkeypatch.setattr(binding.tfstate, "read", unreadable)
    with pytest.raises(GateError) as err:
        verify_binding(str(root), "tfplan", check_state=True)
    assert str(err.value).startswith("the root's state could not be read to tell whether tfplan still applies to it: ")
    assert str(err.value).endswith("backend down; nothing was applied")
    monkeypatch.setattr(binding.tfstate, "read", lambda directory, binary="terraform": {"serial": 3, "lineage": "L"})
    assert verify_binding(str(root), "tfplan", check_state=True)["state_check"] == \
        "the state is the one the plan was made against"


def test_open_removes_old_plan_and_binding(root, fake_show):
    _plan_now(root)
    open_binding(str(root), "tfplan")
    assert not (root / "tfplan").exists()
    with pytest.raises(GateRefused, match="STALE PLANFILE: tfplan does not exist — the plan step did not produce it"):
        run_gate(str(root), "tfplan")
    assert fake_show["calls"] == 0


def test_open_check_mode_writes_nothing(root):
    _plan_now(root)
    out = open_binding(str(root), "tfplan", check_mode=True)
    assert out["removed_plan"] is True
    assert (root / "tfplan").exists() and not (root / "tfplan.csis-binding.json").exists()


def test_plan_without_binding_refused(root, fake_show):
    _plan_now(root)
    with pytest.raises(GateRefused) as err:
        run_gate(str(root), "tfplan")
    assert err.value.messages[0].startswith("STALE PLANFILE: tfplan has no binding")
    with pytest.raises(GateRefused, match="STALE PLANFILE: tfplan has no binding"):
        verify_binding(str(root), "tfplan")


@pytest.mark.parametrize("when", ["yesterday", 5, None])
def test_a_binding_whose_time_does_not_read_is_no_binding(root, fake_show, when):
    """The binding's time is the floor of the unmount receipts' freshness: one that does not read
    would let any old receipt pass, so that binding counts as none (the gate refuses the plan)."""
    open_binding(str(root), "tfplan")
    path = root / "tfplan.csis-binding.json"
    data = json.loads(path.read_text())
    data["opened"]["time"] = when
    path.write_text(json.dumps(data))
    _plan_now(root)
    with pytest.raises(GateRefused, match="STALE PLANFILE: tfplan has no binding"):
        run_gate(str(root), "tfplan")


@pytest.mark.parametrize("path, name", [
    ("main.tf", "main.tf (modified)"),
    ("user_data.tftpl", "user_data.tftpl (modified)"),
    ("b.tfbackend.hcl", "b.tfbackend.hcl (modified)"),
    ("../mods/m/main.tf", "module ../mods/m/main.tf (modified)"),
    ("extra.tf", "extra.tf (added)"),
])
def test_edit_after_open_is_stale_at_gate(root, fake_show, path, name):
    open_binding(str(root), "tfplan")
    _plan_now(root)
    with open(os.path.join(str(root), path), "a") as fh:
        fh.write("# edited\n")
    with pytest.raises(GateRefused) as err:
        run_gate(str(root), "tfplan")
    msg = err.value.messages[-1]
    assert msg.startswith("STALE PLANFILE: tfplan is older than the root: ")
    assert name in msg
    assert fake_show["calls"] == 0


def test_removed_file_is_stale(root, fake_show):
    open_binding(str(root), "tfplan")
    _plan_now(root)
    os.unlink(str(root / "user_data.tftpl"))
    with pytest.raises(GateRefused, match=r"user_data.tftpl \(removed\)"):
        run_gate(str(root), "tfplan")


def test_edit_after_gate_is_stale_at_verified(root, fake_show):
    open_binding(str(root), "tfplan")
    _plan_now(root)
    run_gate(str(root), "tfplan")
    (root / "user_data.tftpl").write_text("#!/bin/sh\necho changed\n")
    with pytest.raises(GateRefused, match=r"STALE PLANFILE: tfplan is older than the root: user_data.tftpl \(modified\)"):
        verify_binding(str(root), "tfplan")


def test_tampered_plan_refused_at_verified(root, fake_show):
    open_binding(str(root), "tfplan")
    _plan_now(root)
    run_gate(str(root), "tfplan")
    (root / "tfplan").write_bytes(PLAN_BYTES + b"!")
    with pytest.raises(GateRefused, match="STALE PLANFILE: tfplan changed after the gate passed it"):
        verify_binding(str(root), "tfplan")


def test_missing_plan_refused_at_verified(root, fake_show):
    open_binding(str(root), "tfplan")
    _plan_now(root)
    run_gate(str(root), "tfplan")
    os.unlink(str(root / "tfplan"))
    with pytest.raises(GateRefused, match="STALE PLANFILE: tfplan does not exist"):
        verify_binding(str(root), "tfplan")


def test_verified_requires_gate(root, fake_show):
    open_binding(str(root), "tfplan")
    _plan_now(root)
    with pytest.raises(GateRefused, match="has not passed the gate"):
        verify_binding(str(root), "tfplan")


def test_refusal_clears_previous_pass(root, fake_show):
    open_binding(str(root), "tfplan")
    _plan_now(root)
    run_gate(str(root), "tfplan")
    fake_show["plan"] = REPLACING
    with pytest.raises(GateRefused, match="DESTROY NOT WHITELISTED: terraform_data.x"):
        run_gate(str(root), "tfplan")
    with pytest.raises(GateRefused, match="has not passed the gate"):
        verify_binding(str(root), "tfplan")
    run_gate(str(root), "tfplan", allow_destroy=["terraform_data.x"])
    assert verify_binding(str(root), "tfplan")["verdict"]["replacements"] == 1


def test_gate_check_mode_does_not_record(root, fake_show):
    open_binding(str(root), "tfplan")
    _plan_now(root)
    before = (root / "tfplan.csis-binding.json").read_bytes()
    run_gate(str(root), "tfplan", check_mode=True)
    assert (root / "tfplan.csis-binding.json").read_bytes() == before


def test_gate_receipts_after_open(root, fake_show):
    open_binding(str(root), "tfplan")
    _receipt(root / "unmount-receipts", "web", "data", time="2020-01-01T00:00:00Z")
    _plan_now(root)
    with pytest.raises(GateRefused, match="DETACH NOT UNMOUNTED: web:data has no successful unmount receipt"):
        run_gate(str(root), "tfplan", require_unmounted=["web:data"])
    # a receipt written after the opening counts (and the receipts dir is not part of the digest)
    _receipt(root / "unmount-receipts", "web", "data", time=clock.now())
    assert run_gate(str(root), "tfplan", require_unmounted=["web:data"])["violations"] == []
    assert verify_binding(str(root), "tfplan")


def test_gate_lists_receipts_and_destroys_together(root, fake_show):
    open_binding(str(root), "tfplan")
    _plan_now(root)
    fake_show["plan"] = REPLACING
    with pytest.raises(GateRefused) as err:
        run_gate(str(root), "tfplan", require_unmounted=["web:data"])
    assert [m.split(":")[0] for m in err.value.messages] == ["DETACH NOT UNMOUNTED", "DESTROY NOT WHITELISTED"]


def test_binding_is_for_its_root(root, tmp_path, fake_show):
    other = tmp_path / "other"
    other.mkdir()
    open_binding(str(root), "tfplan")
    _plan_now(root)
    # a plan file given by absolute path from another project_path
    with pytest.raises(GateRefused, match="binding for another root"):
        run_gate(str(other), str(root / "tfplan"))


# ----------------------------------------------------------------------------- recorded storages (issue 16)
VOL = "module.storage_mnt_data.aws_ebs_volume.this"


def test_create_of_a_recorded_storage_is_refused():
    v = evaluate_plan(plan(rc(VOL, "create"), rc("module.storage_p1.aws_ebs_volume.this", "create")), refuse_create=[VOL])
    assert v.creates == [VOL, "module.storage_p1.aws_ebs_volume.this"]
    assert len(v.violations) == 1 and v.violations[0].startswith("RECORDED STORAGE WOULD BE CREATED: %s: " % VOL)
    assert "forget.yml" in v.violations[0] and "state_import.yml" in v.violations[0]
    # indexed instances are covered, other resources of the module are not (a new lifecycle rule is fine)
    v = evaluate_plan(plan(rc(VOL + "[0]", "create"), rc("module.storage_mnt_data.aws_s3_object.x", "create")),
                      refuse_create=[VOL])
    assert [x.split(":")[0] for x in v.violations] == ["RECORDED STORAGE WOULD BE CREATED"]
    # without refuse_create a create passes; a replacement is the whitelist's business
    assert evaluate_plan(plan(rc(VOL, "create"))).violations == []
    v = evaluate_plan(plan(rc(VOL, "delete", "create")), allow_destroy=["module.storage_mnt_data"], refuse_create=[VOL])
    assert v.violations == [] and v.replaces == [VOL]


def test_run_gate_passes_refuse_create(tmp_path):
    pj = tmp_path / "plan.json"
    pj.write_text(json.dumps(plan(rc(VOL, "create"))))
    with pytest.raises(GateRefused) as exc:
        run_gate(plan_json=str(pj), refuse_create=[VOL])
    assert exc.value.messages[0].startswith("RECORDED STORAGE WOULD BE CREATED: " + VOL)
    assert run_gate(plan_json=str(pj))["adds"] == 1


def test_an_applys_sensitive_outputs_are_masked_and_the_others_kept():
    """community.general.terraform returns ``terraform output -json`` after an apply, sensitive
    values in clear; csis_apply_wait shows that result with them masked (issue: the identity
    root's enrollment token reached the console at -v and AWX's job events)."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply.plan_verdict import MASKED, masked_outputs

    outputs = {
        "sft_enrollment_token": {"sensitive": True, "type": "string", "value": "sft-enroll-0123456789"},
        "group_gids": {"sensitive": False, "type": ["map", "number"], "value": {"coops": 2001}},
        "leaked": {"sensitive": False, "type": "string", "value": "AKIAABCDEFGHIJKLMNOP"},
        "odd": "not an output document",
    }
    shown = masked_outputs(outputs)
    assert shown["sft_enrollment_token"] == {"sensitive": True, "type": "string", "value": MASKED}
    assert shown["group_gids"] == outputs["group_gids"]
    assert shown["leaked"]["value"] == MASKED  # secret-shaped, though terraform does not mark it
    assert shown["odd"] == "not an output document"
    assert outputs["sft_enrollment_token"]["value"] == "sft-enroll-0123456789"  # the input is not changed
    assert masked_outputs(None) is None and masked_outputs([]) == []


def test_an_ordinary_plan_s_digest_is_the_one_it_had():
    """Moves, imports and output changes joined the digest; a plan with none of them digests as
    before (the receipts of plans made before stay valid), and one with them differs."""
    plan = {"format_version": "1.2", "resource_changes": [
        {"address": "a.b", "change": {"actions": ["create"], "before": None, "after": {"x": 1}}},
        {"address": "a.c", "change": {"actions": ["no-op"], "before": {"x": 1}, "after": {"x": 1}}}],
        "output_changes": {"o": {"actions": ["no-op"], "before": 1, "after": 1}}}
    blob = json.dumps([{"actions": ["create"], "address": "a.b", "after": {"x": 1}}], sort_keys=True, separators=(",", ":"))
    assert plan_content_digest(plan) == hashlib.sha256(blob.encode("utf-8")).hexdigest()
    moved = json.loads(json.dumps(plan))
    moved["resource_changes"][1]["previous_address"] = "a.old"
    assert plan_content_digest(moved) != plan_content_digest(plan)
    # an output that changes beside the resource changes (every storage root's module output does
    # at a create or an update) follows from them: the digest is the one it had
    output = json.loads(json.dumps(plan))
    output["output_changes"]["o"] = {"actions": ["update"], "before": 1, "after": 2}
    assert plan_content_digest(output) == plan_content_digest(plan)
    # outputs alone: digested (an empty plan's digest is another)
    output["resource_changes"] = output["resource_changes"][1:]
    empty = dict(plan, resource_changes=[], output_changes={})
    assert plan_content_digest(output) != plan_content_digest(empty)


@pytest.mark.parametrize("extra,expected", [
    ({"output_changes": {"o": {"actions": 5}}}, 'output_changes["o"].actions must be a list of strings'),
])
def test_malformed_outputs_are_one_message_and_malformed_checks_are_skipped(tmp_path, extra, expected):
    pj = tmp_path / "plan.json"
    pj.write_text(json.dumps(dict({"format_version": "1.2", "resource_changes": []}, **extra)))
    with pytest.raises(GateError) as err:
        run_gate(plan_json=str(pj))
    assert str(err.value) == "%s: %s" % (pj, expected)
    for checks in (5, [5], [{"status": "fail", "instances": 5}], [{"instances": [{"status": "fail", "address": {"to_display": {"secret": "hunter2"}}}]}]):
        v = evaluate_plan({"format_version": "1.2", "resource_changes": [], "checks": checks})
        assert v.failed_checks == [] and "hunter2" not in v.summary()


def test_an_output_only_plan_lists_each_output_as_added_removed_or_changed():
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply.plan_verdict import change_lines
    verdict = evaluate_plan(plan(output_changes={
        "gone": {"actions": ["delete"], "before": 1, "after": None},
        "new": {"actions": ["create"], "before": None, "after": 2},
        "moved": {"actions": ["update"], "before": 1, "after": 3},
        "same": {"actions": ["no-op"], "before": 1, "after": 1}}))
    assert verdict.outputs == ["gone", "moved", "new"]
    assert change_lines(verdict) == ["- output.gone: removed", "~ output.moved: changes", "+ output.new: added"]
