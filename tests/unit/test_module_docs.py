# -*- coding: utf-8 -*-
"""Every module and plugin carries DOCUMENTATION, EXAMPLES and RETURN that Ansible parses,
and every documented option is in the argument spec (and the other way round).

These are quick, dependency-free checks of what ansible-test's validate-modules also
checks (scripts/sanity runs that): authors in ``Name (@handle)`` form, the attributes
every module declares through a kind of module (``csis.infra.controller...``) or the
``csis.infra.attributes`` doc fragments, with the fragments merged in as Ansible does, RETURN in
block style with a description and a type for every value, examples by FQCN, and
the ``csis.infra.csis`` action group naming every module."""
from __future__ import annotations

import ast
import glob
import os
import re

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = sorted(glob.glob(os.path.join(REPO, "plugins", "modules", "*.py")))
PLUGINS = MODULES + [os.path.join(REPO, "plugins", "inventory", "meta_state.py")]
# validate-modules' rule (schema.py, author_line)
AUTHOR = re.compile(r"^\w.*\(@[\w-]+\)(?![\w.])")
ATTRIBUTES = ("check_mode", "diff_mode", "platform")


def _runtime():
    return yaml.safe_load(open(os.path.join(REPO, "meta", "runtime.yml"), encoding="utf-8"))


def _docs(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("DOCUMENTATION", "EXAMPLES", "RETURN") and isinstance(node.value, ast.Constant):
                out[name] = node.value.value
    return out


def _fragment(name):
    """csis.infra.<file>[.<variable>] -> the parsed fragment (DOCUMENTATION by default).

    The fragments are imported and instantiated, as Ansible's fragment loader does (their
    variables are put together from texts shared between the fragment files)."""
    import importlib

    parts = name.split(".")
    assert parts[:2] == ["csis", "infra"] and len(parts) in (3, 4), name
    var = parts[3].upper() if len(parts) == 4 else "DOCUMENTATION"
    fragment = importlib.import_module("ansible_collections.csis.infra.plugins.doc_fragments." + parts[2])
    text = getattr(fragment.ModuleDocFragment(), var, None)
    assert isinstance(text, str), "no %s in doc fragment %s" % (var, parts[2])
    return yaml.safe_load(text)


def _expanded(doc):
    """The module's documentation with its csis.infra fragments merged in, as Ansible's
    add_fragments does: notes and seealso extended; options and attributes merged entry by
    entry (the module's keys, then earlier fragments', win inside an entry); other lists
    (author, requirements) joined."""
    doc = dict(doc)
    for frag in doc.pop("extends_documentation_fragment", None) or []:
        if not frag.startswith("csis.infra."):
            continue  # ansible.builtin's (the inventory plugin's constructed, inventory_cache)
        fdoc = _fragment(frag)
        for key in ("notes", "seealso"):
            doc[key] = list(doc.get(key) or []) + list(fdoc.pop(key, None) or [])
        for key in ("options", "attributes"):
            entries = {k: dict(v) for k, v in (doc.get(key) or {}).items()}
            for name, entry in (fdoc.pop(key, None) or {}).items():
                entries[name] = dict(entry, **entries.get(name, {}))
            doc[key] = entries
        for key, val in fdoc.items():
            if isinstance(doc.get(key), list):
                val = sorted(set(val) | set(doc[key]))
            elif isinstance(doc.get(key), dict):
                val = dict(val, **doc[key])
            doc[key] = val
    return doc


def _merged(doc):
    """The options and the attributes of the expanded documentation."""
    doc = _expanded(doc)
    return doc.get("options") or {}, doc.get("attributes") or {}


def _ids(paths):
    return [os.path.basename(p)[:-3] for p in paths]


@pytest.mark.parametrize("path", MODULES, ids=_ids(MODULES))
def test_module_docs_parse(path):
    docs = _docs(path)
    assert set(docs) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, "missing doc blocks in %s" % path
    doc = _expanded(yaml.safe_load(docs["DOCUMENTATION"]))
    assert doc["module"] == os.path.basename(path)[:-3]
    assert doc.get("short_description") and doc.get("description") and doc.get("author")
    examples = yaml.safe_load(docs["EXAMPLES"])
    assert isinstance(examples, list) and examples
    module_keys = [k for task in examples for k in task
                   if k not in ("name", "register", "when", "loop", "vars", "environment", "no_log", "check_mode",
                                "diff", "delegate_to", "run_once", "changed_when", "failed_when", "tags", "become",
                                "module_defaults", "async", "poll")]
    assert any(k == "csis.infra." + os.path.basename(path)[:-3] for k in module_keys), "an example calls the module by FQCN"
    assert all("." in k for k in module_keys), "every example task uses a FQCN: %s" % module_keys
    ret = yaml.safe_load(docs["RETURN"])
    assert ret is None or isinstance(ret, dict)


@pytest.mark.parametrize("path", PLUGINS, ids=_ids(PLUGINS))
def test_authors_have_a_handle(path):
    doc = _expanded(yaml.safe_load(_docs(path)["DOCUMENTATION"]))
    authors = doc.get("author")
    authors = [authors] if isinstance(authors, str) else authors
    assert authors, "no author in %s" % path
    for line in authors:
        assert AUTHOR.search(line), "author %r is not in 'Name (@handle)' form" % line


@pytest.mark.parametrize("path", MODULES, ids=_ids(MODULES))
def test_attributes_are_complete(path):
    doc = yaml.safe_load(_docs(path)["DOCUMENTATION"])
    frags = doc.get("extends_documentation_fragment") or []
    assert all(f.startswith("csis.infra.") for f in frags), frags
    assert "csis.infra.attributes" in frags or any(f.startswith("csis.infra.controller") for f in frags), \
        "the csis.infra.attributes fragment (or a kind of module, csis.infra.controller...) describes the attributes"
    attributes = _merged(doc)[1]
    assert set(ATTRIBUTES) <= set(attributes), "attributes %s lack %s" % (sorted(attributes), ATTRIBUTES)
    for name, attr in attributes.items():
        assert attr.get("description"), "attribute %s has no description" % name
        assert attr.get("support") in ("full", "partial", "none", "N/A"), "attribute %s: support %r" % (name, attr.get("support"))
    assert attributes["platform"]["platforms"]
    member = os.path.basename(path)[:-3] in _runtime()["action_groups"]["csis"]
    assert ("action_group" in attributes) == member, "the action_group attribute says whether the module is in csis.infra.csis"
    if member:
        assert attributes["action_group"]["membership"] == ["csis.infra.csis"]


def _returns(entries, where):
    for key, entry in entries.items():
        assert isinstance(entry, dict), "%s.%s is not a mapping" % (where, key)
        assert set(entry) <= {"description", "returned", "type", "elements", "contains", "sample", "version_added"}, \
            "%s.%s has unknown keys %s (a flow mapping split on a comma?)" % (where, key, sorted(entry))
        assert entry.get("description"), "%s.%s has no description" % (where, key)
        assert entry.get("type") in ("bool", "complex", "dict", "float", "int", "list", "raw", "str", "path"), \
            "%s.%s: type %r" % (where, key, entry.get("type"))
        if "contains" in entry:
            _returns(entry["contains"], "%s.%s" % (where, key))


@pytest.mark.parametrize("path", MODULES, ids=_ids(MODULES))
def test_return_values_are_described(path):
    ret = yaml.safe_load(_docs(path)["RETURN"]) or {}
    _returns(ret, "RETURN")
    for key, entry in ret.items():
        assert entry.get("returned"), "RETURN.%s says when it is returned" % key


def test_the_action_group_holds_the_modules_that_take_config_root():
    """module_defaults of group/csis.infra.csis reach every module of the group, and a module
    refuses an option it does not have: the group is exactly the modules taking config_root."""
    runtime = _runtime()
    assert runtime["requires_ansible"]
    takes = [os.path.basename(p)[:-3] for p in MODULES
             if "config_root" in _merged(yaml.safe_load(_docs(p)["DOCUMENTATION"]))[0]]
    assert sorted(runtime["action_groups"]["csis"]) == sorted(takes)


class _Spec(Exception):
    """Raised by the patched AnsibleModule constructor: carries the module's argument spec."""


def _argument_spec(path, monkeypatch):
    """The module's real argument spec: run its main() with AnsibleModule's constructor
    replaced (as validate-modules does); None when the module cannot be imported."""
    import importlib

    from ansible.module_utils import basic

    def capture(self, *args, **kwargs):
        raise _Spec(kwargs.get("argument_spec", args[0] if args else {}))

    monkeypatch.setattr(basic.AnsibleModule, "__init__", capture)
    name = "ansible_collections.csis.infra.plugins.modules." + os.path.basename(path)[:-3]
    try:
        mod = importlib.import_module(name)
    except ImportError:
        return None
    if not hasattr(mod, "main"):
        # a module that is an action plugin only (its file holds the documentation): the
        # arguments the action plugin accepts
        action = importlib.import_module("ansible_collections.csis.infra.plugins.action." + os.path.basename(path)[:-3])
        return set(action.ActionModule._VALID_ARGS)
    try:
        mod.main()
    except _Spec as spec:
        return set(spec.args[0])
    raise AssertionError("%s: main() did not construct AnsibleModule" % name)


def _static_argument_spec(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    spec = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "argument_spec":
            val = node.value
            if isinstance(val, ast.Call) and getattr(val.func, "id", "") == "dict":
                if any(k.arg is None for k in val.keywords):
                    return set()
                spec |= {k.arg for k in val.keywords}
            elif isinstance(val, ast.Dict):
                if any(k is None for k in val.keys):
                    return set()
                spec |= {k.value for k in val.keys if isinstance(k, ast.Constant)}
    return spec


@pytest.mark.parametrize("path", MODULES, ids=_ids(MODULES))
def test_documented_options_match_the_argument_spec(path, monkeypatch):
    doc = yaml.safe_load(_docs(path)["DOCUMENTATION"])
    options = _merged(doc)[0]
    documented = set(options)
    spec = _argument_spec(path, monkeypatch)
    if spec is None:
        spec = _static_argument_spec(path)
    if not spec:
        pytest.skip("argument spec built dynamically and the module does not import")
    assert documented == spec, "documented %s vs spec %s" % (sorted(documented), sorted(spec))


def _version(text):
    return tuple(int(x) for x in str(text).split("."))


def test_versions_agree_with_the_changelog_and_the_awx_requirements():
    """galaxy.yml's version is one the changelog has not released yet, every module the last
    release did not list is ``version_added`` in it, none is added after it, and the AWX
    project's collections/requirements.yml admits it (an artifact built from the tree
    installs where the docs say it does)."""
    galaxy = yaml.safe_load(open(os.path.join(REPO, "galaxy.yml"), encoding="utf-8"))
    version = _version(galaxy["version"])
    changelog = yaml.safe_load(open(os.path.join(REPO, "changelogs", "changelog.yaml"), encoding="utf-8"))
    released = sorted(_version(v) for v in changelog["releases"])
    assert released and released[-1] < version, "galaxy.yml's version %s is already released" % galaxy["version"]
    listed = {m["name"] for r in changelog["releases"].values() for m in r.get("modules") or []}
    for path in MODULES:
        name = os.path.splitext(os.path.basename(path))[0]
        added = _version(yaml.safe_load(_docs(path)["DOCUMENTATION"])["version_added"])
        assert added <= version, name
        if name not in listed:
            assert added == version, "%s is new since the last release: version_added %s" % (name, galaxy["version"])
    requirements = yaml.safe_load(open(os.path.join(REPO, "docs", "awx-project", "collections", "requirements.yml"),
                                       encoding="utf-8"))
    spec = [c["version"] for c in requirements["collections"] if c["name"] == "csis.infra"][0]
    for clause in spec.split(","):
        op, bound = re.match(r"\s*(>=|<|==)\s*([\d.]+)", clause).groups()
        assert {">=": version >= _version(bound), "<": version < _version(bound), "==": version == _version(bound)}[op], spec
