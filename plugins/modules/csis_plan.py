#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r'''
---
module: csis_plan
short_description: Open the plan binding and plan a terraform root to a plan file, with one terraform call
version_added: 0.2.0
description:
  - Opens the plan binding exactly as M(csis.infra.csis_plan_binding) O(csis.infra.csis_plan_binding#module:state=opened)
    does (the old plan file and binding are deleted, the root's files are hashed), then runs
    C(<binary_path> plan -input=false -no-color -detailed-exitcode -out=<plan_file>) once in O(project_path).
  - >-
    Records in the binding what terraform said of the plan (exit code 0: no changes; 2: changes) together
    with the plan file's sha256. M(csis.infra.csis_gate_plan) trusts "no changes" only for those very bytes and
    then skips C(show -json); every other plan is read in full.
  - Where C(community.general.terraform) O(community.general.terraform#module:state=planned) runs C(version),
    C(validate), C(workspace list), C(plan) and C(output), this runs the plan alone. The roots
    M(csis.infra.csis_render) writes were validated when they were rendered and use no workspaces.
    The apply still runs through C(community.general.terraform) with the exact plan file.
  - Secrets go in C(TF_VAR_*) environment variables, never in O(variables) (they would show in the command line).
  - >-
    An action plugin runs first on the controller: it decrypts O(secrets) (the root's C(!vault) values) with the run's
    vault secrets and hands the module the clear values as O(secret_env), a C(no_log) argument; terraform gets them
    as C(TF_VAR_<name>) environment. A value that does not decrypt fails the task naming its file and key.
extends_documentation_fragment:
  - csis.infra.controller
  - csis.infra.attributes.worker
options:
  project_path:
    description: The initialised terraform root.
    type: path
    required: true
  plan_file:
    description: The plan file to write, relative to O(project_path) unless absolute.
    type: path
    default: tfplan
  binary_path:
    description:
      - The terraform or OpenTofu executable, or a wrapper with the same command line (the
        C(csis.infra.tofu_root) role passes its C(csis-tf-supervise), which stops terraform when the run dies).
    type: str
    default: terraform
  variables:
    description:
      - C(-var name=value) values. Strings are passed as they are, booleans as C(true)/C(false),
        numbers, lists and dictionaries as JSON.
    type: dict
    default: {}
  replace:
    description: Resource addresses to plan as replaced (C(-replace=<address>)).
    type: list
    elements: str
    default: []
  secrets:
    description:
      - The root's secret values (M(csis.infra.csis_render)'s C(roots[].secrets)) - C(TF_VAR_<name>) to C({vault, file, key})
        (a C(!vault) ciphertext and where the tree holds it) or C({value}) (a secret field given in clear text).
      - The action plugin replaces them by O(secret_env); the module itself refuses them.
    type: dict
    default: {}
  secret_env:
    description:
      - C(TF_VAR_<name>) to clear value, added to terraform's environment (set by the action plugin from O(secrets)).
    type: dict
    default: {}
  release_stale_lock:
    description:
      - Before planning, do what M(csis.infra.csis_state_lock) does, in the same module run (the
        C(csis.infra.tofu_root) role sets it for every root's plan). A root holding
        C(errored.tfstate) is refused, an S3 state lock whose holder on this machine is gone is
        released (with a warning naming it; never inside an AWX job, whose container cannot see other jobs'
        processes), as is one named in O(force_unlock); any other lock is refused with its holder and the procedure.
      - In check mode (terraform does not run) the lock is not looked at.
    type: bool
    default: false
  force_unlock:
    description:
      - With O(release_stale_lock), the IDs of S3 state locks the operator found left by runs that are gone (a
        refusal names the lock's ID; the role passes the run variable C(csis_force_unlock)). Such a lock is released
        whoever took it (another machine, a killed AWX job), but for one a live process of this machine works on
        (where its processes can be read); an ID that is not the lock's releases nothing. The release is a warning
        in the run's output.
      - Null (what AWX passes for a survey question left blank) is read as none.
    type: list
    elements: str
  real_binary:
    description:
      - The terraform (or tofu) binary itself when O(binary_path) is a wrapper (the role's
        C(csis-tf-supervise)). O(release_stale_lock) runs its C(force-unlock) and names it in messages.
      - Defaults to O(binary_path).
    type: str
  reads:
    description:
      - The roots whose state this root reads, C(data "terraform_remote_state" "<label>") label to root key
        (M(csis.infra.csis_render)'s C(roots[].reads)). Used to name them when one of them has no state yet.
    type: dict
    default: {}
  unapplied_upstream:
    description:
      - >-
        What to do when the plan fails only because a root this one reads has no state in its backend yet
        (terraform's C(Unable to find remote state): that root was never applied; an EFS root reads the identity
        root's gids, an instance root the identity and storage roots).
      - V(fail) fails the task, naming those roots and the apply flag that would apply them.
      - >-
        V(skip) plans nothing and returns RV(waiting_for) with a warning, for a root that this run does not apply
        (the C(csis.infra.tofu_root) role passes it for a plan job, a root whose apply flag is off, and an apply job
        whose plan job approved nothing of the root); it is planned by the first run after those roots applied.
    type: str
    choices: [fail, skip]
    default: fail
  timeout:
    description:
      - Seconds the plan may take. Past them terraform is interrupted (SIGINT, so it releases its state
        lock; SIGKILL 30 s later) and the module fails naming the timeout. V(0) waits without limit.
    type: int
    default: 0
notes:
  - In check mode neither the binding nor the plan is written and terraform does not run.
seealso:
  - module: csis.infra.csis_gate_plan
    description: Gates the plan this module wrote.
  - module: csis.infra.csis_plan_binding
    description: The binding this module opens; verifies it before the apply.
  - module: community.general.terraform
    description: Applies the exact plan file.
attributes:
  check_mode:
    support: full
    details: Nothing is planned or written.
  diff_mode:
    support: none
'''

EXAMPLES = r'''
- name: Plan the root (binding opened, one terraform call)
  csis.infra.csis_plan:
    project_path: "{{ root_dir }}"
    plan_file: tfplan
    timeout: 1800
  register: planned

- name: Plan the teardown of a root's ephemeral instances (a root that declares them)
  csis.infra.csis_plan:
    project_path: "{{ root_dir }}"
    plan_file: tfplan
    variables:
      ephemeral_present: false
  register: teardown

- name: Gate it (no show -json when terraform said the plan is empty)
  csis.infra.csis_gate_plan:
    project_path: "{{ root_dir }}"
    plan_file: tfplan
'''

RETURN = r'''
state_lock:
  description:
    - With O(release_stale_lock), what the lock check found (as M(csis.infra.csis_state_lock) returns it).
  returned: when O(release_stale_lock) is true, not in check mode
  type: dict
  contains:
    locked:
      description: Whether the state was locked when the module looked.
      type: bool
    released:
      description: Whether the module released a stale lock.
      type: bool
    lock:
      description:
        - The lock object's content (ID, Operation, Who, Created, Path, lock_object), or null.
        - C(lock_age) is the seconds since the lock object was written, by the store's clock (when its answer tells it).
      type: dict
    msg:
      description: What was found or done.
      type: str
changes:
  description: Whether terraform planned any change (C(-detailed-exitcode) 2). Null in check mode.
  returned: always
  type: bool
summary:
  description: "terraform's own summary line (C(Plan: 1 to add, 0 to change, 0 to destroy.) or C(No changes. ...))."
  returned: always
  type: str
plan_file:
  description: The absolute path of the plan file.
  returned: always
  type: str
binding:
  description: The binding file (C(<plan_file>.csis-binding.json)).
  returned: always
  type: str
plan_sha256:
  description: The sha256 of the plan file terraform wrote.
  returned: when terraform planned (not for a root skipped for an unapplied upstream)
  type: str
seconds:
  description: How long terraform took.
  returned: when terraform ran
  type: float
cmd:
  description: The terraform command line (variable values included; they are not secrets).
  returned: always
  type: str
stdout:
  description: The end of terraform's output.
  returned: when terraform planned (not for a root skipped for an unapplied upstream)
  type: str
stderr:
  description: The end of terraform's error output (its warnings).
  returned: when terraform planned
  type: str
waiting_for:
  description:
    - With O(unapplied_upstream=skip), the keys of the roots this root reads that were never applied, when that is
      why nothing was planned (RV(changes) is then null and RV(msg) says what to do); empty otherwise.
  returned: always
  type: list
  elements: str
  sample: [identity-posix-groups]
msg:
  description: When RV(waiting_for) is not empty, which roots were never applied and how to apply them.
  returned: when RV(waiting_for) is not empty
  type: str
'''

import os

from ansible_collections.csis.infra.plugins.module_utils.csis.module import ModuleRun, argument_spec
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.statelock import StateLockError
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.tfplan import make_plan


def _plan(module, p):
    if p["secrets"]:
        module.fail_json(msg="plan: secrets are decrypted by the csis_plan action plugin on the controller "
                             "(run the module as csis.infra.csis_plan, not through a module path)", changed=False)
    env = dict(os.environ, **{str(k): str(v) for k, v in p["secret_env"].items()}) if p["secret_env"] else None
    try:
        result = make_plan(p["project_path"], p["plan_file"], p["binary_path"], variables=p["variables"],
                           replace=p["replace"], env=env, timeout=p["timeout"] or None, check_mode=module.check_mode,
                           release_stale_lock=p["release_stale_lock"], real_binary=p["real_binary"],
                           reads=p["reads"], skip_unapplied=p["unapplied_upstream"] == "skip",
                           force_unlock=p["force_unlock"])
    except StateLockError as exc:  # the lock's own message, as csis_state_lock fails with it
        module.fail_json(msg=str(exc), changed=False)
    if (result.get("state_lock") or {}).get("released"):
        module.warn(result["state_lock"]["msg"])
    if result.get("waiting_for"):
        module.warn("not planned: " + result["msg"])
    return result


RUN = ModuleRun(_plan, argument_spec(
    project_path=dict(type="path", required=True),
    plan_file=dict(type="path", default="tfplan"),
    binary_path=dict(type="str", default="terraform"),
    variables=dict(type="dict", default={}),
    replace=dict(type="list", elements="str", default=[]),
    # vault ciphertext (and where the tree holds it), not secret: the action plugin decrypts it
    secrets=dict(type="dict", default={}, no_log=False),
    secret_env=dict(type="dict", default={}, no_log=True),
    timeout=dict(type="int", default=0),
    release_stale_lock=dict(type="bool", default=False),
    force_unlock=dict(type="list", elements="str"),
    real_binary=dict(type="str"),
    reads=dict(type="dict", default={}),
    unapplied_upstream=dict(type="str", default="fail", choices=["fail", "skip"]),
), failure={"prefix": "plan: ", "changed": False}, options=dict(supports_check_mode=True))


def main():
    RUN.main()


if __name__ == "__main__":
    main()
