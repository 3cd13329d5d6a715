# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Issue 16, defect 3: a truncated meta-state file is refused everywhere, never rebuilt.

The reproduction of the issue, on a copy of ``examples/`` applied for real once (``site.yml``:
real terraform and provider, the session's moto server): ``launch-params.yaml`` is cut to half
its size, then ``validate.yml``, the inventory (``ansible-inventory --list``), ``state_query.yml``
(the drift report) and a real ``instance_image.yml`` run must each refuse it with the file's name
and the reason, and leave every meta-state file byte-identical. An emptied file is refused the
same way (it used to be an empty inventory).

The copy gets its own ``id`` (``csis_config`` tag), state key and bucket name, so other tests
on the shared moto server never look foreign to it, nor it to them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402
from trees import replace_text  # noqa: E402

pytestmark = e2e.needs_terraform()

TAG = "csis-damage"
BUCKET = "csis-damage-default-bucket"
LP = "launch-params.yaml"
INVENTORY_BIN = os.path.join(e2e.VENV_BIN, "ansible-inventory")


def _copy_tree(parent: str) -> str:
    root = e2e.copy_example_tree(parent)
    for rel, old, new in (("cfg/_config.yml", "id: csis-example", "id: %s" % TAG),
                          ("cfg/state-backends.yml", "statefiles/csis-example", "statefiles/%s" % TAG),
                          ("cfg/storage-builders.yml", "csis-example-default-bucket", BUCKET),
                          ("storages/storage0.yaml", "csis-example-default-bucket", BUCKET)):
        replace_text(os.path.join(root, rel), old, new)
    # only the EBS volume the instance mounts: no S3 bucket (its lifecycle costs the provider's
    # 55 s waiter) and no EFS, which this test does not need
    e2e.write_yaml(os.path.join(root, "storages", "storage0.yaml"), {"storages": [
        {"name": "mnt_data", "mount_point": "/mnt/data", "is_default": True, "groups": ["coops"], "state": "active"}]})
    return root


def _flat(text: str) -> str:
    """Output with whitespace collapsed (the callback wraps long messages)."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def applied(moto_endpoint, tmp_path_factory):
    parent = str(tmp_path_factory.mktemp("damage"))
    root = _copy_tree(parent)
    run = e2e.run_playbook("site.yml", root, moto_endpoint.env, overlays=[moto_endpoint.overlay_path, e2e.APPLY_ALL],
                           log=os.path.join(parent, "site.log"))
    assert run.rc == 0, run.tail()
    lp = e2e.meta(root, LP)["instances"]
    assert lp["test2"]["launched"] is True, lp
    source = os.path.join(parent, "hosts.csis.yml")
    with open(source, "w", encoding="utf-8") as fh:
        yaml.safe_dump({"plugin": "csis.infra.meta_state", "config_root": root}, fh)
    return {"root": root, "parent": parent, "source": source}


def _inventory(source: str) -> subprocess.CompletedProcess:
    env = e2e.run_env({}, {"ANSIBLE_CONFIG": os.path.join(e2e.REPO, "ansible.cfg"),
                           "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "1"})
    return subprocess.run([INVENTORY_BIN, "-i", source, "--list"], cwd=e2e.REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def _runs(applied: Dict[str, Any], ep: Any) -> List[Any]:
    root = applied["root"]
    over = [ep.overlay_path, e2e.APPLY_ALL]
    return [
        ("validate.yml", e2e.run_playbook("validate.yml", root, ep.env, overlays=over, dry_run=None)),
        ("state_query.yml", e2e.run_playbook("state_query.yml", root, ep.env, overlays=over, dry_run=None)),
        ("instance_image.yml", e2e.run_playbook("instance_image.yml", root, ep.env, overlays=over)),
    ]


def test_the_inventory_lists_the_launched_hosts_first(applied):
    proc = _inventory(applied["source"])
    assert proc.returncode == 0, proc.stderr
    assert "test2" in json.loads(proc.stdout)["_meta"]["hostvars"]


def _record(root: str) -> tuple:
    """(the path of test2's launch-params record, its name in messages): one file per record (issue 10)."""
    return os.path.join(root, "meta-state", "launch-params", "test2.yaml"), "launch-params/test2.yaml"


def test_a_launch_params_file_cut_to_half_is_refused_everywhere_and_left_as_it_is(applied, moto_endpoint):
    root = applied["root"]
    path, shown = _record(root)
    with open(path, "rb") as fh:
        whole = fh.read()
    half = whole[:len(whole) // 2]
    with open(path, "wb") as fh:
        fh.write(half)
    before = e2e.meta_state_digest(root)
    reason = "meta-state/%s: is incomplete: it stops at byte %d without its end line" % (shown, len(half))
    try:
        proc = _inventory(applied["source"])
        assert proc.returncode != 0
        assert "csis.infra.meta_state: %s/%s" % (root, reason) in _flat(proc.stderr), proc.stderr
        for playbook, run in _runs(applied, moto_endpoint):
            assert run.rc != 0, (playbook, run.tail())
            out = _flat(run.out)
            assert reason in out, (playbook, run.tail())
            assert "is valid" not in out and "foreign" not in out, (playbook, run.tail())
            assert "terraform apply" not in out and "Apply complete" not in out, (playbook, run.tail())
            assert e2e.meta_state_digest(root) == before, playbook
        with open(path, "rb") as fh:
            assert fh.read() == half
    finally:
        with open(path, "wb") as fh:
            fh.write(whole)
    proc = _inventory(applied["source"])
    assert proc.returncode == 0 and "test2" in json.loads(proc.stdout)["_meta"]["hostvars"], proc.stderr


def test_an_emptied_file_is_no_empty_inventory(applied):
    root = applied["root"]
    path, shown = _record(root)
    with open(path, "rb") as fh:
        whole = fh.read()
    with open(path, "wb"):
        pass
    try:
        proc = _inventory(applied["source"])
        assert proc.returncode != 0
        assert "%s/meta-state/%s: is empty (0 bytes), but csis.infra never writes an empty meta-state file" % (
            root, shown) in _flat(proc.stderr), proc.stderr
        assert os.path.getsize(path) == 0
    finally:
        with open(path, "wb") as fh:
            fh.write(whole)
