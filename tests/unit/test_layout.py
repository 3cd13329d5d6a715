# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The library's layout rules, read from its source with ``ast`` (nothing is imported):

* no import cycle between its files (imports inside functions count too);
* no ``_private`` name imported from another of its files.
"""
from __future__ import annotations

import ast
import os
from typing import Dict, List, Optional, Set, Tuple

import pytest

LIB = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "plugins", "module_utils", "csis"))
PREFIX = "ansible_collections.csis.infra.plugins.module_utils.csis"


def _modules() -> Dict[str, str]:
    """{dotted name relative to the library ('' is the package, 'apply.gate' ...): path}."""
    out = {}
    for base, dirs, files in os.walk(LIB):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(base, f), LIB)[:-3].replace(os.sep, ".")
            name = rel[:-len("__init__")].rstrip(".") if rel.endswith("__init__") else rel
            out[name] = os.path.join(base, f)
    return out


MODULES = _modules()


def _package_of(name: str, path: str) -> str:
    return name if path.endswith("__init__.py") else name.rpartition(".")[0]


def _resolve(name: str, path: str, node: ast.ImportFrom) -> Optional[str]:
    """The library module an ``import from`` names (relative to the library), else None."""
    if node.level:
        base = _package_of(name, path).split(".") if _package_of(name, path) else []
        if node.level > 1:
            base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
        return target
    mod = node.module or ""
    if mod == PREFIX:
        return ""
    if mod.startswith(PREFIX + "."):
        return mod[len(PREFIX) + 1:]
    return None


def _edges(modules: Optional[Dict[str, str]] = None) -> Tuple[Dict[str, Set[str]], List[str]]:
    """(the import graph of the library's files, the private names they import from each other)."""
    modules = MODULES if modules is None else modules
    graph: Dict[str, Set[str]] = {n: set() for n in modules}
    private: List[str] = []
    for name, path in modules.items():
        with open(path, "r", encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(PREFIX + "."):
                        target = alias.name[len(PREFIX) + 1:]
                        if target in modules and target != name:
                            graph[name].add(target)
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _resolve(name, path, node)
            if target is None:
                continue
            for alias in node.names:
                sub = (target + "." + alias.name) if target else alias.name
                if sub in modules:  # ``from . import models``: the module itself
                    if sub != name:
                        graph[name].add(sub)
                    continue
                if target in modules and target != name:
                    graph[name].add(target)
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    private.append("%s imports %s from %s" % (name, alias.name, target or "the package"))
    return graph, private


def _cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(n: str) -> Optional[List[str]]:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_library_is_found():
    assert {"errors", "aws", "terraform", "module", "config.loader", "render.plan", "apply.gate",
            "state.store"} <= set(MODULES)


def test_no_import_cycle():
    graph, _private = _edges()
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_private_name_is_imported_from_another_file():
    _graph, private = _edges()
    assert private == []


@pytest.mark.parametrize("source, expected", [
    ("from .b import c\n", ["pkg.b"]),
    ("from .. import b\n", ["b"]),
    ("from ..b import _c\n", ["b"]),
])
def test_the_walker_resolves_relative_imports(tmp_path, source, expected):
    lib = tmp_path / "lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "pkg" / "__init__.py").write_text("")
    (lib / "pkg" / "a.py").write_text(source)
    (lib / "pkg" / "b.py").write_text("")
    (lib / "b.py").write_text("from .pkg import a\n")
    mods = {"pkg": str(lib / "pkg" / "__init__.py"), "pkg.a": str(lib / "pkg" / "a.py"),
            "pkg.b": str(lib / "pkg" / "b.py"), "b": str(lib / "b.py")}
    graph, private = _edges(mods)
    assert sorted(graph["pkg.a"]) == expected
    assert bool(private) == ("_c" in source)
    if expected == ["b"]:
        assert _cycle(graph) is not None  # b -> pkg.a -> b
