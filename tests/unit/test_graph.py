# -*- coding: utf-8 -*-
"""The picture of a tree (render/graph.py): the DOT text names every object of the example
tree with its state (meta-state written through the store, a state report with a HARD
line), draws the containment, mount and remote-state edges, and nothing from a name or a
report can add DOT syntax (checked by parsing the text with graphviz itself). The files:
written atomically, unchanged on a second run, nothing in check mode, and a missing ``dot``
is an error naming it."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from trees import copy_as_shipped

from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate
from ansible_collections.csis.infra.plugins.module_utils.csis.render import graph as gr
from ansible_collections.csis.infra.plugins.module_utils.csis.render.launch import compute_launch_params
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: graphviz's dot is required, not optional: scripts/bootstrap (the README's set-up, and the first
#: step of scripts/test) installs it, so a machine without it fails here, naming it
DOT = shutil.which("dot") or "dot"


def _no_version(binary):
    return None, None


@pytest.fixture
def tree_root(tmp_path):
    return copy_as_shipped(os.path.join(REPO, "examples"), str(tmp_path / "examples"))


def _load(root):
    return load_and_validate(root, run_version=_no_version)


def _objects(tree):
    """(kind, name) of every object the picture must show."""
    out = [(n.kind, n.name) for n in tree.hierarchy.values()]
    out += [("runtime", n) for n in tree.runtimes]
    out += [("group builder", n) for n in tree.group_builders]
    out += [("storage builder", n) for n in tree.storage_builders]
    out += [("instance builder", n) for n in tree.instance_builders]
    out += [("group", n) for n in tree.groups]
    out += [("storage", n) for n in tree.storages]
    out += [("instance", n) for n in tree.instances]
    return out


def _dot_json(text):
    """The graph as graphviz parses it (``dot -Tjson``): what it really holds."""
    import subprocess

    gr.find_dot(DOT)  # a clear error when graphviz is missing
    proc = subprocess.run([DOT, "-Tjson"], input=text.encode("utf-8"), capture_output=True, timeout=60, check=True)
    return json.loads(proc.stdout)


def _svg_texts(text):
    """The text lines of the SVG graphviz draws from ``text``."""
    import subprocess
    import xml.etree.ElementTree as ET

    gr.find_dot(DOT)
    proc = subprocess.run([DOT, "-Tsvg"], input=text.encode("utf-8"), capture_output=True, timeout=60, check=True)
    root = ET.fromstring(proc.stdout)
    return [el.text for el in root.iter("{http://www.w3.org/2000/svg}text")]


def _node(g, kind, name):
    n = g.get(kind, name)
    assert n is not None, (kind, name)
    return n


def _edge(g, kind, src, dst):
    s, d = g.get(*src), g.get(*dst)
    return [e for e in g.edges if e.kind == kind and e.src == s.id and e.dst == d.id]


def test_every_object_of_the_example_tree_is_drawn_declared(tree_root):
    tree, meta = _load(tree_root)
    g = gr.build(tree, meta)
    text = gr.to_dot(g)
    objects = _objects(tree)
    assert len(objects) == 15  # account, environment, runtime, 5 builders, 2 groups, 3 storages, 2 instances
    assert sorted((n.kind, n.name) for n in g.nodes.values()) == sorted(objects)
    for kind, name in objects:
        n = _node(g, kind, name)
        assert n.state == "declared" and n.declared and not n.hard
        assert '%s [label="%s\\n%s\\n' % (n.id, kind, name) in text


def test_containment_mount_and_remote_state_edges(tree_root):
    tree, meta = _load(tree_root)
    g = gr.build(tree, meta)
    assert _edge(g, "contains", ("account", "example-account"), ("environment", "example-us-east-2"))
    assert _edge(g, "contains", ("environment", "example-us-east-2"), ("runtime", "aws-east2-runtime"))
    for b in ("aws-ebs", "aws-efs", "aws-s3", "open-tofu", "posix-groups"):
        assert _edge(g, "contains", ("runtime", "aws-east2-runtime"), ("builder", b))
    assert _edge(g, "contains", ("builder", "aws-ebs"), ("storage", "mnt_data"))
    assert _edge(g, "contains", ("builder", "open-tofu"), ("instance", "test2"))
    assert _edge(g, "contains", ("builder", "posix-groups"), ("group", "coops"))
    mount = _edge(g, "mount", ("storage", "mnt_data"), ("instance", "test2"))
    assert [e.label for e in mount] == ["mount /mnt/data"]
    assert len([e for e in g.edges if e.kind == "mount"]) == 1
    # the terraform_remote_state blocks of the rendered roots: the instance root reads the
    # identity root (the owning group's gid) and the EBS root (the volume); the EFS root
    # reads the identity root (its access points' gids)
    refs = sorted((by_id(g, e.src), by_id(g, e.dst), e.label) for e in g.edges if e.kind == "remote_state")
    assert refs == [("aws-efs", "posix-groups", "remote state (storage)"),
                    ("open-tofu", "aws-ebs", "remote state (instance-image)"),
                    ("open-tofu", "posix-groups", "remote state (instance-image)")]


def by_id(g, node_id):
    return [n.name for n in g.nodes.values() if n.id == node_id][0]


def test_a_tree_that_breaks_a_rule_is_drawn_without_remote_state_and_says_why(tree_root):
    # a launched instance whose declaration then changed (N26): the picture is most wanted then
    _record(tree_root)
    path = os.path.join(tree_root, "instances", "instances.yaml")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text.replace("mount_point: /mnt/data", "mount_point: /mnt/moved"))
    out = gr.picture(tree_root, write=False)
    assert len(out["problems"]) == 1 and "(N26)" in out["problems"][0] and "test2" in out["problems"][0]
    assert not [e for e in out["graph"]["edges"] if e["kind"] == "remote_state"]
    assert {"kind": "mount", "from": "storage mnt_data", "to": "instance test2", "label": "mount /mnt/moved"} \
        in out["graph"]["edges"]
    assert {"kind": "instance", "name": "test2", "state": "launched", "declared": True} in out["graph"]["nodes"]
    assert "the tree does not validate (1 problem(s), see playbooks/validate.yml): remote-state references not drawn" \
        in out["dot_text"]
    assert not os.path.exists(os.path.join(tree_root, "generated"))  # check mode: nothing written


def test_a_valid_tree_has_no_problems_and_draws_remote_state(tree_root):
    out = gr.picture(tree_root, write=False)
    assert out["problems"] == [] and out["hard"] == []
    assert len([e for e in out["graph"]["edges"] if e["kind"] == "remote_state"]) == 3
    assert "does not validate" not in out["dot_text"]


def _record(root):
    """Records as an apply leaves them, written through the store (test2's launch parameters
    computed from its declaration, as csis_record keeps them)."""
    tree, meta = _load(root)
    params = compute_launch_params(tree, meta, tree.instances["test2"])
    ms = MetaState(root)
    with ms.transaction("test_graph") as txn:
        ss = txn.load("storage-state.yaml")
        ss["storages"]["mnt_data"] = {"state": "active", "generation": 1,
                                      "facts": {"builder": "aws-ebs", "volume_id": "vol-0123456789abcdef0"}}
        ss["storages"]["efs-storage"] = {"state": "active", "generation": 1, "facts": {"builder": "aws-efs"}}
        ss["storages"]["default-bucket"] = {"state": "destroyed", "generation": 1, "facts": {"builder": "aws-s3"}}
        ss["storages"]["old-volume"] = {"state": "destroyed", "generation": 1, "facts": {"builder": "aws-ebs"}}
        ss["storages"]["old-archive"] = {"state": "archived", "generation": 1, "facts": {"builder": "aws-ebs"}}
        txn.save("storage-state.yaml", ss)
        lp = txn.load("launch-params.yaml")
        lp["instances"]["test2"] = dict(params, launched=True)
        lp["instances"]["gone"] = {"launched": True, "builder": "open-tofu", "hostname": "gone",
                                   "mounts": [{"storage": "mnt_data", "mount_point": "/srv/old", "type": "ebs"}]}
        txn.save("launch-params.yaml", lp)


def test_states_from_meta_state_and_the_state_report(tree_root):
    _record(tree_root)
    report = {"drift": [
        {"kind": "storage", "name": "mnt_data", "drift": "missing", "detail": "gone", "hard": True},
        {"kind": "instance", "name": "test", "drift": "changed", "detail": "other ami", "hard": False},
    ]}
    tree, meta = _load(tree_root)
    g = gr.build(tree, meta, report)
    assert gr.state_text(_node(g, "storage", "mnt_data")) == "drifted HARD (missing)"
    assert _node(g, "storage", "efs-storage").state == "active"
    assert _node(g, "storage", "default-bucket").state == "destroyed -> active"  # recorded, then requested
    archived = _node(g, "storage", "old-archive")
    assert (archived.state, archived.declared) == ("archived", False)
    old = _node(g, "storage", "old-volume")
    assert (old.state, old.declared) == ("destroyed", False)
    assert _edge(g, "contains", ("builder", "aws-ebs"), ("storage", "old-volume"))
    assert _node(g, "instance", "test2").state == "launched"
    assert gr.state_text(_node(g, "instance", "test")) == "declared"  # a line that is not HARD changes nothing
    gone = _node(g, "instance", "gone")
    assert (gone.state, gone.declared) == ("launched", False)
    assert [e.label for e in _edge(g, "mount", ("storage", "mnt_data"), ("instance", "gone"))] == ["mount /srv/old"]
    text = gr.to_dot(g)
    hard = _node(g, "storage", "mnt_data")
    assert '%s [label="storage\\nmnt_data\\nebs\\ndrifted HARD (missing)"' % hard.id in text
    assert 'fillcolor="%s", color="#c00000"' % gr.HARD_COLOR in text
    assert '"storage\\nold-volume\\ndestroyed (not declared)"' in text
    assert 'label="storage\\nold-archive\\narchived (not declared)", shape="cylinder", fillcolor="%s"' \
        % gr.STATE_COLORS["archived"] in text
    assert g.as_dict()["nodes"][[n["name"] for n in g.as_dict()["nodes"]].index("mnt_data")]["state"] == \
        "drifted HARD (missing)"


def test_a_hard_line_for_an_object_nothing_else_knows_is_still_drawn(tree_root):
    tree, meta = _load(tree_root)
    g = gr.build(tree, meta, {"drift": [{"kind": "instance", "name": "phantom", "drift": "missing", "hard": True}]})
    n = _node(g, "instance", "phantom")
    assert (gr.state_text(n), n.declared) == ("drifted HARD (missing)", False)


HOSTILE = ['a"];evil [shape=star', "back\\slash \\N \\G \\L", "new\nline\tand\x00nul", "<b>html</b> & {x}",
           "x -> y", "}"]


def test_quote_escapes_quotes_backslashes_and_control_characters():
    assert gr.quote('a"b') == '"a\\"b"'
    assert gr.quote("a\\b") == '"a\\\\b"'
    assert gr.quote("a\nb\x00c\u2028") == '"a?b?c?"'
    assert gr.label("x", 'y"') == '"x\\ny\\""'
    for h in HOSTILE:
        q = gr.quote(h)
        inner = q[1:-1]
        # every quote inside is escaped, and no backslash is left to escape what follows it
        assert inner.replace("\\\\", "").replace('\\"', "").count('"') == 0
        assert "\n" not in q


def test_hostile_names_and_report_text_cannot_inject_dot():
    g = gr.Graph(HOSTILE[0])
    rt = g.add("runtime", HOSTILE[1], details=[HOSTILE[2]])
    b = g.add("storage builder", HOSTILE[3])
    s = g.add("storage", HOSTILE[4], state="active")
    i = g.add("instance", HOSTILE[5], state="launched")
    s.hard = ['missing"] ; n1 -> n1 [color=red']
    g.link(rt, b)
    g.link(b, s)
    g.link(s, i, "mount", 'mount /x"];n9 [label=pwned')
    g.link(b, rt, "remote_state", "remote state (\\G)")
    parsed = _dot_json(gr.to_dot(g))
    nodes = {o["name"]: o for o in parsed.get("objects", [])}
    assert sorted(nodes) == sorted(n.id for n in g.nodes.values())  # no node added
    assert len(parsed.get("edges", [])) == 4  # no edge added
    texts = _svg_texts(gr.to_dot(g))  # what the picture shows: every name as it is, on its own line
    for want in HOSTILE:
        shown = want.replace("\n", "?").replace("\t", "?").replace("\x00", "?")
        assert shown in texts or "csis.infra tree " + shown in texts, (want, texts)
    assert 'drifted HARD (missing"] ; n1 -> n1 [color=red)' in texts
    assert 'mount /x"];n9 [label=pwned' in texts and "remote state (\\G)" in texts
    assert "star" not in json.dumps([o.get("shape") for o in nodes.values()])


def test_files_written_atomically_once_and_not_in_check_mode(tree_root):
    tree, meta = _load(tree_root)
    text = gr.to_dot(gr.build(tree, meta))
    paths = gr.graph_paths(tree_root)
    dry = gr.render_files(tree_root, text, write=False)
    assert dry["changed"] is True and not os.path.exists(os.path.join(tree_root, "generated"))
    first = gr.render_files(tree_root, text)
    assert first["changed"] is True and first["formats"][:2] == ["dot", "svg"]
    with open(paths["dot"], encoding="utf-8") as fh:
        assert fh.read() == text
    with open(paths["svg"], encoding="utf-8") as fh:
        svg = fh.read()
    assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
    if "png" in first["formats"]:
        with open(paths["png"], "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    stats = {p: os.stat(p).st_mtime_ns for p in first["paths"].values()}
    again = gr.render_files(tree_root, text)
    assert again["changed"] is False
    assert {p: os.stat(p).st_mtime_ns for p in again["paths"].values()} == stats  # not rewritten
    assert sorted(os.listdir(os.path.dirname(paths["dot"]))) == sorted(os.path.basename(p) for p in stats)


def test_a_missing_dot_is_an_error_naming_it(tree_root):
    with pytest.raises(gr.GraphError) as exc:
        gr.render_files(tree_root, "digraph {}\n", dot=os.path.join(tree_root, "no-such-dot"))
    assert "no-such-dot" in str(exc.value) and "graphviz" in str(exc.value) and "not installed" in str(exc.value)
    assert not os.path.exists(os.path.join(tree_root, "generated"))


def test_a_failing_dot_is_an_error(tree_root, tmp_path):
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\necho 'Error: syntax error in line 1' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(gr.GraphError, match=r"-Tsvg failed \(exit 1\): Error: syntax error"):
        gr.render_files(tree_root, "digraph {}\n", dot=str(fake))
    assert not os.path.exists(os.path.join(tree_root, "generated"))


def test_the_readme_picture_names_every_object_of_examples():
    """docs/images/examples.svg (the README's picture) is playbooks/graph.yml's SVG of a copy of
    examples/; it must keep naming every object the example tree declares. Refresh it after
    changing examples/ or the picture:

        T=$(mktemp -d) && cp -r examples $T/ && .venv/bin/ansible-playbook playbooks/graph.yml \\
            -e csis_config_root=$T/examples && cp $T/examples/generated/graph.svg docs/images/examples.svg
    """
    import xml.etree.ElementTree as ET

    from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import load_tree

    tree = load_tree(os.path.join(REPO, "examples"))
    svg = ET.parse(os.path.join(REPO, "docs", "images", "examples.svg")).getroot()
    texts = [el.text for el in svg.iter("{http://www.w3.org/2000/svg}text")]
    names = [name for _kind, name in _objects(tree)]
    assert len(names) == 15
    assert [n for n in names if n not in texts] == []
    assert "csis.infra tree %s" % tree.config_file.id in texts
