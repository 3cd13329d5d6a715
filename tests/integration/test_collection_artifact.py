# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The collection as users get it (issue 11, items 1, 5 and 6).

* the artifact of ``ansible-galaxy collection build`` ships what users need and nothing
  of the development tree (tests, golden files, benchmarks, scripts, ansible.cfg, CI,
  molecule, linters' configuration, the dev requirements.txt);
* ``ansible-builder create`` makes the execution environment's build context (no image,
  no network) from ``execution-environment.yml`` with that artifact;
* the artifact installed into a temporary collections path (``ansible-galaxy collection
  install -p``; community.general and amazon.aws from .venv's ansible package) runs the
  collection playbook ``csis.infra.storage`` on a copy of ``examples/`` outside the
  checkout, with no ``tfmodules`` next to it and no ansible.cfg: a dry run (render, init,
  validate), then a real one-EBS-volume apply against the session's moto endpoint; the
  rendered tree moved to another directory still plans (no changes).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from typing import List, Optional

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import artifact as artifact_support  # noqa: E402  (tests/support/artifact.py: build and install, shared)
import e2e  # noqa: E402

REPO = e2e.REPO
GALAXY_BIN = artifact_support.GALAXY_BIN
BUILDER_BIN = os.path.join(e2e.VENV_BIN, "ansible-builder")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.exists(GALAXY_BIN), reason="needs the project venv"),
]


_version = artifact_support.version
_outside_env = artifact_support.outside_env


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The built artifact (tests/support/artifact.py: once per session, shared with test_awx_runner.py)."""
    return artifact_support.session_collection(tmp_path_factory)[0]


@pytest.fixture(scope="module")
def installed(artifact: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The artifact installed into a fresh collections path; its dependencies resolve
    (offline) to the community.general and amazon.aws of .venv's ansible package."""
    cpath = artifact_support.session_collection(tmp_path_factory)[1]
    env = _outside_env({"ANSIBLE_COLLECTIONS_PATH": cpath})
    listed = subprocess.run([GALAXY_BIN, "collection", "list", "csis.infra", "--format", "json"], cwd=cpath, env=env,
                            capture_output=True, text=True, check=False)
    assert listed.returncode == 0, listed.stderr
    assert list(json.loads(listed.stdout)) == [os.path.join(cpath, "ansible_collections")], listed.stdout
    return cpath


# ------------------------------------------------------------------ item 6: the artifact
def test_the_artifact_ships_only_what_users_need(artifact: str) -> None:
    with tarfile.open(artifact) as tf:
        names = [n[2:] if n.startswith("./") else n for n in tf.getnames()]
    top = {n.split("/", 1)[0] for n in names}
    for want in ("plugins/modules/csis_render.py", "plugins/module_utils/csis/render/bundled_modules.py",
                 "plugins/inventory/meta_state.py", "roles/render/tasks/main.yml", "roles/tofu_root/tasks/main.yml",
                 "playbooks/storage.yml", "playbooks/lifecycle.yml", "playbooks/awx_configure.yml",
                 "docs/awx-project/collections/requirements.yml", "docs/awx-project/playbooks/storage.yml", "tfmodules/aws_storage_ebs/main.tf",
                 "meta/runtime.yml", "meta/execution-environment.yml", "meta/ee-requirements.txt", "meta/ee-bindep.txt",
                 "docs/configuration.md", "README.md", "LICENSE", "changelogs/changelog.yaml",
                 "examples/cfg/_config.yml", "MANIFEST.json", "FILES.json"):
        assert want in names, want
    assert top <= {"plugins", "roles", "playbooks", "tfmodules", "meta", "docs", "examples", "changelogs",
                   "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.json", "FILES.json"}, sorted(top)
    for gone in ("tests", "benchmarks", "scripts", "ansible.cfg", "pytest.ini", "requirements.txt", "galaxy.yml",
                 "execution-environment.yml", "ee", ".ci", ".venv", ".local", ".git", ".gitignore", ".ansible-lint",
                 ".ansible-lint-ignore", ".hypothesis", ".pytest_cache", "dist", "context", "extensions"):
        assert gone not in top, gone
    for n in names:
        parts = n.split("/")
        assert not any(p.startswith(".") for p in parts), n  # nothing hidden anywhere
        assert "__pycache__" not in parts and not n.endswith((".pyc", ".tar.gz")), n
        assert not n.startswith(("extensions/molecule", "changelogs/fragments", "examples/generated",
                                 "examples/meta-state", "examples/state", "examples/unmount-receipts")), n
        assert "golden" not in parts, n
    with tarfile.open(artifact) as tf:
        manifest = json.load(tf.extractfile("MANIFEST.json"))
    deps = manifest["collection_info"]["dependencies"]
    assert set(deps) == {"community.general", "amazon.aws"}, deps


# ------------------------------------------------------------------ item 5: the execution environment
@pytest.mark.skipif(not os.path.exists(BUILDER_BIN), reason="needs ansible-builder in .venv (requirements.txt)")
def test_ansible_builder_creates_the_execution_environment_context(artifact: str, tmp_path) -> None:
    """``ansible-builder create`` from a copy of the EE definition (nothing written into the checkout)."""
    work = str(tmp_path / "ee-build")
    os.makedirs(os.path.join(work, "dist"))
    shutil.copy(os.path.join(REPO, "execution-environment.yml"), work)
    for d in ("ee", "meta"):
        shutil.copytree(os.path.join(REPO, d), os.path.join(work, d))
    shutil.copy(artifact, os.path.join(work, "dist", "csis-infra.tar.gz"))
    proc = subprocess.run([BUILDER_BIN, "create", "-f", "execution-environment.yml", "-c", "context",
                           "--output-filename", "Containerfile"],
                          cwd=work, env=_outside_env(), capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ctx = os.path.join(work, "context")
    with open(os.path.join(ctx, "Containerfile"), encoding="utf-8") as fh:
        containerfile = fh.read()
    build = os.path.join(ctx, "_build")

    # the requirement files are in the context and the Containerfile uses them
    for n in ("requirements.yml", "requirements.txt", "bindep.txt"):
        assert os.path.isfile(os.path.join(build, n)), n
    assert "COPY _build/requirements.txt requirements.txt" in containerfile
    assert "COPY _build/bindep.txt bindep.txt" in containerfile
    assert "ansible-galaxy collection install" in containerfile and "-r requirements.yml" in containerfile
    assert "ansible-core>=2.17,<2.20" in containerfile and "ansible-runner" in containerfile

    # galaxy: csis.infra from the artifact, and every collection galaxy.yml depends on
    with open(os.path.join(build, "requirements.yml"), encoding="utf-8") as fh:
        galaxy = yaml.safe_load(fh)["collections"]
    by_name = {c["name"]: c for c in galaxy}
    art = by_name["collections/csis-infra.tar.gz"]
    assert art["type"] == "file"
    assert os.path.isfile(os.path.join(build, "collections", "csis-infra.tar.gz"))
    with open(os.path.join(REPO, "galaxy.yml"), encoding="utf-8") as fh:
        deps = yaml.safe_load(fh)["dependencies"]
    for name, spec in deps.items():
        assert by_name[name]["version"] == spec, name

    # python and system requirements: the collection's run-time needs, not the dev set
    with open(os.path.join(build, "requirements.txt"), encoding="utf-8") as fh:
        pyreqs = {line.split(">")[0].split("=")[0].split("<")[0].strip().lower()
                  for line in fh if line.strip() and not line.startswith("#")}
    assert pyreqs == {"pydantic", "pyyaml", "boto3", "botocore"}, pyreqs
    with open(os.path.join(REPO, "meta", "execution-environment.yml"), encoding="utf-8") as fh:
        meta_ee = yaml.safe_load(fh)
    assert meta_ee["dependencies"] == {"python": "meta/ee-requirements.txt", "system": "meta/ee-bindep.txt"}
    with open(os.path.join(build, "bindep.txt"), encoding="utf-8") as fh:
        assert "unzip" in fh.read()

    # terraform and the provider mirror, installed in an additional build step
    assert os.path.isfile(os.path.join(build, "ee", "install-terraform.sh"))
    assert os.path.isfile(os.path.join(build, "ee", "providers.tf"))
    assert 'RUN /bin/sh /build/ee/install-terraform.sh "$TERRAFORM_VERSION" "$TERRAFORM_ARCH"' in containerfile
    assert "ENV CSIS_PROVIDER_MIRROR=/usr/share/terraform/plugins" in containerfile
    with open(os.path.join(build, "ee", "install-terraform.sh"), encoding="utf-8") as fh:
        script = fh.read()
    assert "sha256sum -c" in script and "terraform providers mirror" in script
    assert containerfile.index("install-terraform.sh") > containerfile.index("FROM base AS final")


# ------------------------------------------------------------------ item 1: trees anywhere
def _collection_playbook(installed: str, root: str, ep, dry_run: bool, key: str, log: str,
                         cfg: Optional[str] = None):
    ev = {"csis_config_root": root, "csis_overlays": [ep.overlay_path, e2e.APPLY_ALL], "csis_dry_run": dry_run,
          "csis_auto_approve": True}
    env = _outside_env(dict(ep.env, ANSIBLE_COLLECTIONS_PATH=installed, **({"ANSIBLE_CONFIG": cfg} if cfg else {})))
    cwd = os.path.dirname(root)  # outside the checkout: no ansible.cfg applies (but ``cfg``, when given)
    proc = subprocess.run([e2e.PLAYBOOK_BIN, "csis.infra.storage", "-e", json.dumps(ev)], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=1800, check=False)
    out = proc.stdout.decode("utf-8", "replace")
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(out)
    return proc.returncode, out


def _warnings(out: str) -> List[str]:
    return [line for line in out.splitlines() if line.startswith(("[WARNING]", "[DEPRECATION WARNING]"))]


def _readme_ansible_cfg() -> str:
    """The README's ``ansible.cfg`` for runs of the installed collection (its one ini block)."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        blocks = re.findall(r"^```ini\n(.*?)^```$", fh.read(), re.M | re.S)
    assert len(blocks) == 1, blocks
    return blocks[0]


@pytest.mark.skipif(shutil.which("terraform") is None, reason="needs terraform on PATH")
def test_the_installed_collection_runs_a_tree_outside_the_checkout(installed: str, tmp_path, moto_endpoint) -> None:
    ep = moto_endpoint
    parent = str(tmp_path / "users-home")
    os.makedirs(parent)
    key = "installed-%s" % uuid.uuid4().hex[:8]
    root = e2e.make_ebs_tree(parent, key, name="my-tree")
    assert not os.path.lexists(os.path.join(parent, "tfmodules")) and not root.startswith(REPO + os.sep)
    version = _version()

    # 1. dry run: renders (vendoring the installed collection's modules), init -backend=false, validate
    rc, out = _collection_playbook(installed, root, ep, True, key, str(tmp_path / "dry.log"))
    assert rc == 0, out[-6000:]
    assert "dry run: nothing is planned or applied" in out
    # with no ansible.cfg, Ansible's two warnings of a run without inventory, which the README
    # names; nothing of the collection's own (its roots' play, with no host in a dry run, is
    # skipped without "Could not match supplied host pattern")
    assert _warnings(out) == ["[WARNING]: No inventory was parsed, only implicit localhost is available",
                              "[WARNING]: provided hosts list is empty, only localhost is available. Note that the "
                              "implicit localhost does not match 'all'"], out[-6000:]
    assert "skipping: no hosts matched" in out
    # ... and the README's ansible.cfg for the installed collection silences those two
    cfg = str(tmp_path / "ansible.cfg")
    with open(cfg, "w", encoding="utf-8") as fh:
        fh.write(_readme_ansible_cfg())
    rc, out = _collection_playbook(installed, root, ep, True, key, str(tmp_path / "dry-cfg.log"), cfg=cfg)
    assert rc == 0, out[-6000:]
    assert _warnings(out) == [], out[-6000:]
    vendored = os.path.join(root, "generated", ".modules", version)
    shipped = os.path.join(installed, "ansible_collections", "csis", "infra", "tfmodules")
    for module in os.listdir(shipped):
        for n in os.listdir(os.path.join(shipped, module)):
            with open(os.path.join(shipped, module, n), encoding="utf-8") as a, \
                    open(os.path.join(vendored, module, n), encoding="utf-8") as b:
                assert a.read() == b.read(), (module, n)
    ebs_root = os.path.join(root, "generated", "storage", "aws-ebs", "storage-generation")
    with open(os.path.join(ebs_root, "aws-ebs-storage-generation-storage-mnt_data.tf"), encoding="utf-8") as fh:
        assert 'source = "../../../.modules/%s/aws_storage_ebs"' % version in fh.read()
    assert os.path.isfile(os.path.join(ebs_root, ".terraform", "csis-prepared.json"))  # init + validate passed
    assert REPO not in out

    # 2. a real run: plan, gate, apply and record the one EBS volume at the session's endpoint
    rc, out = _collection_playbook(installed, root, ep, False, key, str(tmp_path / "apply.log"))
    assert rc == 0, out[-6000:]
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState
    recs = MetaState(root).load("storage-state.yaml")["storages"]  # through the store, whatever its layout
    assert recs["mnt_data"]["state"] == "active", recs
    vid = recs["mnt_data"]["facts"]["volume_id"]
    assert ep.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"][0]["Size"] == 100

    # 3. portability: the rendered tree moved elsewhere plans, with no change, from a fresh init
    moved_parent = str(tmp_path / "another-machine" / "checkout")
    os.makedirs(moved_parent)
    moved = os.path.join(moved_parent, "my-tree")
    shutil.move(root, moved)
    moved_root = os.path.join(moved, "generated", "storage", "aws-ebs", "storage-generation")
    shutil.rmtree(os.path.join(moved_root, ".terraform"))
    sys.path.insert(0, os.path.join(REPO, ".venv", "collections"))
    from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import terraform_env
    tf_env = terraform_env(e2e.run_env(ep.env))
    init = subprocess.run(["terraform", "init", "-input=false", "-no-color", "-reconfigure",
                           "-backend-config=aws-ebs-storage-generation.tfbackend.hcl"],
                          cwd=moved_root, env=tf_env, capture_output=True, text=True, check=False)
    assert init.returncode == 0, init.stdout + init.stderr
    plan = subprocess.run(["terraform", "plan", "-input=false", "-no-color", "-detailed-exitcode", "-lock=false"],
                          cwd=moved_root, env=tf_env, capture_output=True, text=True, check=False)
    assert plan.returncode == 0, plan.stdout[-4000:] + plan.stderr[-4000:]  # 0: no changes
