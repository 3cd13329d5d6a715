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
    assert set(spec) == {"config_root", "overlays", "aws", "secrets", "x"}
    spec["overlays"]["default"].append("changed")
    assert scaffold.CONFIG_ARGS["overlays"]["default"] == []
    assert set(spec["aws"]["options"]) == {"region", "profile", "endpoints", "s3_use_path_style", "session_mechanism", "ssh"}


def test_every_library_the_modules_may_require_is_known():
    assert set(scaffold.LIBRARIES) == {"PyYAML", "pydantic", "boto3"}
    assert all(installed for installed, _error in scaffold.LIBRARIES.values())  # the dev venv has both


class Exited(Exception):
    pass


class RunModule(FakeModule):
    """What run_module builds (csis_module is replaced): params, check mode, exit and fail."""

    def __init__(self, params, check_mode=False):
        super().__init__()
        self.params, self.check_mode, self.exited, self.built = params, check_mode, None, None

    def exit_json(self, **kw):
        self.exited = kw
        raise Exited()


def run(monkeypatch, fn, params=None, check_mode=False, **kw):
    m = RunModule(params or {}, check_mode)

    def build(argument_spec, requires=(), **kwargs):
        m.built = dict(argument_spec=dict(argument_spec), requires=tuple(requires), **kwargs)
        return m

    monkeypatch.setattr(scaffold, "csis_module", build)
    with pytest.raises((Exited, Failed)):
        scaffold.run_module(fn, {"x": dict(type="str")}, requires=("PyYAML",), supports_check_mode=True, **kw)
    return m


def test_run_module_exits_with_what_the_call_returns(monkeypatch):
    m = run(monkeypatch, lambda module, p: dict(changed=False, x=p["x"]), params={"x": "v"})
    assert m.exited == {"changed": False, "x": "v"} and m.failed is None
    assert m.built == {"argument_spec": {"x": dict(type="str")}, "requires": ("PyYAML",), "supports_check_mode": True}


def test_run_module_fails_a_library_error_through_fail_from(monkeypatch):
    def boom(module, p):
        raise ConfigError([Problem("cfg/a.yml", "x", "bad")])

    m = run(monkeypatch, boom, failure=dict(prefix="step: ", changed=False))
    assert m.failed == {"msg": "step: cfg/a.yml: x: bad", "problems": ["cfg/a.yml: x: bad"], "changed": False}
    assert m.exited is None
    m = run(monkeypatch, boom, check_mode=True, failure=lambda module: dict(prefix="" if module.check_mode else "step: "))
    assert m.failed["msg"] == "cfg/a.yml: x: bad"


def test_run_module_lets_other_errors_through(monkeypatch):
    def bug(module, p):
        raise KeyError("x")

    with pytest.raises(KeyError):
        run(monkeypatch, bug)


def test_the_instance_spec():
    assert scaffold.argument_spec(scaffold.CONFIG_ROOT_ARGS, scaffold.INSTANCE_ARGS) == {
        "config_root": dict(type="path", required=True), "instance": dict(type="str", required=True)}
