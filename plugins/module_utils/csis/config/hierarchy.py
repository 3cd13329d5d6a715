# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The hierarchy of ``cfg/hierarchy.yml``: accounts, and environments (regions) under them,
above the runtimes (a runtime names its environment: ``environment: <name>``).

Each node carries **dependency tags** and **dependency configs**; they flow farthest ->
nearest -> own (the account, its environments, then the runtime itself) and the nearest wins:

* tags: a runtime's effective tags are its chain's ``dependency_tags``, then its own ``tags``.
  They are the provider's ``default_tags`` of every root of the runtime and the first layer of
  every storage's and instance's module-call ``tags`` (under the builder's, the storage's or
  instance's own, and ``csis_config``).
* configs: each key of :data:`..models.DEPENDENCY_CONFIG_KEYS` that a runtime leaves out is
  seeded from its chain before the runtime is parsed (:func:`seed_runtimes`, run by the loader),
  so every reader of the tree sees one runtime with one value.

``config.required_tags`` (cfg/_config.yml only: :data:`POLICY_KEYS`) names tag keys every
storage and instance must carry (:func:`required_tag_problems`); the gate checks the plan again.
Nothing here reads a file: the loader hands in what it read.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import Problem
from . import models as m

HIERARCHY_REL = "cfg/hierarchy.yml"
#: the kind of a node in the tree's ``where`` table and its broken names
KIND = "hierarchy node"
#: ``config:`` keys an overlay may not change (a policy holds for every run)
POLICY_KEYS = ("required_tags",)

#: a value's source: (``node``, name), (``runtime``, file), (``overlay``, file), (``default``, "")
Source = Tuple[str, str]


def _names(xs: Any) -> str:
    return "[" + ", ".join("'%s'" % x for x in sorted(xs)) + "]"


def chain(nodes: Mapping[str, m.HierarchyNode], name: Optional[str]) -> List[m.HierarchyNode]:
    """The nodes from the farthest to ``name`` (its account first). A dangling parent or a cycle
    ends the walk (both are reported by :func:`hierarchy_problems`)."""
    out: List[m.HierarchyNode] = []
    seen = set()
    cur = nodes.get(name) if name else None
    while cur is not None and cur.name not in seen:
        seen.add(cur.name)
        out.append(cur)
        cur = nodes.get(cur.parent) if cur.parent else None
    return list(reversed(out))


def _normal(v: Any) -> Optional[str]:
    return m.normalize_builder_name(v) if isinstance(v, str) else None


def complete(tree: Any, environment: Optional[str]) -> bool:
    """Whether a runtime of ``environment`` (None: of no environment) has its whole chain: the
    environment is a declared environment node whose parents end at an account (no dangling,
    broken or circular parent on the way). An incomplete chain is reported at its node; what
    depends on the chain (the seeded configs, the required tags) is then unknown, not refused."""
    if environment is None:
        return True
    nodes = chain(tree.hierarchy, environment)
    return (bool(nodes) and nodes[-1].name == environment and nodes[-1].kind == "environment"
            and nodes[0].kind == "account")


def seed_runtimes(tree: Any, entries: List[Any], patched: Mapping[int, Sequence[Tuple[str, int, Mapping[str, Any]]]],
                  rel: str) -> Tuple[List[Problem], Dict[int, str]]:
    """Fill in, on the raw runtime ``entries`` of file ``rel`` (overlays already merged: ``patched``
    maps an entry's index to the overlay patches merged onto it), every dependency-config key a
    runtime leaves out (or sets to null) from the nearest node of its environment's chain that sets
    it; record in ``tree.runtime_sources`` where each such key and each own tag came from.

    Returns the problems of the ``environment`` references (a name no node has, an account) and
    ``{index: environment}`` of the entries whose chain is incomplete (:func:`complete`): a key
    their environment would have seeded is unknown, not missing (:func:`unseeded_problem`)."""
    problems: List[Problem] = []
    unseeded: Dict[int, str] = {}
    nodes_by_name: Dict[str, m.HierarchyNode] = tree.hierarchy
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or _normal(entry.get("name")) is None:
            continue
        name = _normal(entry["name"])
        patches = list(patched.get(i, ()))
        env = _normal(entry.get("environment"))
        if env is not None and not m.NAME_RE.match(env):
            env = None  # not a name: the model refuses it
        if env is not None:
            node = nodes_by_name.get(env)
            by = [(shown, j) for shown, j, p in patches if isinstance(p, Mapping) and "environment" in p]
            shown_name = entry["name"]  # as written, like every key path of the loader
            file, key = (by[-1][0], "runtime_builders[%d] (%s).environment" % (by[-1][1], shown_name)) if by else \
                (rel, "runtime_builders[%d] (%s).environment" % (i, shown_name))
            if node is None and tree.dangling(KIND, env):
                problems.append(Problem(file, key, "names environment '%s', which is not declared in %s (environments: %s)"
                                        % (env, HIERARCHY_REL, _names(n.name for n in nodes_by_name.values()
                                                                      if n.kind == "environment"))))
            elif node is not None and node.kind != "environment":
                problems.append(Problem(file, key, "names %s '%s'; a runtime belongs to an environment (a node of kind "
                                                   "environment under that account)" % (node.kind, env)))
            if not complete(tree, env):
                unseeded[i] = env
        nodes = chain(nodes_by_name, env)
        configs: Dict[str, Source] = {}
        for key in m.DEPENDENCY_CONFIG_KEYS:
            by_key = [shown for shown, _j, p in patches if isinstance(p, Mapping) and p.get(key) is not None]
            if entry.get(key) is not None:
                configs[key] = ("overlay", by_key[-1]) if by_key else ("runtime", rel)
                continue
            for node in reversed(nodes):
                value = getattr(node.dependency_configs, key)
                if value is not None:
                    entry[key] = value
                    configs[key] = ("node", node.name)
                    break
            else:
                configs[key] = ("default", "")
        tags: Dict[str, Source] = {}
        own = entry.get("tags")
        if isinstance(own, dict):
            for k in own:
                by_tag = [shown for shown, _j, p in patches
                          if isinstance(p, Mapping) and isinstance(p.get("tags"), Mapping) and k in p["tags"]]
                tags[str(k)] = ("overlay", by_tag[-1]) if by_tag else ("runtime", rel)
        tree.runtime_sources[name] = {"configs": configs, "tags": tags}
    return problems, unseeded


_SEEDED_KEY = re.compile(r"^runtime_builders\[(\d+)\].*\.(%s)\Z" % "|".join(m.DEPENDENCY_CONFIG_KEYS))


def unseeded_problem(problem: Problem, unseeded: Mapping[int, str]) -> bool:
    """Whether ``problem`` is a dependency-config key reported missing on a runtime whose
    environment chain is incomplete (that chain's own problem says why; the runtime does not
    load, so nothing that names it is reported either)."""
    found = _SEEDED_KEY.match(problem.key or "")
    return bool(found) and int(found.group(1)) in unseeded and problem.message == "required key is missing"


def runtime_tags(tree: Any, rt: m.RuntimeBuilder) -> Dict[str, str]:
    """The runtime's effective tags: its environment chain's dependency tags, farthest first,
    then its own ``tags`` (the nearest wins)."""
    out: Dict[str, str] = {}
    for node in chain(tree.hierarchy, rt.environment):
        out.update(node.dependency_tags)
    out.update(rt.tags)
    return out


def module_tags(tree: Any, rt: m.RuntimeBuilder, *layers: Mapping[str, str]) -> Dict[str, str]:
    """The ``tags`` of a module call on runtime ``rt``: its effective tags, then ``layers`` (the
    builder's, the storage's or instance's own), then ``csis_config``. The renderer emits these;
    validation checks them (with the module's own ``Name``) against ``config.required_tags``."""
    out = runtime_tags(tree, rt)
    for layer in layers:
        out.update(layer)
    out.update(tree.resource_tag())
    return out


def _source(tree: Any, src: Source) -> Dict[str, Optional[str]]:
    kind, where = src
    if kind == "node":
        node = tree.hierarchy.get(where)
        return {"from": "%s '%s'" % (node.kind if node else "node", where),
                "file": tree.where.get((KIND, where), (HIERARCHY_REL, ""))[0]}
    if kind == "runtime":
        return {"from": "runtime", "file": where}
    if kind == "overlay":
        return {"from": "overlay", "file": where}
    return {"from": "default", "file": None}


def _entry(tree: Any, layers: List[Tuple[Any, Source]]) -> Dict[str, Any]:
    """The nearest of ``layers`` (farthest first) with where it came from, and what it overrode."""
    value, src = layers[-1]
    out: Dict[str, Any] = dict(_source(tree, src), value=value)
    if len(layers) > 1:
        out["overrides"] = [dict(_source(tree, s), value=v) for v, s in reversed(layers[:-1])]
    return out


def effective(tree: Any, rt: m.RuntimeBuilder) -> Dict[str, Any]:
    """What validation shows of runtime ``rt``: its environment, its chain (farthest first), and
    each effective tag and dependency config: ``{"value", "from", "file"}`` (``from``: ``account 'x'``,
    ``environment 'y'``, ``runtime``, ``overlay`` or ``default``) and, when nearer layers won over
    farther ones, ``overrides`` (what they replaced, nearest first)."""
    nodes = chain(tree.hierarchy, rt.environment)
    own = tree.runtime_sources.get(rt.name) or {}
    tag_layers: Dict[str, List[Tuple[Any, Source]]] = {}
    for node in nodes:
        for k, v in node.dependency_tags.items():
            tag_layers.setdefault(k, []).append((v, ("node", node.name)))
    for k, v in rt.tags.items():
        tag_layers.setdefault(k, []).append((v, (own.get("tags") or {}).get(k, ("runtime", "?"))))
    configs: Dict[str, Dict[str, Any]] = {}
    for key in m.DEPENDENCY_CONFIG_KEYS:
        src = (own.get("configs") or {}).get(key, ("default", ""))
        layers = [(getattr(n.dependency_configs, key), ("node", n.name)) for n in nodes
                  if getattr(n.dependency_configs, key) is not None]
        if src[0] in ("runtime", "overlay"):  # the runtime's own value is nearer than every node
            layers.append((getattr(rt, key), src))
        elif src[0] != "node":  # no node sets it, nor the runtime: the model's default
            layers = [(getattr(rt, key), src)]
        configs[key] = _entry(tree, layers)
    return {"environment": rt.environment, "chain": [n.name for n in nodes],
            "tags": {k: _entry(tree, tag_layers[k]) for k in sorted(tag_layers)}, "configs": configs}


def _said(e: Mapping[str, Any]) -> str:
    return "%s from %s%s" % (m.show(str(e["value"])), e["from"], " (%s)" % e["file"] if e["file"] else "")


def effective_lines(tree: Any) -> List[str]:
    """What validation prints of every runtime that belongs to an environment: its chain, then one
    line per effective tag and dependency config with its source (and what it overrode)."""
    lines = []
    for name, rt in sorted(tree.runtimes.items()):
        if rt.environment is None:
            continue
        eff = effective(tree, rt)
        lines.append("runtime '%s': environment '%s' (%s)" % (name, rt.environment, " -> ".join(eff["chain"] + [name])))
        for what, table in (("tag", eff["tags"]), ("config", eff["configs"])):
            for k, e in table.items():
                if e["value"] is None:
                    continue
                over = "; over %s" % ", ".join(_said(o) for o in e["overrides"]) if e.get("overrides") else ""
                lines.append("runtime '%s': %s %s = %s%s" % (name, what, k, _said(e), over))
    return lines


# --------------------------------------------------------------------------- rules
def hierarchy_problems(tree: Any) -> List[Problem]:
    """A dangling or circular parent, each at its node's file and key (the loader reports them:
    the runtimes' seeded configs depend on whole chains)."""
    out: List[Problem] = []
    nodes: Dict[str, m.HierarchyNode] = tree.hierarchy

    def add(name: str, message: str) -> None:
        f, k = tree.at(KIND, name, "parent")
        out.append(Problem(f, k, message))

    for node in nodes.values():
        if node.parent is None:
            continue
        parent = nodes.get(node.parent)
        if parent is None:
            if tree.dangling(KIND, node.parent):
                add(node.name, "%s '%s' names parent '%s', which is not a node of %s (declared: %s)"
                    % (node.kind, node.name, node.parent, HIERARCHY_REL, _names(nodes)))
            continue
        # an environment under an environment: walk up; a cycle never reaches an account
        path = [node.name]
        cur: Optional[m.HierarchyNode] = parent
        while cur is not None and cur.name not in path:
            path.append(cur.name)
            cur = nodes.get(cur.parent) if cur.parent else None
        if cur is not None and cur.name == node.name:
            add(node.name, "%s '%s' is its own ancestor (its parents go round: %s); an environment's parents must "
                           "end at an account" % (node.kind, node.name, " -> ".join(path + [node.name])))
    return out


def _missing(tags: Mapping[str, str], required: Sequence[str]) -> List[str]:
    """The required keys ``tags`` lacks; a key whose value is empty (a leaf blanking an inherited
    cost tag) lacks it too, and is named ``<key> (empty)``."""
    return [k if k not in tags else "%s (empty)" % k for k in required if not str(tags.get(k) or "").strip()]


def required_tag_problems(tree: Any) -> List[Problem]:
    """``config.required_tags``: every active storage and every instance carries each key in its
    effective tags (what its module call emits, over the provider's default tags), and so does the
    security group of each instance root (the runtime's effective tags only)."""
    required = list(tree.config.required_tags)
    if not required:
        return []
    where = tree.config_source.get("required_tags", "cfg/_config.yml")
    out: List[Problem] = []

    def add(kind: str, name: str, what: str, lacking: List[str], fix: str) -> None:
        f, k = tree.at(kind, name, "tags")
        out.append(Problem(f, k, "%s lacks the required tag%s %s (config.required_tags in %s): %s"
                           % (what, "" if len(lacking) == 1 else "s", ", ".join(lacking), where,
                              fix % ("it" if len(lacking) == 1 else "them"))))

    for st in tree.storages.values():
        sb = tree.storage_builder_for(st)
        rt = tree.builder_runtime(sb) if sb is not None else None
        if rt is None or not complete(tree, rt.environment) or st.state != "active" or sb.type == "tf-aws":
            continue
        lacking = _missing(module_tags(tree, rt, sb.variables.tags, st.tags, {"Name": st.name}), required)
        if lacking:
            add("storage", st.name, "storage '%s'" % st.name, lacking,
                "set %%s in the storage's tags, its builder's variables.tags, its runtime's tags or a node of its "
                "runtime's environment (%s)" % HIERARCHY_REL)
    rooted = set()
    for inst in tree.instances.values():
        ib = tree.instance_builder_for(inst)
        rt = tree.builder_runtime(ib) if ib is not None else None
        if rt is None or not complete(tree, rt.environment):
            continue
        if rt.networking.network:
            rooted.add((ib.name, rt.name))
        lacking = _missing(module_tags(tree, rt, inst.tags, {"Name": inst.name}), required)
        if lacking:
            add("instance", inst.name, "instance '%s'" % inst.name, lacking,
                "set %%s in the instance's tags, its runtime's tags or a node of its runtime's environment (%s)"
                % HIERARCHY_REL)
    for ib_name, rt_name in sorted(rooted):
        lacking = _missing(module_tags(tree, tree.runtimes[rt_name], {"Name": "csis-instances"}), required)
        if lacking:
            add("runtime", rt_name, "the security group aws_security_group.csis_instances of instance builder '%s'"
                % ib_name, lacking, "it carries only its runtime's tags; set %%s in runtime '%s''s tags or a node of "
                                    "its environment (%s)" % (rt_name, HIERARCHY_REL))
    return out
