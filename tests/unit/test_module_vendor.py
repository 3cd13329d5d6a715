# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The collection's terraform modules in a tree (issue 11, "trees anywhere").

* the bundle (render/bundled_modules.py, what csis_render carries in its AnsiballZ zip)
  is ``tfmodules/`` and galaxy.yml's version (``scripts/bundle-tfmodules`` refreshes it);
* without ``module_source_base`` a render writes them to ``generated/.modules/<version>/``,
  only when they differ, and every root calls them by a relative path inside the tree;
* an explicit ``module_source_base`` wins (nothing vendored); a local one without the
  modules is refused at validate;
* a tree copied anywhere (no ``tfmodules`` next to it) renders.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest
import yaml

from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError
from ansible_collections.csis.infra.plugins.module_utils.csis.render import bundled_modules
from ansible_collections.csis.infra.plugins.module_utils.csis.render import pipeline as service
from ansible_collections.csis.infra.plugins.module_utils.csis.render.plan import VENDORED_MODULES
from ansible_collections.csis.infra.plugins.module_utils.csis.render.writer import MANIFEST

import render_trees as rt

REPO = rt.REPO_ROOT
TFMODULES = os.path.join(REPO, "tfmodules")
SOURCE = re.compile(r'^\s*source\s*=\s*"([./][^"]*)"', re.M)  # module calls (not provider sources)


def _sources(root: str):
    """(root directory, module source) of every module call under generated/."""
    out = []
    for base, dirs, names in os.walk(os.path.join(root, "generated")):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for n in names:
            if n.endswith(".tf"):
                with open(os.path.join(base, n), encoding="utf-8") as fh:
                    out.extend((base, s) for s in SOURCE.findall(fh.read()))
    return out


def test_bundle_is_tfmodules_and_the_galaxy_version() -> None:
    on_disk = {rel.replace(os.sep, "/"): data.decode() for rel, data in rt.files_under(TFMODULES).items()
               if not os.path.basename(rel).startswith(".")}
    assert bundled_modules.FILES == on_disk, "stale: run scripts/bundle-tfmodules"
    with open(os.path.join(REPO, "galaxy.yml"), encoding="utf-8") as fh:
        assert bundled_modules.VERSION == yaml.safe_load(fh)["version"], "stale: run scripts/bundle-tfmodules"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bundle-tfmodules"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_render_vendors_the_modules_once_and_roots_call_them_inside_the_tree(tmp_path: Any) -> None:
    root = rt.copy_tree("examples", str(tmp_path / "elsewhere"))
    assert not os.path.exists(str(tmp_path / "elsewhere" / "tfmodules"))
    res = service.render(root, rt.LIFECYCLES, dry_run=True, prepare=False)
    vendored = os.path.join(root, VENDORED_MODULES)
    assert res["modules"] == {"directory": vendored, "version": bundled_modules.VERSION, "changed": True}
    assert VENDORED_MODULES == os.path.join("generated", ".modules", bundled_modules.VERSION)
    got = {rel.replace(os.sep, "/"): data.decode() for rel, data in rt.files_under(vendored).items()}
    assert got == bundled_modules.FILES
    sources = _sources(root)
    assert len(sources) >= 5
    for directory, src in sources:
        assert src.startswith("../"), src  # relative: the tree moves as a whole
        target = os.path.normpath(os.path.join(directory, src))
        assert target.startswith(vendored + os.sep) and os.path.isdir(target), (directory, src)

    # unchanged: nothing rewritten (same inode), not reported as a change
    inode = os.stat(os.path.join(vendored, "aws_storage_ebs", "main.tf")).st_ino
    again = service.render(root, rt.LIFECYCLES, dry_run=True, prepare=False)
    assert again["changed"] is False and again["modules"]["changed"] is False
    assert os.stat(os.path.join(vendored, "aws_storage_ebs", "main.tf")).st_ino == inode

    # a hand-edited or stray file is put back: the directory holds exactly the bundle
    with open(os.path.join(vendored, "aws_storage_ebs", "main.tf"), "a", encoding="utf-8") as fh:
        fh.write("# edited\n")
    with open(os.path.join(vendored, "stray.tf"), "w", encoding="utf-8") as fh:
        fh.write("# stray\n")
    checked = service.render(root, rt.LIFECYCLES, dry_run=True, prepare=False, check_mode=True)
    assert checked["modules"]["changed"] is True
    assert os.path.exists(os.path.join(vendored, "stray.tf"))  # check mode writes nothing
    fixed = service.render(root, rt.LIFECYCLES, dry_run=True, prepare=False)
    assert fixed["changed"] is True and fixed["modules"]["changed"] is True
    got = {rel.replace(os.sep, "/"): data.decode() for rel, data in rt.files_under(vendored).items()}
    assert got == bundled_modules.FILES
    # no staging debris beside it
    assert sorted(os.listdir(os.path.dirname(vendored))) == [bundled_modules.VERSION]


def test_the_diff_shows_every_file_the_render_writes(tmp_path: Any) -> None:
    """--diff (and --check --diff) shows the vendored modules and generated/.gitignore too, not only
    the roots' files: what check mode predicts is what the real run then writes."""
    root = rt.copy_tree("examples", str(tmp_path / "tree"))
    vendored = os.path.join(root, VENDORED_MODULES)
    gitignore = os.path.join(root, "generated", ".gitignore")
    checked = service.render(root, rt.LIFECYCLES, dry_run=True, prepare=False, check_mode=True, want_diff=True)
    assert not os.path.exists(os.path.join(root, "generated"))  # check mode wrote nothing
    headers = {d["before_header"]: d for d in checked["diff"]}
    for rel, text in bundled_modules.FILES.items():
        entry = headers[os.path.join(vendored, *rel.split("/"))]
        assert (entry["before"], entry["after"]) == ("", text)
    assert headers[gitignore]["before"] == "" and headers[gitignore]["after"].startswith("# written by csis.infra")

    real = service.render(root, rt.LIFECYCLES, dry_run=True, prepare=False, want_diff=True)
    assert [d["before_header"] for d in real["diff"]] == [d["before_header"] for d in checked["diff"]]
    written = {os.path.join(base, n) for base, _dirs, names in os.walk(os.path.join(root, "generated")) for n in names
               if n != MANIFEST}  # the roots' own file list: bookkeeping, not a generated file
    assert written <= set(headers), sorted(written - set(headers))[:5]

    # a hand-edited module file and a stray one: the diff shows both put back
    edited = os.path.join(vendored, "aws_storage_ebs", "main.tf")
    with open(edited, "a", encoding="utf-8") as fh:
        fh.write("# edited\n")
    with open(os.path.join(vendored, "stray.tf"), "w", encoding="utf-8") as fh:
        fh.write("# stray\n")
    again = service.render(root, rt.LIFECYCLES, dry_run=True, prepare=False, check_mode=True, want_diff=True)
    assert {(d["before_header"], d["after_header"]) for d in again["diff"]} == {
        (edited, edited), (os.path.join(vendored, "stray.tf"), "/dev/null")}
    assert again["changed"] is True


def test_an_explicit_module_source_base_wins(tmp_path: Any) -> None:
    root = rt.copy_tree("examples", str(tmp_path))
    cfg = os.path.join(root, "cfg", "_config.yml")
    with open(cfg, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    doc["config"]["module_source_base"] = TFMODULES
    with open(cfg, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh)
    res = service.render(root, rt.LIFECYCLES, dry_run=True, prepare=False)
    assert res["modules"] is None
    assert not os.path.exists(os.path.join(root, "generated", ".modules"))
    for directory, src in _sources(root):
        assert os.path.normpath(os.path.join(directory, src)).startswith(TFMODULES + os.sep), src


def test_validate_refuses_a_local_module_source_without_the_modules(tmp_path: Any) -> None:
    """A local base that exists but lacks a module the builders call (the missing directory
    itself is the corpus case tests/bad_inputs/module-source-base-missing.yaml)."""
    root = rt.copy_tree("examples", str(tmp_path))
    partial = tmp_path / "partial-modules"
    (partial / "aws_storage_ebs").mkdir(parents=True)
    cfg = os.path.join(root, "cfg", "_config.yml")
    with open(cfg, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    doc["config"]["module_source_base"] = "../partial-modules"
    with open(cfg, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh)
    with pytest.raises(ConfigError) as err:
        load_and_validate(root, run_version=lambda binary: ("1.9.0", None))
    got = [(p.file, p.key, p.message) for p in err.value.problems]
    assert got == [("cfg/_config.yml", "config.module_source_base",
                    "'../partial-modules' has no module '%s' (a directory ../partial-modules/%s)" % (n, n))
                   for n in ("aws_instance", "aws_storage_efs", "aws_storage_s3", "identity_groups")]
    # a module URL is terraform's to fetch: not checked
    doc["config"]["module_source_base"] = "git::https://example.invalid/modules.git//tfmodules"
    with open(cfg, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh)
    load_and_validate(root, run_version=lambda binary: ("1.9.0", None))
