# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""csis_state_lock's decisions (the S3 read and the force-unlock are stubbed; the real
path runs in tests/faults/test_kill_at_every_step.py: the plan and apply kills)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from ansible_collections.csis.infra.plugins.module_utils.csis import terraform
from ansible_collections.csis.infra.plugins.module_utils.csis.apply import statelock as sl


def _root(tmp_path, backend_type="s3", use_lockfile=True, workspace=None, key="statefiles/x/aws_ebs.tfstate"):
    d = tmp_path / "root"
    (d / ".terraform").mkdir(parents=True)
    (d / ".terraform" / "terraform.tfstate").write_text(json.dumps({"backend": {"type": backend_type, "config": {
        "bucket": "b", "key": key, "use_lockfile": use_lockfile, "region": "us-east-2"}}}))
    if workspace:
        (d / ".terraform" / "environment").write_text(workspace)
    return str(d)


def test_lock_key(tmp_path):
    assert sl.lock_key(sl.backend_of(_root(tmp_path))) == ("b", "statefiles/x/aws_ebs.tfstate.tflock")


def test_lock_key_of_a_workspace(tmp_path):
    assert sl.lock_key(sl.backend_of(_root(tmp_path, workspace="blue"))) == \
        ("b", "env:/blue/statefiles/x/aws_ebs.tfstate.tflock")


def test_no_lockfile_or_no_init_is_a_no_op(tmp_path):
    assert sl.check_and_release(_root(tmp_path, use_lockfile=False))["locked"] is False
    assert sl.check_and_release(str(tmp_path / "nowhere"))["locked"] is False


@pytest.fixture
def locked(monkeypatch):
    info = {"ID": "abc-123", "Operation": "OperationTypeApply", "Who": sl.local_who(),
            "Created": "2026-01-01T00:00:00Z", "Path": "b/statefiles/x/aws_ebs.tfstate"}
    monkeypatch.setattr(sl, "read_lock", lambda backend: dict(info))
    calls = []

    def fake_run(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")
    monkeypatch.setattr(terraform.subprocess, "run", fake_run)
    return info, calls


def test_a_dead_local_holder_is_released(tmp_path, monkeypatch, locked):
    info, calls = locked
    monkeypatch.setattr(sl, "live_holders", lambda backend: [])
    root = _root(tmp_path)
    with pytest.raises(sl.StateLockError) as exc:  # release off (check mode): what a real run releases
        sl.check_and_release(root, release=False)
    assert exc.value.releasable and exc.value.lock.endswith("lock ID abc-123); its holder on this machine is gone")
    assert calls == []
    res = sl.check_and_release(root)
    assert res["released"] and res["changed"]
    assert calls == [["terraform", "force-unlock", "-force", "-no-color", "abc-123"]]
    assert "its holder on this machine is gone" in res["msg"]


class _CheckModule:
    check_mode = True

    def warn(self, msg):  # pragma: no cover - check mode releases nothing
        raise AssertionError("check mode warned: %s" % msg)


@pytest.mark.parametrize("release", [True, False])
def test_the_modules_check_mode_says_what_a_real_run_would_do(tmp_path, monkeypatch, locked, release):
    """csis_state_lock --check: with release on, the lock a real run releases is a change it would make (and its
    content is returned, as a real run returns it); with release off, the refusal a real run gives, not a change."""
    from ansible_collections.csis.infra.plugins.modules import csis_state_lock
    info, calls = locked
    monkeypatch.setattr(sl, "live_holders", lambda backend: [])
    params = dict(project_path=_root(tmp_path), binary_path="terraform", release=release, force_unlock=None)
    if release:
        res = csis_state_lock._release(_CheckModule(), params)
        assert (res["changed"], res["locked"], res["released"]) == (True, True, False)
        assert res["lock"] == info and res["msg"].startswith("would release the state lock: ")
    else:
        with pytest.raises(sl.StateLockError, match="its holder on this machine is gone") as exc:
            csis_state_lock._release(_CheckModule(), params)
        assert exc.value.content == info
    assert calls == []


def test_a_live_local_holder_is_left_alone(tmp_path, monkeypatch, locked):
    _info, calls = locked
    monkeypatch.setattr(sl, "live_holders", lambda backend: [{"pid": 42, "argv": ["terraform", "apply"], "cwd": "/r"}])
    with pytest.raises(sl.StateLockError, match="held by a live process on this machine: 42"):
        sl.check_and_release(_root(tmp_path))
    assert calls == []


def test_a_local_lock_is_never_released_where_processes_cannot_be_read(tmp_path, monkeypatch, locked):
    """No /proc (a macOS controller): "no live holder" cannot be told from "cannot look", so the
    lock stays and the run stops with the procedure."""
    _info, calls = locked
    monkeypatch.setattr(sl.procs, "available", lambda: False)
    with pytest.raises(sl.StateLockError) as exc:
        sl.check_and_release(_root(tmp_path))
    assert "cannot be read (no /proc)" in str(exc.value) and "force-unlock abc-123" in str(exc.value)
    assert calls == []
    with pytest.raises(sl.StateLockError, match="cannot be read"):
        sl.live_holders({"type": "s3", "config": {}})


def test_inside_an_awx_job_a_lock_of_this_host_name_is_not_released_on_its_own(tmp_path, monkeypatch, locked):
    """An AWX job's container sees its own processes only: another job's container can carry the same
    host name (host networking) while its terraform apply is invisible here. Such a lock is refused
    with the procedure (the operator's csis_force_unlock still releases it); a held apply's lock
    says to query the state first (a killed apply may have left it behind reality)."""
    _info, calls = locked
    monkeypatch.setattr(sl, "live_holders", lambda backend: [])
    monkeypatch.setenv("CSIS_AWX_JOB_ID", "77")
    root = _root(tmp_path)
    with pytest.raises(sl.StateLockError) as exc:
        sl.check_and_release(root)
    text = str(exc.value)
    assert "this run is AWX job 77, whose container cannot see the processes of other jobs on its node" in text
    assert "run again with -e csis_force_unlock=abc-123" in text and calls == []
    assert text.endswith("an apply held it: what it changed may be missing from the state, so run "
                         "playbooks/state_query.yml before the next plan (what it created shows as foreign; adopt it "
                         "with playbooks/state_import.yml)"), text
    res = sl.check_and_release(root, confirmed_gone=["abc-123"])
    assert res["released"] and calls == [["terraform", "force-unlock", "-force", "-no-color", "abc-123"]]
    # AWX's own variable says so too; a blank one (no job) lets a dead local holder's lock go as before
    monkeypatch.delenv("CSIS_AWX_JOB_ID")
    monkeypatch.setenv("AWX_JOB_ID", "78")
    with pytest.raises(sl.StateLockError, match="this run is AWX job 78, "):
        sl.check_and_release(root)
    monkeypatch.setenv("AWX_JOB_ID", "  ")
    assert sl.check_and_release(root)["released"]


def test_another_machines_lock_is_refused_with_the_procedure(tmp_path, monkeypatch, locked):
    info, calls = locked
    info["Who"] = "someone@elsewhere"
    monkeypatch.setattr(sl, "read_lock", lambda backend: dict(info))
    with pytest.raises(sl.StateLockError) as exc:
        sl.check_and_release(_root(tmp_path))
    assert "someone@elsewhere" in str(exc.value) and "force-unlock abc-123" in str(exc.value)
    assert calls == []


def test_another_machines_lock_is_released_when_the_operator_names_its_id(tmp_path, monkeypatch, locked):
    """A killed AWX job's lock (its container is gone, so csis cannot prove it dead): the refusal
    names the ID and csis_force_unlock; with that ID given the plan step releases it."""
    info, calls = locked
    info["Who"] = "runner@awx-ee-7f9c"
    monkeypatch.setattr(sl, "read_lock", lambda backend: dict(info))
    root = _root(tmp_path)
    with pytest.raises(sl.StateLockError) as exc:
        sl.check_and_release(root, confirmed_gone=["another-id"])  # an ID that is not this lock's releases nothing
    assert "run again with -e csis_force_unlock=abc-123" in str(exc.value) and not exc.value.releasable
    # nor does a blank answer (an AWX survey left empty) or a part of the ID
    for blank_or_part in ([""], [" "], ["abc"], ["abc-123-x"]):
        with pytest.raises(sl.StateLockError, match="a run on another machine"):
            sl.check_and_release(root, confirmed_gone=blank_or_part)
    assert calls == []
    res = sl.check_and_release(root, confirmed_gone=[" abc-123"])
    assert res["released"] and res["changed"] and calls == [["terraform", "force-unlock", "-force", "-no-color", "abc-123"]]
    assert "runner@awx-ee-7f9c" in res["msg"] and "given in csis_force_unlock" in res["msg"]
    # release off (check mode): reported as releasable, nothing run
    with pytest.raises(sl.StateLockError) as exc:
        sl.check_and_release(root, release=False, confirmed_gone=["abc-123"])
    assert exc.value.releasable and "not released" in str(exc.value) and len(calls) == 1
    assert exc.value.lock.startswith("b/statefiles/x/aws_ebs.tfstate is locked by runner@awx-ee-7f9c since ")
    assert exc.value.lock.endswith("lock ID abc-123); its ID was given in csis_force_unlock: the operator found its run gone")
    # none named (an unset run variable, null from AWX): nothing released, the refusal as before
    with pytest.raises(sl.StateLockError, match="a run on another machine"):
        sl.check_and_release(root, confirmed_gone=None)
    info["ID"] = ""  # a lock without an ID: a blank answer does not name it
    with pytest.raises(sl.StateLockError, match="a run on another machine"):
        sl.check_and_release(root, confirmed_gone=[""])
    assert len(calls) == 1


@pytest.mark.parametrize("user", ["this user", "another user"])
def test_a_named_lock_a_live_process_of_this_machine_holds_is_not_released(tmp_path, monkeypatch, locked, user):
    """A terraform of this machine (this user's, or another user's) works on the state: the
    operator's word does not override that."""
    info, calls = locked
    if user == "another user":
        info["Who"] = "someone-else@" + sl.local_who().split("@", 1)[1]
    monkeypatch.setattr(sl, "read_lock", lambda backend: dict(info))
    monkeypatch.setattr(sl.procs, "available", lambda: True)
    monkeypatch.setattr(sl, "live_holders", lambda backend: [{"pid": 42, "argv": ["terraform", "apply"], "cwd": "/r"}])
    with pytest.raises(sl.StateLockError, match="held by a live process on this machine: 42"):
        sl.check_and_release(_root(tmp_path), confirmed_gone=["abc-123"])
    assert calls == []


def test_a_named_lock_whose_force_unlock_fails_stops_the_run(tmp_path, monkeypatch):
    """The real terraform's force-unlock, which fails here (the root's backend file is hand-made, not one it reads)."""
    binary = shutil.which("terraform")
    if binary is None:
        pytest.skip("needs terraform on PATH")
    info = {"ID": "abc-123", "Operation": "OperationTypeApply", "Who": "runner@awx-ee-7f9c",
            "Created": "2026-01-01T00:00:00Z", "Path": "b/statefiles/x/aws_ebs.tfstate"}
    monkeypatch.setattr(sl, "read_lock", lambda backend: dict(info))
    monkeypatch.setattr(sl, "live_holders", lambda backend: [])
    with pytest.raises(sl.StateLockError, match=r"given in csis_force_unlock.*force-unlock failed \(rc 1\)"):
        sl.check_and_release(_root(tmp_path), binary, confirmed_gone=["abc-123"])


def test_live_holders_matches_the_same_state_only(tmp_path, monkeypatch):
    root = _root(tmp_path)
    other = tmp_path / "other"
    (other / ".terraform").mkdir(parents=True)
    (other / ".terraform" / "terraform.tfstate").write_text(json.dumps({"backend": {"type": "s3", "config": {
        "bucket": "b", "key": "statefiles/x/aws_efs.tfstate", "use_lockfile": True}}}))
    assert sl._same_state(sl.backend_of(root), sl.backend_of(root))
    assert not sl._same_state(sl.backend_of(root), sl.backend_of(str(other)))
    assert os.getpid()  # live_holders scans /proc: no terraform of ours runs on this state
    assert sl.live_holders(sl.backend_of(root)) == []
    # the same bucket and key through two S3 endpoints that name themselves are two states (a local
    # endpoint's bucket beside AWS's); when either names none, they may be one
    same = {"type": "s3", "workspace": "default", "config": {"bucket": "b", "key": "k"}}

    def at(url, key="endpoints"):
        return dict(same, config=dict(same["config"], **({key: {"s3": url}} if key == "endpoints" else {key: url})))
    assert not sl._same_state(at("http://127.0.0.1:5000"), at("http://127.0.0.1:5001"))
    assert sl._same_state(at("http://127.0.0.1:5000"), at("http://127.0.0.1:5000/", key="endpoint"))
    assert sl._same_state(at("http://127.0.0.1:5000"), same) and sl._same_state(same, same)


def test_live_holders_finds_a_terraform_process_on_the_same_state(tmp_path):
    # a state of its own: its process would be a live holder of any other test's root on the same
    # state (ansible-test units runs this file's tests in parallel, on several workers)
    root = _root(tmp_path, key="statefiles/live-holder/aws_ebs.tfstate")
    fake = tmp_path / "bin" / "terraform"
    fake.parent.mkdir()
    fake.symlink_to("/bin/sleep")     # argv[0] is .../terraform
    proc = subprocess.Popen([str(fake), "30"], cwd=root)
    try:
        import time
        for _attempt in range(50):
            found = sl.live_holders(sl.backend_of(root))
            if found:
                break
            time.sleep(0.05)
        assert [p["pid"] for p in found] == [proc.pid]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("argv,holds", [
    (["terraform", "apply", "-input=false", "plan.tfplan"], True),
    (["terraform", "-chdir=/r", "plan", "-out=p"], True),
    (["tofu", "import", "module.x.aws_ebs_volume.this", "vol-1"], True),
    (["terraform", "state", "rm", "module.x"], True),
    (["terraform", "init", "-reconfigure"], True),
    (["terraform"], True),                      # unknown: counted, as before
    (["terraform", "30"], True),
    (["terraform", "validate", "-json"], False),
    (["terraform", "-chdir=/r", "show", "-json", "p"], False),
    (["terraform", "output", "-json"], False),
    (["terraform", "version", "-json"], False),
    (["terraform", "-version"], False),
    (["terraform", "state", "pull"], False),
    (["terraform", "state", "list"], False),
    (["terraform", "workspace", "list"], False),
    (["terraform", "workspace", "new", "w"], True),
    (["terraform", "plan", "-lock=false", "-out=p"], False),
])
def test_only_a_command_that_can_lock_is_a_holder(argv, holds):
    """A dry run's validate of another tree on the same state is no holder (the stale-lock check
    named one); a plan, apply, import or state change is."""
    assert sl.may_hold_lock(argv) is holds


@pytest.mark.parametrize("body", [b"[1, 2]", b"\"locked\"", b"{not json", b"[" * 100000])
def test_a_lock_object_that_is_not_terraforms_is_shown_raw_not_read_as_one(tmp_path, monkeypatch, body):
    """Another tool's object at the lock's key (or a cut one) is never taken for terraform's lock
    info: it is shown as it is (a TypeError or RecursionError came out of the JSON instead)."""
    import io

    class S3:
        def get_object(self, Bucket, Key):  # noqa: N803 (boto3's names)
            return {"Body": io.BytesIO(body)}

    monkeypatch.setattr(sl.aws, "client", lambda service, access: S3())
    info = sl.read_lock(sl.backend_of(_root(tmp_path)))
    assert info == {"raw": body.decode("utf-8", "replace"),
                    "lock_object": "s3://b/statefiles/x/aws_ebs.tfstate.tflock"}


@pytest.mark.parametrize("config", [["bucket", "b"], {"path": 5}, {"workspace_dir": ["x"]}])
def test_backend_settings_not_as_terraform_writes_them_are_left_to_terraform(tmp_path, config):
    from ansible_collections.csis.infra.plugins.module_utils.csis import tfstate

    d = tmp_path / "root"
    (d / ".terraform").mkdir(parents=True)
    (d / ".terraform" / "terraform.tfstate").write_text(json.dumps({"backend": {"type": "local", "config": config}}))
    (d / ".terraform" / "environment").write_text("blue")
    backend = tfstate.backend_of(str(d))
    assert backend is None or tfstate.state_object(backend, str(d)) is None


def test_another_machines_lock_says_its_age_by_the_stores_clock(tmp_path, monkeypatch):
    """The lock's Created is the holder's clock; the refusal also says how long ago the object was
    written by the store's own (its answer's Date less its Last-Modified): what tells an operator
    a lock of a job that ended hours ago from a run in progress."""
    import datetime as dt
    import io

    lock = {"ID": "abc-123", "Operation": "OperationTypeApply", "Who": "runner@awx-job-41",
            "Created": "2026-12-06T09:00:00Z", "Path": "b/statefiles/x/aws_ebs.tfstate",
            "lock_age": float("nan")}  # a field terraform never writes is not taken for the store's word

    class S3:
        def get_object(self, Bucket, Key):  # noqa: N803 (boto3's names)
            return {"Body": io.BytesIO(json.dumps(lock).encode()),
                    "LastModified": dt.datetime(2026, 12, 6, 9, 0, 0, tzinfo=dt.timezone.utc),
                    "ResponseMetadata": {"HTTPHeaders": {"date": "Sun, 06 Dec 2026 12:05:30 GMT"}}}

    monkeypatch.setattr(sl.aws, "client", lambda service, access: S3())
    root = _root(tmp_path)
    info = sl.read_lock(sl.backend_of(root))
    assert info["lock_age"] == 3 * 3600 + 5 * 60 + 30 and info["Who"] == "runner@awx-job-41"
    with pytest.raises(sl.StateLockError) as exc:
        sl.check_and_release(root)
    assert ("is locked by runner@awx-job-41 since 2026-12-06T09:00:00Z (operation OperationTypeApply, lock ID abc-123, "
            "written 3 h 05 min ago by the store's clock), a run on another machine") in str(exc.value)

    class Dateless(S3):
        def get_object(self, Bucket, Key):  # noqa: N803 (boto3's names)
            return {"Body": io.BytesIO(json.dumps(lock).encode())}

    monkeypatch.setattr(sl.aws, "client", lambda service, access: Dateless())
    assert "lock_age" not in sl.read_lock(sl.backend_of(root))  # the object's own NaN is dropped, nothing claimed
    with pytest.raises(sl.StateLockError, match=r"lock ID abc-123\), a run on another machine"):
        sl.check_and_release(root)


def test_where_processes_cannot_be_read_the_operators_word_is_taken(tmp_path, monkeypatch, locked):
    _info, calls = locked
    monkeypatch.setattr(sl.procs, "available", lambda: False)
    res = sl.check_and_release(_root(tmp_path), confirmed_gone=["abc-123"])
    assert res["released"] and len(calls) == 1


def test_a_refusal_names_the_way_its_caller_takes_the_id(tmp_path, monkeypatch, locked):
    info, _calls = locked
    info["Who"] = "runner@awx-ee-7f9c"
    monkeypatch.setattr(sl, "read_lock", lambda backend: dict(info))
    root = _root(tmp_path)
    with pytest.raises(sl.StateLockError) as exc:  # a caller that takes no IDs (the state import) names none
        sl.check_and_release(root, confirm_with=None)
    assert "csis_force_unlock" not in str(exc.value) and "force-unlock abc-123" in str(exc.value)
    with pytest.raises(sl.StateLockError) as exc:
        sl.check_and_release(root, confirm_with="give {id} to the module")
    assert "release the lock: give abc-123 to the module, or terraform" in str(exc.value)
    info["ID"] = ""  # no ID to name: nothing to run again with
    with pytest.raises(sl.StateLockError) as exc:
        sl.check_and_release(root)
    assert "csis_force_unlock" not in str(exc.value) and "force-unlock <ID>" in str(exc.value)


def test_a_plan_that_fails_after_a_release_keeps_the_release_in_its_message(tmp_path, monkeypatch):
    """The lock went before the plan failed: the failure (and so its audit record) says so."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply import tfplan

    binary = shutil.which("terraform")
    if binary is None:
        pytest.skip("needs terraform on PATH")
    released = {"changed": True, "locked": True, "released": True, "msg": "released the state lock: X; its ID was given"}
    asked = []
    monkeypatch.setattr(tfplan, "check_and_release", lambda *a, **k: asked.append(k) or dict(released))
    root = str(tmp_path / "root")
    os.makedirs(root)
    with pytest.raises(terraform.TerraformError) as exc:  # the real terraform, in a root with no configuration
        tfplan.make_plan(root, binary_path=binary, release_stale_lock=True, force_unlock=["X"])
    assert "terraform plan failed" in str(exc.value) and "(before this plan, released the state lock: X" in str(exc.value)
    assert [k["confirmed_gone"] for k in asked] == [["X"]]  # the operator's IDs reach the check


@pytest.mark.parametrize("value,ids", [(None, None), ("", [""]), ("a, b", ["a", " b"]), (["x"], ["x"])])
def test_the_roles_csis_force_unlock_takes_what_awx_and_a_terminal_pass(value, ids):
    """roles/tofu_root's argument spec: null (an AWX survey question left blank, awx issue 16205),
    an empty string, a comma-separated string and a list all pass the role's validation; none of
    the first two can name a lock (check_and_release wants a non-empty ID)."""
    import yaml
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "roles", "tofu_root", "meta", "argument_specs.yml")
    with open(path, encoding="utf-8") as fh:
        option = yaml.safe_load(fh)["argument_specs"]["main"]["options"]["csis_force_unlock"]
    spec = {k: v for k, v in option.items() if k != "description"}
    result = ArgumentSpecValidator({"csis_force_unlock": spec}).validate({"csis_force_unlock": value})
    assert result.error_messages == [] and result.validated_parameters["csis_force_unlock"] == ids
