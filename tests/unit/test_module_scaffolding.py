# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""module.py: the common argument specs, fail_from and the library check."""
from __future__ import annotations

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis import module as scaffold
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import (  # noqa: E501
    ConfigError, CsisError, GateRefused, MissingDependency, Problem)


class Failed(Exception):
    pass


class FakeModule:
    def __init__(self):
        self.failed = None

    def fail_json(self, **kw):
        self.failed = kw
        raise Failed()


def fail(exc, **kw):
    m = FakeModule()
    with pytest.raises(Failed):
        scaffold.fail_from(m, exc, **kw)
    return m.failed


def test_a_plain_error_is_its_message():
    assert fail(CsisError("boom"), changed=False) == {"msg": "boom", "changed": False}


def test_the_problems_come_back_one_string_each():
    exc = ConfigError([Problem("cfg/a.yml", "x", "bad"), Problem("", "", "worse")])
    assert fail(exc) == {"msg": "cfg/a.yml: x: bad\nworse", "problems": ["cfg/a.yml: x: bad", "worse"]}
    assert fail(exc, msg=scaffold.problems_message(exc, "/t", "; nothing was written"))["msg"] == \
        "2 problem(s) in /t; nothing was written:\ncfg/a.yml: x: bad\nworse"


def test_refusals_under_their_own_key_and_a_prefix():
    exc = GateRefused(["DESTROY NOT WHITELISTED: a.b"], {"adds": 1})
    assert exc.messages == ["DESTROY NOT WHITELISTED: a.b"] and exc.result == {"adds": 1}
    assert fail(exc, problems_key="violations", prefix="gate: ") == {
        "msg": "gate: DESTROY NOT WHITELISTED: a.b", "violations": ["DESTROY NOT WHITELISTED: a.b"]}
    assert "problems" not in fail(exc, problems_key=None)


def test_a_missing_library_is_reported_the_ansible_way():
    out = fail(MissingDependency("boto3", "Traceback ..."))
    assert out["msg"].startswith("Failed to import the required Python library (boto3)")
    assert out["exception"] == "Traceback ..."


def test_common_specs_are_copied():
    spec = scaffold.argument_spec(scaffold.CONFIG_ARGS, scaffold.AWS_ACCESS_ARGS, x=dict(type="str"))
    assert set(spec) == {"config_root", "overlays", "aws", "x"}
    spec["overlays"]["default"].append("changed")
    assert scaffold.CONFIG_ARGS["overlays"]["default"] == []
    assert set(spec["aws"]["options"]) == {"region", "profile", "endpoints", "s3_use_path_style", "session_mechanism"}


def test_every_library_the_modules_may_require_is_known():
    assert set(scaffold.LIBRARIES) == {"PyYAML", "pydantic", "boto3"}
    assert all(installed for installed, _error in scaffold.LIBRARIES.values())  # the dev venv has both
