# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What ``terraform init`` of a rendered root depends on (render/writer.py ``init_inputs`` and
``init_state``): a change where init does not read (a module call's argument, a launch script,
a variable) keeps the state; a new module call, a new source, a provider, the terraform block
or the backend file changes it. Pure library: no terraform runs here (the real-terraform
side is in tests/integration/test_render_validate_together.py)."""
from __future__ import annotations

import json
import os
from typing import Any

from ansible_collections.csis.infra.plugins.module_utils.csis.render import writer

MAIN = '''terraform {
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0, < 6.0"
    }
  }

  backend "s3" {}
}

provider "aws" {
  alias  = "r"
  region = "us-east-2"
}
'''

CALL = '''module "instance_a" {
  source = "../.modules/0.1.0/aws_instance"
  providers = {
    aws = aws.r
  }
  ami_id = var.a_ami_id
  tags = {
    source = "not a module source"
  }
}

resource "aws_security_group" "csis" {
  name = "one"
}
'''


def _root(tmp_path: Any, main: str = MAIN, call: str = CALL, backend: str = 'bucket = "b"\n') -> str:
    d = str(tmp_path)
    files = {"main.tf": main, "call.tf": call, "root.tfbackend.hcl": backend, "user-data.sh.tftpl": "#!/bin/sh\n"}
    for name, text in files.items():
        with open(os.path.join(d, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    with open(os.path.join(d, writer.MANIFEST), "w", encoding="utf-8") as fh:
        json.dump({"files": sorted(files)}, fh)
    return d


def _key(d: str) -> Any:
    return writer.init_state(d, "terraform", False, "root.tfbackend.hcl")


def test_init_inputs_are_the_blocks_init_reads(tmp_path: Any) -> None:
    lines = writer.init_inputs(_root(tmp_path))
    assert 'call.tf: module "instance_a" {' in lines
    assert 'call.tf:   source = "../.modules/0.1.0/aws_instance"' in lines
    assert 'call.tf: resource "aws_security_group" "csis" {' in lines
    assert 'main.tf:   backend "s3" {}' in lines and 'main.tf: provider "aws" {' in lines
    assert not [x for x in lines if "ami_id" in x or "not a module source" in x or "region" in x or "name =" in x], lines


def test_arguments_and_scripts_keep_the_key(tmp_path: Any) -> None:
    before = _key(_root(tmp_path))
    d = _root(tmp_path, call=CALL.replace("var.a_ami_id", '"ami-0123"').replace('"one"', '"two"'),
              main=MAIN.replace("us-east-2", "eu-west-1"))
    with open(os.path.join(d, "user-data.sh.tftpl"), "w", encoding="utf-8") as fh:
        fh.write("#!/bin/sh\necho changed\n")
    assert _key(d) == before


def test_what_init_reads_changes_the_key(tmp_path: Any) -> None:
    before = _key(_root(tmp_path))
    changes = {
        "a new module call": dict(call=CALL + CALL.split("\n\nresource", maxsplit=1)[0].replace("instance_a", "instance_b") + "\n"),
        "a new source": dict(call=CALL.replace("0.1.0", "0.2.0")),
        "a new resource type": dict(call=CALL + 'resource "random_id" "x" {\n  byte_length = 2\n}\n'),
        "the provider constraint": dict(main=MAIN.replace("< 6.0", "< 7.0")),
        "the backend file": dict(backend='bucket = "other"\n'),
    }
    for what, change in changes.items():
        assert _key(_root(tmp_path, **change)) != before, what
        _root(tmp_path)  # back to the start for the next change


def test_an_older_stamp_is_one_key_line(tmp_path: Any) -> None:
    d = str(tmp_path)
    os.makedirs(os.path.join(d, ".terraform"))
    with open(os.path.join(d, writer.STAMP), "w", encoding="utf-8") as fh:
        fh.write("abc\n")
    stamp = writer._read_stamp(d)  # pylint: disable=protected-access
    assert stamp == {"key": "abc"}
    # an older stamp's key counts for the kind of run it was made by (the key says which)
    assert writer._stamped(stamp, True, "abc") and writer._stamped(stamp, False, "abc")  # pylint: disable=protected-access
    with open(os.path.join(d, writer.STAMP), "w", encoding="utf-8") as fh:
        fh.write('{"key": "k", "init": "i"}\n')
    assert writer._read_stamp(d) == {"key": "k", "init": "i"}  # pylint: disable=protected-access


def test_each_kind_of_run_keeps_its_own_stamp(tmp_path: Any) -> None:
    """A dry run's stamp keeps the real run's key unless the dry run initialised the root itself."""
    d = str(tmp_path)
    writer._write_stamp(d, real="r", init="ri")  # pylint: disable=protected-access
    old = writer._read_stamp(d)  # pylint: disable=protected-access
    writer._stamp_kind(d, True, "k", old, old.get("init"))  # pylint: disable=protected-access
    stamp = writer._read_stamp(d)  # pylint: disable=protected-access
    assert stamp == {"dry": "k", "real": "r", "init": "ri"}
    assert writer._stamped(stamp, True, "k") and writer._stamped(stamp, False, "r")  # pylint: disable=protected-access
    assert not writer._stamped(stamp, False, "k")  # pylint: disable=protected-access
    writer._stamp_kind(d, True, "k2", stamp, "di", keep_other=False)  # pylint: disable=protected-access
    assert writer._read_stamp(d) == {"dry": "k2", "init": "di"}  # pylint: disable=protected-access


def _state(d: str) -> Any:
    return writer.init_state(d, "terraform", False, "root.tfbackend.hcl")


TWO_CALLS = CALL + CALL.split("\n\nresource", maxsplit=1)[0].replace("instance_a", "instance_b") + "\n"


def test_the_init_state_names_each_module_call_and_directory(tmp_path: Any) -> None:
    state = _state(_root(tmp_path, call=TWO_CALLS))
    assert state["calls"] == {"instance_a": 'source = "../.modules/0.1.0/aws_instance"\n',
                              "instance_b": 'source = "../.modules/0.1.0/aws_instance"\n'}
    assert list(state["dirs"]) == [os.path.normpath(os.path.join(str(tmp_path), "../.modules/0.1.0/aws_instance"))]
    # the arguments of a call are not in it; what else init reads is in the base alone
    assert state["base"] == _state(_root(tmp_path, call=TWO_CALLS.replace("var.a_ami_id", '"ami-1"')))["base"]


def test_an_init_holds_for_a_root_that_only_lost_module_calls(tmp_path: Any) -> None:
    """A detach, a decommission, a cascade phase removes module calls: terraform needs no new
    init for that (it ignores what its modules.json lists and the configuration no longer calls),
    so the stamp's state, which names more calls, still holds."""
    held = _state(_root(tmp_path, call=TWO_CALLS))
    assert writer._init_holds(held, _state(_root(tmp_path, call=CALL)))  # pylint: disable=protected-access
    assert writer._init_holds(held, held)  # pylint: disable=protected-access
    # ... and a call put back as it was installed still finds it
    assert writer._init_holds(held, _state(_root(tmp_path, call=TWO_CALLS)))  # pylint: disable=protected-access


def test_an_init_does_not_hold_for_anything_new(tmp_path: Any) -> None:
    held = _state(_root(tmp_path))
    changes = {
        "a new module call": dict(call=TWO_CALLS),
        "a new source": dict(call=CALL.replace("0.1.0", "0.2.0")),
        "a new resource type": dict(call=CALL + 'resource "random_id" "x" {\n  byte_length = 2\n}\n'),
        "the provider constraint": dict(main=MAIN.replace("< 6.0", "< 7.0")),
        "the backend file": dict(backend='bucket = "other"\n'),
    }
    for what, change in changes.items():
        assert not writer._init_holds(held, _state(_root(tmp_path, **change))), what  # pylint: disable=protected-access
        _root(tmp_path)
    # a module directory whose files changed since the init
    now = dict(held, dirs={d: "0" * 64 for d in held["dirs"]})
    assert not writer._init_holds(held, now)  # pylint: disable=protected-access
    # an older stamp's digest, or none, holds nothing
    for old in (None, "abc", {"base": held["base"]}):
        assert not writer._init_holds(old, held), old  # pylint: disable=protected-access


def test_the_stamp_keeps_the_init_state(tmp_path: Any) -> None:
    d = _root(tmp_path)
    os.makedirs(os.path.join(d, ".terraform"))
    state = _state(d)
    writer._write_stamp(d, real="r", init=state)  # pylint: disable=protected-access
    assert writer._read_stamp(d) == {"real": "r", "init": state}  # pylint: disable=protected-access
