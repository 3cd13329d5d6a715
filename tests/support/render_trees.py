# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Configuration trees the render tests use, always as copies in a temporary directory.

No tree sets ``module_source_base``: the roots call the collection's own modules, which
csis_render copies into the tree's ``generated/.modules/<version>/``.
"""
from __future__ import annotations

import hashlib
import os
from typing import Dict, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TREES = {
    "examples": os.path.join(REPO_ROOT, "examples"),
    "variations": os.path.join(REPO_ROOT, "tests", "fixtures", "variations"),
    "nobackend": os.path.join(REPO_ROOT, "tests", "fixtures", "nobackend"),
}
LIFECYCLES = ["identity", "storage", "instance-image"]
GOLDEN_DIR = os.path.join(REPO_ROOT, "tests", "golden", "examples")

#: a value that holds every character HCL or a template could take for syntax
NASTY = 'say "hi" \\ back\\slash ${not_interp} %{ if x }directive%{ endif } $${x} %%{y} end$ 100%'


def copy_tree(name: str, dest_parent: str, target_name: Optional[str] = None) -> str:
    """Copy tree ``name`` to ``dest_parent/<target_name or name>`` (without any ``generated/``
    or run output); return the copy's path."""
    from trees import copy_as_shipped

    dest = os.path.join(dest_parent, target_name or name)
    copy_as_shipped(TREES[name], dest, keep_meta_state=(name != "examples"))
    for readme in (os.path.join(dest, "README.md"),):
        if os.path.exists(readme):
            os.remove(readme)
    return dest


def files_under(top: str) -> Dict[str, bytes]:
    """relative path -> bytes of every file under ``top`` (skipping terraform run output)."""
    out: Dict[str, bytes] = {}
    if not os.path.isdir(top):
        return out
    for base, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != ".terraform")
        for n in sorted(names):
            if n == ".terraform.lock.hcl":
                continue
            p = os.path.join(base, n)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, top)] = fh.read()
    return out


def tree_hash(top: str) -> str:
    """A hash of every file (names, bytes, modes) and directory under ``top``, all of it."""
    h = hashlib.sha256()
    if not os.path.exists(top):
        return "absent"
    for base, dirs, names in os.walk(top):
        dirs.sort()
        h.update(b"D" + os.path.relpath(base, top).encode() + b"\0")
        for n in sorted(names):
            p = os.path.join(base, n)
            st = os.lstat(p)
            h.update(b"F" + os.path.relpath(p, top).encode() + b"\0" + str(st.st_mode).encode())
            if os.path.islink(p):
                h.update(os.readlink(p).encode())
            else:
                with open(p, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()


def write_escaping_tree(dest_parent: str, name: str = "escaping") -> str:
    """The no-backend tree with tags, descriptions and userdata full of quotes, backslashes,
    newlines, ``${...}`` and ``%{...}``."""
    root = copy_tree("nobackend", dest_parent, name)
    import yaml

    instances = {"instances": [{
        "name": "solo.box",
        "image": "solo-img",
        "description": 'a "quoted"\\ description\nwith ${interp} and %{ if true }directives%{ endif }',
        "tags": escaping_tags(),
        "userdata": escaping_userdata(),
    }]}
    storages = {"storages": [
        {"name": "scratch", "type": "solo-ebs", "description": NASTY + "\nline two", "tags": escaping_tags()},
        {"name": "solo-logs", "type": "solo-s3", "description": "${x} %{y} \"z\" \\", "tags": {"Owner": NASTY}},
    ]}
    with open(os.path.join(root, "instances", "instances.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(instances, fh, sort_keys=False, allow_unicode=True)
    with open(os.path.join(root, "storages", "storages.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(storages, fh, sort_keys=False, allow_unicode=True)
    return root


def escaping_tags() -> Dict[str, str]:
    return {
        "Name": 'box "one"',
        "Backslash": "C:\\path\\to\\${HOME}",
        "Multi": "line one, two; and (three)",
        "Interp": "${var.secret}",
        "Directive": "%{ for x in y }${x}%{ endfor }",
        "Escaped": "$${already} %%{escaped}",
        "Dollar": "cost $5 and 100%",
        'we"ird key': "v",
        "for": "a key that is an HCL keyword",
        "${key}": "interpolated key",
        "unicode": "caf\u00e9 \u2603",
    }


def escaping_userdata() -> str:
    return (
        'echo "quoted ${HOME} and $${literal} and %{ if x }not a directive%{ endif }"\n'
        "printf '%s\\n' \"back\\\\slash\" 'single \\' quote'\n"
        'cat <<\'EOF\' > /etc/motd\n'
        'Welcome to ${HOSTNAME}; 100% %{ for } $$ %%\n'
        'EOF\n'
        "echo tail$\n"
    )
