# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Fuzz: the configuration loader never raises anything but a validation problem.

A copy of ``examples/`` (``copy_as_shipped``) is mutated -- values replaced by arbitrary YAML
scalars, lists and maps, keys deleted, unknown keys added, hostile strings inserted, files
truncated, invalid UTF-8 and raw YAML oddities (aliases, merge keys, complex keys, tags)
written, files removed or turned into directories -- and ``load_and_validate`` must either
succeed or raise :class:`ConfigError` whose problems each name a file. Any other exception
(a traceback for the operator) is a bug; the ones found are kept below as regression tests.
"""
from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Tuple

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from trees import EXAMPLES, copy_as_shipped

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.applycheck import ApplyCheckRefused, check_apply
from ansible_collections.csis.infra.plugins.module_utils.csis.config import models as m
from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError, Problem
from ansible_collections.csis.infra.plugins.module_utils.csis.yamlio import VALUE_ERRORS

SCALE = int(os.environ.get("CSIS_FUZZ_SCALE", "1"))

#: the example tree's files (relative path -> text), read once; never written
ORIGINAL: Dict[str, str] = {}
for _dir, _subdirs, _names in os.walk(EXAMPLES):
    _subdirs[:] = sorted(d for d in _subdirs if d not in ("generated", "meta-state", "state", "unmount-receipts"))
    for _n in sorted(_names):
        _path = os.path.join(_dir, _n)
        with open(_path, "r", encoding="utf-8") as _fh:
            ORIGINAL[os.path.relpath(_path, EXAMPLES)] = _fh.read()
FILES = sorted(ORIGINAL)
OVERLAY = "overlays/apply-all.yml"
META_FILES = ("storage-state.yaml", "launch-params.yaml", "pins.yaml", "instance-state.yaml", "verifications.yaml")


def _field_names() -> List[str]:
    names = set()
    for obj in vars(m).values():
        if isinstance(obj, type) and issubclass(obj, m.BaseModel) and obj is not m.BaseModel:
            names.update(getattr(obj, "model_fields", {}))
    return sorted(names)


#: keys the models know: an added key is often a real one in the wrong place or type
KNOWN_KEYS = _field_names()
#: names declared in the example (cross-references)
EXAMPLE_NAMES = ["aws-east2-runtime", "s3-east2", "local-state", "open-tofu", "open-tofu-1", "aws-efs", "aws-ebs",
                 "aws-s3", "posix-groups", "coops", "stofs", "imgfile-basic", "imgfile-basic-dask", "mnt_data",
                 "default-bucket", "efs-storage", "test", "test2", "default"]

HOSTILE = [
    "", " ", "\t", "\n", "${var.x}", "%{ if true }x%{ endif }", "$${", "%%{", '"', "'", "\\", "\\\"", '";\nx = 1 #',
    "a\x00b", "\x07\x1b[31m", "\u202e\u2066", "caf\u00e9", "cafe\u0301", "\U0001f600", "\ufeff", "\ud7ff",
    "ALL", "aws:x", "default", "..", "../../etc/passwd", "/", "//", "/mnt/../etc", "$(id)", "`id`", "a;b|c&d",
    "x" * 300, "-1", "0", "1e9999", "null", "~", "true", "yes", "no", "on", "2024-01-01", "0x10", "0o17", ".nan",
    "us-east-2", "us-east-2a", "tf-aws-ebs", "tf-aws", "s3", "local", "2770", "archived", "destroyed", "30m", "0s",
    "ami-0123abcd", "sg-zz", "vpc-0123456789abcdef0", "fs-0123abcd", "http://127.0.0.1:5055", "http://[::1", ">=1.5,<",
    "*", "[0]", '["k"]', "module.x",
] + EXAMPLE_NAMES

hostile_text = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40),
                         st.text(alphabet=st.sampled_from('${}%"\\\n\r\t\x00\x7f:#&*!|>-?[],\u0301\u00e9'), max_size=20))

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70), st.sampled_from([0, -1, 1, 2 ** 31, 2 ** 63, 65536, 65537]),
    st.floats(allow_nan=True, allow_infinity=True),
    hostile_text,
    st.dates(), st.datetimes(timezones=st.one_of(st.none(), st.just(datetime.timezone.utc))),
    st.binary(max_size=8),
)
map_keys = st.one_of(st.sampled_from(KNOWN_KEYS), hostile_text, st.integers(-5, 5), st.none(), st.booleans(),
                     st.floats(allow_nan=False, allow_infinity=True), st.dates())
yaml_values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(map_keys, children, max_size=4)),
    max_leaves=12,
)

#: raw YAML texts the dumper would never write
RAW_YAML = [
    "", "---\n", "--- 1\n--- 2\n", "[]\n", "- 1\n", "x\n", "~\n", "!!binary aGVsbG8=\n", "!!python/object:os.system {}\n",
    "a: &a {x: 1}\nb: *a\n", "a: &a [1]\nb: {<<: *a}\n", "a: {<<: 5}\n", "a: {<<: [1, 2]}\n", "? [a, b]\n: 1\n",
    "? {a: 1}\n: 1\n", "a: *undefined\n", "a: !!int x\n", "a: !!float x\n", "a: !!timestamp 2024-99-99\n",
    "a: !!timestamp x\n", "a: !!bool x\n", "a: !!int _\n",
    "a: !!str\n", "a: !custom x\n", "\t- x\n", "a:\n\t- x\n", "a: 'unterminated\n", "a: \"\\xZZ\"\n", '"\\ud800": 1\n',
    "a: \"\\ud800\"\n", "a: 1\na: 2\n", "{a: 1, a: 1}\n", "a: [\n", "%YAML 9.9\n---\na: 1\n", "%TAG ! tag:x,2000:\n---\n!a b\n",
    "a: 2001-12-14t21:59:43.10-05:00\n", "a: 1_000\n", "a: 0b101\n", "a: 12:30:00\n", "a: .inf\n", "a: |\n  x\n b\n",
    "\ufeffa: 1\n", "a: \x85\n", "a: \u2028\n", "&a a: 1\n", "a: &x\n  - *x\n",
]


def _walk(data: Any, draw: Any) -> List[Any]:
    """A path into ``data`` (keys / list indices), drawn step by step."""
    path: List[Any] = []
    node = data
    while len(path) < 6:
        if isinstance(node, dict) and node:
            children: List[Any] = list(node)
        elif isinstance(node, list) and node:
            children = list(range(len(node)))
        else:
            break
        if draw(st.integers(0, 4)) == 0:
            break
        k = draw(st.sampled_from(children))
        path.append(k)
        node = node[k]
    return path


def _parent(data: Any, path: List[Any]) -> Tuple[Any, Any]:
    node = data
    for k in path[:-1]:
        node = node[k]
    return node, path[-1]


def _dump(data: Any, draw: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=draw(st.booleans()),
                          default_flow_style=draw(st.sampled_from([False, None, True])))


def _mutate_structure(text: str, draw: Any) -> Optional[str]:
    """One structural mutation of a YAML text; None when the text does not parse."""
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError,) + VALUE_ERRORS:  # an earlier mutation made it unreadable
        return None
    op = draw(st.sampled_from(["set", "set", "hostile", "delete", "add", "duplicate"]))
    path = _walk(data, draw)
    if op == "set" or (not path and op != "add"):
        value = draw(yaml_values)
        if path:
            parent, k = _parent(data, path)
            parent[k] = value
        else:
            data = value
    elif op == "hostile":
        parent, k = _parent(data, path)
        parent[k] = draw(hostile_text)
    elif op == "delete":
        parent, k = _parent(data, path)
        del parent[k]
    elif op == "duplicate":  # an entry twice (a list item) or a value under another key
        parent, k = _parent(data, path)
        if isinstance(parent, list):
            parent.insert(k, parent[k])
        else:
            parent[draw(map_keys)] = parent[k]
    else:  # add: an unknown (or known-but-misplaced) key, or a list item
        node = data
        for k in path:
            node = node[k]
        if isinstance(node, dict):
            node[draw(map_keys)] = draw(yaml_values)
        elif isinstance(node, list):
            node.insert(draw(st.integers(0, len(node))), draw(yaml_values))
        else:
            parent, k = _parent(data, path) if path else (None, None)
            if parent is None:
                data = {draw(map_keys): node}
            else:
                parent[k] = {draw(map_keys): node}
    return _dump(data, draw)


def _mutate_bytes(raw: bytes, draw: Any) -> bytes:
    op = draw(st.sampled_from(["truncate", "insert", "invalid_utf8", "replace_all", "raw_yaml", "splice_text"]))
    if op == "truncate":
        return raw[:draw(st.integers(0, len(raw)))]
    if op == "insert":
        i = draw(st.integers(0, len(raw)))
        return raw[:i] + draw(st.binary(min_size=1, max_size=6)) + raw[i:]
    if op == "invalid_utf8":
        i = draw(st.integers(0, len(raw)))
        return raw[:i] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80\x80",
                                               b"\xef\xbb\xbf", b"\x00"])) + raw[i:]
    if op == "replace_all":
        return draw(st.binary(max_size=40))
    if op == "raw_yaml":
        return draw(st.sampled_from(RAW_YAML)).encode("utf-8", "surrogatepass")
    i = draw(st.integers(0, len(raw)))
    return raw[:i] + draw(st.sampled_from(RAW_YAML + HOSTILE)).encode("utf-8", "surrogatepass") + raw[i:]


def _check(root: str, overlays: Tuple[str, ...] = (), undeclare: Tuple[str, ...] = ()) -> Optional[ConfigError]:
    """The property: load_and_validate succeeds, or raises ConfigError whose problems name a file.

    A tree that loads has only names that are wholly plain (they become directories, terraform
    labels, hostnames and shell words) and mount points that are wholly paths."""
    try:
        tree, _meta = load_and_validate(root, overlays=overlays, undeclare=undeclare,
                                        run_version=lambda binary: ("1.11.0", None))
    except ConfigError as exc:
        assert exc.problems, "a ConfigError without problems"
        for p in exc.problems:
            assert isinstance(p, Problem), p
            assert isinstance(p.file, str) and p.file, "a problem that names no file: %r" % (p,)
            assert isinstance(p.message, str) and p.message, p
        assert str(exc)
        return exc
    for table in (tree.runtimes, tree.backends, tree.executables, tree.instance_builders, tree.storage_builders,
                  tree.group_builders, tree.groups, tree.images, tree.storages, tree.instances):
        for name in table:
            assert m.NAME_RE.fullmatch(name), "a name accepted with more than a plain name: %r" % (name,)
    for inst in tree.instances.values():
        for mp in inst.storages:
            assert m.MOUNT_POINT_RE.fullmatch(mp.mount_point), mp.mount_point
    return None


def _write(root: str, rel: str, data: bytes) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def _apply_mutations(root: str, draw: Any) -> None:
    for _i in range(draw(st.integers(1, 4))):
        what = draw(st.sampled_from(["structure"] * 6 + ["bytes"] * 2 + ["file"]))
        rel = draw(st.sampled_from(FILES))
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as fh:
            raw = fh.read()
        if what == "structure":
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            out = _mutate_structure(text, draw)
            if out is not None:
                _write(root, rel, out.encode("utf-8", "surrogatepass"))
        elif what == "bytes":
            _write(root, rel, _mutate_bytes(raw, draw))
        else:
            op = draw(st.sampled_from(["remove", "directory", "extra", "symlink_loop", "empty_dir"]))
            if op == "remove":
                os.remove(path)
            elif op == "directory":
                os.remove(path)
                os.mkdir(path)
            elif op == "extra":  # another file the globs pick up
                extra = draw(st.sampled_from(["storages/zz.yaml", "instances/zz.yml", "groups/zz.yaml",
                                              "images/zz.yaml", "cfg/state-backends-zz.yml"]))
                _write(root, extra, _mutate_bytes(raw, draw) if draw(st.booleans()) else raw)
            elif op == "symlink_loop":
                os.remove(path)
                os.symlink(os.path.basename(path), path)
            else:
                for sub in ("cfg", "storages", "instances"):
                    if rel.startswith(sub + "/"):
                        for name in os.listdir(os.path.join(root, sub)):
                            gone = os.path.join(root, sub, name)
                            # an earlier "directory" op may have made a file a directory
                            if os.path.isdir(gone) and not os.path.islink(gone):
                                shutil.rmtree(gone)
                            else:
                                os.remove(gone)


@settings(max_examples=300 * SCALE)
@given(st.data())
def test_loader_raises_only_config_errors(data: Any) -> None:
    with tempfile.TemporaryDirectory(prefix="csis-fuzz-") as tmp:
        root = copy_as_shipped(EXAMPLES, os.path.join(tmp, "tree"))
        _apply_mutations(root, data.draw)
        overlays: Tuple[str, ...] = (OVERLAY,) if data.draw(st.booleans()) else ()
        undeclare: Tuple[str, ...] = tuple(data.draw(st.lists(st.sampled_from(["test", "test2", "nope"]), max_size=2)))
        _check(root, overlays, undeclare)


@settings(max_examples=100 * SCALE)
@given(st.data())
def test_meta_state_garbage_is_a_problem(data: Any) -> None:
    """A meta-state file the validators read holding any YAML (or bytes) is a problem, not a traceback."""
    with tempfile.TemporaryDirectory(prefix="csis-fuzz-") as tmp:
        root = copy_as_shipped(EXAMPLES, os.path.join(tmp, "tree"))
        os.makedirs(os.path.join(root, "meta-state"))
        for name in data.draw(st.lists(st.sampled_from(META_FILES), min_size=1, max_size=3, unique=True)):
            if data.draw(st.booleans()):
                body = _dump(data.draw(yaml_values), data.draw).encode("utf-8", "surrogatepass")
            else:
                body = _mutate_bytes(b"", data.draw)
            _write(root, os.path.join("meta-state", name), body)
        _check(root)


@settings(max_examples=150 * SCALE)
@given(st.data())
def test_apply_check_refuses_cleanly(data: Any) -> None:
    """The apply-check re-reads cfg/_config.yml and the overlays (plain YAML, no model) right
    before an apply: whatever they hold, it allows or refuses (ApplyCheckRefused), never a traceback."""
    draw = data.draw
    with tempfile.TemporaryDirectory(prefix="csis-fuzz-") as tmp:
        root = copy_as_shipped(EXAMPLES, os.path.join(tmp, "tree"))
        for rel in draw(st.lists(st.sampled_from(["cfg/_config.yml", OVERLAY]), min_size=1, max_size=2, unique=True)):
            if draw(st.integers(0, 2)):
                out = _mutate_structure(ORIGINAL[rel], draw)
                body = (out or "").encode("utf-8", "surrogatepass")
            else:
                body = _mutate_bytes(ORIGINAL[rel].encode("utf-8"), draw)
            _write(root, rel, body)
        lifecycle = draw(st.sampled_from(["identity", "storage", "instance-image"]))
        try:
            result = check_apply(lifecycle, root=draw(st.sampled_from([None, "aws-ebs", "open-tofu"])),
                                 overlays=[OVERLAY] if draw(st.booleans()) else [], config_root=root,
                                 apply_runtime=draw(st.sampled_from([None, "aws-east2-runtime", "x"])))
        except ApplyCheckRefused as exc:
            assert str(exc)
            return
        assert result["allowed"] is True


# ------------------------------------------------------------------ regression cases
# Each input below once raised something other than ConfigError, or was accepted when it
# must not be (found by the properties above).

def _tree_with(tmp_path: Any, rel: str, text: str) -> str:
    root = copy_as_shipped(EXAMPLES, str(tmp_path / "tree"))
    _write(root, rel, text.encode("utf-8", "surrogatepass"))
    return root


def _set(text: str, dotted: str, value: Any) -> str:
    data = yaml.safe_load(text)
    path = [int(k) if k.isdigit() else k for k in dotted.split(".")]
    node = data
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return yaml.safe_dump(data, sort_keys=False)


#: PyYAML's constructors raised ValueError, KeyError, IndexError or AttributeError (a
#: traceback) on a tag they cannot build
TAGGED = ["config: !!int x\n", "config: !!float x\n", "config: {apply_storage: !!timestamp 2024-99-99}\n",
          "config: {apply_storage: !!timestamp x}\n", "config: !!bool x\n", "config: !!int _\n",
          "config: " + "[" * 2000 + "]" * 2000 + "\n"]


@pytest.mark.parametrize("text", TAGGED)
def test_regression_tagged_values_in_config(tmp_path: Any, text: str) -> None:
    exc = _check(_tree_with(tmp_path, "cfg/_config.yml", text))
    assert exc is not None and [p.file for p in exc.problems] == ["cfg/_config.yml"]
    assert "YAML value that cannot be read" in exc.problems[0].message


#: a node aliased inside itself sent the vault walker into a RecursionError; nested aliases
#: (a "billion laughs") would keep every walk busy for hours
LAUGHS = "a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
    "%s: &%s [%s]\n" % (chr(98 + i), chr(98 + i), ",".join(["*" + chr(97 + i)] * 10)) for i in range(9))
SHAPES = [("a: &x\n  - *x\n", "a[0]: a YAML alias refers to a node that contains it (a cycle)"),
          ("runtime_builders: [&r {name: x, more: [*r]}]\n", "runtime_builders[0].more[0]: a YAML alias refers"),
          (LAUGHS, "its aliases expand to more than")]


@pytest.mark.parametrize("text, message", SHAPES)
def test_regression_cyclic_and_exploding_aliases(tmp_path: Any, text: str, message: str) -> None:
    exc = _check(_tree_with(tmp_path, "cfg/runtime-builders.yml", text))
    assert exc is not None and [p.file for p in exc.problems] == ["cfg/runtime-builders.yml"], exc
    assert message in exc.problems[0].message
    exc = _check(_tree_with(tmp_path / "meta", "meta-state/storage-state.yaml", text))
    assert exc is not None and any(p.file == "meta-state/storage-state.yaml" and message in p.message
                                   for p in exc.problems), exc


@pytest.mark.parametrize("text", ["storages: !!int x\n", "storages: {a: {state: !!float x}}\n",
                                  "storages: !!bool x\n", "storages: !!int _\n"])
def test_regression_tagged_values_in_meta_state(tmp_path: Any, text: str) -> None:
    exc = _check(_tree_with(tmp_path, "meta-state/storage-state.yaml", text))
    assert exc is not None and any(p.file == "meta-state/storage-state.yaml" for p in exc.problems)


#: every validator regex ended in "$", which also matches before a final newline: these
#: values were accepted with the newline (a name into a directory, a label, a hostname;
#: a mount point into the launch script and /etc/fstab)
TRAILING_NEWLINE = [
    ("instances/instances.yaml", "instances.0.name", "test2\n"),
    ("instances/instances.yaml", "instances.0.storages.0.mount_point", "/mnt/data\n"),
    ("instances/instances.yaml", "instances.0.machine_type", "t3.medium\n"),
    ("storages/storage0.yaml", "storages.1.bucket_name", "csis-example-default-bucket\n"),
    ("cfg/runtime-builders.yml", "runtime_builders.0.region", "us-east-2\n"),
    ("cfg/runtime-builders.yml", "runtime_builders.0.account_id", "123456789012\n"),
    ("cfg/runtime-builders.yml", "runtime_builders.0.session_instance_profile", "csis-ssm\n"),
    ("cfg/runtime-builders.yml", "runtime_builders.0.networking.network", "vpc-0a1b2c3d4e5f60718\n"),
    ("cfg/runtime-builders.yml", "runtime_builders.0.endpoints.url", "http://127.0.0.1:5055\n"),
    ("cfg/instance-builders.yml", "instance_builders.0.required_plugins.0.name", "aws\n"),
    ("images/images.yaml", "images.0.name_pattern", "imgfile-basic-dask-pckr-ebs-ans\n"),
    ("groups/groups.yaml", "groups.0.name", "coops\n"),
]


@pytest.mark.parametrize("rel, dotted, value", TRAILING_NEWLINE)
def test_regression_trailing_newline_refused(tmp_path: Any, rel: str, dotted: str, value: str) -> None:
    exc = _check(_tree_with(tmp_path, rel, _set(ORIGINAL[rel], dotted, value)))
    assert exc is not None and any(p.file == rel for p in exc.problems), exc


@pytest.mark.parametrize("rel, body", [
    ("cfg/_config.yml", b"\x80config: {apply_storage: true}\n"),  # UnicodeDecodeError
    ("cfg/_config.yml", b"config: {apply_storage: !!int x}\n"),  # ValueError from the constructor
    ("cfg/_config.yml", b"config: {apply_storage: !!bool x}\n"),  # KeyError from the constructor
    ("cfg/_config.yml", b"config: {apply_storage: !!timestamp x}\n"),  # AttributeError
    ("cfg/_config.yml", b"config: &c {apply_storage: true, again: *c}\n"),  # a cycle
    (OVERLAY, b"config:\n  apply_storage: \xff\n"),
])
def test_regression_apply_check_unreadable(tmp_path: Any, rel: str, body: bytes) -> None:
    root = copy_as_shipped(EXAMPLES, str(tmp_path / "tree"))
    _write(root, rel, body)
    with pytest.raises(ApplyCheckRefused, match="cannot be read"):
        check_apply("storage", root="aws-ebs", overlays=[OVERLAY], config_root=root)


def test_regression_apply_check_on_an_empty_config_file(tmp_path: Any) -> None:
    """A truncated (empty) cfg/_config.yml reached the alias walk as None (a TypeError)."""
    root = copy_as_shipped(EXAMPLES, str(tmp_path / "tree"))
    _write(root, "cfg/_config.yml", b"")
    with pytest.raises(ApplyCheckRefused, match="has no config: mapping"):
        check_apply("storage", root="aws-ebs", overlays=[OVERLAY], config_root=root)
