# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The storage lifecycle's refusals and failures end to end, on the one-EBS tree: real
ansible-playbook, real terraform and provider, the session's moto server.

``ebs``: the example tree cut to one EBS volume (``tests/support/e2e.py``, ``make_ebs_tree``),
applied ONCE per module through ``storage.yml``: every refusal (gate, apply-check, approval,
binding), failed plan/apply, a second run on the tree. The tests run in file
order and each leaves the tree as the next expects. (The example tree as a whole, through
``scripts/demo`` and ``site.yml``, is ``test_lifecycle_e2e.py``: a separate file, so the two
trees run on two workers.)

That first apply also loses its async job's worker (ansible-core issue 87387, :data:`INJECT`):
the role starts the same plan file once more, and the tree ends as a plain first apply leaves
it (one volume, one record), which is what every later test starts from.
"""
from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import uuid
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import e2e  # noqa: E402

pytestmark = e2e.needs_terraform()

NOOP = "Plan: 0 to add, 0 to change, 0 to destroy"
EBS_ADDR = "module.storage_mnt_data.aws_ebs_volume.this"
EBS_ROOT = e2e.EBS_ROOT


def overlays(ep, *more):
    return [ep.overlay_path, e2e.APPLY_ALL] + list(more)


def volume(ep, vid):
    return ep.client("ec2").describe_volumes(VolumeIds=[vid])["Volumes"][0]


def ebs_volume_id(root):
    return e2e.meta(root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]["volume_id"]


# ====================================================================== the one-EBS tree
# ansible-core issue 87387: async_wrapper loses its worker on a loaded controller.
# ``async_wrapper``'s first process waits 2.5 s for its worker's "started" notification, then
# returns and closes the pipe; a worker slower than that writes "started" to the job's results
# file, fails on the closed pipe before it starts the module, and nothing ever writes a result.
# The ansible-core maintainers reproduce it with a sleep before the notification; so does the
# fixture's run (until the parent has given up, however loaded the machine), for its first async
# job only (a ``sitecustomize`` on the run's ``PYTHONPATH``, active in ``async_wrapper``
# processes alone).
INJECT = '''
import os, sys, time
if any("async_wrapper" in os.path.basename(a) for a in sys.argv[:1]):
    marker = os.environ.get("CSIS_TEST_LOSE_ASYNC_WORKER", "")
    import multiprocessing.connection as _conn
    _send = _conn.Connection.send

    def send(self, obj):
        try:
            os.rename(marker, marker + ".taken")   # the first job only
        except OSError:
            return _send(self, obj)
        # slower than the parent's 2.5 s wait, however loaded the machine: until the parent has
        # given up and closed its end (the other end reads as at its end), at most 60 s
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self.poll(0.2):
            pass
        return _send(self, obj)

    _conn.Connection.send = send
'''


@pytest.fixture(scope="module")
def ebs(moto_endpoint, tmp_path_factory):
    """The one-EBS tree, applied once; its async apply job loses its worker (:data:`INJECT`,
    checked by the first test). Its own ``csis_config`` tag (``tree_id``): the first test counts
    the tree's volumes by it."""
    parent = str(tmp_path_factory.mktemp("ebs"))
    key = "e2e-%s" % uuid.uuid4().hex[:8]
    root = e2e.make_ebs_tree(parent, key, tree_id=key)
    inject = os.path.join(parent, "inject")
    os.mkdir(inject)
    with open(os.path.join(inject, "sitecustomize.py"), "w", encoding="utf-8") as fh:
        fh.write(INJECT)
    marker = os.path.join(parent, "lose-the-first-worker")
    open(marker, "w", encoding="utf-8").close()
    env = {"PYTHONPATH": inject, "CSIS_TEST_LOSE_ASYNC_WORKER": marker}
    env.update(e2e.ansible_dirs_in(parent))  # the lost job's payload stays in the test's directory
    run = e2e.run_playbook("storage.yml", root, moto_endpoint.env, overlays=overlays(moto_endpoint), env=env,
                           log=os.path.join(parent, "ebs-1.log"))
    assert run.rc == 0, run.tail()
    assert e2e.plan_summaries(run.out) == {"storage-aws-ebs": "Plan: 1 to add, 0 to change, 0 to destroy"}
    vid = ebs_volume_id(root)
    assert volume(moto_endpoint, vid)["Size"] == 100
    return SimpleNamespace(root=root, parent=parent, key=key, vid=vid, first_run=run, marker=marker,
                           root_dir=os.path.join(root, EBS_ROOT), log=lambda n: os.path.join(parent, n))


def test_a_job_whose_worker_is_lost_before_terraform_starts_is_started_once_more(ebs, moto_endpoint):
    """The fixture's apply (real ansible-core, terraform and provider): ``csis_apply_wait`` sees
    the job gone before terraform started (the root's ``.apply.log`` not written since), the role
    starts the same plan file once more, and the run applies and records the volume once."""
    run = ebs.first_run
    assert not os.path.exists(ebs.marker) and os.path.exists(ebs.marker + ".taken"), "the fault was not injected"
    text = " ".join(run.out.split())
    assert "is gone before its command started" in text and "Nothing was applied" in text, run.tail()
    assert "This run starts the same plan file once more now." in text, run.tail()
    assert "TASK [csis.infra.tofu_root : Apply exactly that plan file, second start]" in run.out
    rec = e2e.meta(ebs.root, "storage-state.yaml")["storages"]["mnt_data"]
    assert rec["state"] == "active"
    vols = moto_endpoint.client("ec2").describe_volumes(
        Filters=[{"Name": "tag:csis_config", "Values": [ebs.key]}])["Volumes"]
    assert [v["VolumeId"] for v in vols] == [rec["facts"]["volume_id"]]


def test_replacement_is_refused_by_the_gate(ebs, moto_endpoint):
    storages = os.path.join(ebs.root, "storages", "storage0.yaml")
    original = open(storages, "rb").read()
    doc = e2e.read_yaml(storages)
    doc["storages"][0]["availability_zone"] = "us-east-2b"       # a zone change replaces the volume
    e2e.write_yaml(storages, doc)
    before = e2e.meta_state_digest(ebs.root)
    try:
        run = e2e.run_playbook("storage.yml", ebs.root, moto_endpoint.env, overlays=overlays(moto_endpoint),
                               log=ebs.log("replace.log"))
    finally:
        open(storages, "wb").write(original)
    assert run.rc != 0
    assert "DESTROY NOT WHITELISTED: %s" % EBS_ADDR in run.out, run.tail()
    assert "Apply exactly that plan file" not in run.out
    vol = volume(moto_endpoint, ebs.vid)
    assert vol["AvailabilityZone"] == "us-east-2a" and vol["State"] in ("available", "in-use")
    assert e2e.meta_state_digest(ebs.root) == before
    # no record changed, and the audit trail holds the refusal (playbooks/history.yml)
    from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import history_report
    lines = history_report(ebs.root, root="storage-aws-ebs")["lines"]
    assert any("gate refused storage-aws-ebs" in line and "DESTROY NOT WHITELISTED: %s" % EBS_ADDR in line
               for line in lines), lines


def test_apply_flag_turned_off_at_the_approval_prompt(ebs, moto_endpoint):
    """An operator at the approval prompt; meanwhile the apply flag goes off: csis_apply_check refuses."""
    e2e.set_storage_builder_size(ebs.root, "aws-ebs", 110)           # pending: an in-place resize
    flag = os.path.join(ebs.parent, "apply-storage.yml")
    e2e.write_yaml(flag, {"config": {"apply_storage": True}})
    before = e2e.meta_state_digest(ebs.root)

    def flag_off():
        e2e.write_yaml(flag, {"config": {"apply_storage": False}})

    run = e2e.run_playbook_at_prompt("storage.yml", ebs.root, moto_endpoint.env, flag_off,
                                     overlays=[moto_endpoint.overlay_path, flag], log=ebs.log("flag-off.log"))
    assert "Type 'yes' to apply them" in run.out, run.tail()
    assert run.rc != 0
    assert "apply_storage is false NOW in %s for root 'aws-ebs' -- not applying." % flag in run.out, run.tail()
    assert "Apply exactly that plan file" not in run.out
    assert volume(moto_endpoint, ebs.vid)["Size"] == 100
    assert e2e.meta_state_digest(ebs.root) == before


def test_no_approval_on_a_non_interactive_stdin(ebs, moto_endpoint):
    before = e2e.meta_state_digest(ebs.root)
    run = e2e.run_playbook("storage.yml", ebs.root, moto_endpoint.env, overlays=overlays(moto_endpoint),
                           auto_approve=False, log=ebs.log("no-approval.log"))
    assert run.rc != 0
    assert "Not approved (no answer: stdin is not interactive, or an empty line): nothing applied." in run.out, run.tail()
    assert "Apply exactly that plan file" not in run.out
    assert volume(moto_endpoint, ebs.vid)["Size"] == 100
    assert e2e.meta_state_digest(ebs.root) == before


def test_failed_plan_and_failed_apply_leave_meta_state_and_do_not_block(ebs, moto_endpoint):
    ep = moto_endpoint
    before = e2e.meta_state_digest(ebs.root)
    bad_plan = e2e.run_playbook("storage.yml", ebs.root, ep.env, overlays=overlays(ep),
                                env={"TF_CLI_ARGS_plan": "-var=nosuch=1"}, log=ebs.log("bad-plan.log"))
    assert bad_plan.rc != 0 and "nosuch" in bad_plan.out, bad_plan.tail()
    assert "Apply exactly that plan file" not in bad_plan.out
    assert e2e.meta_state_digest(ebs.root) == before

    # the apply itself fails (after plan, gate, approval, apply-check and the binding passed)
    bad_apply = e2e.run_playbook("storage.yml", ebs.root, ep.env, overlays=overlays(ep),
                                 env={"TF_CLI_ARGS_apply": "-var=nosuch=1"}, log=ebs.log("bad-apply.log"))
    assert bad_apply.rc != 0, bad_apply.tail()
    assert "TASK [csis.infra.tofu_root : Apply exactly that plan file]" in bad_apply.out
    # no record after a failed apply: the rescue's record (for a root whose apply succeeded while
    # another failed) is skipped for this one
    after_apply = bad_apply.out.split("Apply exactly that plan file", 1)[1]
    records = re.findall(r"TASK \[csis\.infra\.tofu_root : Record what[^\n]*\n[^\n]*\n(\w+):", after_apply)
    assert records == ["skipping"], after_apply[-3000:]
    assert volume(ep, ebs.vid)["Size"] == 100
    assert e2e.meta_state_digest(ebs.root) == before
    # the run summary names the root, the step that failed, and that nothing was applied
    with open(os.path.join(ebs.root, "generated", "run-summary.json"), encoding="utf-8") as fh:
        entry = json.load(fh)["roots"]["storage-aws-ebs"]
    assert entry["status"] == "failed" and entry["failed_step"].startswith("Apply exactly that plan file"), entry
    assert entry["applied"] is False and entry["gate"]["verdict"] == "passed", entry

    # the next run is not blocked (no stale lock, no stale plan) and records what it applied
    good = e2e.run_playbook("storage.yml", ebs.root, ep.env, overlays=overlays(ep), log=ebs.log("after-failures.log"))
    assert good.rc == 0, good.tail()
    assert e2e.plan_summaries(good.out) == {"storage-aws-ebs": "Plan: 0 to add, 1 to change, 0 to destroy"}
    assert volume(ep, ebs.vid)["Size"] == 110
    facts = e2e.meta(ebs.root, "storage-state.yaml")["storages"]["mnt_data"]["facts"]
    assert facts["size"] == 110 and facts["volume_id"] == ebs.vid


PLAN_FILE_CHECKS = textwrap.dedent("""\
    - hosts: localhost
      connection: local
      gather_facts: false
      vars:
        tfplan: "{{ root_dir }}/tfplan"
      tasks:
        - name: untouched, the gated plan file verifies
          csis.infra.csis_plan_binding: {project_path: "{{ root_dir }}", state: verified}
          register: fresh
        - name: terraform itself refuses the plan file once applied (state moved on)
          community.general.terraform:
            project_path: "{{ root_dir }}"
            state: present
            plan_file: "{{ tfplan }}"
          environment: "{{ tf_env }}"
          register: applied_again
          ignore_errors: true

        - name: tamper with the plan file
          ansible.builtin.shell: cp tfplan tfplan.orig && printf 'x' >> tfplan
          args: {chdir: "{{ root_dir }}"}
        - csis.infra.csis_plan_binding: {project_path: "{{ root_dir }}", state: verified}
          register: tampered
          ignore_errors: true
        - ansible.builtin.shell: mv tfplan.orig tfplan
          args: {chdir: "{{ root_dir }}"}

        - name: change the root after the plan (a stale plan)
          ansible.builtin.shell: cp {{ tf_file }} {{ tf_file }}.orig && printf '\\n# edited after the plan\\n' >> {{ tf_file }}
          args: {chdir: "{{ root_dir }}"}
        - csis.infra.csis_plan_binding: {project_path: "{{ root_dir }}", state: verified}
          register: stale_verify
          ignore_errors: true
        - csis.infra.csis_gate_plan: {project_path: "{{ root_dir }}", plan_file: tfplan}
          environment: "{{ tf_env }}"
          register: stale_gate
          ignore_errors: true
        - ansible.builtin.shell: mv {{ tf_file }}.orig {{ tf_file }}
          args: {chdir: "{{ root_dir }}"}

        - name: a missing plan file
          ansible.builtin.file: {path: "{{ tfplan }}", state: absent}
        - csis.infra.csis_gate_plan: {project_path: "{{ root_dir }}", plan_file: tfplan}
          environment: "{{ tf_env }}"
          register: missing_gate
          ignore_errors: true
        - csis.infra.csis_plan_binding: {project_path: "{{ root_dir }}", state: verified}
          register: missing_verify
          ignore_errors: true
        - ansible.builtin.copy:
            dest: "{{ result_file }}"
            content: "{{ {'fresh': fresh, 'applied_again': applied_again, 'tampered': tampered,
                          'stale_verify': stale_verify, 'stale_gate': stale_gate,
                          'missing_gate': missing_gate, 'missing_verify': missing_verify} | to_json }}"
""")


def test_tampered_stale_and_missing_plan_files_are_refused(ebs, moto_endpoint):
    """The real modules on the real root the previous test applied (its tfplan passed the gate)."""
    from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import env_overrides
    pb = ebs.log("plan-files.yml")
    result = ebs.log("plan-files.json")
    with open(pb, "w", encoding="utf-8") as fh:
        fh.write(PLAN_FILE_CHECKS)
    before = e2e.meta_state_digest(ebs.root)
    run = e2e.run_playbook(pb, ebs.root, moto_endpoint.env, extra_vars={
        "root_dir": ebs.root_dir, "result_file": result, "tf_env": env_overrides(),
        "tf_file": "aws-ebs-storage-generation-storage-mnt_data.tf"}, log=ebs.log("plan-files.log"))
    assert run.rc == 0, run.tail()
    r = json.load(open(result, encoding="utf-8"))
    assert not r["fresh"].get("failed"), r["fresh"]
    assert r["applied_again"].get("failed") and "Saved plan is stale" in json.dumps(r["applied_again"]), \
        r["applied_again"]
    assert r["tampered"]["failed"] and "changed after the gate passed it" in r["tampered"]["msg"]
    for k in ("stale_verify", "stale_gate"):
        assert r[k]["failed"] and "STALE PLANFILE" in r[k]["msg"], r[k]
        assert "aws-ebs-storage-generation-storage-mnt_data.tf" in r[k]["msg"], r[k]
    for k in ("missing_gate", "missing_verify"):
        assert r[k]["failed"] and "does not exist" in r[k]["msg"], r[k]
    assert volume(moto_endpoint, ebs.vid)["Size"] == 110
    assert e2e.meta_state_digest(ebs.root) == before


def _run_lock_holder(root):
    from ansible_collections.csis.infra.plugins.module_utils.csis.state import runlock

    return runlock.holder(runlock.open_objects(root))


def test_concurrent_runs_on_the_tree_wait_or_are_refused_naming_the_first(ebs, moto_endpoint):
    """Two runs on one tree at once (issues 16 and 10). The first creates a volume. A run
    started while the first holds the tree waits for it (the default csis_run_lock_timeout),
    then plans nothing: the first's apply is in the state and in meta-state. A run that may
    not wait (csis_run_lock_timeout=0) fails in one line naming the first before it renders
    anything. The first finishes untouched, and its lock ends with it."""
    import time

    ep = moto_endpoint
    storages = os.path.join(ebs.root, "storages", "storage0.yaml")
    doc = e2e.read_yaml(storages)
    doc["storages"].append({"name": "mnt_extra", "mount_point": "/mnt/extra", "groups": ["coops"],
                            "state": "active"})
    e2e.write_yaml(storages, doc)
    first = e2e.start_playbook("storage.yml", ebs.root, ep.env, ebs.log("first.log"), overlays=overlays(ep))
    waiting = None
    try:
        deadline = time.monotonic() + 120
        while (_run_lock_holder(ebs.root) or {}).get("pid") != first.pid and first.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        held = _run_lock_holder(ebs.root)
        assert held and held["pid"] == first.pid, open(ebs.log("first.log"), encoding="utf-8").read()[-3000:]
        waiting = e2e.start_playbook("storage.yml", ebs.root, ep.env, ebs.log("waiting.log"), overlays=overlays(ep),
                                     extra_vars={"csis_run_lock_timeout": 900})
        refused = e2e.run_playbook("storage.yml", ebs.root, ep.env, overlays=overlays(ep),
                                   extra_vars={"csis_run_lock_timeout": 0}, log=ebs.log("refused.log"))
        assert refused.rc != 0
        line = " ".join(refused.out.split())
        assert "meta-state/.run.lock: this tree is held by pid %d on host" % first.pid in line, refused.tail()
        assert "playbooks/storage.yml" in line
        assert "TASK [csis.infra.render : Render the storage roots]" not in refused.out  # it rendered nothing
    finally:
        rc = first.wait(timeout=900)
        rc_waiting = waiting.wait(timeout=900) if waiting is not None else None
    first_out = open(ebs.log("first.log"), encoding="utf-8").read()
    assert rc == 0, first_out[-3000:]
    assert e2e.plan_summaries(first_out) == {"storage-aws-ebs": "Plan: 1 to add, 0 to change, 0 to destroy"}
    waited_out = open(ebs.log("waiting.log"), encoding="utf-8").read()
    assert rc_waiting == 0, waited_out[-3000:]
    assert "waited" in waited_out and "for the run that held this tree (pid %d on host" % first.pid \
        in " ".join(waited_out.split()), waited_out[-3000:]
    assert e2e.plan_summaries(waited_out) == {"storage-aws-ebs": NOOP}
    recs = e2e.meta(ebs.root, "storage-state.yaml")["storages"]
    assert recs["mnt_extra"]["state"] == "active"
    assert volume(ep, recs["mnt_extra"]["facts"]["volume_id"])["State"] in ("available", "in-use")
    deadline = time.monotonic() + 10
    while _run_lock_holder(ebs.root) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _run_lock_holder(ebs.root) is None, "the runs' lock outlived them"
