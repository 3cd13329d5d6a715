#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r'''
---
module: csis_run_summary
short_description: Add a root's outcome to the run summary (generated/run-summary.json), or read it
version_added: 0.2.0
description:
  - Merges one root's entry (plan summary, gate verdict, applied or not, meta-state files recorded,
    start, end and duration, status and the failed step) into C(<config_root>/generated/run-summary.json)
    under an exclusive lock, and replaces the file atomically. The roots of a lifecycle run in parallel.
  - A run id other than the file's starts the file afresh, so the file describes one run
    (C(site.yml) runs its three lifecycles under one run id).
  - The C(csis.infra.tofu_root) role calls it when a root's chain ends, passed or failed;
    C(playbooks/summary.yml) shows the file.
  - Without O(entry), reads the file and returns it with one line per root (what C(playbooks/summary.yml) prints).
  - A report, not meta-state. Nothing reads it to decide anything.
extends_documentation_fragment:
  - csis.infra.controller.config_root
  - csis.infra.attributes.worker
options:
  run_id:
    description: The run's id (C(csis_run_id)). Required with O(entry).
    type: str
  entry:
    description:
      - The root's outcome. Known keys are C(key) (required), C(lifecycle), C(builder), C(runtime),
        C(status), C(failed_step), C(plan), C(gate) (C(verdict), C(violations)), C(applied),
        C(apply_failed) (an apply that began and failed), C(recorded), C(started), C(finished),
        C(seconds) (the root's whole pass) and C(apply_seconds) (the apply's own time; empty or
        absent when nothing was applied). Other keys are dropped.
      - Omitted, the module only reads the run summary.
    type: dict
notes:
  - In check mode nothing is written.
attributes:
  check_mode:
    details: Nothing is written.
'''

EXAMPLES = r'''
- name: Read the last run's summary
  csis.infra.csis_run_summary:
    config_root: "{{ csis_root }}"
  register: last_run

- name: Add the root to the run summary
  csis.infra.csis_run_summary:
    config_root: "{{ csis_root }}"
    run_id: "{{ csis_run_id }}"
    entry:
      key: storage-aws-ebs
      status: ok
      plan: "Plan: 1 to add, 0 to change, 0 to destroy."
      applied: true
'''

RETURN = r'''
path:
  description: The run summary file.
  returned: always
  type: str
summary:
  description:
    - The whole run summary after the merge, or as read (C(run_id), C(started), C(roots), C(totals)).
    - Null when no real run has written one.
  returned: unless in check mode with O(entry)
  type: dict
lines:
  description: One line for the run, then one per root.
  returned: without O(entry)
  type: list
  elements: str
'''

from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ROOT_ARGS, ModuleRun, argument_spec
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.runsummary import add_root, path_of, read, summary_lines


def _add(module, p):
    if p["entry"] is None:
        data = read(p["config_root"])
        return dict(changed=False, path=path_of(p["config_root"]), summary=data, lines=summary_lines(data))
    if module.check_mode:
        return dict(changed=False, path=path_of(p["config_root"]))
    data = add_root(p["config_root"], p["run_id"], p["entry"])
    return dict(changed=False, path=path_of(p["config_root"]), summary=data)


RUN = ModuleRun(_add, argument_spec(
    CONFIG_ROOT_ARGS,
    run_id=dict(type="str"),
    entry=dict(type="dict"),
), failure={"changed": False}, options=dict(supports_check_mode=True, required_by={"entry": "run_id"}))


def main():
    RUN.main()


if __name__ == "__main__":
    main()
