# -*- coding: utf-8 -*-
"""A dry run validates the roots that need it in one terraform process (one provider
checksum and schema load, render/writer.py ``validate_together``), never validates an
unchanged root again, whichever lifecycles a render names, and names an invalid root by
itself, with terraform's own message, as when each root was validated alone.

Real terraform and the AWS provider from the mirror, on the no-backend tree (two storage
roots, one instance root); no endpoint is reached (``init -backend=false``, ``validate``).
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Dict

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.render import pipeline as service
from ansible_collections.csis.infra.plugins.module_utils.csis.render import writer

import render_trees as rt
from trees import replace_text

pytestmark = pytest.mark.integration

UNCHANGED = [writer.UNCHANGED]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: Any) -> Dict[str, Any]:
    """The storage dry run, then a render of both lifecycles, then the instance-image one."""
    root = rt.copy_tree("nobackend", str(tmp_path_factory.mktemp("together")))
    storage = service.render(root, ["storage"], dry_run=True)
    both = service.render(root, ["storage", "instance-image"], dry_run=True)
    instance = service.render(root, ["instance-image"], dry_run=True)
    return {"root": root, "storage": storage, "both": both, "instance": instance}


def _commands(res: Dict[str, Any]) -> Dict[str, Any]:
    return {r["builder"]: r["commands"] for r in res["roots"]}


def test_storage_roots_validate_in_one_run(rendered: Dict[str, Any]) -> None:
    cmds = _commands(rendered["storage"])
    assert set(cmds) == {"solo-ebs", "solo-s3"}
    for builder, c in cmds.items():
        # no init of each root: the one temporary root that calls them all is initialised
        assert c[0].startswith("terraform fmt -check"), (builder, c)
        assert c[1:] == ["terraform validate -no-color (one run for 2 roots)"], (builder, c)
        root = os.path.join(rendered["root"], "generated", "storage", builder, "storage-generation")
        assert os.path.isfile(os.path.join(root, writer.STAMP))
        assert not os.path.exists(os.path.join(root, ".terraform.lock.hcl"))


def test_an_unchanged_root_is_never_validated_twice_across_lifecycles(rendered: Dict[str, Any]) -> None:
    both = _commands(rendered["both"])
    assert both["solo-ebs"] == UNCHANGED and both["solo-s3"] == UNCHANGED
    # the one root left to validate is validated alone (no batch of one)
    assert both["solo-tofu"][-1] == "terraform validate -no-color", both["solo-tofu"]
    assert _commands(rendered["instance"]) == {"solo-tofu": UNCHANGED}
    assert rendered["instance"]["changed"] is False


def test_an_invalid_root_is_named_alone_with_terraforms_message(rendered: Dict[str, Any], tmp_path: Any) -> None:
    """Together fails, so each root is validated alone: the error names the broken root and
    terraform's diagnostic; the valid one is validated and stamped, and nothing else changes."""
    root = os.path.join(str(tmp_path), "copy")
    shutil.copytree(rendered["root"], root, symlinks=True)
    gen = os.path.join(root, "generated", "storage")
    ebs, s3 = (os.path.join(gen, b, "storage-generation") for b in ("solo-ebs", "solo-s3"))
    os.unlink(os.path.join(ebs, writer.STAMP))
    tf = sorted(n for n in os.listdir(s3) if n.endswith(".tf"))[0]
    with open(os.path.join(s3, tf), "a", encoding="utf-8") as fh:
        fh.write('\noutput "csis_broken" {\n  value = var.not_declared\n}\n')
    with pytest.raises(writer.EmitError) as err:
        writer.prepare_roots([(ebs, "terraform", None), (s3, "terraform", None)], dry_run=True)
    msg = str(err.value)
    assert msg.startswith(s3 + ": 'terraform validate -no-color' failed (rc 1):"), msg
    assert "not_declared" in msg and ebs not in msg, msg
    assert not os.path.exists(os.path.join(s3, writer.STAMP))
    # validated alone, each root was initialised first (the batch had not initialised them)
    assert os.path.isfile(os.path.join(ebs, ".terraform.lock.hcl"))
    again = writer.prepare_roots([(ebs, "terraform", None)], dry_run=True)
    assert [c["cmd"] for c in again[ebs]] == UNCHANGED


def _copy_ebs_root(rendered: Dict[str, Any], tmp_path: Any) -> str:
    """A copy of the rendered EBS root, prepared where it is (the modules' paths are in the stamp)."""
    root = os.path.join(str(tmp_path), "copy")
    shutil.copytree(rendered["root"], root, symlinks=True)
    ebs = os.path.join(root, "generated", "storage", "solo-ebs", "storage-generation")
    writer.prepare_roots([(ebs, "terraform", None)], dry_run=True)
    assert [c["cmd"] for c in writer.prepare_roots([(ebs, "terraform", None)], dry_run=True)[ebs]] == UNCHANGED
    return ebs


def test_a_changed_module_argument_is_validated_without_a_new_init(rendered: Dict[str, Any], tmp_path: Any) -> None:
    """A root whose files changed where init does not read (a module call's argument: what a pinned
    AMI or a new size does) is formatted and validated again, not initialised again."""
    ebs = _copy_ebs_root(rendered, tmp_path)
    call = os.path.join(ebs, "solo-ebs-storage-generation-storage-scratch.tf")
    replace_text(call, "size              = 100", "size              = 200")
    out = writer.prepare_roots([(ebs, "terraform", None)], dry_run=True)
    cmds = [c["cmd"] for c in out[ebs]]
    assert cmds[0].startswith("terraform fmt -check") and cmds[1] == writer.INIT_UNCHANGED, cmds
    assert cmds[2] == "terraform validate -no-color", cmds
    again = writer.prepare_roots([(ebs, "terraform", None)], dry_run=True)
    assert [c["cmd"] for c in again[ebs]] == UNCHANGED


def _add_twin_call(ebs: str) -> str:
    """A second module call (``storage_twin``) beside the root's ``storage_scratch``; returns the
    call file's text before."""
    call = os.path.join(ebs, "solo-ebs-storage-generation-storage-scratch.tf")
    with open(call, encoding="utf-8") as fh:
        text = fh.read()
    twin = text.split('output "storage_scratch"', maxsplit=1)[0].replace('module "storage_scratch"', 'module "storage_twin"')
    with open(call, "w", encoding="utf-8") as fh:
        fh.write(text + "\n" + twin.split("\n\n", 2)[-1])
    return text


def test_a_new_module_call_inits_again_and_a_removed_one_needs_no_new_init(
        rendered: Dict[str, Any], tmp_path: Any) -> None:
    """A module call init has not installed (a new storage, a new instance) makes the root init
    again: validate alone would fail with terraform's "Module not installed". A detach, a
    decommission or a cascade phase only removes module calls: the root is then formatted and
    validated again, not initialised again (terraform ignores a module its modules.json lists and
    the configuration no longer calls), and the real terraform agrees."""
    ebs = _copy_ebs_root(rendered, tmp_path)
    before = _add_twin_call(ebs)
    cmds = [c["cmd"] for c in writer.prepare_roots([(ebs, "terraform", None)], dry_run=True)[ebs]]
    assert "-backend=false" in cmds[1] and cmds[1].startswith("terraform init"), cmds
    assert cmds[2] == "terraform validate -no-color", cmds
    with open(os.path.join(ebs, "solo-ebs-storage-generation-storage-scratch.tf"), "w", encoding="utf-8") as fh:
        fh.write(before)                                    # the twin's call removed
    out = writer.prepare_roots([(ebs, "terraform", None)], dry_run=True)
    cmds = [c["cmd"] for c in out[ebs]]
    assert cmds[0].startswith("terraform fmt -check") and cmds[1] == writer.INIT_UNCHANGED, cmds
    assert cmds[2] == "terraform validate -no-color" and out[ebs][2]["rc"] == 0, out[ebs]
    # the twin back as it was installed: still no init (a call never installed inits: the first step)
    _add_twin_call(ebs)
    cmds = [c["cmd"] for c in writer.prepare_roots([(ebs, "terraform", None)], dry_run=True)[ebs]]
    assert cmds[1] == writer.INIT_UNCHANGED and cmds[2] == "terraform validate -no-color", cmds


def test_a_dry_run_validates_the_following_lifecycles_roots_beside_its_own(tmp_path: Any) -> None:
    """prepare_ahead (the render role's default in a dry run): the storage dry run also writes the
    instance-image root and validates it in a run of its own beside the storage roots' run, so the
    instance-image dry run after it finds the root unchanged and runs no terraform at all."""
    root = rt.copy_tree("nobackend", str(tmp_path))
    storage = service.render(root, ["storage"], dry_run=True, prepare_ahead=True)
    assert {r["builder"] for r in storage["roots"]} == {"solo-ebs", "solo-s3"}
    for c in _commands(storage).values():
        assert c[1:] == ["terraform validate -no-color (one run for 2 roots)"], c
    [ahead] = storage["prepared_ahead"]
    assert ahead["key"] == "instance-image-solo-tofu" and ahead["changed"] is True, ahead
    assert ahead["commands"][0].startswith("terraform fmt -check"), ahead
    assert ahead["commands"][1:] == ["terraform validate -no-color (one run for 1 root)"], ahead
    assert os.path.isfile(os.path.join(root, ahead["directory"], writer.STAMP))
    instance = service.render(root, ["instance-image"], dry_run=True, prepare_ahead=True)
    assert _commands(instance) == {"solo-tofu": UNCHANGED}
    assert instance["prepared_ahead"] == []  # nothing follows instance-image
    # a second storage dry run: the instance-image root is stamped, so nothing is listed as prepared
    assert service.render(root, ["storage"], dry_run=True, prepare_ahead=True)["prepared_ahead"] == []
    # check mode writes nothing; a real run never prepares ahead (its init needs the backend, its
    # plan validates): the instance-image root keeps only its dry run's stamp
    stamp = os.path.join(root, ahead["directory"], writer.STAMP)
    with open(stamp, encoding="utf-8") as fh:
        dry_stamp = fh.read()
    assert service.render(root, ["storage"], dry_run=True, check_mode=True, prepare_ahead=True)["prepared_ahead"] == []
    real = service.render(root, ["storage"], dry_run=False, prepare_ahead=True)
    assert real["prepared_ahead"] == [], real["prepared_ahead"]
    with open(stamp, encoding="utf-8") as fh:
        assert fh.read() == dry_stamp


def test_a_following_root_that_fails_is_left_to_its_own_run(rendered: Dict[str, Any], tmp_path: Any) -> None:
    """An invalid root of a following lifecycle (optional) fails nothing in this run and is not
    stamped; this run's own roots are validated and stamped; its own run then names it."""
    root = os.path.join(str(tmp_path), "copy")
    shutil.copytree(rendered["root"], root, symlinks=True)
    ebs, s3 = (os.path.join(root, "generated", "storage", b, "storage-generation") for b in ("solo-ebs", "solo-s3"))
    tofu = os.path.join(root, "generated", "instance-image", "solo-tofu", "instance-generation")
    for d in (ebs, s3, tofu):
        os.unlink(os.path.join(d, writer.STAMP))
    tf = sorted(n for n in os.listdir(tofu) if n.endswith(".tf"))[0]
    with open(os.path.join(tofu, tf), "a", encoding="utf-8") as fh:
        fh.write('\noutput "csis_broken" {\n  value = var.not_declared\n}\n')
    out = writer.prepare_roots([(ebs, "terraform", None), (s3, "terraform", None), (tofu, "terraform", None)],
                               dry_run=True, optional=[tofu])
    assert out[ebs][-1]["cmd"] == "terraform validate -no-color (one run for 2 roots)", out[ebs]
    assert os.path.isfile(os.path.join(ebs, writer.STAMP)) and os.path.isfile(os.path.join(s3, writer.STAMP))
    assert [c["cmd"].split()[1] for c in out[tofu]] == ["fmt"], out[tofu]
    assert not os.path.exists(os.path.join(tofu, writer.STAMP))
    with pytest.raises(writer.EmitError) as err:
        writer.prepare_roots([(tofu, "terraform", None)], dry_run=True)
    assert str(err.value).startswith(tofu + ": 'terraform validate -no-color' failed (rc 1):"), err.value


def _generated_files(root: str) -> Dict[str, bytes]:
    """Every file under ``generated/`` but the modules' copies and terraform's own data directory."""
    out: Dict[str, bytes] = {}
    gen = os.path.join(root, "generated")
    for base, dirs, names in os.walk(gen):
        dirs[:] = [d for d in dirs if d not in (".terraform", ".modules")]
        for n in names:
            with open(os.path.join(base, n), "rb") as fh:
                out[os.path.relpath(os.path.join(base, n), gen)] = fh.read()
    return out


def test_a_render_that_fails_its_validate_puts_back_every_root_it_wrote(rendered: Dict[str, Any], tmp_path: Any) -> None:
    """Nothing half-written: a change that every root takes (the terraform version the roots
    require) and that terraform then refuses fails the render, and the roots are as they were
    before it, byte for byte, without their prepare stamps (the next render initialises and
    validates them again); a root the render created is gone. The next render with the tree as
    it was finds the roots' files unchanged and validates them again."""
    root = os.path.join(str(tmp_path), "copy")
    shutil.copytree(rendered["root"], root, symlinks=True)
    was = _generated_files(root)
    config = os.path.join(root, "cfg", "_config.yml")
    with open(config, encoding="utf-8") as fh:
        good = fh.read()
    replace_text(config, "config:\n", 'config:\n  terraform_required_version: ">= 99.0"\n')
    with pytest.raises(writer.EmitError) as err:
        service.render(root, ["storage", "instance-image"], dry_run=True)
    msg = str(err.value)
    assert "Unsupported Terraform Core version" in msg, msg
    assert msg.endswith("\n(the 3 roots this render wrote were put back as they were)"), msg
    assert _generated_files(root) == was
    gen = os.path.join(root, "generated")
    dirs = [os.path.join(gen, "storage", b, "storage-generation") for b in ("solo-ebs", "solo-s3")]
    dirs.append(os.path.join(gen, "instance-image", "solo-tofu", "instance-generation"))
    assert not [d for d in dirs if os.path.exists(os.path.join(d, writer.STAMP))]
    with open(config, "w", encoding="utf-8") as fh:
        fh.write(good)
    again = service.render(root, ["storage", "instance-image"], dry_run=True)
    assert again["changed"] is False, [r["key"] for r in again["roots"] if r["changed"]]
    assert {r["key"]: r["commands"][-1] for r in again["roots"]} == dict.fromkeys(
        ("storage-solo-ebs", "storage-solo-s3", "instance-image-solo-tofu"),
        "terraform validate -no-color (one run for 3 roots)")
    # a first render that fails leaves no root behind
    fresh = rt.copy_tree("nobackend", os.path.join(str(tmp_path), "fresh"))
    replace_text(os.path.join(fresh, "cfg", "_config.yml"), "config:\n", 'config:\n  terraform_required_version: ">= 99.0"\n')
    with pytest.raises(writer.EmitError) as err:
        service.render(fresh, ["storage"], dry_run=True)
    assert str(err.value).endswith("\n(the 2 roots this render wrote were put back as they were)"), err.value
    # (nor the folders made for them; the modules' copy and generated/.gitignore may stay)
    assert not os.path.exists(os.path.join(fresh, "generated", "storage"))
