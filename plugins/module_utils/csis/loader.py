# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Load a configuration tree into typed models, collecting every problem at once.

Nothing here touches the network or writes a file. A problem always names the file
(relative to the configuration root) and the key path inside it.
"""
from __future__ import annotations

import copy
import glob
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Type

import yaml
from pydantic import BaseModel, ValidationError

from . import models as m


@dataclass(frozen=True)
class Problem:
    file: str
    key: str
    message: str

    def __str__(self) -> str:
        if not self.file:
            return self.message
        where = self.file + (": " + self.key if self.key else "")
        return "%s: %s" % (where, self.message)


class ConfigError(Exception):
    """Raised with every problem found; ``str()`` lists them one per line."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (silently dropped otherwise)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: Dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                "found duplicate key %r" % (key,), key_node.start_mark)
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str, rel: str, problems: List[Problem], top_key: Optional[str]) -> Optional[Dict[str, Any]]:
    """Read one YAML file that must hold a mapping; record a problem and return None on failure."""
    try:
        with open(path, "r", encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        problems.append(Problem(rel, "", "cannot read file: %s" % exc.strerror))
        return None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = " (line %d, column %d)" % (mark.line + 1, mark.column + 1) if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        problems.append(Problem(rel, "", "YAML syntax error%s: %s" % (pos, problem)))
        return None
    if data is None:
        want = " (expected a mapping with key '%s:')" % top_key if top_key else ""
        problems.append(Problem(rel, "", "file is empty%s" % want))
        return None
    if not isinstance(data, dict):
        problems.append(Problem(rel, "", "top level must be a mapping, found %s" % type(data).__name__))
        return None
    return data


def _loc_to_key(loc: Tuple[Any, ...], data: Any) -> str:
    parts: List[str] = []
    cur = data
    for item in loc:
        if isinstance(item, int):
            label = "[%d]" % item
            if isinstance(cur, list) and 0 <= item < len(cur):
                cur = cur[item]
                if isinstance(cur, dict) and isinstance(cur.get("name"), str):
                    label += " (%s)" % cur["name"]
            else:
                cur = None
            parts.append(label)
        else:
            key = str(item)
            if key.startswith("function-") or key in ("tagged-union",):
                continue
            parts.append(("." if parts else "") + key)
            cur = cur.get(item) if isinstance(cur, dict) else None
    return "".join(parts)


def _pydantic_problems(rel: str, exc: ValidationError, data: Any) -> List[Problem]:
    out: List[Problem] = []
    for err in exc.errors(include_url=False):
        loc = tuple(x for x in err.get("loc", ()) if not (isinstance(x, str) and x in m.STORAGE_KINDS))
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if err.get("type") == "extra_forbidden":
            msg = "unknown key (not a field of this entry; check the spelling)"
        elif err.get("type") == "missing":
            msg = "required key is missing"
        elif err.get("type") == "literal_error":
            msg = "%r is not allowed: %s" % (err.get("input"), msg.replace("Input should be", "expected"))
        out.append(Problem(rel, _loc_to_key(loc, data), msg))
    return out


def parse_model(model: Type[BaseModel], data: Dict[str, Any], rel: str, problems: List[Problem],
                broken: Optional[set] = None) -> Optional[Any]:
    """Validate ``data`` as ``model``; entries that fail are reported and dropped, the rest kept.

    List files are validated entry by entry so that one bad entry does not hide the
    problems (or the cross-references) of the others.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems.extend(_pydantic_problems(rel, exc, data))
    # Salvage: keep the valid entries of list-of-entries files for cross-file checks.
    fields = list(model.model_fields)
    if len(fields) == 1 and isinstance(data.get(fields[0]), list):
        good = []
        for item in data[fields[0]]:
            try:
                model.model_validate({fields[0]: [item]})
                good.append(item)
            except ValidationError:
                if broken is not None and isinstance(item, dict) and isinstance(item.get("name"), str):
                    broken.add(m.normalize_builder_name(item["name"]))
                continue
        try:
            return model.model_validate({fields[0]: good})
        except ValidationError:
            return None
    return None


# --------------------------------------------------------------------------- tree
@dataclass
class Tree:
    """The loaded configuration: every entry by name, with where it was declared."""

    root: str
    config_file: m.ConfigFile
    executables: Dict[str, m.Executable] = field(default_factory=dict)
    runtimes: Dict[str, m.RuntimeBuilder] = field(default_factory=dict)
    backends: Dict[str, m.StateBackend] = field(default_factory=dict)
    instance_builders: Dict[str, m.InstanceBuilder] = field(default_factory=dict)
    storage_builders: Dict[str, Any] = field(default_factory=dict)
    group_builders: Dict[str, m.GroupBuilder] = field(default_factory=dict)
    groups: Dict[str, m.Group] = field(default_factory=dict)
    images: Dict[str, m.Image] = field(default_factory=dict)
    storages: Dict[str, m.Storage] = field(default_factory=dict)
    instances: Dict[str, m.Instance] = field(default_factory=dict)
    #: (kind, name) -> (file, key) for messages
    where: Dict[Tuple[str, str], Tuple[str, str]] = field(default_factory=dict)
    overlays: List[str] = field(default_factory=list)
    undeclared: List[str] = field(default_factory=list)
    #: names of entries that failed to load (references to them are not re-reported)
    broken: set = field(default_factory=set)

    @property
    def config(self) -> m.ConfigFlags:
        return self.config_file.config

    def at(self, kind: str, name: str, key: str = "") -> Tuple[str, str]:
        f, k = self.where.get((kind, name), ("?", name))
        return f, (k + ("." + key if key else ""))

    # -- resolution ------------------------------------------------------------
    @staticmethod
    def _resolve(ref: str, table: Dict[str, Any]) -> Optional[Any]:
        if ref == "default":
            defaults = [b for b in table.values() if getattr(b, "is_default", False)]
            if len(defaults) == 1:
                return defaults[0]
            if not defaults and len(table) == 1:
                return next(iter(table.values()))
            return None
        if ref in table:
            return table[ref]
        for b in table.values():
            if ref in (getattr(b, "aliases", None) or []):
                return b
        return None

    def runtime(self, ref: str) -> Optional[m.RuntimeBuilder]:
        return self._resolve(ref, self.runtimes)

    def instance_builder_for(self, inst: m.Instance) -> Optional[m.InstanceBuilder]:
        return self._resolve(inst.type, self.instance_builders)

    def storage_builder_for(self, st: m.Storage) -> Optional[Any]:
        return self._resolve(st.type, self.storage_builders)

    def storage_builder(self, name: str) -> Optional[Any]:
        return self._resolve(name, self.storage_builders)

    def group_builder_for(self, group: m.Group) -> Optional[m.GroupBuilder]:
        return self._resolve(group.type, self.group_builders)

    def builder_runtime(self, builder: Any) -> Optional[m.RuntimeBuilder]:
        return self.runtime(builder.runtime)

    def backend_for(self, builder: Any) -> Optional[m.StateBackend]:
        """builder's state_configuration -> its runtime's -> the is_default backend."""
        ref = getattr(builder, "state_configuration", "default") or "default"
        if ref != "default":
            return self.backends.get(ref)
        rt = self.builder_runtime(builder)
        if rt is not None and rt.state_configuration:
            return self.backends.get(rt.state_configuration)
        return self._resolve("default", self.backends) if self.backends else None

    def image_of(self, inst: m.Instance) -> Optional[m.Image]:
        return self.images.get(inst.image) if inst.image else None

    def owning_group(self, inst: m.Instance) -> Optional[str]:
        img = self.image_of(inst)
        return img.group if img else None

    def kind_of(self, builder: Any) -> Dict[str, Any]:
        return m.STORAGE_KINDS.get(getattr(builder, "type", ""), m.STORAGE_KINDS["tf-aws"])

    def resource_tag(self) -> Dict[str, str]:
        """The tag every resource of this tree carries (``csis_config``)."""
        import re
        ident = self.config_file.id or os.path.basename(os.path.abspath(self.root))
        return {"csis_config": re.sub(r"[^a-z0-9_-]", "-", ident.lower())}


# (file glob, top key, file model, table attribute, kind, required?)
_CFG_FILES: List[Tuple[str, str, Type[BaseModel], str, str, bool]] = [
    ("cfg/executables.yml", "executables", m.ExecutablesFile, "executables", "executable", True),
    ("cfg/runtime-builders.yml", "runtime_builders", m.RuntimeBuildersFile, "runtimes", "runtime", True),
    ("cfg/state-backends*.yml", "state_backends", m.StateBackendsFile, "backends", "backend", False),
    ("cfg/instance-builders.yml", "instance_builders", m.InstanceBuildersFile, "instance_builders", "instance builder", False),
    ("cfg/storage-builders.yml", "storage_builders", m.StorageBuildersFile, "storage_builders", "storage builder", False),
    ("cfg/group-builders.yml", "group_builders", m.GroupBuildersFile, "group_builders", "group builder", False),
    ("groups/*.y*ml", "groups", m.GroupsFile, "groups", "group", False),
    ("images/*.y*ml", "images", m.ImagesFile, "images", "image", False),
    ("storages/*.y*ml", "storages", m.StoragesFile, "storages", "storage", False),
    ("instances/*.y*ml", "instances", m.InstancesFile, "instances", "instance", False),
]

#: kinds that share one namespace for the name-uniqueness check
_BUILDER_KINDS = ("instance builder", "storage builder", "group builder")


def _deep_merge(base: Dict[str, Any], patch: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _files(root: str, pattern: str) -> List[str]:
    return sorted(glob.glob(os.path.join(root, pattern)))


def load_tree(root: str, overlays: Iterable[str] = (), undeclare: Iterable[str] = ()) -> Tree:
    """Load and type-check the tree at ``root``. Raises :class:`ConfigError` with every problem."""
    tree, problems = load_tree_partial(root, overlays, undeclare)
    return tree, problems


def load_tree_partial(root: str, overlays: Iterable[str] = (),
                      undeclare: Iterable[str] = ()) -> Tuple[Tree, List[Problem]]:
    """Load what loads; return the tree of valid entries and every problem found."""
    problems: List[Problem] = []
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        return Tree(root=root, config_file=m.ConfigFile()), [
            Problem(root, "", "configuration root does not exist or is not a directory")]
    cfg_rel = "cfg/_config.yml"
    cfg_path = os.path.join(root, cfg_rel)
    raw_cfg: Optional[Dict[str, Any]] = None
    if not os.path.exists(cfg_path):
        problems.append(Problem(cfg_rel, "", "file is missing (every configuration tree needs cfg/_config.yml with a 'config:' mapping)"))
    else:
        raw_cfg = read_yaml(cfg_path, cfg_rel, problems, "config")

    # Overlays: read them all first (their problems are reported with the rest).
    overlay_data: List[Tuple[str, m.OverlayFile]] = []
    for ov in overlays:
        ov_abs = ov if os.path.isabs(ov) else os.path.join(root, ov)
        shown = ov
        if not os.path.exists(ov_abs):
            problems.append(Problem(shown, "", "overlay file does not exist"))
            continue
        data = read_yaml(ov_abs, shown, problems, "config")
        if data is None:
            continue
        parsed = parse_model(m.OverlayFile, data, shown, problems)
        if parsed is not None:
            overlay_data.append((shown, parsed))

    if raw_cfg is not None:
        raw_cfg = copy.deepcopy(raw_cfg)
        for shown, ov in overlay_data:
            if ov.config:
                if not isinstance(raw_cfg.get("config"), dict):
                    raw_cfg["config"] = {}
                raw_cfg["config"].update(copy.deepcopy(ov.config))
    config_file = parse_model(m.ConfigFile, raw_cfg, cfg_rel, problems) if raw_cfg is not None else None

    tree = Tree(root=root, config_file=config_file or m.ConfigFile(),
                overlays=[s for s, _ in overlay_data], undeclared=list(undeclare))
    seen_names: Dict[Tuple[str, str], str] = {}
    patch_targets = {"runtime_builders": {}, "state_backends": {}}  # name -> applied?
    for _shown, ov in overlay_data:
        for key in patch_targets:
            for entry in getattr(ov, key):
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    problems.append(Problem(_shown, key, "every entry needs a 'name' naming the entry it patches"))
                    continue
                patch_targets[key].setdefault(m.normalize_builder_name(entry["name"]), []).append((_shown, entry))

    for pattern, top, model, attr, kind, required in _CFG_FILES:
        paths = _files(root, pattern)
        if not paths and required:
            problems.append(Problem(pattern, "", "file is missing (it declares the %ss)" % kind))
        for path in paths:
            rel = os.path.relpath(path, root)
            data = read_yaml(path, rel, problems, top)
            if data is None:
                continue
            if top in patch_targets and isinstance(data.get(top), list):
                data = copy.deepcopy(data)
                for i, entry in enumerate(data[top]):
                    if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                        for _shown, patch in patch_targets[top].pop(m.normalize_builder_name(entry["name"]), []):
                            data[top][i] = _deep_merge(data[top][i], patch)
            parsed = parse_model(model, data, rel, problems, tree.broken)
            if parsed is None:
                if isinstance(data.get(top), list):
                    tree.broken.update(m.normalize_builder_name(e.get("name")) for e in data[top]
                                       if isinstance(e, dict) and isinstance(e.get("name"), str))
                continue
            entries = getattr(parsed, top)
            raw_entries = data.get(top) or []
            for idx, entry in enumerate(entries):
                # find the raw index for the key path (salvaged lists may be shorter)
                ridx = next((i for i, r in enumerate(raw_entries)
                             if isinstance(r, dict) and m.normalize_builder_name(r.get("name")) == entry.name), idx)
                key = "%s[%d] (%s)" % (top, ridx, entry.name)
                ns = "builder" if kind in _BUILDER_KINDS else kind
                prev = seen_names.get((ns, entry.name))
                if prev is not None:
                    problems.append(Problem(rel, key, "duplicate %s name '%s' (also declared in %s)" % (kind, entry.name, prev)))
                    continue
                seen_names[(ns, entry.name)] = rel
                getattr(tree, attr)[entry.name] = entry
                tree.where[(kind, entry.name)] = (rel, key)
    for key, left in patch_targets.items():
        for name, patches in left.items():
            for shown, _ in patches:
                problems.append(Problem(shown, key, "overlay patches %s '%s', which is not declared" % (key[:-1].replace("_", " "), name)))

    # Undeclare for one run (a decommission): CLI list plus `undeclare: true` entries.
    for name in list(undeclare):
        if name not in tree.instances:
            problems.append(Problem("undeclare", name, "instance '%s' is not declared, so it cannot be undeclared" % name))
    for name, inst in list(tree.instances.items()):
        if inst.undeclare or name in undeclare:
            del tree.instances[name]
            if name not in tree.undeclared:
                tree.undeclared.append(name)

    return tree, problems
