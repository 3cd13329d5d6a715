# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Apply flags (flags.py) and the apply-check library that reads them (applycheck.py)."""
from __future__ import annotations

import os
import sys

_COLL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".venv", "collections")
if os.path.normpath(_COLL) not in [os.path.normpath(p) for p in sys.path]:
    sys.path.insert(0, os.path.normpath(_COLL))

import pytest  # noqa: E402
import yaml  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.config.flags import (  # noqa: E402
    RuntimeNarrowed, apply_flag_allows, describe_flag, narrow_by_apply_runtime, parse_apply_flag,
)
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.applycheck import (  # noqa: E402
    ApplyCheckRefused, check_apply, find_config_root,
)

WHERE = "cfg/_config.yml: config.apply_storage"


# ----------------------------------------------------------------------------- parse
@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False), (None, False),
    ([], []), (["aws-ebs"], ["aws-ebs"]), (["a", "rt"], ["a", "rt"]), (("a",), ["a"]),
])
def test_parse_accepts(value, expected):
    assert parse_apply_flag(value, WHERE) == expected


@pytest.mark.parametrize("value, found", [
    ("false", "'false'"), ("no", "'no'"), ("yes", "'yes'"), ("true", "'true'"), ("aws-ebs", "'aws-ebs'"),
    (0, "int 0"), (1, "int 1"), (1.5, "float"), ({"a": 1}, "dict"),
    (["a", ""], "empty string"), (["a", 3], "int 3"), (["a", None], "null"), ([True], "bool True"),
    ([" a"], "whitespace"),
])
def test_parse_refuses(value, found):
    with pytest.raises(ValueError) as err:
        parse_apply_flag(value, WHERE)
    msg = str(err.value)
    assert msg.startswith(WHERE + ":")
    assert found in msg
    assert "true/false or a list of builder/runtime names" in msg


def test_quoted_false_from_yaml_is_refused():
    value = yaml.safe_load('apply_storage: "false"')["apply_storage"]
    with pytest.raises(ValueError, match="quoted"):
        parse_apply_flag(value, WHERE)


# ----------------------------------------------------------------------------- allows
def test_allows():
    assert apply_flag_allows(True, "b", ["rt"]) is True
    assert apply_flag_allows(False, "b", ["rt"]) is False
    assert apply_flag_allows([], "b", ["rt"]) is False
    assert apply_flag_allows(["b"], "b", ["rt"]) is True
    assert apply_flag_allows(["rt"], "b", ["rt"]) is True
    assert apply_flag_allows(["other"], "b", ["rt"]) is False
    assert apply_flag_allows(["b"], None, []) is False
    with pytest.raises(ValueError):
        apply_flag_allows("false", "b", [])  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- narrow
def test_narrow_never_widens():
    assert narrow_by_apply_runtime(False, "rt") is False
    assert narrow_by_apply_runtime([], "rt") == []
    assert narrow_by_apply_runtime(True, "rt") == ["rt"]
    assert narrow_by_apply_runtime(True, None) is True
    assert narrow_by_apply_runtime(["b"], None) == ["b"]
    assert narrow_by_apply_runtime(["b", "rt"], "rt") == ["rt"]
    n = narrow_by_apply_runtime(["b"], "rt")
    assert n == RuntimeNarrowed(runtime="rt", names=("b",))
    # root b on runtime rt: allowed; root b on another runtime: not; root c on rt: not
    assert apply_flag_allows(n, "b", ["rt"]) is True
    assert apply_flag_allows(n, "b", ["rt2"]) is False
    assert apply_flag_allows(n, "c", ["rt"]) is False
    # narrowing a narrowed flag to another runtime leaves nothing
    assert narrow_by_apply_runtime(n, "rt2") == []
    assert narrow_by_apply_runtime(n, "rt") == n


@pytest.mark.parametrize("flag", [True, False, [], ["a"], ["a", "rt"], ["rt"]])
@pytest.mark.parametrize("root, aliases", [("a", ["rt"]), ("a", ["rt2"]), ("b", ["rt"]), ("rt", [])])
def test_narrow_is_subset(flag, root, aliases):
    narrowed = narrow_by_apply_runtime(flag, "rt")
    if apply_flag_allows(narrowed, root, aliases):
        assert apply_flag_allows(flag, root, aliases)
        assert "rt" in [root] + aliases


def test_describe():
    assert describe_flag(False) == "false"
    assert describe_flag(True) == "true"
    assert describe_flag(["a", "b"]) == '["a", "b"]'


# ----------------------------------------------------------------------------- apply-check library
def _tree(tmp_path, config, overlays=None):
    (tmp_path / "cfg").mkdir(exist_ok=True)
    (tmp_path / "cfg" / "_config.yml").write_text(config)
    for name, text in (overlays or {}).items():
        (tmp_path / name).write_text(text)
    return str(tmp_path)


def test_apply_check_true(tmp_path):
    root = _tree(tmp_path, "config:\n  apply_storage: true\n")
    out = check_apply("storage", root="aws-ebs", root_alias=["rt"], config_root=root)
    assert out["allowed"] is True and out["flag"] is True
    assert out["source"] == os.path.join(root, "cfg", "_config.yml")


def test_apply_check_false_names_file_and_root(tmp_path):
    root = _tree(tmp_path, "config:\n  apply_storage: false\n")
    with pytest.raises(ApplyCheckRefused) as err:
        check_apply("storage", root="aws-ebs", config_root=root)
    assert str(err.value) == ("apply_storage is false NOW in %s/cfg/_config.yml for root 'aws-ebs' -- not applying."
                              % root)


def test_apply_check_unset_is_false(tmp_path):
    root = _tree(tmp_path, "config: {}\n")
    with pytest.raises(ApplyCheckRefused, match=r"apply_instances is false \(not set\) NOW in"):
        check_apply("instance-image", root="b", config_root=root)


def test_apply_check_overlay_wins_and_is_named(tmp_path):
    root = _tree(tmp_path, "config:\n  apply_instances: true\n",
                 {"off.yml": "config:\n  apply_instances: false\n", "on.yml": "config:\n  apply_instances: [b]\n"})
    with pytest.raises(ApplyCheckRefused) as err:
        check_apply("instance-image", root="b", overlays=["off.yml"], config_root=root)
    assert str(err.value) == ("apply_instances is false NOW in %s for root 'b' -- not applying."
                              % os.path.join(root, "off.yml"))
    out = check_apply("instance-image", root="b", overlays=["off.yml", "on.yml"], config_root=root)
    assert out["source"] == os.path.join(root, "on.yml") and out["flag"] == ["b"]


def test_apply_check_overlay_gone(tmp_path):
    root = _tree(tmp_path, "config:\n  apply_storage: true\n")
    with pytest.raises(ApplyCheckRefused, match="apply-check: overlay .*gone.yml is gone; refusing to apply"):
        check_apply("storage", root="b", overlays=["gone.yml"], config_root=root)


def test_apply_check_no_config(tmp_path):
    d = tmp_path / "a" / "b"
    d.mkdir(parents=True)
    assert find_config_root(str(d)) is None
    with pytest.raises(ApplyCheckRefused) as err:
        check_apply("storage", root="b", search_from=str(d))
    assert str(err.value) == ("apply-check: no cfg/_config.yml found from the working directory up; "
                              "refusing to apply")


def test_apply_check_walks_up(tmp_path):
    root = _tree(tmp_path, "config:\n  apply_storage: [rt]\n")
    d = tmp_path / "generated" / "storage" / "b"
    d.mkdir(parents=True)
    out = check_apply("storage", root="b", root_alias=["rt"], search_from=str(d))
    assert out["config_root"] == root


def test_apply_check_string_false_refused(tmp_path):
    root = _tree(tmp_path, 'config:\n  apply_storage: "false"\n')
    with pytest.raises(ApplyCheckRefused) as err:
        check_apply("storage", root="b", config_root=root)
    msg = str(err.value)
    assert "cfg/_config.yml: config.apply_storage" in msg and "'false'" in msg


def test_apply_runtime_cannot_turn_false_on(tmp_path):
    root = _tree(tmp_path, "config:\n  apply_instances: false\n")
    with pytest.raises(ApplyCheckRefused, match="apply_instances is false NOW in"):
        check_apply("instance-image", root="b", root_alias=["rt"], apply_runtime="rt", config_root=root)


def test_apply_runtime_narrows(tmp_path):
    root = _tree(tmp_path, "config:\n  apply_instances: true\n")
    assert check_apply("instance-image", root="b", root_alias=["rt"], apply_runtime="rt",
                       config_root=root)["allowed"]
    with pytest.raises(ApplyCheckRefused, match="narrowed by apply_runtime 'rt2'"):
        check_apply("instance-image", root="b", root_alias=["rt"], apply_runtime="rt2", config_root=root)


def test_identity_fallback(tmp_path):
    root = _tree(tmp_path, "config:\n  apply_storage: false\n  apply_instances: [idb]\n")
    out = check_apply("identity", root="idb", config_root=root)
    assert out["key"] == "apply_instances"
    root2 = _tree(tmp_path, "config:\n  apply_storage: false\n")
    with pytest.raises(ApplyCheckRefused, match="apply_identity is not set and apply_storage is false NOW"):
        check_apply("identity", root="idb", config_root=root2)
    root3 = _tree(tmp_path, "config:\n  apply_identity: false\n  apply_storage: true\n")
    with pytest.raises(ApplyCheckRefused, match="apply_identity is false NOW"):
        check_apply("identity", root="idb", config_root=root3)


def test_identity_null_is_unset_as_the_render_reads_it(tmp_path):
    """``apply_identity: null`` (documented as the default) is not set, at the render and at the
    apply check alike: the check once read it as false and refused, after the approval, a root the
    render had let through on apply_storage."""
    root = _tree(tmp_path, "config:\n  apply_identity: null\n  apply_storage: [idb]\n")
    out = check_apply("identity", root="idb", config_root=root)
    assert out["allowed"] and out["key"] == "apply_storage"
    assert out["msg"].startswith("apply_identity is null (not set) in %s" % os.path.join(root, "cfg", "_config.yml"))
    with pytest.raises(ApplyCheckRefused, match=r"apply_identity is null \(not set\) in .* and apply_storage is "):
        check_apply("identity", root="other", config_root=root)
    # an overlay's null unsets the tree's false, as it does for the render
    (tmp_path / "2").mkdir()
    root2 = _tree(tmp_path / "2", "config:\n  apply_identity: false\n  apply_instances: true\n",
                  overlays={"unset.yml": "config:\n  apply_identity: null\n"})
    assert check_apply("identity", root="idb", config_root=root2, overlays=["unset.yml"])["key"] == "apply_instances"


def test_malformed_yaml_refused(tmp_path):
    root = _tree(tmp_path, "config: [\n")
    with pytest.raises(ApplyCheckRefused, match="not valid YAML"):
        check_apply("storage", root="b", config_root=root)


def test_an_apply_flag_naming_an_alias_allows_the_apply_the_render_allowed(tmp_path):
    """apply_storage names a builder alias, or csis_apply_runtime a runtime alias: the render's
    may_apply allows the root through it, and so must the apply-time check after the approval,
    from the names the render returns for the root (apply_names, the role's root_alias)."""
    import shutil

    from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree
    from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import read_meta
    from ansible_collections.csis.infra.plugins.module_utils.csis.render.plan import RenderOptions
    from ansible_collections.csis.infra.plugins.module_utils.csis.render.storage_roots import StorageRoots

    root = tmp_path / "tree"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "..", "..", "examples"), root,
                    ignore=shutil.ignore_patterns("overlays", "generated", "meta-state"))
    for name, edit in (("storage-builders.yml", lambda d: d["storage_builders"][1].update(aliases=["ebs"])),
                       ("runtime-builders.yml", lambda d: d["runtime_builders"][0].update(aliases=["east2"])),
                       ("_config.yml", lambda d: d["config"].update(apply_storage=["ebs"]))):
        path = root / "cfg" / name
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        edit(doc)
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    tree = load_tree(str(root))
    meta = read_meta(tree.root)[0]
    for apply_runtime in (None, "east2"):
        roots = {r.builder: r for r in StorageRoots(tree, meta, RenderOptions(apply_runtime=apply_runtime)).roots()}
        ebs = roots["aws-ebs"]
        assert ebs.may_apply and not roots["aws-efs"].may_apply
        assert ebs.apply_names == ["ebs", "aws-east2-runtime", "east2"]
        assert ebs.as_dict(str(root))["apply_names"] == ebs.apply_names
        out = check_apply("storage", root="aws-ebs", root_alias=ebs.apply_names, apply_runtime=apply_runtime,
                          config_root=str(root))
        assert out["allowed"] is True
        # what the role passed before (the runtime's name alone) refused the approved root
        with pytest.raises(ApplyCheckRefused):
            check_apply("storage", root="aws-ebs", root_alias=["aws-east2-runtime"], config_root=str(root))
