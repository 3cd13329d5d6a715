# -*- coding: utf-8 -*-
"""The S3 meta-state store (issue 10) against the session's moto server: two checkouts that
share only the endpoint, a waiting second writer, a SIGKILLed holder's lock broken once it
expired, a lost update refused, the migration of a checkout's local meta-state, a reader in one
checkout never returning half of the other's commit, and the inventory plugin listing what the
other checkout recorded. boto3 only: no terraform."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from ansible_collections.csis.infra.plugins.module_utils.csis.module import call_run
from ansible_collections.csis.infra.plugins.module_utils.csis.state import store
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import (
    Conflict, MetaState, MetaStateError, audit_trail, launched_instances, record_at)

import local_aws  # noqa: E402  (tests/support, on sys.path through tests/conftest.py)
from store_faults import ends_before_lock_check, paused_commit  # noqa: E402  (tests/support)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO / ".venv" / "collections"
LP, IS = "launch-params.yaml", "instance-state.yaml"


@pytest.fixture
def aws_env(moto_endpoint, monkeypatch, tmp_path):
    for key, value in moto_endpoint.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CSIS_META_STATE_CACHE", str(tmp_path / "reader-cache"))
    return dict(os.environ)


@pytest.fixture
def checkouts(tmp_path, moto_endpoint, aws_env):
    """make(name) -> a tree declaring an S3 meta-state under one prefix shared by every checkout."""
    prefix = "test-%s" % uuid.uuid4().hex[:10]

    def make(name: str) -> Path:
        root = tmp_path / name
        if (root / "cfg").is_dir():
            return root
        (root / "cfg").mkdir(parents=True)
        (root / "cfg" / "_config.yml").write_text(yaml.safe_dump({
            "id": "s3-store", "config": {},
            "meta_state": {"backend": "s3", "state_backend": "shared", "prefix": prefix}}))
        (root / "cfg" / "state-backends.yml").write_text(yaml.safe_dump({"state_backends": [{
            "name": "shared", "type": "s3", "bucket": local_aws.STATE_BUCKET, "key": "statefiles/%s" % prefix,
            "region": local_aws.REGION, "endpoints": {"url": moto_endpoint.url}, "use_path_style": True}]}))
        return root
    make.prefix = prefix  # type: ignore[attr-defined]
    return make


def _launch(**extra):
    return dict({"image": "base", "launched": True, "group": "team"}, **extra)


def _current(iid):
    return {"generation": {"durable": 1, "ephemeral": 0}, "current": {"number": 1, "kind": "durable", "instance_id": iid}}


def _s3_keys(moto_endpoint, prefix):
    s3 = moto_endpoint.client("s3")
    resp = s3.list_objects_v2(Bucket=local_aws.STATE_BUCKET, Prefix=prefix + "/")
    return sorted(o["Key"][len(prefix) + 1:] for o in resp.get("Contents") or ())


def test_two_checkouts_share_records_revisions_and_history(checkouts, moto_endpoint):
    a, b = MetaState(str(checkouts("a"))), MetaState(str(checkouts("b")))
    assert a.backend == "s3" and a.where == b.where
    with a.transaction("apply from A", context={"root": "instances-aws"}) as txn:
        txn.save_record(LP, "web", _launch())
        txn.save_record(IS, "web", _current("i-1"))
    assert sorted(launched_instances(b)) == ["web"]
    assert b.load(IS)["instances"]["web"]["current"]["instance_id"] == "i-1"
    assert not os.path.exists(os.path.join(b.config_root, "meta-state"))  # nothing local
    with b.transaction("change from B") as txn:
        rec = txn.load_record(LP, "web")
        rec["alias"] = "db"
        txn.save_record(LP, "web", rec)
    assert a.load(LP)["instances"]["web"]["alias"] == "db" and a.revision() == 2
    assert _s3_keys(moto_endpoint, checkouts.prefix) == [
        "meta-state/audit/00000001.yaml", "meta-state/audit/00000002.yaml", "meta-state/instance-state/web.yaml",
        "meta-state/launch-params/web.yaml", "meta-state/revision.yaml"]
    trail = audit_trail(a, instance="web")
    assert [(d["revision"], d["what"]) for d in trail] == [(1, "apply from A"), (2, "change from B")]
    assert [d["revision"] for d in audit_trail(a, root="instances-aws")] == [1]
    assert "alias" not in record_at(a, LP, "web", 1) and record_at(b, LP, "web", 2)["alias"] == "db"
    # no credential of any kind went into the store
    s3 = moto_endpoint.client("s3")
    for key in _s3_keys(moto_endpoint, checkouts.prefix):
        body = s3.get_object(Bucket=local_aws.STATE_BUCKET, Key="%s/%s" % (checkouts.prefix, key))["Body"].read()
        assert os.environ["AWS_SECRET_ACCESS_KEY"].encode() not in body


HOLDER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {collections!r})
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState
    ms = MetaState({root!r})
    with ms.transaction("holder") as txn:
        txn.save_record("launch-params.yaml", "held", {{"launched": True}})
        print("LOCKED", flush=True)
        time.sleep({hold})
    print("DONE", flush=True)
""")


def _holder(root, hold, env):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(collections=str(COLLECTIONS), root=str(root), hold=hold)],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "LOCKED"
    return proc


def test_recording_one_instance_in_s3_reads_and_writes_only_its_objects(checkouts, moto_endpoint):
    """The record after an apply, in the S3 store: checkout B records one instance of a fleet that
    A recorded; the other instances' objects are not read (emptied, they would be refused) and
    the commit writes the instance's records, its pin, the pins' rest and nothing else."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import record

    a = MetaState(str(checkouts("a")))
    with a.transaction("fleet from A") as txn:
        for n in ("n1", "n2", "n3"):
            txn.save_record(LP, n, _launch())
            txn.save_record(IS, n, _current("i-%s" % n))
            txn.save_record("pins.yaml", n, "ami-1")
    s3 = moto_endpoint.client("s3")
    for n in ("n2", "n3"):
        for folder in ("launch-params", "instance-state", "pins"):
            s3.put_object(Bucket=local_aws.STATE_BUCKET, Key="%s/meta-state/%s/%s.yaml" % (checkouts.prefix, folder, n),
                          Body=b"")
    root = {"lifecycle": "instance-image", "builder": "ec2", "instances": {
        "n1": {"address": "module.inst_n1", "launch_params": {"image": "base", "group": "team"}}}}
    state = {"resources": [{"mode": "managed", "module": "module.inst_n1", "type": "aws_instance", "name": "this",
                            "instances": [{"attributes": {"id": "i-new", "ami": "ami-2"}}]}]}
    got = record.record_instance_root(MetaState(str(checkouts("b"))), root, state, "r2")
    assert got["n1"] == "launched" and sorted(got["_written"]) == sorted([LP, IS, "pins.yaml"])
    keys = [(c["file"], c.get("key") or "") for c in audit_trail(a)[-1]["changes"]]
    assert sorted(keys) == sorted([(LP, "n1"), (IS, "n1"), ("pins.yaml", "n1"), ("pins.yaml", "")])
    assert a.load_record("pins.yaml", "n1") == "ami-2" and a.load_record(IS, "n1")["current"]["instance_id"] == "i-new"
    assert "pins/_rest.yaml" in _s3_keys(moto_endpoint, checkouts.prefix + "/meta-state")


def test_a_second_writer_waits_then_sees_the_first(checkouts, aws_env):
    a, b = checkouts("a"), checkouts("b")
    proc = _holder(a, 1.5, aws_env)
    try:
        started = time.monotonic()
        ms = MetaState(str(b), lock_timeout=30)
        with ms.transaction("waiter") as txn:
            waited = time.monotonic() - started
            assert txn.load_record(LP, "held") == {"launched": True}  # the holder's commit, read under the lock
            txn.save_record(LP, "second", {"launched": True})
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == 0 and waited >= 0.8
    assert sorted(ms.load(LP)["instances"]) == ["held", "second"]
    # a writer that cannot wait long enough fails naming the holder
    proc = _holder(a, 3, aws_env)
    try:
        with pytest.raises(MetaStateError, match=r"meta-state/\.lock: meta-state is locked by pid %d on host .* \(holder\)"
                           % proc.pid):
            with MetaState(str(b), lock_timeout=0.5).transaction("impatient"):
                pytest.fail("must not get the lock")
    finally:
        proc.wait(timeout=30)


def test_a_killed_holders_lock_expires_and_is_broken(checkouts, aws_env):
    a, b = checkouts("a"), checkouts("b")
    env = dict(aws_env, CSIS_META_STATE_LOCK_TTL="2")
    proc = _holder(a, 60, env)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    ms = MetaState(str(b), lock_timeout=30)
    started = time.monotonic()

    def run(_module, _params):  # a writer module's run (csis_record, csis_forget, ...): it returns no notices
        with ms.transaction("after the kill") as txn:
            txn.save_record(LP, "next", {"launched": True})
        return {"changed": True}

    class Module:  # the controller's stand-in for AnsibleModule (plugins/plugin_utils/controller.py)
        params: dict = {}
        warnings: list = []

        def warn(self, text):
            self.warnings.append(text)

    task = Module()
    assert call_run(run, task) == {"changed": True}
    assert time.monotonic() - started < 20
    assert len(ms.notices) == 1 and "broke the expired lock of pid %d" % proc.pid in ms.notices[0]
    assert task.warnings == ms.notices  # the task shows it, once, whatever writer broke the lock
    assert sorted(ms.load(LP)["instances"]) == ["next"]  # the killed holder committed nothing


def test_a_lock_expires_by_the_stores_clock_not_the_holders(checkouts, moto_endpoint):
    """Whether a lock expired is read by the store's clock (the object's age: its Date less its
    Last-Modified, both the store's) against the life its holder wrote: a live lock of a node whose
    clock is an hour behind (its expiry an hour past by this machine's clock) is not broken, and a
    lock unrenewed past its life is broken though its holder's clock put its expiry far ahead."""
    b = checkouts("b")
    s3 = moto_endpoint.client("s3")
    key = "%s/meta-state/.lock" % checkouts.prefix

    def lock_of(pid, ttl, expires_epoch):
        return json.dumps({"owner": {"pid": pid, "host": "skewed-node", "what": "holder"}, "ttl": ttl,
                           "created": "2026-12-06T00:00:00Z", "expires": "2026-12-06T00:01:00Z",
                           "expires_epoch": expires_epoch}).encode("utf-8")

    from ansible_collections.csis.infra.plugins.module_utils.csis.state import runlock

    objects = runlock.open_objects(str(b))
    run_key = "%s/meta-state/%s" % (checkouts.prefix, runlock.RUN_LOCK_NAME)
    s3.put_object(Bucket=local_aws.STATE_BUCKET, Key=key, Body=lock_of(101, 60, time.time() - 3600))
    s3.put_object(Bucket=local_aws.STATE_BUCKET, Key=run_key, Body=lock_of(103, 60, time.time() - 3600))
    assert objects.lock_held() and runlock.holder(objects)["pid"] == 103  # what readers and a second run see
    with pytest.raises(MetaStateError, match=r"meta-state is locked by pid 101 on host skewed-node .*\(\d+ s more "
                                             r"unless renewed, by the store's clock\)"):
        with MetaState(str(b), lock_timeout=0.5).transaction("impatient"):
            pytest.fail("broke a live lock by its holder's clock")
    assert b"skewed-node" in s3.get_object(Bucket=local_aws.STATE_BUCKET, Key=key)["Body"].read()

    s3.put_object(Bucket=local_aws.STATE_BUCKET, Key=key, Body=lock_of(102, 1, time.time() + 3600))
    s3.put_object(Bucket=local_aws.STATE_BUCKET, Key=run_key, Body=lock_of(104, 1, time.time() + 3600))
    time.sleep(2.2)  # their life (1 s) and the store clock's grain (1 s) gone, unrenewed
    assert not objects.lock_held() and runlock.holder(objects) is None
    ms = MetaState(str(b), lock_timeout=5)
    with ms.transaction("after its life") as txn:
        txn.save_record(LP, "next", {"launched": True})
    assert len(ms.notices) == 1 and "broke the expired lock of pid 102" in ms.notices[0], ms.notices
    assert "(it was not renewed within its 1 s life, by the store's clock: its holder is gone)" in ms.notices[0]


def test_a_lost_update_is_refused_and_overwrites_nothing(checkouts, aws_env):
    a, b = MetaState(str(checkouts("a"))), MetaState(str(checkouts("b")))
    with a.transaction() as txn:
        txn.save_record(LP, "web", _launch())
    stale = store.Transaction(a, None, "slow writer")  # its lock expired and was broken, say
    rec = stale.load_record(LP, "web")
    rec["alias"] = "stale"
    stale.save_record(LP, "web", rec)
    with b.transaction("fast writer") as txn:
        txn.save_record(LP, "web", _launch(alias="fresh"))
    with pytest.raises(Conflict, match=r"revision.yaml: another run committed since this transaction began"):
        stale._commit()
    assert b.load(LP)["instances"]["web"]["alias"] == "fresh" and b.revision() == 2
    # the record's own condition (IfMatch on the ETag read) holds even if the revision did not move
    stale = store.Transaction(a, None, "slow writer")
    rec = stale.load_record(LP, "web")
    rec["alias"] = "stale"
    stale.save_record(LP, "web", rec)
    b.objects.put("launch-params/web.yaml", store.dumps({"instances": {"web": _launch(alias="behind")}}).encode())
    with pytest.raises(Conflict, match=r"launch-params/web.yaml: changed since this transaction read it"):
        stale._commit()
    assert b.load(LP)["instances"]["web"]["alias"] == "behind"


def test_a_checkouts_local_meta_state_migrates_into_s3(checkouts, moto_endpoint):
    a = checkouts("a")
    os.makedirs(a / "meta-state")
    (a / "meta-state" / LP).write_text(yaml.safe_dump({"instances": {"web": _launch(), "old": _launch(launched=False)}}))
    (a / "meta-state" / "runs.yaml").write_text(yaml.safe_dump({"runs": [{"run": "r1"}]}))
    ms = MetaState(str(a))
    assert sorted(launched_instances(ms)) == ["web"]  # read from the checkout until the first transaction
    assert MetaState(str(checkouts("b"))).load(LP) == {"instances": {}}  # not in S3 yet
    with ms.transaction("first s3 transaction") as txn:
        txn.save_record(IS, "web", _current("i-9"))
    b = MetaState(str(checkouts("b")))
    assert sorted(b.load(LP)["instances"]) == ["old", "web"]
    assert b.load("runs.yaml") == {"runs": [{"run": "r1"}]}
    assert b.load(IS)["instances"]["web"]["current"]["instance_id"] == "i-9"
    changes = audit_trail(b)[0]["changes"]
    assert {(c["file"], c["action"]) for c in changes} >= {(LP, "imported"), ("runs.yaml", "created")}
    # from now on the checkout's files are not read: S3 is the meta-state
    (a / "meta-state" / LP).write_text(yaml.safe_dump({"instances": {}}))
    assert sorted(MetaState(str(a)).load(LP)["instances"]) == ["old", "web"]


def test_an_s3_object_cut_short_is_refused_naming_it(checkouts, moto_endpoint):
    ms = MetaState(str(checkouts("a")))
    with ms.transaction() as txn:
        txn.save_record(LP, "web", _launch())
    raw, _etag = ms.objects.get("launch-params/web.yaml")
    ms.objects.put("launch-params/web.yaml", raw[:-10])
    with pytest.raises(MetaStateError, match=r"^s3://%s/%s/meta-state/launch-params/web.yaml: is incomplete"
                       % (local_aws.STATE_BUCKET, checkouts.prefix)):
        ms.load(LP)


def test_a_reader_in_another_checkout_never_returns_half_a_commit(checkouts):
    """Checkout B reads while A's commit is stopped between its marker and its next revision:
    a commit that ends before B looks at the lock is read again (not taken for a crashed one),
    and one that does not end fails B's read after its timeout instead of being returned."""
    a = MetaState(str(checkouts("a")))
    with a.transaction() as txn:
        txn.save(LP, {"instances": {"n%02d" % i: _launch() for i in range(12)}})
    thread, go = paused_commit(a, {"instances": {"only": _launch()}}, after=6)
    b = MetaState(str(checkouts("b")), lock_timeout=1)
    try:
        with pytest.raises(MetaStateError, match=r"^s3://.*/meta-state/revision\.yaml: a commit was in progress "
                                                 r"for all of the \d+ s this read waited \(writer: .*paused writer"):
            b.load(LP)
        looked = ends_before_lock_check(b, thread, go)  # A's commit ends, its lock removed, before B looks
        # the hook waits for A's commit to end inside B's read, and that read's clock runs meanwhile:
        # on a loaded machine A's last deletions and its revision take more than the 1 s above
        b.lock_timeout = 30
        assert sorted(b.load(LP)["instances"]) == ["only"]
        assert looked
    finally:
        go.set()
        thread.join(60)


def test_the_inventory_plugin_lists_what_another_checkout_recorded(checkouts, aws_env, tmp_path):
    with MetaState(str(checkouts("a"))).transaction() as txn:
        txn.save_record(LP, "web", _launch())
        txn.save_record(IS, "web", _current("i-5"))
    b = checkouts("b")
    source = tmp_path / "b.csis.yml"
    source.write_text("plugin: csis.infra.meta_state\nconfig_root: %s\n" % b)
    env = dict(aws_env, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-inventory"), "-i", str(source), "--list"],
                          cwd=str(REPO), env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    hostvars = json.loads(proc.stdout)["_meta"]["hostvars"]
    assert sorted(hostvars) == ["web"]


def test_an_inventory_source_names_the_s3_store_and_needs_no_tree(checkouts, aws_env, moto_endpoint, tmp_path):
    """A *.csis.yml in an empty directory lists what a tree recorded in its S3 store: the source
    names the bucket, prefix, region and endpoint itself; credentials come from the environment."""
    with MetaState(str(checkouts("a"))).transaction() as txn:
        txn.save_record(LP, "web", _launch(alias="front"))
        txn.save_record(IS, "web", _current("i-7"))
        txn.save_record(LP, "planned", dict(_launch(), launched=False))
    empty = tmp_path / "no-tree"
    empty.mkdir()
    source = empty / "hosts.csis.yml"
    options = {"plugin": "csis.infra.meta_state", "meta_state_backend": "s3", "meta_state_bucket": local_aws.STATE_BUCKET,
               "meta_state_prefix": checkouts.prefix, "meta_state_region": local_aws.REGION,
               "meta_state_endpoint": moto_endpoint.url, "meta_state_path_style": True, "hostnames": ["alias", "name"]}
    source.write_text(yaml.safe_dump(options))
    env = dict(aws_env, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    for key in ("CSIS_AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        env.pop(key, None)  # the endpoint comes from the source file alone

    def inventory(path):
        return subprocess.run([str(REPO / ".venv" / "bin" / "ansible-inventory"), "-i", str(path), "--list"],
                              cwd=str(empty), env=env, capture_output=True, text=True, check=False)
    proc = inventory(source)
    assert proc.returncode == 0, proc.stderr
    hostvars = json.loads(proc.stdout)["_meta"]["hostvars"]
    assert sorted(hostvars) == ["front"]  # "planned" is not launched
    assert hostvars["front"]["csis_name"] == {"__ansible_unsafe": "web"}
    assert hostvars["front"]["csis_instance_id"] == {"__ansible_unsafe": "i-7"}
    assert sorted(p.name for p in empty.iterdir()) == ["hosts.csis.yml"]  # read only, nothing written here

    # records that contradict each other (a launch record lost, its open generation kept): the
    # message names where this store keeps them, s3://<bucket>/<prefix>/meta-state/..., once
    ms = MetaState(str(checkouts("a")))
    with ms.transaction() as txn:
        txn.save_record(LP, "ghost", _launch())
        txn.save_record(IS, "ghost", _current("i-9"))
    ms.objects.delete(store.record_object(LP, "ghost"))
    try:
        proc = inventory(source)
    finally:
        ms.objects.delete(store.record_object(IS, "ghost"))
    assert proc.returncode != 0
    text = " ".join(proc.stderr.split())
    assert "s3://%s/%s/meta-state/instance-state.yaml: 'instances.ghost.current' is an open generation" % (
        local_aws.STATE_BUCKET, checkouts.prefix) in text, text
    assert "meta-state/meta-state" not in text
    assert inventory(source).returncode == 0  # the contradiction is gone again

    # the inventory cache keys its entry on the store it read: the same bucket and prefix through
    # another endpoint (here the same server by another name) is another store, read afresh
    cached = dict(options, cache=True, cache_plugin="ansible.builtin.jsonfile", cache_timeout=3600,
                  cache_connection=str(tmp_path / "inv-cache"))
    source.write_text(yaml.safe_dump(cached))
    assert sorted(json.loads(inventory(source).stdout)["_meta"]["hostvars"]) == ["front"]
    with MetaState(str(checkouts("a"))).transaction() as txn:
        txn.save_record(LP, "web2", _launch(alias="back"))
        txn.save_record(IS, "web2", _current("i-8"))
    try:
        assert sorted(json.loads(inventory(source).stdout)["_meta"]["hostvars"]) == ["front"]  # the cache answers
        source.write_text(yaml.safe_dump(dict(cached, meta_state_endpoint=moto_endpoint.url.replace("127.0.0.1", "localhost"))))
        proc = inventory(source)
        assert proc.returncode == 0, proc.stderr
        assert sorted(json.loads(proc.stdout)["_meta"]["hostvars"]) == ["back", "front"]
    finally:
        with MetaState(str(checkouts("a"))).transaction() as txn:
            txn.save_record(LP, "web2", None)
            txn.save_record(IS, "web2", None)

    # a mistyped prefix reads an empty place, not an error: an empty inventory, with a warning naming
    # where it read and what to check (an AWX source that overwrites would drop every host in silence)
    source.write_text(yaml.safe_dump(dict(options, meta_state_prefix=checkouts.prefix + "-typo")))
    proc = inventory(source)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["_meta"]["hostvars"] == {}
    text = " ".join(proc.stderr.split())
    assert "s3://%s/%s-typo/meta-state holds no meta-state (no committed revision): check meta_state_bucket and " \
           "meta_state_prefix" % (local_aws.STATE_BUCKET, checkouts.prefix) in text, text
    source.write_text(yaml.safe_dump(options))
    assert "holds no meta-state" not in inventory(source).stderr  # the right one says nothing

    # without the bucket: one message naming the source file and the option
    options.pop("meta_state_bucket")
    source.write_text(yaml.safe_dump(options))
    proc = inventory(source)
    assert proc.returncode != 0
    assert "%s: 'meta_state_backend: s3' needs 'meta_state_bucket'" % source in proc.stderr


def test_history_playbook_shows_each_step_and_a_record_as_of_a_revision(checkouts, aws_env):
    a = MetaState(str(checkouts("a")))
    for alias in ("first", "second"):
        with a.transaction("set alias %s" % alias) as txn:
            txn.save_record(LP, "web", _launch(alias=alias))
    env = dict(aws_env, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "playbooks/history.yml",
                           "-e", "csis_config_root=%s" % checkouts("b"), "-e", "history_instance=web",
                           "-e", "history_revision=1"],
                          cwd=str(REPO), env=env, capture_output=True, text=True, check=False)
    out = " ".join(proc.stdout.split())  # the callback wraps long lines
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "r1 " in out and "created launch-params.yaml/web [set alias first]" in out, out[-3000:]
    assert "r2 " in out and 'changed launch-params.yaml/web [set alias second] -- alias: "first" -> "second"' in out
    assert "History of s3://%s/%s/meta-state (revision 2)" % (local_aws.STATE_BUCKET, checkouts.prefix) in out
    assert "launch-params.yaml: alias: first" in out and "revision: 1" in out  # as of revision 1

    # a revision without an instance or storage, a mistyped revision number, and a configuration root
    # that is no tree are refused (they were skipped in silence, read as 0: every revision, and read
    # as an empty history)
    missing = str(checkouts("b")) + "-mistyped"
    for root, extra, said in (
            (checkouts("b"), ("-e", "history_revision=1"), "revision 1 needs an instance or a storage whose records to show"),
            (checkouts("b"), ("-e", "history_since=abc"), "history_since=abc: pass a revision number"),
            (missing, (), "%s: the configuration root does not exist or is not a directory (check csis_config_root)" % missing)):
        proc = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "playbooks/history.yml",
                               "-e", "csis_config_root=%s" % root, *extra],
                              cwd=str(REPO), env=env, capture_output=True, text=True, check=False)
        out = " ".join((proc.stdout + proc.stderr).split())
        assert proc.returncode != 0 and said in out, out[-3000:]
        assert "History of" not in out


def test_a_run_whose_s3_run_lock_was_broken_applies_nothing_more(checkouts, aws_env, moto_endpoint, monkeypatch):
    """The run lock's watcher, a real process holding the lock in the S3 store, finds it broken by
    another run (here: the object overwritten with another holder, as a run does that breaks an
    expired lock). It leaves word for the run: the run's next lifecycle takes the tree no more, and
    its apply check refuses (``runlock.check_held``, what ``csis_apply_check`` runs first). When
    the run ends, the word goes with it."""
    from ansible_collections.csis.infra.plugins.module_utils.csis import procs
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import runlock

    monkeypatch.setenv("CSIS_RUN_LOCK_TTL", "2")  # the watcher renews every second
    root = str(checkouts("a"))
    run = subprocess.Popen(["sleep", "600"])  # the run's ansible-playbook: the watcher watches it
    ctl = {"pid": run.pid, "start": procs.stat_fields(run.pid)[19], "playbooks": ["storage.yml"]}
    marker = runlock.lost_marker(ctl)
    try:
        held = runlock.acquire(root, timeout=10, ctl=ctl)
        assert held["reentered"] is False and runlock.lost(ctl) is None
        runlock.check_held(ctl)  # held: nothing to refuse
        s3 = moto_endpoint.client("s3")
        key = [k for k in _s3_keys(moto_endpoint, checkouts.prefix) if k.endswith(runlock.RUN_LOCK_NAME)]
        assert len(key) == 1, key
        other = {"owner": {"pid": 1, "host": "another-node", "what": "csis.infra run: storage.yml"},
                 "created": "2026-12-06T00:00:00Z", "expires_epoch": time.time() + 600}
        s3.put_object(Bucket=local_aws.STATE_BUCKET, Key="%s/%s" % (checkouts.prefix, key[0]),
                      Body=json.dumps(other).encode("utf-8"))
        deadline = time.monotonic() + 30
        while runlock.lost(ctl) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        msg = runlock.lost(ctl)
        assert msg and msg.startswith("s3://%s/%s/meta-state/.run.lock: this run's lock on the tree was lost at "
                                      % (local_aws.STATE_BUCKET, checkouts.prefix)), msg
        assert "(another run broke it after it expired unrenewed): another run may be working on this tree now" in msg
        with pytest.raises(runlock.LockLost) as refused:  # the apply check
            runlock.check_held(ctl)
        assert str(refused.value) == msg
        with pytest.raises(runlock.LockLost):  # the run's next lifecycle
            runlock.acquire(root, timeout=1, ctl=ctl)
        # the other run's lock is as it wrote it: the watcher gave the tree up and deleted nothing
        body = json.loads(s3.get_object(Bucket=local_aws.STATE_BUCKET, Key="%s/%s" % (checkouts.prefix, key[0]))["Body"].read())
        assert body["owner"]["host"] == "another-node"
        # the run ends: the watcher, which outlived the lock to keep its word, removes the marker
        run.kill()
        run.wait()
        deadline = time.monotonic() + 30
        while os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not os.path.exists(marker)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if os.path.exists(marker):
            os.unlink(marker)


def test_a_writer_whose_lock_was_broken_writes_nothing_not_even_the_marker(checkouts, aws_env, monkeypatch):
    """A writer stalls inside its transaction past its lock's life (2 s here); another run breaks the lock and takes
    it. The stalled writer's commit renews its lock on the condition that it is still its own before the marker:
    refused, it writes nothing (before, its marker landed in revision.yaml and the real holder's commit was then
    refused as a conflict nobody had made)."""
    monkeypatch.setenv("CSIS_META_STATE_LOCK_TTL", "2")
    a, b = MetaState(str(checkouts("a")), lock_timeout=30), MetaState(str(checkouts("b")), lock_timeout=30)
    with a.transaction("seed") as txn:
        txn.save_record(LP, "seed", {"launched": False})
    revision = a.objects.get("revision.yaml")[0]
    real_put, puts = a.objects.put, []
    a.objects.put = lambda rel, payload, expect=None: (puts.append(rel), real_put(rel, payload, expect))[1]
    taken, release = threading.Event(), threading.Event()

    def other_run():
        with b.transaction("the run that broke the lock") as txn:
            taken.set()
            release.wait(30)
            txn.save_record(LP, "other", {"launched": False})

    thread = threading.Thread(target=other_run, daemon=True)
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.backends import LockLost
    with pytest.raises(LockLost, match="this run's lock was broken by another run"):
        with a.transaction("stalled writer") as txn:
            txn.save_record(LP, "stalled", {"launched": False})
            time.sleep(3)  # past the lock's life: the other run breaks it and holds it
            thread.start()
            assert taken.wait(30)
    # nothing but its own lock's object (taken, then the refused renewal): not even a marker, nothing put back
    assert [rel for rel in puts if rel != ".lock"] == [] and a.objects.get("revision.yaml")[0] == revision
    release.set()
    thread.join(30)
    assert sorted(b.load(LP)["instances"]) == ["other", "seed"]  # the real holder committed


def test_a_lock_removed_behind_its_holder_reads_as_lost(checkouts, aws_env):
    """Another run broke this holder's lock and has not taken it yet: S3 answers the conditional renewal of the
    removed object NoSuchKey, which is a lost lock (LockLost), not a store that did not answer."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.backends import LockLost, S3Lock
    objects = MetaState(str(checkouts("a"))).objects
    lock = S3Lock(objects, 5, "holder", 120)
    lock.acquire()
    objects.delete(".lock")
    with pytest.raises(LockLost, match="this run's lock was broken by another run"):
        lock.refresh(force=True)


def test_a_lock_whose_taking_answer_was_lost_is_its_own(checkouts, aws_env):
    """The put that takes the lock lands, its answer is lost, and the SDK's retry is refused (the object is there
    now): the lock is this holder's own, taken at once, not waited for as another run's and then broken."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.backends import Conflict, S3Lock
    objects = MetaState(str(checkouts("a"))).objects
    real_put = objects.put

    def put(rel, payload, expect=None):
        real_put(rel, payload, expect)  # landed ...
        raise Conflict("%s: the retry of a put whose answer was lost" % rel)  # ... and the retry refused

    objects.put = put
    lock = S3Lock(objects, 30, "holder", 120)
    started = time.monotonic()
    lock.acquire()
    assert time.monotonic() - started < 5 and lock.etag == objects.version(".lock")
    assert objects.notices == []  # nothing broken


def test_two_locks_of_one_process_with_the_same_what_are_two_holders(checkouts, aws_env):
    """Each lock carries a mark of its own: a second lock of this process, for the same writer's what, does not take
    the first one's object for its own (two threads of one run would both think they held the tree)."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.backends import LockBusy, S3Lock
    objects = MetaState(str(checkouts("a"))).objects
    first = S3Lock(objects, 5, "same writer", 120)
    first.acquire()
    try:
        with pytest.raises(LockBusy):
            S3Lock(objects, 1, "same writer", 120).acquire()
    finally:
        first.release()
