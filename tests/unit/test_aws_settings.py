# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""aws.client_settings: bounded timeouts and attempts for every boto3 client (issue 16, defect 5).
The behaviour against a hung endpoint is tested in tests/integration/test_aws_timeouts.py."""
from __future__ import annotations

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis import aws


def test_defaults_bound_a_hung_call_well_under_a_minute():
    limits = aws.client_settings(environ={})
    assert limits == {"connect_timeout": 5.0, "read_timeout": 10.0, "max_attempts": 3}
    assert limits["max_attempts"] * max(limits["connect_timeout"], limits["read_timeout"]) <= 30


def test_environment_then_access_override_the_defaults():
    env = {"CSIS_AWS_CONNECT_TIMEOUT": "1.5", "CSIS_AWS_READ_TIMEOUT": "60", "CSIS_AWS_MAX_ATTEMPTS": "5"}
    assert aws.client_settings(environ=env) == {"connect_timeout": 1.5, "read_timeout": 60.0, "max_attempts": 5}
    assert aws.client_settings({"read_timeout": 30, "max_attempts": 1}, environ=env) == {
        "connect_timeout": 1.5, "read_timeout": 30.0, "max_attempts": 1}


@pytest.mark.parametrize("var,value,what", [
    ("CSIS_AWS_READ_TIMEOUT", "soon", "a positive number of seconds"),
    ("CSIS_AWS_CONNECT_TIMEOUT", "-1", "a positive number of seconds"),
    ("CSIS_AWS_MAX_ATTEMPTS", "0", "a positive whole number of attempts"),
    ("CSIS_AWS_MAX_ATTEMPTS", "2.5", "a positive whole number of attempts"),
])
def test_bad_settings_are_refused_by_name(var, value, what):
    with pytest.raises(aws.ClientSettingsError) as err:
        aws.client_settings(environ={var: value})
    assert str(err.value) == "%s=%r: must be %s" % (var, value, what)


def test_every_client_gets_the_bounds(monkeypatch):
    pytest.importorskip("boto3")
    monkeypatch.setenv("CSIS_AWS_READ_TIMEOUT", "7")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    cfg = aws.client("ec2", {"region": "us-east-2", "endpoints": {"ec2": "http://127.0.0.1:9"}}).meta.config
    assert (cfg.connect_timeout, cfg.read_timeout) == (5.0, 7.0)
    assert cfg.retries == {"total_max_attempts": 3, "mode": "standard"}
