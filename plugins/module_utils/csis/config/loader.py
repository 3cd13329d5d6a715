# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Load a configuration tree into typed models, collecting every problem at once.

Nothing here touches the network or writes a file. A problem always names the file
(relative to the configuration root) and the key path inside it.
"""
from __future__ import annotations

import copy
import datetime
import difflib
import fnmatch
import glob
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Type, Union, get_args, get_origin

from ..errors import ConfigError, Problem
from ..yamlio import VALUE_ERRORS, VAULT_TAG, Vaulted, config_loaders, shape_problem, yaml
from . import parsecache
from . import hierarchy as h
from . import models as m
from . import secrets
from .models import BaseModel, ValidationError


def _name_of(node: Any) -> Optional[str]:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == "name" and isinstance(v, yaml.ScalarNode):
                return v.value
    return None


def _key_path_at(text: str, index: int) -> str:
    """The key path (``groups[1] (stofs).gid``) of the mapping key that starts at ``index``."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return ""

    def walk(node: Any, path: str) -> Optional[str]:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                kname = k.value if isinstance(k, yaml.ScalarNode) else "?"
                sub = (path + "." if path else "") + kname
                if k.start_mark.index == index:
                    return sub
                found = walk(v, sub)
                if found:
                    return found
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                name = _name_of(v)
                sub = "%s[%d]%s" % (path, i, " (%s)" % _display(name) if name is not None else "")
                found = walk(v, sub)
                if found:
                    return found
        return None

    return walk(root, "") or ""


def read_yaml(path: str, rel: str, problems: List[Problem], top_key: Optional[str]) -> Optional[Dict[str, Any]]:
    """Read one YAML file that must hold a mapping; record a problem and return None on failure."""
    return read_config_yaml(path, rel, problems, top_key)[0]


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_problem(path: str, root: Optional[str] = None) -> Optional[str]:
    """Why a configuration file is not read, or None: it is not a regular file (a named pipe
    would block the read for ever, a device never end it), or, for a file of the tree at
    ``root``, a symbolic link that leads out of it (a tree's files are its own: a link to
    ``/etc/shadow`` would print its lines as unknown keys)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return "cannot read file: %s" % (exc.strerror or exc)
    if not stat.S_ISREG(mode):
        kind = next((word for test, word in _FILE_KINDS if test(mode)), "not a regular file")
        return "is %s, not a regular file: not read" % kind
    if root is not None:
        real, top = os.path.realpath(path), os.path.realpath(root)
        if real != top and not real.startswith(top.rstrip(os.sep) + os.sep):
            return "is a symbolic link to %s, outside the configuration root: not read (a tree's files must be inside it)" % real
    return None


def read_config_yaml(path: str, rel: str, problems: List[Problem],
                     top_key: Optional[str], root: Optional[str] = None) -> Tuple[Optional[Dict[str, Any]], bool]:
    """:func:`read_yaml`, and whether the text holds a ``!vault`` tag at all (when it does not,
    :func:`place_vaulted` has nothing to find: a 10,000-instance file is not walked again).
    ``root``: the file is one of the tree at ``root`` (:func:`file_problem`)."""
    refused = file_problem(path, root)
    if refused:
        problems.append(Problem(rel, "", refused))
        return None, False
    try:
        with open(path, "r", encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError as exc:
        problems.append(Problem(rel, "", "not UTF-8 text (byte %d)" % exc.start))
        return None, False
    except OSError as exc:
        problems.append(Problem(rel, "", "cannot read file: %s" % (exc.strerror or exc)))
        return None, False
    known = parsecache.get(text)  # a large file parsed before, byte for byte
    if isinstance(known, dict):
        return known, False
    fast_loader, clear_loader, duplicate_key_error = config_loaders()
    try:
        try:
            data = yaml.load(text, Loader=fast_loader)  # noqa: S506 - SafeLoader subclass
        except yaml.YAMLError:
            data = yaml.load(text, Loader=clear_loader)  # noqa: S506 - same error, clearer words
    except duplicate_key_error as exc:
        mark = exc.problem_mark
        problems.append(Problem(rel, _key_path_at(text, mark.index),
                                "%s (line %d, column %d): a key may appear only once in a mapping "
                                "(YAML would silently keep the last one)"
                                % (exc.problem.replace("found ", ""), mark.line + 1, mark.column + 1)))
        return None, False
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = " (line %d, column %d)" % (mark.line + 1, mark.column + 1) if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        problems.append(Problem(rel, "", "YAML syntax error%s: %s" % (pos, problem)))
        return None, False
    except VALUE_ERRORS as exc:
        # PyYAML's constructors raise these on a tagged value they cannot build
        # (`!!int x`, `!!timestamp 2024-99-99`) or on nesting too deep to build
        problems.append(Problem(rel, "", "YAML value that cannot be read: %s" % (str(exc) or type(exc).__name__)))
        return None, False
    shape = shape_problem(data, text)
    if shape:
        problems.append(Problem(rel, "", shape))
        return None, False
    want = "a mapping with key '%s:'" % top_key if top_key else "a mapping"
    if data is None:
        problems.append(Problem(rel, "", "file is empty (expected %s)" % want))
        return None, False
    if not isinstance(data, dict):
        problems.append(Problem(rel, "", "top level must be %s, found %s" % (want, _type_word(data))))
        return None, False
    tagged = VAULT_TAG in text or "%TAG" in text  # (a %TAG handle can spell the tag otherwise)
    if not tagged:
        parsecache.put(text, data)
    return data, tagged


def _type_word(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    return {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number"}.get(
        type(v), type(v).__name__)


def _display(name: Any) -> str:
    """A name inside a key path: as written, or escaped when it holds control characters."""
    if isinstance(name, str) and name.isprintable():
        return name
    return repr(name)[1:-1] if isinstance(name, str) else repr(name)


def _loc_to_key(loc: Tuple[Any, ...], data: Any) -> str:
    parts: List[str] = []
    cur = data
    for item in loc:
        if isinstance(item, int) and not isinstance(item, bool) and not isinstance(cur, dict):
            label = "[%d]" % item
            if isinstance(cur, list) and 0 <= item < len(cur):
                cur = cur[item]
                if isinstance(cur, dict) and isinstance(cur.get("name"), str):
                    label += " (%s)" % _display(cur["name"])
            else:
                cur = None
            parts.append(label)
        else:
            if isinstance(cur, dict) and not isinstance(item, str):  # the key as written: True, not 1
                item = next((k for k in cur if k == item and not isinstance(k, str)), item)
            key = _display(item if isinstance(item, str) else _yaml_spelling(item))
            parts.append(("." if parts else "") + key)
            cur = cur.get(item) if isinstance(cur, dict) else None
    return "".join(parts)


def _resolve_type(tp: Any) -> Any:
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
            continue
        if origin is Union:
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
            return args
        return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _fields_at(model: Any, loc: Sequence[Any]) -> Optional[List[str]]:
    """The field names of the (sub)model at ``loc`` (a pydantic error location), if any."""
    cur: Any = model
    for item in loc:
        cur = _resolve_type(cur)
        if isinstance(cur, list):  # a tagged union: the location names the tag
            pick = [a for a in cur if _is_model(a) and "type" in a.model_fields
                    and item in (get_args(a.model_fields["type"].annotation) or ())]
            if not pick:
                return None
            cur = pick[0]
            continue
        origin = get_origin(cur)
        if origin is list and isinstance(item, int):
            cur = get_args(cur)[0]
        elif origin is dict:
            cur = get_args(cur)[1]
        elif _is_model(cur) and isinstance(item, str) and item in cur.model_fields:
            cur = cur.model_fields[item].annotation
        else:
            return None
    cur = _resolve_type(cur)
    if _is_model(cur):
        return sorted(cur.model_fields)
    return None


def _shown(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return _type_word(v)
    if isinstance(v, (datetime.date, datetime.datetime)):
        return "the date %s" % v.isoformat()
    return m.show(v) if isinstance(v, str) else repr(v)


def _unquoted(v: Any) -> str:
    """What YAML made of an unquoted scalar where a string belongs, and the cure (quotes)."""
    if isinstance(v, bool):
        what = "the boolean %s (an unquoted on/off, yes/no, true/false)" % str(v).lower()
    elif isinstance(v, int):
        what = "the number %d (an unquoted number; a leading 0 is read as octal: 0123 is 83)" % v
    elif isinstance(v, float):
        what = "the number %r" % v
    elif isinstance(v, (datetime.date, datetime.datetime)):
        what = "the date %s" % v.isoformat()
    else:
        return ""
    return "YAML read it as %s: write it in quotes" % what


def _yaml_spelling(v: Any) -> str:
    """A non-string mapping key as YAML would print it (pydantic's location turns ``True`` into ``1``)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    return str(v)


def _pydantic_problems(rel: str, exc: ValidationError, data: Any, model: Any = None,
                       ) -> List[Tuple[Tuple[Any, ...], Problem]]:
    """(location, problem) for every error of ``exc``; messages rewritten for operators."""
    out: List[Tuple[Tuple[Any, ...], Problem]] = []
    for err in exc.errors(include_url=False):
        raw_loc = tuple(err.get("loc", ()))
        loc = tuple(x for x in raw_loc if not (isinstance(x, str) and (x in m.STORAGE_KINDS or x.startswith("function-"))))
        typ = err.get("type")
        msg = err.get("msg", "invalid")
        inp = err.get("input")
        ctx = err.get("ctx") or {}
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        mark = re.match(r"^\[\[([^\]]+)\]\] ", msg)
        if mark:
            loc = loc + tuple(mark.group(1).split("."))
            msg = msg[mark.end():]
        elif typ == "extra_forbidden":
            allowed = _fields_at(model, raw_loc[:-1]) if model is not None else None
            key = str(loc[-1]) if loc else "?"
            msg = "unknown key %s" % m.show(key)
            if allowed:
                close = difflib.get_close_matches(key.replace("-", "_"), allowed, n=1, cutoff=0.6)
                if close:
                    msg += "; did you mean '%s'?" % close[0]
                msg += " (allowed here: %s)" % ", ".join(allowed)
            else:
                msg += " (not a field of this entry; check the spelling)"
        elif typ == "missing":
            msg = "required key is missing"
        elif typ == "literal_error":
            msg = "%s is not allowed: expected %s" % (_shown(inp), ctx.get("expected", ""))
        elif typ == "union_tag_invalid":
            loc = loc + ("type",)
            msg = "type %s is not a storage builder type (expected %s)" % (
                m.show(ctx.get("tag")), ", ".join(sorted(x for x in m.STORAGE_KINDS)))
        elif typ == "union_tag_not_found":
            loc = loc + ("type",)
            msg = "required key is missing (a storage builder's type: %s)" % ", ".join(sorted(m.STORAGE_KINDS))
        elif typ in ("model_type", "model_attributes_type", "dict_type"):
            # the kind only, never the value: a string where a mapping belongs may be the secret
            # the mapping was to hold (``credentials: <key>``, a ``workspace:`` URL with a token)
            msg = "expected a mapping, got %s" % _type_word(inp)
        elif typ == "list_type":
            msg = "expected a list, got %s" % _type_word(inp)
        elif loc and loc[-1] == "[key]" and _unquoted(inp):
            # a mapping's key that is no string: pydantic's location ends with the key itself, then "[key]"
            loc = loc[:-2] + (_yaml_spelling(inp),)
            msg = "a key must be a string; %s" % _unquoted(inp)
        elif typ == "string_type" and _unquoted(inp):
            msg = "expected a string; %s" % _unquoted(inp)
        elif msg.startswith("Input should be"):
            msg = "expected %s, got %s" % (msg[len("Input should be "):].split(", unable")[0], _shown(inp))
        out.append((loc, Problem(rel, _loc_to_key(loc, data), msg)))
    return out


def parse_model(model: Type[BaseModel], data: Dict[str, Any], rel: str, problems: List[Problem],
                broken: Optional[set] = None,
                located: Optional[List[Tuple[Tuple[Any, ...], Problem]]] = None) -> Optional[Any]:
    """Validate ``data`` as ``model``; entries that fail are reported and dropped, the rest kept.

    List files are validated entry by entry so that one bad entry does not hide the
    problems (or the cross-references) of the others. ``broken`` collects the names
    (and aliases) of entries that failed, so references to them are not reported as
    dangling; ``located`` collects (location, problem) pairs.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        pairs = _pydantic_problems(rel, exc, data, model)
        problems.extend(p for _loc, p in pairs)
        if located is not None:
            located.extend(pairs)
    # Salvage: keep the valid entries of list-of-entries files for cross-file checks.
    fields = list(model.model_fields)
    if len(fields) == 1 and isinstance(data.get(fields[0]), list):
        good = []
        for item in data[fields[0]]:
            try:
                model.model_validate({fields[0]: [item]})
                good.append(item)
            except ValidationError:
                if broken is not None and isinstance(item, dict):
                    broken.update(_names_of_raw(item))
                continue
        try:
            return model.model_validate({fields[0]: good})
        except ValidationError:
            return None
    return None


def _names_of_raw(item: Dict[str, Any]) -> List[str]:
    out = []
    if isinstance(item.get("name"), str):
        out.append(m.normalize_builder_name(item["name"]))
    if isinstance(item.get("aliases"), list):
        out.extend(m.normalize_builder_name(a) for a in item["aliases"] if isinstance(a, str))
    return out


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
    #: kinds with a file that did not load at all (missing, unreadable, syntax error,
    #: empty, wrong shape): references to that kind are not reported as dangling
    unloaded: set = field(default_factory=set)
    #: ``config:`` keys whose value is unknown (refused, or cfg/_config.yml did not
    #: load: ``"*"``); rules that depend on them do not run
    config_unknown: set = field(default_factory=set)
    #: ``config:`` key -> the file its value came from (cfg/_config.yml or an overlay)
    config_source: Dict[str, str] = field(default_factory=dict)
    #: the nodes of cfg/hierarchy.yml (accounts, environments) by name
    hierarchy: Dict[str, m.HierarchyNode] = field(default_factory=dict)
    #: runtime -> where its dependency-config keys and its own tags came from (config/hierarchy.py)
    runtime_sources: Dict[str, Dict[str, Dict[str, Tuple[str, str]]]] = field(default_factory=dict)
    #: every ``!vault`` value read at a secret field (config/secrets.py), with its file and key
    vaulted: List[Vaulted] = field(default_factory=list)

    def dangling(self, kind: str, ref: Optional[str]) -> bool:
        """Whether an unresolved reference ``ref`` to a ``kind`` is worth reporting:
        not when that kind's file did not load, nor when ``ref`` names an entry that
        failed to load (its own problem is reported), nor ``default`` while any entry
        of that kind failed to load (it may have been the default)."""
        if kind in self.unloaded or ref is None:
            return False
        if ref in self.broken:
            return False
        if ref == "default" and self.broken_kinds.get(kind):
            return False
        return True

    broken_kinds: Dict[str, set] = field(default_factory=dict)

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

    def instance_builder(self, name: str) -> Optional[m.InstanceBuilder]:
        return self._resolve(name, self.instance_builders)

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


# --------------------------------------------------------------------------- !vault values
#: an overlay's entries are patches of these models (their secret fields take !vault values)
_OVERLAY_SHAPES: Dict[str, Any] = {"runtime_builders": List[m.RuntimeBuilder], "state_backends": List[m.StateBackend]}


def _model_at(tp: Any, node: Dict[Any, Any]) -> Any:
    """The model a mapping ``node`` is parsed as, where the expected type is ``tp`` (None: unknown)."""
    rt = _resolve_type(tp)
    if isinstance(rt, list):  # a tagged union: the entry's type picks the model
        for a in rt:
            if _is_model(a) and "type" in a.model_fields and node.get("type") in (
                    get_args(a.model_fields["type"].annotation) or ()):
                return a
        return None
    return rt if _is_model(rt) else None


def _vaulted_in(node: Any, tp: Any, loc: Tuple[Any, ...], out: List[Tuple[Tuple[Any, ...], Vaulted, Optional[str]]]) -> None:
    """(location, value, secret policy or None) of every !vault value under ``node``."""
    if isinstance(node, dict):
        model = _model_at(tp, node)
        rt = _resolve_type(tp)
        for k, v in node.items():
            sub: Any = None
            policy = None
            if model is not None and isinstance(k, str) and k in model.model_fields:
                sub, policy = model.model_fields[k].annotation, secrets.policy_of(model, k)
            elif model is None and get_origin(rt) is dict:
                sub = get_args(rt)[1]
            if isinstance(v, Vaulted):
                out.append((loc + (k,), v, policy))
            else:
                _vaulted_in(v, sub, loc + (k,), out)
    elif isinstance(node, list):
        rt = _resolve_type(tp)
        elem = get_args(rt)[0] if get_origin(rt) is list else None
        for i, v in enumerate(node):
            if isinstance(v, Vaulted):
                out.append((loc + (i,), v, None))
            else:
                _vaulted_in(v, elem, loc + (i,), out)


def place_vaulted(data: Dict[str, Any], rel: str, model: Any, problems: List[Problem]) -> Tuple[List[Vaulted], set]:
    """Name the file and key of every !vault value of one file's ``data`` (parsed as ``model``,
    or an overlay: ``None``); one at a field that is not secret is reported and taken out of
    ``data``. Returns (the values kept, the (file, key) of those taken out)."""
    found: List[Tuple[Tuple[Any, ...], Vaulted, Optional[str]]] = []
    if model is None:
        for k, v in data.items():
            tp = _OVERLAY_SHAPES.get(k) if isinstance(k, str) else None
            if isinstance(v, Vaulted):
                found.append(((k,), v, None))
            else:
                _vaulted_in(v, tp, (k,), found)
    else:
        _vaulted_in(data, model, (), found)
    kept: List[Vaulted] = []
    taken: List[Tuple[Tuple[Any, ...], str]] = []
    for loc, v, policy in found:
        v.file, v.key = rel, _loc_to_key(loc, data)
        if policy is None:
            problems.append(Problem(rel, v.key, secrets.not_secret_message()))
            taken.append((loc, v.key))
        else:
            kept.append(v)
    for loc, _key in sorted(taken, key=lambda t: [str(x).zfill(9) if isinstance(x, int) else str(x) for x in t[0]],
                            reverse=True):
        parent: Any = data
        for item in loc[:-1]:
            parent = parent[item]
        del parent[loc[-1]]
    return kept, {(rel, key) for _loc, key in taken}


def _has_secret(model: Any, seen: Optional[set] = None) -> bool:
    """Whether ``model`` (or a model inside it) has a secret field."""
    seen = set() if seen is None else seen
    if model in seen:
        return False
    seen.add(model)
    for name, info in model.model_fields.items():
        if secrets.policy_of(model, name):
            return True
        stack = [info.annotation]
        while stack:
            tp = stack.pop()
            if _is_model(tp) and _has_secret(tp, seen):
                return True
            stack.extend(a for a in get_args(tp) if a is not None)
    return False


def secret_values(root: str, overlays: Iterable[str] = ()) -> Tuple[List[Vaulted], List[Problem]]:
    """The !vault values at secret fields of the tree at ``root`` and its ``overlays`` (what
    :attr:`Tree.vaulted` holds after a load), reading only the files that can hold one: what the
    controller decrypts before a module loads the tree. Problems of reading are returned, not raised
    (the module's own load reports them in full)."""
    root = os.path.abspath(root)
    problems: List[Problem] = []
    out: List[Vaulted] = []
    for pattern, top, model, _attr, _kind, _required in _CFG_FILES:
        if not _has_secret(model):
            continue
        for path in _files(root, pattern):
            rel = os.path.relpath(path, root)
            data, tagged = read_config_yaml(path, rel, problems, top, root)
            if data is not None and tagged:
                out.extend(place_vaulted(data, rel, model, problems)[0])
    for ov in overlays:
        ov_abs = ov if os.path.isabs(ov) else os.path.join(root, ov)
        if os.path.isfile(ov_abs):
            data, tagged = read_config_yaml(ov_abs, ov, problems, "config")
            if data is not None and tagged:
                out.extend(place_vaulted(data, ov, None, problems)[0])
    return out, problems


# (file glob, top key, file model, table attribute, kind, required?)
_CFG_FILES: List[Tuple[str, str, Type[BaseModel], str, str, bool]] = [
    # first: its dependency configs seed the runtimes (config/hierarchy.py)
    (h.HIERARCHY_REL, "hierarchy", m.HierarchyFile, "hierarchy", h.KIND, False),
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
    # "*.y*ml" stands for the two suffixes docs/configuration.md names, and only those
    # (glob's own "*.y*ml" would also read a "notes.yaml.html" or an "x.yhtml")
    return sorted(f for f in glob.glob(os.path.join(root, pattern)) if f.endswith((".yaml", ".yml")))


#: the reference's configuration files that csis.infra has no part for (docs/differences.md)
REFERENCE_ONLY_CFG = {
    "cfg/os-builders.yml": "the reference's OS builders (base images and their storage_types)",
    "cfg/image-builders.yml": "the reference's image builders (packer bakes)",
    "cfg/mod-builders.yml": "the reference's module builders",
}


def stray_cfg_files(root: str) -> List[Problem]:
    """A ``*.yml``/``*.yaml`` file in ``cfg/`` that csis.infra does not read: refused, never
    ignored (a setting that would silently do nothing, such as the reference's os-builders
    capability gate). Other names (``*.bak``, ``README.md``) are not configuration."""
    read = [pattern for pattern, *_rest in _CFG_FILES if pattern.startswith("cfg/")] + [CONFIG_REL]
    holds = ", ".join(sorted(pattern[len("cfg/"):] for pattern in read))
    out = []
    for path in _files(root, "cfg/*.y*ml"):
        rel = os.path.relpath(path, root)
        if not rel.endswith((".yml", ".yaml")) or any(fnmatch.fnmatch(rel, pattern) for pattern in read):
            continue
        as_yml = rel[:-len(".yaml")] + ".yml" if rel.endswith(".yaml") else rel
        if as_yml != rel and any(fnmatch.fnmatch(as_yml, pattern) for pattern in read):
            out.append(Problem(rel, "", "csis.infra reads %s (ending in .yml), not .yaml, so this file would be ignored: "
                               "rename it" % as_yml))
            continue
        what = REFERENCE_ONLY_CFG.get(as_yml)
        head = ("declares %s, which csis.infra has no equivalent of (docs/differences.md)" % what if what
                else "is not a csis.infra configuration file")
        out.append(Problem(rel, "", "%s: csis.infra reads no such file (cfg/ holds %s), so what it says would be "
                           "ignored; remove it, or move it out of cfg/%s"
                           % (head, holds, "" if what else " (overlays are passed per run: overlays/)")))
    return out


def load_tree(root: str, overlays: Iterable[str] = (), undeclare: Iterable[str] = ()) -> Tree:
    """Load and type-check the tree at ``root``. Raises :class:`ConfigError` with every problem."""
    tree, problems = load_tree_partial(root, overlays, undeclare)
    if problems:
        raise ConfigError(problems)
    return tree


CONFIG_REL = "cfg/_config.yml"


def _parse_config(raw: Dict[str, Any], problems: List[Problem]) -> Tuple[m.ConfigFile, set]:
    """Parse cfg/_config.yml; a refused key is reported and left out (its value unknown)."""
    try:
        return m.ConfigFile.model_validate(raw), set()
    except ValidationError as exc:
        problems.extend(p for _loc, p in _pydantic_problems(CONFIG_REL, exc, raw, m.ConfigFile))
        bad: set = set()
        cleaned = copy.deepcopy(raw)
        for err in exc.errors(include_url=False):
            loc = err.get("loc", ())
            if len(loc) >= 2 and loc[0] == "config" and isinstance(cleaned.get("config"), dict):
                cleaned["config"].pop(loc[1], None)
                bad.add(str(loc[1]))
            elif loc:
                cleaned.pop(loc[0], None)
                if loc[0] == "config":
                    bad.add("*")
        try:
            return m.ConfigFile.model_validate(cleaned), bad
        except ValidationError:
            return m.ConfigFile(), {"*"}


def _overlay_config(shown: str, config: Dict[str, Any], problems: List[Problem]) -> Dict[str, Any]:
    """The overlay's ``config:`` keys that are valid; the others are reported at the overlay."""
    good: Dict[str, Any] = {}
    fields = sorted(k for k in m.ConfigFlags.model_fields if k not in h.POLICY_KEYS)
    for k, v in config.items():
        if k in h.POLICY_KEYS:
            problems.append(Problem(shown, "config.%s" % k, "'%s' is a policy: only cfg/_config.yml sets it "
                                                            "(an overlay cannot change it)" % k))
            continue
        if k not in m.ConfigFlags.model_fields:
            close = difflib.get_close_matches(str(k), fields, n=1, cutoff=0.6)
            problems.append(Problem(shown, "config.%s" % _display(str(k)), "unknown key %s%s (allowed here: %s)"
                                    % (m.show(str(k)), "; did you mean '%s'?" % close[0] if close else "",
                                       ", ".join(fields))))
            continue
        try:
            m.ConfigFlags.model_validate({k: v})
        except ValidationError as exc:
            for loc, p in _pydantic_problems(shown, exc, {k: v}, m.ConfigFlags):
                problems.append(Problem(shown, "config." + p.key if p.key else "config", p.message))
            continue
        good[k] = v
    return good


def load_tree_partial(root: str, overlays: Iterable[str] = (),
                      undeclare: Iterable[str] = ()) -> Tuple[Tree, List[Problem]]:
    """Load what loads; return the tree of valid entries and every problem found."""
    problems: List[Problem] = []
    vaulted: List[Vaulted] = []
    #: (file, key) of !vault values taken out (refused): their "required key is missing" is not repeated
    vault_taken: set = set()
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        return Tree(root=root, config_file=m.ConfigFile()), [
            Problem(root, "", "configuration root does not exist or is not a directory")]
    cfg_path = os.path.join(root, CONFIG_REL)
    raw_cfg: Optional[Dict[str, Any]] = None
    if not os.path.exists(cfg_path):
        problems.append(Problem(CONFIG_REL, "", "file is missing (every configuration tree needs cfg/_config.yml with a 'config:' mapping)"))
    else:
        raw_cfg, tagged = read_config_yaml(cfg_path, CONFIG_REL, problems, "config", root)
        if raw_cfg is not None and tagged:
            vault_taken |= place_vaulted(raw_cfg, CONFIG_REL, m.ConfigFile, problems)[1]

    # Overlays: read them all first (their problems are reported with the rest).
    # A relative overlay path is relative to the configuration root.
    overlay_data: List[Tuple[str, m.OverlayFile, Dict[str, Any]]] = []
    for ov in overlays:
        ov_abs = ov if os.path.isabs(ov) else os.path.join(root, ov)
        shown = ov
        if not os.path.exists(ov_abs):
            problems.append(Problem(shown, "", "overlay file does not exist (a relative overlay path is "
                                               "relative to the configuration root)"))
            continue
        data, tagged = read_config_yaml(ov_abs, shown, problems, "config")  # a directory: refused by name
        if data is None:
            continue
        kept, taken = place_vaulted(data, shown, None, problems) if tagged else ([], set())
        vaulted.extend(kept)
        vault_taken |= taken
        parsed = parse_model(m.OverlayFile, data, shown, problems)
        known = {k: v for k, v in data.items() if k in m.OverlayFile.model_fields}
        if parsed is None and known != data:
            # an unknown top-level key (reported above) does not hide what the rest of the overlay
            # would do wrong: every problem at once (the run fails on the unknown key anyway)
            parsed = parse_model(m.OverlayFile, known, shown, [])
        if parsed is not None:
            overlay_data.append((shown, parsed, _overlay_config(shown, parsed.config, problems)))

    config_file, config_unknown = (None, {"*"})
    config_source: Dict[str, str] = {}
    if raw_cfg is not None:
        config_file, config_unknown = _parse_config(raw_cfg, problems)
        if isinstance(raw_cfg.get("config"), dict):
            config_source = {k: CONFIG_REL for k in raw_cfg["config"]}
    if overlay_data:
        merged = config_file.config.model_dump() if config_file is not None else {}
        for shown, _ov, good in overlay_data:
            for k, v in good.items():
                merged[k] = v
                config_source[k] = shown
                config_unknown.discard(k)
        if config_file is not None:
            config_file = config_file.model_copy(update={"config": m.ConfigFlags.model_validate(merged)})

    tree = Tree(root=root, config_file=config_file or m.ConfigFile(),
                overlays=[s for s, _parsed, _config in overlay_data], undeclared=list(undeclare),
                config_unknown=config_unknown, config_source=config_source)
    seen_names: Dict[Tuple[str, str], Tuple[str, str]] = {}
    patch_targets: Dict[str, Dict[str, List[Tuple[str, int, Dict[str, Any]]]]] = {
        "runtime_builders": {}, "state_backends": {}}
    for _shown, ov, _good in overlay_data:
        for key in patch_targets:
            for j, entry in enumerate(getattr(ov, key)):
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    problems.append(Problem(_shown, "%s[%d]" % (key, j),
                                            "every entry needs a 'name' naming the entry it patches"))
                    continue
                patch_targets[key].setdefault(m.normalize_builder_name(entry["name"]), []).append((_shown, j, entry))

    problems += stray_cfg_files(root)
    declared_names: Dict[str, List[str]] = {"runtime_builders": [], "state_backends": []}
    for pattern, top, model, attr, kind, required in _CFG_FILES:
        paths = _files(root, pattern)
        if not paths and required:
            problems.append(Problem(pattern, "", "file is missing (it declares the %ss)" % kind))
            tree.unloaded.add(kind)
        for path in paths:
            rel = os.path.relpath(path, root)
            data, tagged = read_config_yaml(path, rel, problems, top, root)
            if data is None:
                tree.unloaded.add(kind)
                continue
            kept, taken = place_vaulted(data, rel, model, problems) if tagged else ([], set())
            vaulted.extend(kept)
            vault_taken |= taken
            patched: Dict[int, List[Tuple[str, int, Dict[str, Any]]]] = {}
            unpatched = data
            if top in patch_targets and isinstance(data.get(top), list):
                data = copy.deepcopy(data)
                for i, entry in enumerate(data[top]):
                    if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                        nm = m.normalize_builder_name(entry["name"])
                        declared_names[top].append(nm)
                        for shown, j, patch in patch_targets[top].pop(nm, []):
                            data[top][i] = _deep_merge(data[top][i], patch)
                            patched.setdefault(i, []).append((shown, j, patch))
            unseeded: Dict[int, str] = {}
            if top == "runtime_builders" and isinstance(data.get(top), list):
                # the hierarchy's dependency configs: defaults of the keys a runtime leaves out
                env_problems, unseeded = h.seed_runtimes(tree, data[top], patched, rel)
                problems.extend(env_problems)
            file_problems: List[Problem] = []
            located: List[Tuple[Tuple[Any, ...], Problem]] = []
            broken: set = set()
            parsed = parse_model(model, data, rel, file_problems, broken, located)
            if unseeded:  # (at the file's own index: before a problem is put at an overlay's)
                file_problems = [p for p in file_problems if not h.unseeded_problem(p, unseeded)]
            if patched:
                file_problems = [_blame_overlay(p, located, patched, top) for p in file_problems]
                if any(p.file == rel for p in file_problems):
                    file_problems = _blame_merge(file_problems, located, patched, top, rel,
                                                 lambda i, k, d=unpatched: _problems_with(tree, d, model, top, rel,
                                                                                          patched, i, k))
            problems.extend(file_problems)
            tree.broken |= broken
            tree.broken_kinds.setdefault(kind, set()).update(broken)
            if parsed is None:
                tree.unloaded.add(kind)
                if isinstance(data.get(top), list):
                    for e in data[top]:
                        if isinstance(e, dict):
                            tree.broken.update(_names_of_raw(e))
                continue
            entries = getattr(parsed, top)
            raw_entries = data.get(top) or []
            used: set = set()
            # the raw indices of each name, in order: the key path of each parsed entry is the
            # first raw entry of its name not used yet (salvaged lists may be shorter); one pass,
            # not a scan per entry (10,000 instances)
            raw_at: Dict[Any, List[int]] = {}
            for i, r in enumerate(raw_entries):
                name = m.normalize_builder_name(r.get("name")) if isinstance(r, dict) else None
                if isinstance(name, str):  # a parsed entry's name is a string
                    raw_at.setdefault(name, []).append(i)
            for idx, entry in enumerate(entries):
                queue = raw_at.get(entry.name) or []
                while queue and queue[0] in used:
                    queue.pop(0)
                ridx = queue.pop(0) if queue else idx
                used.add(ridx)
                key = "%s[%d] (%s)" % (top, ridx, entry.name)
                ns = "builder" if kind in _BUILDER_KINDS else kind
                prev = seen_names.get((ns, entry.name))
                if prev is not None:
                    problems.append(Problem(rel, key, "duplicate %s name '%s' (also declared at %s: %s)"
                                            % (kind, entry.name, prev[0], prev[1])))
                    continue
                seen_names[(ns, entry.name)] = (rel, key)
                getattr(tree, attr)[entry.name] = entry
                tree.where[(kind, entry.name)] = (rel, key)
    for key, left in patch_targets.items():
        what = key[:-1].replace("_", " ")
        source = "cfg/runtime-builders.yml" if key == "runtime_builders" else "cfg/state-backends.yml"
        for name, patches in left.items():
            for shown, j, _patch in patches:
                problems.append(Problem(shown, "%s[%d] (%s)" % (key, j, name),
                                        "overlay patches %s '%s', which is not declared in %s (declared: %s); "
                                        "an overlay can only change declared entries"
                                        % (what, name, source, ", ".join(sorted(declared_names[key])) or "none")))

    problems.extend(h.hierarchy_problems(tree))
    tree.vaulted = vaulted
    if vault_taken:
        problems = [p for p in problems if not ((p.file, p.key) in vault_taken and p.message == "required key is missing")]

    # Undeclare for one run (a decommission): CLI list plus `undeclare: true` entries.
    for name in list(undeclare):
        if name not in tree.instances:
            problems.append(Problem("undeclare", name, "instance '%s' is not declared, so it cannot be undeclared" % name))
    for name, inst in list(tree.instances.items()):
        if inst.undeclare or name in undeclare:
            del tree.instances[name]
            if name not in tree.undeclared:
                tree.undeclared.append(name)

    # a binary given as a relative path (tools/terraform) is relative to the tree, as every other
    # path in it: the version check, the render and the apply each start it from another directory
    for name, ex in list(tree.executables.items()):
        if "/" in ex.binary and not os.path.isabs(ex.binary):
            tree.executables[name] = ex.model_copy(update={"binary": os.path.normpath(os.path.join(tree.root, ex.binary))})

    return tree, problems


def _problems_with(tree: Tree, data: Dict[str, Any], model: Type[BaseModel], top: str, rel: str,
                   patched: Dict[int, List[Tuple[str, int, Dict[str, Any]]]], index: int, count: int) -> set:
    """``{(location, message)}`` of the file's problems with the first ``count`` overlay patches of
    entry ``index`` merged (0: the file alone), its runtimes seeded from the hierarchy as the patched
    file's are, on copies (the tree keeps the patched file's sources). A location, not a key path:
    the patch may spell the entry's name otherwise (names match case-blind)."""
    data = copy.deepcopy(data)
    entries = data.get(top)
    if count and isinstance(entries, list) and 0 <= index < len(entries):
        for _shown, _j, patch in patched[index][:count]:
            entries[index] = _deep_merge(entries[index], patch)
    if top == "runtime_builders" and isinstance(entries, list):
        shadow = copy.copy(tree)
        shadow.runtime_sources = {}
        h.seed_runtimes(shadow, entries, {index: patched[index][:count]} if count else {}, rel)
    found: List[Problem] = []
    located: List[Tuple[Tuple[Any, ...], Problem]] = []
    parse_model(model, data, rel, found, set(), located)
    return {(loc, q.message) for loc, q in located}


def _blame_merge(problems: List[Problem], located: List[Tuple[Tuple[Any, ...], Problem]],
                 patched: Dict[int, List[Tuple[str, int, Dict[str, Any]]]], top: str, rel: str,
                 problems_with: Callable[[int, int], set]) -> List[Problem]:
    """A problem of an entry an overlay patched, at a key the overlay did not set (a key the
    patch made required, a rule across keys), that the file alone does not have: the merge made
    it, so it names the overlay whose patch first brings it (the entry's patches merged one by
    one, in the order the run applies them), at the same key path under its entry."""
    out = []
    base: Dict[int, set] = {}
    for p in problems:
        loc = next((l for l, q in located if q is p), None)
        if p.file == rel and loc and len(loc) >= 2 and loc[0] == top and isinstance(loc[1], int) and loc[1] in patched:
            i = loc[1]
            if i not in base:
                base[i] = problems_with(i, 0)
            if (loc, p.message) not in base[i]:
                patches = patched[i]
                k = next((k for k in range(1, len(patches)) if (loc, p.message) in problems_with(i, k)), len(patches))
                shown, j, patch = patches[k - 1]
                rest = tuple(loc[2:])
                where = "%s[%d] (%s)%s" % (top, j, _display(patch.get("name")),
                                           ("." + _loc_to_key(rest, patch)) if rest else "")
                p = Problem(shown, where, p.message + " (after this overlay's patch of %s)" % rel)
        out.append(p)
    return out


def _blame_overlay(p: Problem, located: List[Tuple[Tuple[Any, ...], Problem]],
                   patched: Dict[int, List[Tuple[str, int, Dict[str, Any]]]], top: str) -> Problem:
    """A problem inside an entry an overlay patched, at a key the overlay set: name the overlay."""
    loc = next((l for l, q in located if q is p), None)
    if not loc or len(loc) < 3 or loc[0] != top or not isinstance(loc[1], int) or loc[1] not in patched:
        return p
    rest = loc[2:]
    for shown, j, patch in reversed(patched[loc[1]]):
        cur: Any = patch
        ok = True
        for item in rest:
            if isinstance(cur, dict) and item in cur:
                cur = cur[item]
            elif isinstance(cur, list) and isinstance(item, int) and 0 <= item < len(cur):
                cur = cur[item]
            else:
                ok = False
                break
        if ok:
            where = "%s[%d] (%s).%s" % (top, j, _display(patch.get("name")), _loc_to_key(tuple(rest), patch))
            return Problem(shown, where, p.message)
    return p
