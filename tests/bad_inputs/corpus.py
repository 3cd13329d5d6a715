# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The bad-input corpus: one YAML file per case, each a small mutation of ``examples/``.

A case file::

    description: what is wrong
    mutate:                                   # applied in order to a copy of examples/
      - file: storages/storage0.yaml
        set: {storages.0.share_mode: "2700"}  # dotted path (list indices are numbers) -> value
      - file: instances/instances.yaml
        delete: [instances.0.storages]        # dotted paths to remove
      - file: storages/storage0.yaml
        append: {storages: {name: x}}         # dotted path of a list -> entry to append
      - file: cfg/_config.yml
        replace_text: {"use_state_backends: true": "use_state_backends: false"}  # literal, must match
      - file: cfg/executables.yml
        write: "executables: [\n"             # the whole text of the file (created if missing)
      - file: cfg/runtime-builders.yml
        remove: true                          # delete the file
    meta:                                     # optional: meta-state files written before the run
      storage-state.yaml: {storages: {mnt_data: {state: active}}}
    overlays: [overlays/x.yml]                # optional: overlay files (relative to the root)
    undeclare: [test]                         # optional: instances undeclared for the run
    versions: {terraform: ["1.9.0", null]}    # optional: stubbed `<binary> version -json`
                                              # (binary -> [version, error]); "real" = run it
    vault: {password: x}                      # optional: the run's vault password (null: none given);
                                              # the tree's !vault values are decrypted with it as the
                                              # controller does (vault_rules)
    playbook: true                            # optional: also run through ansible-playbook
                                              # (given no vault secret)
    expect:                                   # EXACTLY these problems (any order);
                                              # {terraform_version} = what the real binary reports
      - {file: storages/storage0.yaml, key: "storages[0] (mnt_data).share_mode", message: "..."}

Set-valued YAML is written back with ``yaml.safe_dump`` (comments are lost, which
does not matter to validation). The runner hashes the whole tree (including
``generated/`` and ``meta-state/``) before and after the run; the test asserts they
are identical.
"""
from __future__ import annotations

import glob
import hashlib
import os
import shutil
from typing import Any, Dict, List, Optional, Tuple

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(REPO, "examples")

#: the stubbed executable answers when a case names none: every binary reports 1.9.0
DEFAULT_VERSION = ("1.9.0", None)


def case_files() -> List[str]:
    return sorted(glob.glob(os.path.join(HERE, "*.yaml")))


def load_case(path: str) -> Dict[str, Any]:
    with open(path, "r", encoding="utf-8") as fh:
        case = yaml.safe_load(fh)
    assert isinstance(case, dict) and case.get("description") and "expect" in case, path
    return case


#: run artefacts a demo run may have left in examples/: never part of a test's tree
RUN_ARTEFACTS = ("meta-state", "state", ".terraform", "unmount-receipts", "generated")
#: a previous render of examples/ (the checked-in golden), laid in as the tree's generated/
GOLDEN = os.path.join(os.path.dirname(EXAMPLES), "tests", "golden", "examples")


def copy_examples(dest: str) -> str:
    """A copy of examples/ as shipped (without anything a run of the example may have
    left there), with a previous render (the golden) as its generated/."""
    from trees import copy_as_shipped

    copy_as_shipped(EXAMPLES, dest)
    shutil.copytree(GOLDEN, os.path.join(dest, "generated"))
    return dest


def _split(path: str) -> List[Any]:
    return [int(p) if p.lstrip("-").isdigit() else p for p in str(path).split(".")]


def _walk(data: Any, parts: List[Any]) -> Any:
    cur = data
    for p in parts:
        cur = cur[p]
    return cur


def _read(full: str) -> Any:
    with open(full, "r", encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _write(full: str, data: Any) -> None:
    with open(full, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=False, default_flow_style=False, allow_unicode=True)


def apply_mutation(root: str, mut: Dict[str, Any]) -> None:
    rel = mut["file"]
    full = os.path.join(root, rel)
    if mut.get("remove"):
        os.remove(full)
        return
    if "write" in mut:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as fh:
            fh.write(mut["write"])
        return
    if "replace_text" in mut:
        with open(full, "r", encoding="utf-8") as fh:
            text = fh.read()
        for old, new in mut["replace_text"].items():
            assert old in text, "replace_text: %r not in %s" % (old, rel)
            text = text.replace(old, new)
        with open(full, "w", encoding="utf-8") as fh:
            fh.write(text)
        return
    data = _read(full)
    for path, value in (mut.get("set") or {}).items():
        parts = _split(path)
        _walk(data, parts[:-1])[parts[-1]] = value
    for path in mut.get("delete") or []:
        parts = _split(path)
        del _walk(data, parts[:-1])[parts[-1]]
    for path, value in (mut.get("append") or {}).items():
        _walk(data, _split(path)).append(value)
    _write(full, data)


def write_meta(root: str, meta: Dict[str, Any]) -> None:
    d = os.path.join(root, "meta-state")
    os.makedirs(d, exist_ok=True)
    for name, data in meta.items():
        _write(os.path.join(d, name), data)


def prepare(case: Dict[str, Any], dest: str) -> str:
    root = copy_examples(dest)
    for mut in case.get("mutate") or []:
        apply_mutation(root, mut)
    if case.get("meta"):
        write_meta(root, case["meta"])
    return root


def tree_hash(root: str) -> Dict[str, str]:
    """Path -> sha256 of every file and directory under ``root`` (directories as 'dir')."""
    out: Dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def version_stub(case: Dict[str, Any]):
    """The ``run_version`` for a case: None (run the real binary) or a stub."""
    versions = case.get("versions")
    if versions == "real":
        return None
    table: Dict[str, Tuple[Optional[str], Optional[str]]] = {
        k: (v[0], v[1]) for k, v in (versions or {}).items()}

    def run(binary: str) -> Tuple[Optional[str], Optional[str]]:
        return table.get(binary, DEFAULT_VERSION)
    return run


def _real_terraform_version() -> str:
    import json
    import subprocess
    env = dict(os.environ, CHECKPOINT_DISABLE="1")
    env.pop("TF_CLI_CONFIG_FILE", None)
    out = subprocess.run(["terraform", "version", "-json"], capture_output=True, text=True, env=env, check=True)
    return str(json.loads(out.stdout)["terraform_version"])


def expected(case: Dict[str, Any]) -> List[Tuple[str, str, str]]:
    """The expected problems; ``{terraform_version}`` in a message is the real binary's."""
    out = []
    for e in case["expect"]:
        msg = e["message"]
        if "{terraform_version}" in msg:
            msg = msg.replace("{terraform_version}", _real_terraform_version())
        out.append((e["file"], e.get("key", ""), msg))
    return sorted(out)


def problem_line(file: str, key: str, message: str) -> str:
    """How the playbook prints a problem (Problem.__str__)."""
    if not file:
        return message
    return "%s: %s" % (file + (": " + key if key else ""), message)


def vault_rules(case: Dict[str, Any]) -> List[Any]:
    """``extra`` rules of ``load_and_validate`` for a case with ``vault:``: the tree's !vault values
    decrypted with the case's password (none given: ``password: null``), as the controller's
    action plugins do (plugins/plugin_utils/vault.py) before a tree-loading module runs."""
    if "vault" not in case:
        return []
    from ansible.parsing.vault import VaultLib, VaultSecret
    from ansible_collections.csis.infra.plugins.module_utils.csis.config import secrets

    password = (case.get("vault") or {}).get("password")
    vault = VaultLib([("default", VaultSecret(password.encode()))]) if password is not None else None

    def decrypt(ciphertext: str) -> str:
        if vault is None:
            raise secrets.VaultSecretMissing()
        return vault.decrypt(ciphertext).decode()

    def rule(validation: Any) -> None:
        validation.problems.extend(secrets.vault_problems(validation.t.vaulted, decrypt))
    return [rule]
