# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A picture of a configuration tree: accounts -> environments -> runtimes -> builders ->
storages (and groups) -> instances, as graphviz DOT text (``playbooks/graph.yml``).

* **Objects**: the nodes of ``cfg/hierarchy.yml``, the runtimes, the builders (instance,
  storage and group builders: one terraform root each), the storages, the groups and the
  instances, each drawn with its state:

  - a storage: the state meta-state records (``storage-state.yaml``: ``active``,
    ``archived``, ``destroyed``), or ``declared`` when no apply recorded it; a requested
    state other than the recorded one is shown after an arrow (``active -> archived``);
  - an instance: ``launched`` (``launch-params.yaml`` ``launched: true``), ``destroyed``
    (records left, not launched), or ``declared``;
  - any storage or instance with a HARD line of the last state query (kept in meta-state's
    ``drift.yaml``, else this checkout's ``generated/state-report.json``; docs/drift.md):
    ``drifted HARD (<drift>)``, in red;
  - records of storages and instances the tree no longer declares are drawn too, marked
    ``not declared``.
* **Edges**: containment (account -> environment -> runtime -> builder -> object), mounts
  (storage -> instance, labelled with the mount point) and the remote-state references
  between roots (the consumer root's builder -> the producer root's builder, dashed): read
  from the ``data "terraform_remote_state"`` blocks the planned roots really contain
  (:func:`..render.roots.plan_roots`, nothing written), so none when
  ``config.use_state_backends`` is false.

Nothing from the tree reaches the DOT text unquoted: node ids are generated (``n1``,
``n2``...), every label and attribute value is a double-quoted DOT string with ``"`` and
``\\`` escaped and control characters replaced (:func:`quote`).

:func:`build` and :func:`to_dot` are pure; :func:`render_files` writes ``generated/graph.dot``
and runs ``dot`` (with a timeout) for ``graph.svg`` and, when dot supports it, ``graph.png``.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..config import models as m
from ..config.loader import Tree
from ..errors import CsisError
from ..fsutil import write_atomic
from .plan import LIFECYCLES, RenderOptions

#: what ``render_files`` writes, under ``<config root>/generated/``
DOT_NAME, SVG_NAME, PNG_NAME = "graph.dot", "graph.svg", "graph.png"
#: seconds one ``dot`` run may take
DOT_TIMEOUT = 120

#: the fill colour of each state (a HARD drift overrides it)
STATE_COLORS = {
    "declared": "#ffffff",
    "active": "#d9f2d9",
    "launched": "#d9f2d9",
    "archived": "#dde8f7",
    "destroyed": "#e6e6e6",
}
HARD_COLOR = "#f9d0d0"
KIND_SHAPES = {"account": "folder", "environment": "tab", "runtime": "box3d", "builder": "component",
               "storage": "cylinder", "group": "note", "instance": "box"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class GraphError(CsisError):
    """The picture cannot be drawn (``dot`` missing, failing or too slow)."""


def quote(text: Any) -> str:
    """``text`` as one double-quoted DOT string that can only ever be a value: backslashes
    and double quotes escaped (so neither a quote nor graphviz's ``\\N``/``\\G`` escapes of
    a name can end the string or be interpreted), control characters replaced by ``?``."""
    s = _CONTROL.sub("?", str(text))
    return '"%s"' % s.replace("\\", "\\\\").replace('"', '\\"')


def label(*lines: Any) -> str:
    """A multi-line label: each line quoted as :func:`quote` does, joined by DOT's ``\\n``."""
    return '"%s"' % "\\n".join(quote(x)[1:-1] for x in lines)


@dataclass
class Node:
    id: str
    kind: str
    name: str
    state: str = "declared"
    details: List[str] = field(default_factory=list)
    hard: List[str] = field(default_factory=list)
    declared: bool = True


@dataclass
class Edge:
    src: str
    dst: str
    kind: str  # contains | mount | remote_state
    label: str = ""


@dataclass
class Graph:
    title: str
    nodes: Dict[Tuple[str, str], Node] = field(default_factory=dict)
    edges: List[Edge] = field(default_factory=list)
    #: lines added to the picture's title (why something is not drawn)
    notes: List[str] = field(default_factory=list)

    def add(self, kind: str, name: str, **kw: Any) -> Node:
        key = (_ns(kind), name)
        if key not in self.nodes:
            self.nodes[key] = Node("n%d" % (len(self.nodes) + 1), kind, name, **kw)
        return self.nodes[key]

    def get(self, kind: str, name: Optional[str]) -> Optional[Node]:
        return self.nodes.get((_ns(kind), name)) if name is not None else None

    def link(self, src: Optional[Node], dst: Optional[Node], kind: str = "contains", text: str = "") -> None:
        if src is not None and dst is not None:
            e = Edge(src.id, dst.id, kind, text)
            if e not in self.edges:
                self.edges.append(e)

    def as_dict(self) -> Dict[str, Any]:
        """The objects and edges by name (what the module returns)."""
        by_id = {n.id: n for n in self.nodes.values()}
        return {
            "nodes": [{"kind": n.kind, "name": n.name, "state": state_text(n), "declared": n.declared}
                      for n in self.nodes.values()],
            "edges": [{"kind": e.kind, "from": "%s %s" % (by_id[e.src].kind, by_id[e.src].name),
                       "to": "%s %s" % (by_id[e.dst].kind, by_id[e.dst].name), "label": e.label}
                      for e in self.edges],
        }


def _ns(kind: str) -> str:
    """Builders of every kind share one namespace (the tree's uniqueness rule)."""
    return "builder" if kind.endswith("builder") else kind


def state_text(node: Node) -> str:
    if node.hard:
        return "drifted HARD (%s)" % ", ".join(node.hard)
    return node.state


def _records(meta: Mapping[str, Any], fname: str) -> Dict[str, Any]:
    data = (meta.get(fname) or {}).get("storages" if fname.startswith("storage") else "instances") or {}
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def _hard(report: Optional[Mapping[str, Any]]) -> Dict[Tuple[str, str], List[str]]:
    out: Dict[Tuple[str, str], List[str]] = {}
    for d in (report or {}).get("drift") or []:
        if isinstance(d, dict) and d.get("hard") and d.get("kind") in ("storage", "instance"):
            out.setdefault((str(d["kind"]), str(d.get("name"))), []).append(str(d.get("drift") or "drift"))
    return out


def remote_state_refs(tree: Tree, meta: Mapping[str, Any]) -> List[Tuple[str, str, str]]:
    """``(consumer builder, consumer lifecycle, producer builder)`` for every
    ``data "terraform_remote_state"`` block of the roots a render would emit."""
    from .roots import plan_roots  # the planners import much; only this needs them

    plans = {lc: plan_roots(tree, meta, lc, RenderOptions()) for lc in LIFECYCLES}
    producers = {m.label(p.builder): p.builder for lc in ("identity", "storage") for p in plans[lc]}
    out: List[Tuple[str, str, str]] = []
    for lc in LIFECYCLES:
        for p in plans[lc]:
            for fname in sorted(p.files):
                for ref in re.findall(r'^data "terraform_remote_state" "([^"]+)"', p.files[fname], re.M):
                    if ref in producers and (p.builder, lc, producers[ref]) not in out:
                        out.append((p.builder, lc, producers[ref]))
    return out


def build(tree: Tree, meta: Mapping[str, Any], report: Optional[Mapping[str, Any]] = None,
          refs: Optional[List[Tuple[str, str, str]]] = None) -> Graph:
    """The graph of ``tree`` with the states of ``meta`` (the meta-state files by name) and
    the HARD lines of ``report`` (a state report). ``refs``: the remote-state references
    (default: :func:`remote_state_refs`)."""
    g = Graph(tree.config_file.id or os.path.basename(os.path.abspath(tree.root)))
    hard = _hard(report)
    # accounts and environments, parents first
    for node in tree.hierarchy.values():
        g.add(node.kind, node.name)
    for node in tree.hierarchy.values():
        if node.parent:
            parent = tree.hierarchy.get(node.parent)
            g.link(g.get(parent.kind, parent.name) if parent else None, g.get(node.kind, node.name))
    for rt in tree.runtimes.values():
        n = g.add("runtime", rt.name, details=["%s %s" % (rt.type, rt.region)])
        env = tree.hierarchy.get(rt.environment) if rt.environment else None
        g.link(g.get(env.kind, env.name) if env else None, n)
    # builders: one root each
    for kind, table in (("group builder", tree.group_builders), ("storage builder", tree.storage_builders),
                        ("instance builder", tree.instance_builders)):
        for b in table.values():
            n = g.add(kind, b.name, details=[b.type])
            rt = tree.builder_runtime(b)
            g.link(g.get("runtime", rt.name) if rt else None, n)
    for grp in tree.groups.values():
        n = g.add("group", grp.name, details=["gid %s" % grp.gid])
        gb = tree.group_builder_for(grp)
        g.link(g.get("group builder", gb.name) if gb else None, n)
    # storages: declared, then recorded only
    srecs = _records(meta, "storage-state.yaml")
    for st in tree.storages.values():
        sb = tree.storage_builder_for(st)
        rec = (srecs.get(st.name) or {}).get("state")
        state = rec or "declared"
        if rec and st.state != rec:
            state = "%s -> %s" % (rec, st.state)
        elif not rec and st.state != "active":
            state = "declared %s" % st.state
        n = g.add("storage", st.name, state=state, details=[tree.kind_of(sb)["capability"]] if sb else [])
        g.link(g.get("storage builder", sb.name) if sb else None, n)
    for name, rec in sorted(srecs.items()):
        if name not in tree.storages:
            builder = (rec.get("facts") or {}).get("builder")
            n = g.add("storage", name, state=str(rec.get("state") or "recorded"), declared=False)
            g.link(g.get("storage builder", builder), n)
    # instances: declared, then recorded only
    lps = _records(meta, "launch-params.yaml")
    iss = _records(meta, "instance-state.yaml")

    def instance_state(name: str) -> str:
        if (lps.get(name) or {}).get("launched") is True:
            return "launched"
        if name in lps or name in iss:
            return "destroyed"
        return "declared"

    for inst in tree.instances.values():
        ib = tree.instance_builder_for(inst)
        details = ["image %s" % inst.image] if inst.image else []
        n = g.add("instance", inst.name, state=instance_state(inst.name), details=details)
        g.link(g.get("instance builder", ib.name) if ib else None, n)
        for mp in inst.storages:
            g.link(g.get("storage", mp.name), n, "mount", "mount %s" % mp.mount_point)
    for name in sorted(set(lps) | set(iss)):
        if name in tree.instances:
            continue
        rec = lps.get(name) or {}
        n = g.add("instance", name, state=instance_state(name), declared=False)
        g.link(g.get("instance builder", rec.get("builder")), n)
        for mnt in rec.get("mounts") or []:
            if isinstance(mnt, dict):
                g.link(g.get("storage", mnt.get("storage")), n, "mount", "mount %s" % (mnt.get("mount_point") or "?"))
    for (kind, name), drifts in hard.items():
        n = g.get(kind, name)
        if n is None:
            n = g.add(kind, name, state="recorded", declared=False)
        n.hard = drifts
    for consumer, lifecycle, producer in (remote_state_refs(tree, meta) if refs is None else refs):
        g.link(g.get("builder", consumer), g.get("builder", producer), "remote_state", "remote state (%s)" % lifecycle)
    return g


def to_dot(g: Graph) -> str:
    """The DOT text of ``g`` (left to right; deterministic for one graph)."""
    out = ["digraph csis {",
           "  graph [rankdir=LR, fontname=\"Helvetica\", fontsize=12, labelloc=t, label=%s];"
           % label("csis.infra tree %s" % g.title, "solid: contains; bold blue: mount; dashed: remote state;"
                   " red: drifted HARD", *g.notes),
           "  node [fontname=\"Helvetica\", fontsize=10, style=\"filled\"];",
           "  edge [fontname=\"Helvetica\", fontsize=9];"]
    for n in g.nodes.values():
        state = state_text(n)
        lines: List[Any] = [n.kind, n.name] + list(n.details) + [state + ("" if n.declared else " (not declared)")]
        if n.kind in ("storage", "instance"):
            fill = HARD_COLOR if n.hard else STATE_COLORS.get(n.state.split(" ")[0], "#ffffff")
        else:
            fill = "#f5f5f5" if n.kind in ("account", "environment") else "#ffffff"
        attrs = ["label=%s" % label(*lines), "shape=%s" % quote(KIND_SHAPES.get(_shape_kind(n.kind), "box")),
                 "fillcolor=%s" % quote(fill)]
        if n.hard:
            attrs += ["color=%s" % quote("#c00000"), "penwidth=2"]
        if not n.declared:
            attrs.append("style=%s" % quote("filled,dashed"))
        out.append("  %s [%s];" % (n.id, ", ".join(attrs)))
    for e in g.edges:
        attrs = []
        if e.label:
            attrs.append("label=%s" % quote(e.label))
        if e.kind == "mount":
            attrs += ["color=%s" % quote("#1f5fbf"), "style=bold", "fontcolor=%s" % quote("#1f5fbf")]
        elif e.kind == "remote_state":
            attrs += ["style=dashed", "color=%s" % quote("#7a4fbf"), "fontcolor=%s" % quote("#7a4fbf"),
                      "constraint=false"]
        out.append("  %s -> %s%s;" % (e.src, e.dst, " [%s]" % ", ".join(attrs) if attrs else ""))
    out.append("}")
    return "\n".join(out) + "\n"


def _shape_kind(kind: str) -> str:
    return "builder" if kind.endswith("builder") else kind


def find_dot(binary: str = "dot") -> str:
    """The path of graphviz's ``dot``, or :class:`GraphError` naming it."""
    path = shutil.which(binary)
    if not path:
        raise GraphError("graphviz's '%s' is not installed (not on PATH): the picture needs it for its layout. "
                         "Install graphviz (scripts/bootstrap does: apt-get install graphviz), or pass the path "
                         "of dot" % binary)
    return path


def _run_dot(dot: str, fmt: str, text: str, timeout: float) -> bytes:
    try:
        proc = subprocess.run([dot, "-T%s" % fmt], input=text.encode("utf-8"), capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise GraphError("%s -T%s did not finish within %d s" % (dot, fmt, timeout)) from exc
    except OSError as exc:
        raise GraphError("cannot run %s: %s" % (dot, exc.strerror or exc)) from exc
    if proc.returncode != 0 or not proc.stdout:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise GraphError("%s -T%s failed (exit %d): %s" % (dot, fmt, proc.returncode, err))
    return proc.stdout


def dot_formats(dot: str, timeout: float = DOT_TIMEOUT) -> List[str]:
    """The output formats ``dot`` knows (``dot -T?`` lists them on stderr)."""
    try:
        proc = subprocess.run([dot, "-T?"], capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    text = proc.stderr.decode("utf-8", "replace")
    return text.split("Use one of:", 1)[1].split() if "Use one of:" in text else []


def graph_paths(config_root: str) -> Dict[str, str]:
    base = os.path.join(os.path.abspath(config_root), "generated")
    return {"dot": os.path.join(base, DOT_NAME), "svg": os.path.join(base, SVG_NAME),
            "png": os.path.join(base, PNG_NAME)}


def render_files(config_root: str, text: str, dot: str = "dot", timeout: float = DOT_TIMEOUT,
                 write: bool = True) -> Dict[str, Any]:
    """Lay out ``text`` with ``dot``: SVG always, PNG when dot supports it. With ``write``,
    replace ``generated/graph.dot``, ``graph.svg`` (and ``graph.png``) atomically.
    Returns ``{paths, formats, changed}`` (the paths written, or that would be)."""
    path = find_dot(dot)
    formats = ["svg"] + (["png"] if "png" in dot_formats(path, timeout) else [])
    outputs = {"dot": text.encode("utf-8")}
    for fmt in formats:
        outputs[fmt] = _run_dot(path, fmt, text, timeout)
    paths = graph_paths(config_root)
    changed = False
    for fmt, payload in outputs.items():
        try:
            with open(paths[fmt], "rb") as fh:
                same = fh.read() == payload
        except OSError:
            same = False
        changed = changed or not same
        if write and not same:
            os.makedirs(os.path.dirname(paths[fmt]), exist_ok=True)
            write_atomic(paths[fmt], payload, mode=0o644)
    return {"paths": {fmt: paths[fmt] for fmt in outputs}, "formats": ["dot"] + formats, "changed": changed,
            "dot": path}


def _no_version_check(binary: str) -> Tuple[Optional[str], Optional[str]]:
    """The picture runs no terraform: the executables' versions are not checked."""
    return None, None


def picture(config_root: str, overlays: Any = (), dot: str = "dot", timeout: float = DOT_TIMEOUT,
            write: bool = True) -> Dict[str, Any]:
    """The whole job of ``csis_graph``: load the tree and its meta-state, run the validation
    rules (the executables' versions are not checked), read the last state report, build the
    DOT text and lay it out (:func:`render_files`; ``write=False``: nothing is written).

    A tree that loads but breaks a rule (say, a launched instance whose declaration changed)
    is still drawn, with its states: the picture is most wanted then. Its problems are
    returned and named in the picture's title, and the remote-state references (which need
    the roots a valid tree renders) are left out. A tree or meta-state that does not load
    raises :class:`~..errors.ConfigError`. Returns ``{paths, formats, changed, dot, graph,
    hard, problems, dot_text}``."""
    from ..config.loader import load_tree
    from ..config.validate import read_meta, validate_tree
    from ..errors import ConfigError
    from ..state.drift import damaged_record
    from ..state.preflight import hard_drift
    from ..state.store import MetaStateError

    tree = load_tree(config_root, overlays=overlays)
    meta, meta_problems = read_meta(tree.root)
    if meta_problems:
        raise ConfigError(meta_problems)
    problems = [str(p) for p in validate_tree(tree, meta, run_version=_no_version_check)]
    try:  # the lines a real run's preflight refuses on, read as it reads them
        report = {"drift": hard_drift(tree.root)["hard_drift"]}
    except MetaStateError as exc:
        raise ConfigError([str(damaged_record(exc))]) from exc
    g = build(tree, meta, report, refs=[] if problems else None)
    if problems:
        g.notes.append("the tree does not validate (%d problem(s), see playbooks/validate.yml): "
                       "remote-state references not drawn" % len(problems))
    text = to_dot(g)
    out = render_files(tree.root, text, dot=dot, timeout=timeout, write=write)
    out["graph"] = g.as_dict()
    out["hard"] = ["%s %s: %s" % (n.kind, n.name, state_text(n)) for n in g.nodes.values() if n.hard]
    out["problems"] = problems
    out["dot_text"] = text
    return out
