#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_record_verification
short_description: Check an instance's booted AMI from EC2 and record its verification verdict
version_added: 0.1.0
description:
  - Runs on the controller after M(csis.infra.csis_verify_instance) ran on the machine.
    Reads the machine's booted AMI from EC2 by the instance id recorded in
    C(meta-state/instance-state.yaml) (never by a C(Name) tag) and compares it with the
    expected build (O(expected_build), else the pin in C(pins.yaml), else a self-owned AMI
    whose name starts with O(name_pattern)).
  - Joins the on-machine checks and the booted-image check into one verdict and appends it to
    C(meta-state/verifications.yaml) (the last 500 are kept).
  - >-
    The verdict names the machine verified (C(instance_id), the instance id recorded for its standing generation)
    and the build it is about (C(build)): the AMI EC2 reports the machine booted, which is what the checks ran on,
    even when that is not the expected build (the booted-image check then fails); the expected build only when EC2
    was not asked (O(check_booted_image=false)) or did not answer.
  - >-
    The post-bake part of the verdict (the C(test: <command>) checks) is also recorded under that build in
    C(meta-state/image-tests.yaml) (the last 20 per build), which the release grace of
    C(config.require_released_builds) reads.
  - >-
    Does not fail on a failed verdict unless O(fail_on_failure); the verdict's C(message)
    is the manual's C(instance <name> failed verification: <check>: <detail>).
  - >-
    A machine that could not be reached (O(error)) and that EC2 reports stopped (or stopping) is not
    verified: the task is skipped with the warning C(verify <name>: SKIPPED -- the machine is stopped ...)
    and records nothing (a failed verdict would hold the build's release back and start an ephemeral's
    C(teardown_after) clock). Knowing it needs O(check_booted_image).
extends_documentation_fragment:
  - csis.infra.controller.instance
  - csis.infra.attributes.worker
options:
  on_machine:
    description: The result of M(csis.infra.csis_verify_instance) (its C(checks) and C(evidence)).
    type: dict
  error:
    description: Why the machine could not be checked (unreachable, module failure); recorded as a failed check.
    type: str
  runtime:
    description: The runtime's name (recorded).
    type: str
  expected_build:
    description: >-
      The AMI the machine must have booted; default its pin. M(csis.infra.csis_render) gives it as C(verify.expected_build),
      the pin of a standing machine the render replaces (a pending upgrade, or a follow whose series head moved: the new
      build is what the next apply boots), else the build the render launches the machine on.
    type: str
  name_pattern:
    description: The image's name pattern, for a machine with no expected build.
    type: str
  check_booted_image:
    description: Whether to read the booted AMI from EC2.
    type: bool
    default: true
  ephemeral:
    description: Recorded with the verdict.
    type: bool
    default: false
  run_id:
    description: The run id.
    type: str
  record:
    description: Append the verdict to verifications.yaml.
    type: bool
    default: true
  fail_on_failure:
    description: Fail the task when the verdict is a failure (after recording it).
    type: bool
    default: false
attributes:
  check_mode:
    details: Reads EC2; records nothing, and reports C(changed) when O(record) is set (a real run appends the verdict).
"""

EXAMPLES = r"""
- name: Record the verdict
  csis.infra.csis_record_verification:
    config_root: "{{ csis_root }}"
    instance: test2
    on_machine: "{{ verdict }}"
    aws: "{{ root.aws }}"
    runtime: "{{ root.runtime }}"
    run_id: "{{ csis_run_id }}"
"""

RETURN = r"""
verdict:
  description: >-
    The recorded verdict C({instance, instance_id, runtime, build, run, ephemeral, time, ok, checks, evidence}); null
    when skipped.
  returned: success
  type: dict
ok:
  description: Whether every check passed; null when skipped (a stopped machine).
  returned: success
  type: bool
message:
  description: The failure line (empty when ok), or the C(SKIPPED) line.
  returned: success
  type: str
skipped:
  description: True when the machine is stopped and nothing was verified or recorded.
  returned: when skipped
  type: bool
written:
  description: The meta-state files written (empty when skipped, with O(record=false), and in check mode).
  returned: success
  type: list
  elements: str
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import (
    AWS_ACCESS_ARGS, CONFIG_ROOT_ARGS, INSTANCE_ARGS, ModuleRun, argument_spec, fail_from, reveal_of)
from ansible_collections.csis.infra.plugins.module_utils.csis.aws import root_access
from ansible_collections.csis.infra.plugins.module_utils.csis.state.record import record_verification
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState
from ansible_collections.csis.infra.plugins.module_utils.csis.state.verify import (
    booted_image_check, combine, failure_message, skipped_as_stopped, verified_build)


def _verify(module, p):
    ms = MetaState(p["config_root"])
    cur = ((ms.load("instance-state.yaml").get("instances") or {}).get(p["instance"]) or {}).get("current") or {}
    pin = (ms.load("pins.yaml").get("instances") or {}).get(p["instance"])
    expected = p["expected_build"] or pin
    booted = None
    if p["check_booted_image"]:
        try:
            access = root_access(p["aws"], p["secrets"], reveal_of(module), "instance '%s'" % p["instance"])
        except CsisError as exc:
            fail_from(module, exc)
        booted = booted_image_check(access, cur.get("instance_id"), expected, p["name_pattern"])
    skipped = skipped_as_stopped(p["instance"], p["error"], booted)
    if skipped:
        module.warn(skipped)
        return dict(changed=False, skipped=True, msg=skipped, message=skipped, ok=None, verdict=None, written=[])
    # the verdict (and the post-bake result in image-tests.yaml) is about the AMI EC2 says the machine
    # booted, not the one it was expected to boot: tests that ran on another build are no evidence of it
    verdict = combine(p["instance"], p["on_machine"], booted, runtime=p["runtime"],
                      build=verified_build(booted, expected), run=p["run_id"], ephemeral=p["ephemeral"],
                      error=p["error"], instance_id=cur.get("instance_id"))
    written = []
    if p["record"] and not module.check_mode:
        try:
            written = record_verification(p["config_root"], verdict)
        except CsisError as exc:
            fail_from(module, exc, verdict=verdict)
    message = "" if verdict["ok"] else failure_message(verdict)
    if p["fail_on_failure"] and not verdict["ok"]:
        module.fail_json(msg=message, verdict=verdict, ok=False, message=message, written=written)
    # a real run with record appends the verdict every time: check mode says it would
    changed = bool(written) or (p["record"] and module.check_mode)
    return dict(changed=changed, verdict=verdict, ok=verdict["ok"], message=message, written=written)


RUN = ModuleRun(
    _verify,
    argument_spec(
        CONFIG_ROOT_ARGS, AWS_ACCESS_ARGS, INSTANCE_ARGS, on_machine=dict(type="dict"),
        error=dict(type="str"), runtime=dict(type="str"), expected_build=dict(type="str"), name_pattern=dict(type="str"),
        check_booted_image=dict(type="bool", default=True), ephemeral=dict(type="bool", default=False),
        run_id=dict(type="str"), record=dict(type="bool", default=True), fail_on_failure=dict(type="bool", default=False),
    ),
    requires=("PyYAML",),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
