# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The molecule scenarios (extensions/molecule/) against the session's moto server.

``molecule test -s <scenario>`` runs create, converge, idempotence (a second converge
that changes nothing), verify (read back from the endpoint) and destroy; real molecule,
real ansible-playbook, real terraform and provider, the session's ``moto_endpoint``
(named to the scenarios by ``CSIS_LOCAL_AWS_DIR``; they must not start their own).
molecule's ephemeral directory (and the scenario's configuration tree inside it) is a
temporary directory: nothing is written into the checkout.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
MOLECULE = os.path.join(VENV_BIN, "molecule")
SCENARIOS_DIR = os.path.join(REPO, "extensions", "molecule")
# environment a run must not inherit from the machine
_SCRUB = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
          "TF_CLI_ARGS", "TF_CLI_ARGS_plan", "TF_CLI_ARGS_apply", "TF_CLI_ARGS_init", "TF_LOG",
          "MOLECULE_GLOB", "MOLECULE_EPHEMERAL_DIRECTORY", "MOLECULE_PROJECT_DIRECTORY")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("terraform") is None or not os.path.exists(MOLECULE),
                       reason="needs terraform on PATH and molecule in the project venv"),
]


def scenario_files() -> set:
    return {os.path.relpath(os.path.join(d, f), SCENARIOS_DIR)
            for d, _dirs, files in os.walk(SCENARIOS_DIR) for f in files if "__pycache__" not in d}


def run_molecule(scenario: str, moto_endpoint, work: str):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update(moto_endpoint.env)
    env.update({
        "PATH": VENV_BIN + os.pathsep + env.get("PATH", ""),
        "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".venv", "collections"),
        # the session's endpoint; a scenario must not start another one
        "CSIS_LOCAL_AWS_DIR": moto_endpoint.state_dir,
        "CSIS_MOLECULE_START_ENDPOINT": "false",
        "MOLECULE_EPHEMERAL_DIRECTORY": os.path.join(work, "ephemeral"),
        "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "NO_COLOR": "1", "PY_COLORS": "0",
        "PYTHONUNBUFFERED": "1",
    })
    t0 = time.monotonic()
    proc = subprocess.run([MOLECULE, "test", "--scenario-name", scenario, "--no-command-borders"], cwd=REPO, env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=1800, check=False)
    out = _ANSI.sub("", proc.stdout.decode("utf-8", "replace"))
    with open(os.path.join(work, "molecule-%s.log" % scenario), "w", encoding="utf-8") as fh:
        fh.write(out)
    return proc.returncode, out, time.monotonic() - t0


def sections(out: str, scenario: str, action: str) -> list:
    """The output of each run of an action (between its 'Executing' and 'Executed' lines)."""
    found = re.findall(r"\[%s > %s\] Executing\n(.*?)\n[A-Z]+ +\[%s > %s\] Executed" % (scenario, action, scenario, action),
                       out, re.S)
    assert found, "no %s step in the output" % action
    return found


def endpoint_leftovers(moto_endpoint, run_id: str):
    volumes = moto_endpoint.client("ec2").describe_volumes(
        Filters=[{"Name": "tag:csis_molecule", "Values": [run_id]}])["Volumes"]
    objects = moto_endpoint.client("s3").list_objects_v2(
        Bucket=moto_endpoint.state_bucket, Prefix="statefiles/molecule-%s/" % run_id).get("Contents", [])
    return [v["VolumeId"] for v in volumes], [o["Key"] for o in objects]


@pytest.mark.parametrize("scenario", ["render", "tofu_root"])
def test_molecule_scenario(scenario, moto_endpoint, tmp_path):
    before = scenario_files()
    rc, out, seconds = run_molecule(scenario, moto_endpoint, str(tmp_path))
    tail = "\n".join(out.splitlines()[-80:])
    assert rc == 0, tail
    print("molecule test -s %s: %.0f s" % (scenario, seconds))

    # the whole sequence ran and passed, in order
    steps = re.findall(r"^%s > (\w+): Executed: (\w+)" % scenario, out, re.M)
    assert steps == [(a, "Successful") for a in
                     ("destroy", "syntax", "create", "converge", "idempotence", "verify", "destroy")], steps
    assert re.search(r"^%s +: actions=7 +successful=7 .* failed=0" % scenario, out, re.M), tail

    # the scenario ran against the session's endpoint, on a tree of its own
    # (the YAML callback folds a long message at its spaces: a long temporary directory moves the fold)
    m = re.search(r"msg:\s+(\S+)/tree/examples\s+\(run\s+(%s-[0-9a-f]{8}),\s+endpoint\s+(\S+)\)"
                  % scenario.replace("_", "-"), out)
    assert m, tail
    assert m.group(3) == moto_endpoint.url
    run_id = m.group(2)

    # idempotence: the second converge changed nothing
    converge, again = sections(out, scenario, "converge")[0], sections(out, scenario, "idempotence")[0]
    assert re.search(r"^localhost +: ok=\d+ +changed=[1-9]", converge, re.M), converge[-2000:]
    for host_recap in re.findall(r"^\S+ +: ok=\d+ +changed=(\d+)", again, re.M):
        assert host_recap == "0", again[-3000:]
    if scenario == "tofu_root":
        assert "storage-aws-ebs: Plan: 1 to add, 0 to change, 0 to destroy" in converge
        assert "storage-aws-ebs: Plan: 0 to add, 0 to change, 0 to destroy" in again

    # the final destroy deleted what the run created at the endpoint (tofu_root: the volume
    # and the state object; render: nothing was there)
    deleted = re.search(r"TASK \[Delete the run's volumes and state objects at the endpoint\].*?\n(changed|ok): \[localhost\]",
                        sections(out, scenario, "destroy")[-1], re.S)
    assert deleted and deleted.group(1) == ("changed" if scenario == "tofu_root" else "ok"), out[-3000:]

    # destroy left nothing: not at the endpoint, not on disk, not in the checkout
    assert endpoint_leftovers(moto_endpoint, run_id) == ([], [])
    assert not os.path.exists(os.path.join(str(tmp_path), "ephemeral", "tree"))
    assert scenario_files() == before
