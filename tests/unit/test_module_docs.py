# -*- coding: utf-8 -*-
"""Every module and plugin carries DOCUMENTATION, EXAMPLES and RETURN that Ansible parses,
and every documented option is in the argument spec (and the other way round)."""
from __future__ import annotations

import ast
import glob
import os

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = sorted(glob.glob(os.path.join(REPO, "plugins", "modules", "*.py")))


def _docs(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("DOCUMENTATION", "EXAMPLES", "RETURN") and isinstance(node.value, ast.Constant):
                out[name] = node.value.value
    return out


def _fragment(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTATION":
            return yaml.safe_load(node.value.value)
    raise AssertionError("no DOCUMENTATION in %s" % path)


@pytest.mark.parametrize("path", MODULES, ids=[os.path.basename(p)[:-3] for p in MODULES])
def test_module_docs_parse(path):
    docs = _docs(path)
    assert set(docs) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, "missing doc blocks in %s" % path
    doc = yaml.safe_load(docs["DOCUMENTATION"])
    assert doc["module"] == os.path.basename(path)[:-3]
    assert doc.get("short_description") and doc.get("description") and doc.get("author")
    examples = yaml.safe_load(docs["EXAMPLES"])
    assert isinstance(examples, list) and examples
    module_keys = [k for task in examples for k in task
                   if k not in ("name", "register", "when", "loop", "vars", "environment", "no_log", "check_mode",
                                "diff", "delegate_to", "run_once", "changed_when", "failed_when", "tags", "become")]
    assert any(k == "csis.infra." + os.path.basename(path)[:-3] for k in module_keys), "an example calls the module by FQCN"
    assert all("." in k for k in module_keys), "every example task uses a FQCN: %s" % module_keys
    ret = yaml.safe_load(docs["RETURN"])
    assert ret is None or isinstance(ret, dict)


@pytest.mark.parametrize("path", MODULES, ids=[os.path.basename(p)[:-3] for p in MODULES])
def test_documented_options_match_the_argument_spec(path):
    doc = yaml.safe_load(_docs(path)["DOCUMENTATION"])
    documented = set((doc.get("options") or {}).keys())
    for frag in doc.get("extends_documentation_fragment") or []:
        assert frag.startswith("csis.infra."), frag
        fpath = os.path.join(REPO, "plugins", "doc_fragments", frag.split(".")[-1] + ".py")
        fdoc = _fragment(fpath)
        documented |= set((fdoc.get("options") or {}).keys())
    src = open(path, encoding="utf-8").read()
    tree = ast.parse(src)
    spec = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "argument_spec":
            val = node.value
            if isinstance(val, ast.Call) and getattr(val.func, "id", "") == "dict":
                spec |= {k.arg for k in val.keywords}
            elif isinstance(val, ast.Dict):
                spec |= {k.value for k in val.keys if isinstance(k, ast.Constant)}
    if not spec:
        pytest.skip("argument spec built dynamically")
    assert documented == spec, "documented %s vs spec %s" % (sorted(documented), sorted(spec))
