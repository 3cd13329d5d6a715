# -*- coding: utf-8 -*-
"""A runtime's ``endpoints`` in csis.infra's own terraform runs come from the environment
(``AWS_ENDPOINT_URL_<SERVICE>``, kept in the root's ``csis-endpoint-env.json``) and the
provider's endpoints block is a dynamic block that the ephemeral
``csis_endpoints_from_environment`` drops: the provider validates such a block in about 3 s
of CPU at each start. The real-terraform half (a hand-run plan still reaches the declared
endpoint; a saved plan is refused without the variable) is in
tests/integration/test_render_roots.py.
"""
from __future__ import annotations

import json
import os
from typing import Any

import yaml

from ansible_collections.csis.infra.plugins.module_utils.csis import terraform
from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate
from ansible_collections.csis.infra.plugins.module_utils.csis.render import pipeline as service
from ansible_collections.csis.infra.plugins.module_utils.csis.render.plan import RenderOptions
from ansible_collections.csis.infra.plugins.module_utils.csis.render.roots import plan_roots

import render_trees as rt

FLAG = "TF_VAR_csis_endpoints_from_environment"
URL = "http://127.0.0.1:5055"


def render(root: str) -> dict:
    return {r["key"]: r for r in service.render(root, rt.LIFECYCLES, dry_run=True, prepare=False)["roots"]}


def edit(root: str, rel: str, change: Any) -> None:
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    change(data)
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh)


def main_tf(root_item: dict) -> str:
    d = root_item["directory"]
    name = [f for f in root_item["files"] if f.endswith("-generation.tf")][0]
    with open(os.path.join(d, name), encoding="utf-8") as fh:
        return fh.read()


def test_the_example_roots_take_their_endpoints_from_the_environment(tmp_path: Any) -> None:
    root = rt.copy_tree("examples", str(tmp_path))
    roots = render(root)
    ebs = roots["storage-aws-ebs"]
    want = {"AWS_ENDPOINT_URL_%s" % s.upper(): URL for s in ("ec2", "efs", "iam", "s3", "ssm", "sts")}
    want[FLAG] = "true"
    assert ebs["endpoint_env"] == want
    with open(os.path.join(ebs["directory"], terraform.ENDPOINT_ENV_FILE), encoding="utf-8") as fh:
        assert json.load(fh) == want
    assert terraform.root_endpoint_env(ebs["directory"]) == want
    tf = main_tf(ebs)
    # the block is still there for a hand run: dropped only when the variable says so
    assert 'dynamic "endpoints"' in tf and "for_each = var.csis_endpoints_from_environment ? [] : [1]" in tf
    assert 'ec2 = "%s"' % URL in tf
    assert 'variable "csis_endpoints_from_environment"' in tf and "ephemeral   = true" in tf
    # terraform_env in that root carries it; elsewhere it does not
    env = terraform.terraform_env({"PATH": os.environ.get("PATH", "")}, root=ebs["directory"])
    assert env["AWS_ENDPOINT_URL_EC2"] == URL and env[FLAG] == "true"
    assert FLAG not in terraform.terraform_env({"PATH": os.environ.get("PATH", "")}, root=str(tmp_path))
    # the identity root has no provider (no enrollment token): nothing to stand in for
    assert all(r["endpoint_env"] == {} for k, r in roots.items() if k.startswith("identity-"))


def test_an_s3_backend_on_another_s3_endpoint_keeps_the_block(tmp_path: Any) -> None:
    """terraform's S3 backend reads AWS_ENDPOINT_URL_S3 too: a state backend without the runtime's
    S3 endpoint would be sent to it, so the root keeps the plain endpoints block."""
    root = rt.copy_tree("examples", str(tmp_path))

    def drop_endpoint(data: Any) -> None:
        for b in data["state_backends"]:
            b.pop("endpoints", None)
    edit(root, "cfg/state-backends.yml", drop_endpoint)
    ebs = render(root)["storage-aws-ebs"]
    assert ebs["endpoint_env"] == {}
    assert not os.path.exists(os.path.join(ebs["directory"], terraform.ENDPOINT_ENV_FILE))
    tf = main_tf(ebs)
    assert "dynamic" not in tf and "csis_endpoints_from_environment" not in tf
    assert "  endpoints {" in tf and 'ec2 = "%s"' % URL in tf


def test_a_root_without_endpoints_has_neither(tmp_path: Any) -> None:
    root = rt.copy_tree("examples", str(tmp_path))

    def drop_endpoints(data: Any) -> None:
        for r in data["runtime_builders"]:
            r.pop("endpoints", None)
    edit(root, "cfg/runtime-builders.yml", drop_endpoints)
    ebs = render(root)["storage-aws-ebs"]
    assert ebs["endpoint_env"] == {} and "endpoints" not in main_tf(ebs)


def test_a_damaged_endpoint_file_is_ignored(tmp_path: Any) -> None:
    """Without the file's environment the root's block names the endpoints: slower, as correct."""
    d = str(tmp_path)
    path = os.path.join(d, terraform.ENDPOINT_ENV_FILE)
    for text in ("{", "[]", json.dumps({"AWS_ENDPOINT_URL_EC2": URL}),
                 json.dumps({FLAG: "true", "PATH": "/tmp"}), json.dumps({FLAG: "true", "AWS_ENDPOINT_URL_EC2": 1})):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        assert terraform.root_endpoint_env(d) == {}, text
    assert terraform.root_endpoint_env(None) == {}


def test_without_ephemeral_binaries_every_root_keeps_its_block(tmp_path: Any) -> None:
    """The planner itself asks no binary (the graph and the cascade plan with the default
    options): only pipeline.render names the binaries that take ephemeral variables."""
    root = rt.copy_tree("examples", str(tmp_path))
    tree, meta = load_and_validate(root)
    ebs = [p for p in plan_roots(tree, meta, "storage", RenderOptions()) if p.builder == "aws-ebs"][0]
    assert ebs.endpoint_env == {} and terraform.ENDPOINT_ENV_FILE not in ebs.files
    tf = ebs.files["aws-ebs-storage-generation.tf"]
    assert "  endpoints {" in tf and "csis_endpoints_from_environment" not in tf


def test_which_binaries_take_ephemeral_variables() -> None:
    """terraform on PATH (1.11 on these machines) does; a tofu or a missing binary is not asked."""
    ver, err = terraform.version("terraform")
    assert err is None and ver is not None
    assert terraform.takes_ephemeral_variables("terraform") is (tuple(int(x) for x in ver.split(".")[:2]) >= (1, 10))
    assert terraform.takes_ephemeral_variables("tofu") is False
    assert terraform.takes_ephemeral_variables("terraform-not-installed-here") is False
