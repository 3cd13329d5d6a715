# -*- coding: utf-8 -*-
"""Every emitted root passes the real ``terraform fmt -check`` and ``validate`` (together with the
other roots of its render, or ``init -backend=false`` and ``validate`` alone) with the AWS
provider from the mirror, and an independent ``init -backend=false`` / ``validate -json``; escaped values read back through the
real terraform are the literal configuration text; csis.infra.csis_render through a real
ansible-playbook run in check and diff mode writes nothing.

Each tree is rendered once per session (``service.render(..., prepare=True)``, which runs
fmt -check / init / validate in every root, in parallel) and shared by the tests.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import textwrap
from typing import Any, Dict

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.render import pipeline as service
from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import run as run_tf
from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import terraform_env

import render_trees as rt

pytestmark = pytest.mark.integration

ALL = rt.LIFECYCLES
PLAYBOOK = os.path.join(rt.REPO_ROOT, ".venv", "bin", "ansible-playbook")


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: Any) -> Dict[str, Dict[str, Any]]:
    """examples/, the variations and the no-backend tree, rendered with prepare=True."""
    roots = {name: rt.copy_tree(name, str(tmp_path_factory.mktemp(name))) for name in EXPECTED_ROOTS}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(roots)) as pool:
        futs = {name: pool.submit(service.render, root, ALL, dry_run=True, prepare=True, workers=6)
                for name, root in roots.items()}
        return {name: {"root": roots[name], "result": fut.result()} for name, fut in futs.items()}


EXPECTED_ROOTS = {
    "examples": {"identity/posix-groups", "storage/aws-ebs", "storage/aws-efs", "storage/aws-s3",
                 "instance-image/open-tofu"},
    "variations": {"identity/posix-groups", "storage/ebs", "storage/efs", "storage/s3",
                   "instance-image/tofu-vpc", "instance-image/tofu-plain"},
    "nobackend": {"storage/solo-ebs", "storage/solo-s3", "instance-image/solo-tofu"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED_ROOTS))
def test_every_root_passes_fmt_init_validate(prepared: Dict[str, Dict[str, Any]], name: str) -> None:
    res = prepared[name]["result"]
    roots = {"%s/%s" % (r["lifecycle"], r["builder"]): r for r in res["roots"]}
    assert set(roots) == EXPECTED_ROOTS[name]
    for key, r in roots.items():
        cmds = r["commands"]
        assert cmds[0].startswith("terraform fmt -check"), (key, cmds)
        # validated with the lifecycle's other roots in one run (no init of its own), or alone
        # after its own init -backend=false
        assert (cmds[1:] == ["terraform validate -no-color (one run for %d roots)" % len(roots)]
                or (cmds[1].startswith("terraform init") and "-backend=false" in cmds[1]
                    and cmds[2:] == ["terraform validate -no-color"])), (key, cmds)


def test_validate_json_is_clean(prepared: Dict[str, Dict[str, Any]]) -> None:
    """An independent `terraform validate -json` (valid, and no warnings either) in the roots
    with the most variations: both instance roots and the EFS root of the variations tree."""
    dirs = [r["directory"] for r in prepared["variations"]["result"]["roots"]
            if r["builder"] in ("tofu-vpc", "tofu-plain", "efs")]

    def check(d: str) -> None:
        # as a user would in a dry run's root: init without the backend, then validate
        init = run_tf("terraform", ["init", "-input=false", "-no-color", "-backend=false"], d)
        assert init["rc"] == 0, (d, init)
        # the provider came through the shared plugin cache
        assert os.path.isdir(os.path.join(d, ".terraform", "providers")), d
        res = run_tf("terraform", ["validate", "-json", "-no-color"], d)
        data = json.loads(res["stdout"])
        assert data["valid"] is True, (d, data)
        assert data["warning_count"] == 0, (d, data["diagnostics"])
        fmt = run_tf("terraform", ["fmt", "-check", "-recursive", "-no-color"], d)
        assert fmt["rc"] == 0, (d, fmt)

    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        for fut in [pool.submit(check, d) for d in dirs]:
            fut.result()


def test_warm_render_is_unchanged_and_skips_terraform(prepared: Dict[str, Dict[str, Any]]) -> None:
    root = prepared["variations"]["root"]
    again = service.render(root, ALL, dry_run=True, prepare=True)
    assert again["changed"] is False
    for r in again["roots"]:
        assert r["commands"] == ["(unchanged since the last successful fmt/init/validate)"], r["directory"]


# --------------------------------------------------------------------------- escaping
@pytest.fixture(scope="module")
def escaping(tmp_path_factory: Any) -> Dict[str, Any]:
    base = str(tmp_path_factory.mktemp("escaping"))
    root = rt.write_escaping_tree(base)
    res = service.render(root, ALL, dry_run=True, prepare=True)
    inst = os.path.join(root, "generated", "instance-image", "solo-tofu", "instance-generation")
    ebs = os.path.join(root, "generated", "storage", "solo-ebs", "storage-generation")
    return {"root": root, "result": res, "inst": inst, "ebs": ebs, "base": base}


def _attr_text(path: str, name: str) -> str:
    """The text of the top-level module argument ``name`` (a multi-line object) in ``path``."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("  %s " % name) and line.rstrip().endswith("{"):
            j = i
            while lines[j] != "  }":
                j += 1
            return "\n".join(lines[i:j + 1]).split("=", 1)[1].strip()
    raise AssertionError("no argument %s in %s" % (name, path))


def test_escaping_tree_is_valid_terraform(escaping: Dict[str, Any]) -> None:
    assert {r["builder"] for r in escaping["result"]["roots"]} == {"solo-ebs", "solo-s3", "solo-tofu"}
    for r in escaping["result"]["roots"]:
        assert any(c.startswith("terraform validate") for c in r["commands"])


def test_escaping_read_back_through_terraform(escaping: Dict[str, Any]) -> None:
    """The rendered user-data through the real templatefile, and the rendered tags through
    the real HCL parser, are the literal configuration text."""
    work = os.path.join(escaping["base"], "readback")
    os.makedirs(work)
    tpl = os.path.join(escaping["inst"], "user-data-solo_box.sh.tftpl")
    inst_tags = _attr_text(os.path.join(escaping["inst"], "solo-tofu-instance-generation-instance-solo_box.tf"), "tags")
    ebs_tags = _attr_text(os.path.join(escaping["ebs"], "solo-ebs-storage-generation-storage-scratch.tf"), "tags")
    main = textwrap.dedent("""\
        terraform {
          backend "local" {}
        }
        output "user_data" {
          value = templatefile(%s, {
            group_gid            = ""
            ebs                  = {}
            efs                  = {}
            enrollment_token_b64 = ""
          })
        }
        output "instance_tags" {
          value = %s
        }
        output "storage_tags" {
          value = %s
        }
        """) % (json.dumps(tpl), inst_tags, ebs_tags)
    with open(os.path.join(work, "main.tf"), "w", encoding="utf-8") as fh:
        fh.write(main)
    env = terraform_env()
    for args in (["init", "-input=false", "-no-color"], ["apply", "-auto-approve", "-input=false", "-no-color"]):
        res = subprocess.run(["terraform"] + args, cwd=work, env=env, capture_output=True, text=True, check=False)
        assert res.returncode == 0, (args, res.stdout, res.stderr, main)
    res = subprocess.run(["terraform", "output", "-json", "-no-color"], cwd=work, env=env, capture_output=True,
                         text=True, check=True)
    out = {k: v["value"] for k, v in json.loads(res.stdout).items()}
    ud = rt.escaping_userdata()
    assert ud.rstrip("\n") + "\n" in out["user_data"]
    # the instance's own userdata runs after the mounts and before the completion marker
    assert out["user_data"].index(ud.rstrip("\n")) < out["user_data"].index("date -u +%FT%TZ > /var/lib/csis/launch-applied")
    assert "%{" not in out["user_data"].replace(ud, "")  # every directive of ours was consumed
    want = dict(rt.escaping_tags(), csis_config="csis-nobackend")  # the tree's cfg/_config.yml id
    assert out["instance_tags"] == want
    assert out["storage_tags"] == want


# --------------------------------------------------------------------------- ansible-playbook
def _playbook(path: str, config_root: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent("""\
            - name: render through csis.infra.csis_render
              hosts: localhost
              connection: local
              gather_facts: false
              tasks:
                - name: render every lifecycle (dry run)
                  csis.infra.csis_render:
                    config_root: %s
                    lifecycle: [identity, storage, instance-image]
                    prepare: false
                  register: rendered
                - name: show what the module returned
                  ansible.builtin.copy:
                    content: "{{ rendered | to_json }}"
                    dest: %s
                  check_mode: false
                  diff: false
                  changed_when: false
            """) % (json.dumps(config_root), json.dumps(path + ".result.json")))


def _run_playbook(path: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    # the module runs under the venv's python (where pydantic and the collection are)
    interp = os.path.join(rt.REPO_ROOT, ".venv", "bin", "python")
    return subprocess.run([PLAYBOOK, "-i", "localhost,", "-e", "ansible_python_interpreter=%s" % interp, path]
                          + list(extra), cwd=rt.REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def test_playbook_check_diff_and_failed_validation_write_nothing(tmp_path: Any) -> None:
    """Check and diff mode write nothing and show the files; a real run writes, a second one
    (and a check run after it) reports changed=false; then a validation that fails leaves the
    generated roots as they were. One tree for both halves: the failed validation needs a real
    run's generated/ first, which this test's real runs have made (a playbook run fewer)."""
    root = rt.copy_tree("examples", str(tmp_path))
    pb = os.path.join(str(tmp_path), "render.yml")
    _playbook(pb, root)
    before = rt.tree_hash(root)
    res = _run_playbook(pb, "--check", "--diff")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not os.path.exists(os.path.join(root, "generated"))
    assert rt.tree_hash(root) == before
    # the diff shows the files that would be written
    assert "open-tofu-instance-generation-instance-test2.tf" in res.stdout
    assert "+module \"instance_test2\" {" in res.stdout
    with open(pb + ".result.json", encoding="utf-8") as fh:
        result = json.load(fh)
    assert result["changed"] is True
    assert {r["builder"] for r in result["roots"]} == {"posix-groups", "aws-ebs", "aws-efs", "aws-s3", "open-tofu"}

    # a real run writes; a second one (and a check run after it) reports changed=false
    res = _run_playbook(pb)
    assert res.returncode == 0, res.stdout + res.stderr
    assert os.path.isdir(os.path.join(root, "generated", "instance-image", "open-tofu", "instance-generation"))
    for extra in ((), ("--check", "--diff")):
        res = _run_playbook(pb, *extra)
        assert res.returncode == 0, res.stdout + res.stderr
        with open(pb + ".result.json", encoding="utf-8") as fh:
            assert json.load(fh)["changed"] is False, extra
        assert "changed=0" in res.stdout, res.stdout

    # a failed validation leaves generated/ as the real runs wrote it
    gen = os.path.join(root, "generated")
    before = rt.tree_hash(gen)
    with open(os.path.join(root, "storages", "storage0.yaml"), "a", encoding="utf-8") as fh:
        fh.write("  - {name: born-destroyed, state: destroyed}\n")
    res = _run_playbook(pb)
    assert res.returncode != 0
    assert "nothing was written" in res.stdout
    assert "born-destroyed" in res.stdout
    assert rt.tree_hash(gen) == before


def test_endpoints_from_the_environment_and_by_hand(moto_endpoint: Any, tmp_path: Any) -> None:
    """csis.infra's own terraform runs take the runtime's endpoints from the root's
    csis-endpoint-env.json (tests/unit/test_endpoint_env.py); without that environment a
    hand-run terraform in the same root still reaches the declared endpoint (the provider's
    dynamic endpoints block), and a plan file csis.infra made cannot be applied by hand
    without setting the ephemeral variable again (terraform refuses)."""
    from day2_trees import make_tree

    tag = "csis-epenv"
    root = make_tree(str(tmp_path), tag, [{"name": "epenv", "mount_point": "/mnt/ep", "groups": ["coops"],
                                           "state": "active"}], [])
    res = service.render(root, ["storage"], dry_run=False, prepare=True,
                         overlays=[moto_endpoint.overlay_path, os.path.join(root, "overlays", "apply-all.yml")],
                         extra_env=moto_endpoint.env)
    ebs = [r for r in res["roots"] if r["builder"] == "aws-ebs"][0]
    d = ebs["directory"]
    assert ebs["endpoint_env"]["AWS_ENDPOINT_URL_EC2"] == moto_endpoint.url
    planned = run_tf("terraform", ["plan", "-input=false", "-no-color", "-out=tfplan"], d, extra_env=moto_endpoint.env)
    assert planned["rc"] == 0 and "1 to add" in planned["stdout"], planned
    hand = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL") and not k.startswith("TF_VAR_")}
    hand.update(moto_endpoint.env)
    hand.pop("AWS_ENDPOINT_URL", None)
    refused = subprocess.run(["terraform", "apply", "-input=false", "-no-color", "tfplan"], cwd=d, env=terraform_env(hand),
                             capture_output=True, text=True, check=False)
    assert refused.returncode != 0
    assert 'ephemeral input variable "csis_endpoints_from_environment"' in " ".join((refused.stdout + refused.stderr).split())
    by_hand = subprocess.run(["terraform", "apply", "-auto-approve", "-input=false", "-no-color"], cwd=d,
                             env=terraform_env(hand), capture_output=True, text=True, check=False)
    assert by_hand.returncode == 0, by_hand.stdout[-2000:] + by_hand.stderr[-2000:]
    vols = moto_endpoint.client("ec2").describe_volumes(
        Filters=[{"Name": "tag:csis_config", "Values": [tag]}])["Volumes"]
    assert len(vols) == 1
    # with the variable set, the provider takes EC2 from the environment and not from the block
    # (which names the working endpoint): an AWS_ENDPOINT_URL_EC2 at a path moto does not serve
    # fails the refresh of that volume (404), where the same plan through the block succeeded
    wrong = dict(terraform_env(hand, root=d), AWS_ENDPOINT_URL_EC2=moto_endpoint.url.rstrip("/") + "/nowhere/")
    broken = subprocess.run(["terraform", "plan", "-input=false", "-no-color"], cwd=d, env=wrong,
                            capture_output=True, text=True, check=False, timeout=600)
    out = " ".join((broken.stdout + broken.stderr).split())
    assert broken.returncode != 0 and "DescribeVolumes" in out and "404" in out, out[-1500:]
