# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The alias pool (meta-state/aliases.txt): validation, the draw at render, what the record
keeps, and retirement (the manual's alias pool)."""
from __future__ import annotations

import os
import sys

import pytest
from trees import write_meta  # noqa: E402  (tests/support)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bad_inputs"))
import corpus  # noqa: E402
from render_trees import copy_tree  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.plan import RenderOptions  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.roots import plan_roots  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.state import aliases  # noqa: E402


@pytest.fixture
def tree(tmp_path):
    return copy_tree("examples", str(tmp_path))


def pool(root, text):
    os.makedirs(os.path.join(root, "meta-state"), exist_ok=True)
    with open(os.path.join(root, "meta-state", "aliases.txt"), "w", encoding="utf-8") as fh:
        fh.write(text)


def instance_plan(root):
    t, meta = load_and_validate(root, run_version=corpus.version_stub({}))
    (plan,) = plan_roots(t, meta, "instance-image", RenderOptions())
    return plan


def params(plan, name):
    return plan.instances[name]["launch_params"]


def test_no_pool_no_alias_and_no_warning(tree):
    plan = instance_plan(tree)
    assert "alias" not in params(plan, "test") and "alias" not in params(plan, "test2")
    assert not [w for w in plan.warnings if "alias pool" in w]


def test_new_machines_take_the_first_free_names_in_order(tree):
    pool(tree, "# memorable names\n\ncoops-model\n  sage  \nbasil\n")
    plan = instance_plan(tree)
    # instances in declaration order (test2, test): each takes the next free name
    assert params(plan, "test2")["alias"] == "coops-model"
    assert params(plan, "test")["alias"] == "sage"
    # the draw is the same on every render until a record takes it
    assert params(instance_plan(tree), "test2")["alias"] == "coops-model"


def test_an_exhausted_pool_warns_as_the_manual_says(tree):
    pool(tree, "only-one\n")
    plan = instance_plan(tree)
    assert params(plan, "test2")["alias"] == "only-one" and "alias" not in params(plan, "test")
    assert ("Instance test: the alias pool is EMPTY; launching test-001 without an alias (append names to "
            "aliases.txt to refill it)") in plan.warnings


def test_taken_and_retired_names_are_not_drawn_again(tree):
    pool(tree, "a1\na2\na3\na4\n")
    # another (forgotten-from-the-tree) machine's launch record holds a1; a closed generation retired a2
    write_meta(tree, "launch-params.yaml", {"instances": {}})
    write_meta(tree, "instance-state.yaml", {"instances": {"old": {
        "generation": {"durable": 2, "ephemeral": 0}, "current": None,
        "history": [{"number": 1, "kind": "durable", "alias": "a2", "why": "replaced"}]}}})
    meta = {"launch-params.yaml": {"instances": {"x": {"alias": "a1"}}},
            "instance-state.yaml": {"instances": {"old": {"history": [{"alias": "a2"}], "current": {"alias": "a3"}}}}}
    assert aliases.taken(meta) == {"a1", "a2", "a3"}
    plan = instance_plan(tree)
    assert params(plan, "test2")["alias"] == "a1"  # a1 is taken only by a record in meta-state, none here
    assert params(plan, "test")["alias"] == "a3"   # a2 was retired with old's first generation


@pytest.mark.parametrize("text,line,message", [
    ("good\nBad_Name\n", 2, "alias 'Bad_Name' is not a legal hostname label"),
    ("twice\nother\ntwice\n", 3, "alias 'twice' repeats line 1"),
    ("test2\n", 1, "alias 'test2' is the name of a declared instance"),
    ("-leading\n", 1, "alias '-leading' is not a legal hostname label"),
])
def test_bad_pool_lines_are_refused_naming_the_line(tree, text, line, message):
    pool(tree, text)
    with pytest.raises(ConfigError) as err:
        load_and_validate(tree, run_version=corpus.version_stub({}))
    found = [(p.file, p.key, p.message) for p in err.value.problems]
    assert any(f == "meta-state/aliases.txt" and k == "line %d" % line and msg.startswith(message)
               for f, k, msg in found), found


def test_an_alias_older_than_the_history_keeps_is_still_retired():
    """The history keeps the last 50 generations; the alias of one that drops out of it stays
    retired (``retired_aliases``): a machine replaced on every new series head for two months
    never hands its first alias to another machine."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import record
    rec = {"generation": {"durable": 0, "ephemeral": 0}, "current": None, "history": []}
    for i in range(1, record.HISTORY_MAX + 3):
        record.add_history(rec, {"number": i, "kind": "durable", "alias": "a%02d" % i, "why": "replaced"})
    assert len(rec["history"]) == record.HISTORY_MAX and rec["history"][0]["number"] == 3
    assert rec["retired_aliases"] == ["a01", "a02"]
    taken = aliases.taken({"instance-state.yaml": {"instances": {"m": rec}}})
    assert {"a01", "a02", "a52"} <= taken
