# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""meta-state/image-tests.yaml: the post-bake result per build, recorded with the verification."""
from __future__ import annotations

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis.state import record as rec
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState, MetaStateError


def verdict(build="ami-0123", ok=True, tests=True, instance="eph1"):
    checks = [{"name": "completion marker", "ok": True, "detail": "present"}]
    if tests:
        checks += [{"name": "test: test -x /usr/bin/env", "ok": True, "detail": "exit 0"},
                   {"name": "test: /opt/check", "ok": ok, "detail": "exit 0" if ok else "exit 3"}]
    return {"instance": instance, "runtime": "rt", "build": build, "run": "r1", "ephemeral": True,
            "time": "2026-11-30T10:00:00Z", "ok": ok, "checks": checks, "evidence": []}


def test_post_bake_results_are_recorded_per_build(tmp_path):
    root = str(tmp_path)
    written = rec.record_verification(root, verdict(ok=True))
    assert sorted(written) and any("image-tests" in w for w in written), written
    rec.record_verification(root, verdict(ok=False, instance="eph2"))
    meta = {"image-tests.yaml": MetaState(root).load("image-tests.yaml")}
    build = meta["image-tests.yaml"]["builds"]["ami-0123"]
    assert [r["ok"] for r in build["results"]] == [True, False] and build["last_ok"] is False
    last = rec.last_image_test(meta, "ami-0123")
    assert last["instance"] == "eph2" and last["tests"][1] == {"command": "/opt/check", "ok": False, "detail": "exit 3"}
    assert rec.last_image_test(meta, "ami-none") is None


def test_no_build_or_no_tests_records_no_image_test(tmp_path):
    root = str(tmp_path)
    rec.record_verification(root, verdict(tests=False))
    rec.record_verification(root, verdict(build=None))
    assert MetaState(root).load("image-tests.yaml") == {"builds": {}}
    assert len(MetaState(root).load("verifications.yaml")["verifications"]) == 2


def test_only_the_last_results_per_build_are_kept(tmp_path):
    root = str(tmp_path)
    for i in range(rec.IMAGE_TESTS_MAX + 5):
        rec.record_verification(root, verdict(instance="m%d" % i))
    results = MetaState(root).load("image-tests.yaml")["builds"]["ami-0123"]["results"]
    assert len(results) == rec.IMAGE_TESTS_MAX and results[-1]["instance"] == "m%d" % (rec.IMAGE_TESTS_MAX + 4)


def test_a_malformed_file_is_refused_naming_it(tmp_path):
    (tmp_path / "meta-state").mkdir()
    (tmp_path / "meta-state" / "image-tests.yaml").write_text("builds:\n  ami-1: {results: 3}\n")
    with pytest.raises(MetaStateError) as exc:
        MetaState(str(tmp_path)).load("image-tests.yaml")
    assert "image-tests.yaml" in str(exc.value) and "builds.ami-1.results" in str(exc.value)
