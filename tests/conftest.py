# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Shared test set-up.

* ``<repo>/.venv/collections`` goes on ``sys.path`` so the library imports as
  ``ansible_collections.csis.infra.plugins.module_utils.csis.<mod>``.
* ``moto_endpoint`` (session): ONE moto server for the whole test session, on a free
  port with its own temporary state directory (never the demo's ``.local/aws``),
  seeded like ``scripts/local-aws seed``; stopped at the end of the session.
* ``tf_env`` (session): the terraform environment (``tfcli.terraform_env()``) plus
  the dummy AWS credentials and region.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(REPO_ROOT, ".venv", "collections")
SUPPORT = os.path.join(REPO_ROOT, "tests", "support")
for _p in (COLLECTIONS, SUPPORT):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import local_aws  # noqa: E402  (tests/support/local_aws.py, shared with scripts/local-aws)


@dataclass
class MotoEndpoint:
    """The session's local AWS endpoint and what the seed created there."""

    url: str
    env: Dict[str, str]
    overlay_path: str
    env_path: str
    state_dir: str
    seeded: Dict[str, Any]
    region: str = local_aws.REGION
    _la: Any = field(default=None, repr=False)

    # seeded ids, for convenience
    @property
    def account_id(self) -> str:
        return str(self.seeded["account_id"])

    @property
    def vpc_id(self) -> str:
        return str(self.seeded["vpc_id"])

    @property
    def subnet_ids(self) -> Dict[str, str]:
        return dict(self.seeded["subnet_ids"])

    @property
    def subnets(self) -> list:
        return list(self.seeded["subnets"])

    @property
    def security_groups(self) -> Dict[str, str]:
        return dict(self.seeded["security_groups"])

    @property
    def amis(self) -> Dict[str, str]:
        return dict(self.seeded["amis"])

    @property
    def instance_profile(self) -> str:
        return str(self.seeded["instance_profile"]["name"])

    @property
    def state_bucket(self) -> str:
        return str(self.seeded["state_bucket"])

    def client(self, service: str) -> Any:
        return self._la.client(service, self.url)


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoEndpoint]:
    shared = os.environ.get(SHARED_MOTO_ENV)
    if shared:
        # xdist: the controller started and seeded ONE server for every worker
        la = local_aws.LocalAws(shared)
        rec = la.recorded()
        assert rec, "the shared moto server recorded in %s is gone" % shared
        seeded = la.seeded() or la.seed()
        yield MotoEndpoint(url=rec["url"], env=la.env(rec["url"]), overlay_path=la.overlay_path,
                           env_path=la.env_path, state_dir=shared, seeded=seeded, _la=la)
        return
    state_dir = str(tmp_path_factory.mktemp("local-aws"))
    la = local_aws.LocalAws(state_dir)
    # any free port (never clash with a demo server on 5055); the server exits with this
    # test process even when the session is killed before its teardown
    rec = la.start(prefer_port=None, tie_to_caller=True)
    try:
        seeded = la.seed()
        yield MotoEndpoint(
            url=rec["url"], env=la.env(rec["url"]), overlay_path=la.overlay_path,
            env_path=la.env_path, state_dir=state_dir, seeded=seeded, _la=la,
        )
    finally:
        la.stop()


SHARED_MOTO_ENV = "CSIS_TEST_SHARED_MOTO_DIR"


# -- order: the heaviest end-to-end files first ------------------------------------------
# scripts/test runs `pytest -n 4 --dist loadfile`: xdist hands out whole files, a new one
# to a worker when at most 2 of its tests are left. Left alone it sorts the files by
# their number of tests (--loadscope-reorder, on by default), which puts the many-test
# unit files first and the few-test, minutes-long end-to-end files last: one worker is
# still in test_lifecycle_e2e.py long after the other ran out of work. Heaviest first
# (longest-processing-time first) lets the short files fill the workers at the end.
#
# The order below is the files' worker seconds in a full run (the table pytest prints at the
# end, "slowest test files"), longest first: every file of 8 s or more (2026-12-04). Files not
# listed follow, the end-to-end directories' (integration, faults) before the others, then most
# tests first: a new end-to-end file of one or two tests must not start after every unit file
# and leave one worker alone in it at the end. Refine the list from that table when a file's
# weight changes (test_lifecycle_e2e.py first since it holds the drift tests too, 2026-12-06;
# test_lifecycle_ebs_e2e.py lighter since its refusals covered elsewhere went, 2026-12-07).
HEAVIEST_FIRST = (
    "tests/integration/test_lifecycle_e2e.py",
    "tests/integration/test_day2_instances.py",
    "tests/faults/test_kill_at_every_step.py",
    "tests/integration/test_day2_ephemeral.py",
    "tests/integration/test_interrupted_and_vanished.py",
    "tests/integration/test_destroy_environment.py",
    "tests/integration/test_two_checkouts_e2e.py",
    "tests/integration/test_lifecycle_ebs_e2e.py",
    "tests/faults/test_endpoint_down_mid_apply.py",
    "tests/integration/test_molecule.py",
    "tests/integration/test_day2_storage.py",
    "tests/integration/test_manual_gaps_moto.py",
    "tests/integration/test_awx_runner.py",
    "tests/integration/test_render_roots.py",
    "tests/integration/test_tfmodules_moto.py",
    "tests/integration/test_aws_timeouts.py",
    "tests/integration/test_render_validate_together.py",
    "tests/integration/test_gate_real_plan.py",
    "tests/integration/test_inventory_plugin.py",
    "tests/integration/test_collection_artifact.py",
    "tests/integration/test_static_keys_e2e.py",
    "tests/integration/test_secrets_sentinel.py",
    "tests/integration/test_ansible_test_units.py",
    "tests/unit/test_metastate.py",
    "tests/integration/test_store_s3.py",
    "tests/integration/test_validate_playbook.py",
    "tests/integration/test_workspace_e2e.py",
    "tests/integration/test_csis_plan.py",
    "tests/fuzz/test_config_fuzz.py",
    "tests/integration/test_local_aws.py",
    "tests/integration/test_hierarchy_tags_moto.py",
    "tests/integration/test_plugin_cache.py",
    "tests/fuzz/test_whitelist_fuzz.py",
    "tests/integration/test_controller_actions.py",
    "tests/integration/test_verify_playbook.py",
)

#: unlisted files under these run before the other unlisted ones
END_TO_END_DIRS = ("tests/integration/", "tests/faults/")


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list) -> None:
    """Files in HEAVIEST_FIRST order, then the others: end-to-end directories first, then by
    number of tests (descending);
    the order inside a file is kept. Deterministic, so every xdist worker collects the
    same list (xdist requires it). --ff / --nf keep their own order."""
    if config.getoption("failedfirst", False) or config.getoption("newfirst", False):
        return
    rank = {path: i for i, path in enumerate(HEAVIEST_FIRST)}
    counts: Dict[str, int] = {}
    first_seen: Dict[str, int] = {}
    for i, item in enumerate(items):
        path = _file_of(item)
        counts[path] = counts.get(path, 0) + 1
        first_seen.setdefault(path, i)

    def key(indexed: Any) -> Any:
        i, item = indexed
        path = _file_of(item)
        if path in rank:
            return (0, rank[path], 0, 0, i)
        end_to_end = path.startswith(END_TO_END_DIRS)
        return (1, 0 if end_to_end else 1, -counts[path], first_seen[path], i)

    items[:] = [item for _pos, item in sorted(enumerate(items), key=key)]


def _library_tests_only(config: pytest.Config) -> bool:
    """Every path the run names lies in tests/unit or tests/fuzz, whose tests need no endpoint
    (``scripts/units``: ``ansible-test units`` names each file of tests/unit)."""
    here = str(config.invocation_params.dir)
    paths = [os.path.abspath(os.path.join(here, str(a).split("::", 1)[0])) for a in config.args]
    dirs = [os.path.join(REPO_ROOT, "tests", d) for d in ("unit", "fuzz")]
    return bool(paths) and all(any(p == d or p.startswith(d + os.sep) for d in dirs) for p in paths)


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, start one moto server in the controller for all workers (the workers
    inherit its directory through the environment); it stops with the controller."""
    # keep the file order of pytest_collection_modifyitems: xdist's default re-sorts the
    # files of --dist loadfile/loadscope by their number of tests
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get(SHARED_MOTO_ENV):
        return
    if not getattr(config.option, "numprocesses", None):
        return
    if "not integration" in (getattr(config.option, "markexpr", "") or "") or _library_tests_only(config):
        return
    import tempfile

    state_dir = tempfile.mkdtemp(prefix="csis-test-moto-")
    la = local_aws.LocalAws(state_dir)
    la.start(prefer_port=None, tie_to_caller=True)
    la.seed()
    os.environ[SHARED_MOTO_ENV] = state_dir
    config._csis_shared_moto = la  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._csis_exitstatus = int(exitstatus)  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the shared moto server. Its directory (the server's log, its seed) goes with it when
    every test passed; after a failure it stays, and its path is printed, for the log."""
    la = getattr(config, "_csis_shared_moto", None)
    if la is not None:
        la.stop()
        os.environ.pop(SHARED_MOTO_ENV, None)
        if getattr(config, "_csis_exitstatus", 1) == 0:
            shutil.rmtree(la.state_dir, ignore_errors=True)
        else:
            sys.stderr.write("the shared moto server's directory (its log: server.log) is kept: %s\n" % la.state_dir)


@pytest.fixture(scope="session")
def tf_env() -> Dict[str, str]:
    from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import terraform_env

    env = terraform_env()
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        env.pop(key, None)
    env.update(local_aws.DUMMY_CREDENTIALS)
    env["AWS_DEFAULT_REGION"] = local_aws.REGION
    env["AWS_REGION"] = local_aws.REGION
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


# ------------------------------------------------------------------ where the suite's time goes
_FILE_SECONDS: Dict[str, float] = {}
_FILE_TESTS: Dict[str, int] = {}
#: each test's CPU by phase ({nodeid: {"setup": s, "call": s, "teardown": s}}): a module
#: fixture's work (an applied tree) is in the setup of the first test that uses it
_TEST_CPU: Dict[str, Dict[str, float]] = {}
_CPU_KEY = "csis_cpu_seconds"


def _cpu_now() -> float:
    """CPU seconds (user + system) of this process and of every process it has waited for,
    theirs included (a playbook's terraform and provider); not a detached process (the async
    apply's terraform) nor the shared moto server."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


#: (pid, CPU seconds) at the previous report
_LAST_CPU = [(os.getpid(), _cpu_now())]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    """Each report (setup, call, teardown) carries the CPU used since the previous one, as a
    user property (xdist sends those to the controller). Under ``ansible-test units`` each test
    runs in a fork of its own (ansible-test's ansible_forked plugin), whose counts start at
    zero: there the baseline is zero, not the parent's figure."""
    outcome = yield
    pid, now = os.getpid(), _cpu_now()
    last_pid, last = _LAST_CPU[0]
    outcome.get_result().user_properties.append((_CPU_KEY, now - (last if last_pid == pid else 0.0)))
    _LAST_CPU[0] = (pid, now)


def pytest_runtest_logreport(report: Any) -> None:
    """Sum setup, call and teardown time per test file, and each test's CPU by phase (on the
    xdist controller too); a file's CPU is its tests' sum (pytest_terminal_summary)."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)
    for key, value in getattr(report, "user_properties", None) or ():
        if key == _CPU_KEY:
            phases = _TEST_CPU.setdefault(report.nodeid, {})
            phases[report.when] = phases.get(report.when, 0.0) + float(value)
    if report.when == "call":
        _FILE_TESTS[path] = _FILE_TESTS.get(path, 0) + 1


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The 15 test files that took longest (worker seconds), and their CPU, so the suite's budget
    stays visible; then the 15 that used the most CPU, when those differ."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not _FILE_SECONDS:
        return
    test_cpu = {nodeid: sum(phases.values()) for nodeid, phases in _TEST_CPU.items()}
    file_cpu: Dict[str, float] = {}
    for nodeid, seconds in test_cpu.items():
        path = nodeid.split("::", 1)[0]
        file_cpu[path] = file_cpu.get(path, 0.0) + seconds
    total, cpu = sum(_FILE_SECONDS.values()), sum(file_cpu.values())
    terminalreporter.write_sep("=", "slowest test files (worker seconds; %.0f s in all; CPU: %.0f s, the workers' "
                                    "and what they waited for, not detached applies nor moto)" % (total, cpu))
    slowest = sorted(_FILE_SECONDS, key=lambda p: -_FILE_SECONDS[p])[:15]
    for path in slowest:
        terminalreporter.write_line("%8.1f s  %7.1f s CPU  %4d tests  %s" % (
            _FILE_SECONDS[path], file_cpu.get(path, 0.0), _FILE_TESTS.get(path, 0), path))
    hungriest = sorted(file_cpu, key=lambda p: -file_cpu[p])[:15]
    if file_cpu and set(hungriest) != set(slowest):
        terminalreporter.write_sep("-", "most CPU")
        for path in hungriest:
            terminalreporter.write_line("%8.1f s  %7.1f s CPU  %4d tests  %s" % (
                _FILE_SECONDS.get(path, 0.0), file_cpu[path], _FILE_TESTS.get(path, 0), path))
    if any(seconds >= 1.0 for seconds in test_cpu.values()):  # not for a run of unit tests alone
        fixtures = sum(p.get("setup", 0.0) + p.get("teardown", 0.0) for p in _TEST_CPU.values())
        terminalreporter.write_sep("-", "the 15 tests that used the most CPU (setup: their fixtures, an "
                                        "applied tree in the first test of a file; %.0f s in all setups "
                                        "and teardowns)" % fixtures)
        for nodeid in sorted(test_cpu, key=lambda n: -test_cpu[n])[:15]:
            if test_cpu[nodeid] < 1.0:
                break
            terminalreporter.write_line("%7.1f s CPU  setup %6.1f s  %s" % (
                test_cpu[nodeid], _TEST_CPU[nodeid].get("setup", 0.0), nodeid))
    log = os.environ.get("CSIS_TEST_CPU_LOG")
    if log and _TEST_CPU:  # every test's CPU by phase, as JSON (benchmarks/README.md)
        with open(log, "w", encoding="utf-8") as fh:
            json.dump(_TEST_CPU, fh, indent=1, sort_keys=True)
        terminalreporter.write_line("each test's CPU by phase: %s" % log)
    moto = _moto_cpu(config)
    if moto is not None:
        terminalreporter.write_line("the shared moto server (every test's AWS endpoint): %.0f s of CPU" % moto)


def _moto_cpu(config: pytest.Config) -> Any:
    """CPU seconds (user + system) the shared moto server has used so far; None without one."""
    la = getattr(config, "_csis_shared_moto", None)
    rec = la.recorded() if la is not None else None
    if not rec:
        return None
    from ansible_collections.csis.infra.plugins.module_utils.csis import procs  # the collection's /proc reader

    fields = procs.stat_fields(int(rec["pid"]))
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / float(os.sysconf("SC_CLK_TCK"))  # utime + stime, in ticks
