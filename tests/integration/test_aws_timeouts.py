# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Issue 16, defect 5 (boto3): a hung endpoint fails a run's AWS calls quickly, with the endpoint named.

A moto server of this file's own (``tests/support/local_aws.py``, its own state directory and
port: the session's shared server is never stopped) is seeded, then frozen with SIGSTOP: it
still accepts connections (the kernel does) but never answers, as a hung endpoint does. The
state query (the library, then ``playbooks/state_query.yml``) must report the endpoint
``unavailable`` within the configured bounds (``CSIS_AWS_*``; docs/configuration.md), not after
minutes. The server is resumed (SIGCONT) and stopped at the end.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402
import local_aws  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis import aws  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.state import drift  # noqa: E402

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.path.exists(e2e.PLAYBOOK_BIN), reason="needs the project venv")]


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    """(LocalAws, its record) of a seeded moto server of our own, frozen with SIGSTOP. One for
    the module: what a test learns of the endpoint lives in its own ``aws.Endpoint`` (or its own
    ``ansible-playbook``), so every test meets the hung server afresh and waits its full bounds.
    The connections it never accepts stay in its listen queue (128; the three tests leave fewer
    than ten), so a later test still connects and times out reading, as the first does."""
    la = local_aws.LocalAws(str(tmp_path_factory.mktemp("hung") / "aws"))
    rec = la.start(prefer_port=None, tie_to_caller=True)
    try:
        la.seed()
        os.kill(rec["pid"], signal.SIGSTOP)
        yield la, rec
    finally:
        try:
            os.kill(rec["pid"], signal.SIGCONT)
        except OSError:
            pass
        la.stop()


def _env(monkeypatch, la, rec, **settings):
    for key, value in la.env(rec["url"]).items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    for key, (var, _default) in aws.CLIENT_SETTINGS.items():
        if key in settings:
            monkeypatch.setenv(var, str(settings[key]))
        else:
            monkeypatch.delenv(var, raising=False)


def test_one_call_with_the_defaults_fails_in_well_under_a_minute(hung, monkeypatch):
    la, rec = hung
    _env(monkeypatch, la, rec)
    ep = aws.Endpoint({"region": la.region, "endpoints": {"ec2": rec["url"]}})
    t0 = time.monotonic()
    with pytest.raises(aws.Unreachable) as err:
        ep.call("ec2", "describe_volumes")
    took = time.monotonic() - t0
    assert took < 50, took
    assert str(err.value).startswith("endpoint %s unreachable: Read timeout on endpoint URL" % rec["url"])
    assert "no answer within 10 s (read timeout, 3 attempt(s); set CSIS_AWS_READ_TIMEOUT" in str(err.value)
    # later calls to the same endpoint do not wait again
    t0 = time.monotonic()
    with pytest.raises(aws.Unreachable, match="not retried"):
        ep.call("ec2", "describe_instances")
    assert time.monotonic() - t0 < 1


def test_the_state_query_reports_a_hung_endpoint_unavailable_within_the_configured_bound(hung, monkeypatch, tmp_path):
    la, rec = hung
    _env(monkeypatch, la, rec, connect_timeout=2, read_timeout=2, max_attempts=2)
    root = e2e.copy_example_tree(str(tmp_path / "tree"))
    t0 = time.monotonic()
    report = drift.query(root, overlays=[la.overlay_path])
    took = time.monotonic() - t0
    assert took < 20, took
    assert report["unavailable"], report
    line = report["unavailable"][0]
    assert rec["url"] in line and "no answer within 2 s (read timeout, 2 attempt(s)" in line, report["unavailable"]
    assert report["drift"] == [], report["drift"]  # nothing classified from what could not be read


def test_state_query_playbook_on_a_hung_endpoint_says_unavailable_within_the_operators_bounds(hung, tmp_path):
    """Through the playbook, with the bounds an operator exports (the defaults' 10 s x 3 attempts
    are the first test's: waiting them out again here would only cost the suite 30 s)."""
    la, rec = hung
    root = e2e.copy_example_tree(str(tmp_path / "tree"))
    bounds = {"CSIS_AWS_CONNECT_TIMEOUT": "2", "CSIS_AWS_READ_TIMEOUT": "3", "CSIS_AWS_MAX_ATTEMPTS": "2"}
    run = e2e.run_playbook("state_query.yml", root, dict(la.env(rec["url"]), **bounds), overlays=[la.overlay_path],
                           dry_run=None, timeout=600)
    assert run.rc == 0, run.tail()
    assert run.seconds < 60, run.seconds
    out = " ".join(run.out.split())
    assert "unavailable: " in out and rec["url"] in out, run.tail()
    assert "no answer within 3 s (read timeout, 2 attempt(s)" in out, run.tail()
