#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_apply_wait
short_description: Wait for an async apply on the controller and show its progress
version_added: 0.2.0
author:
  - csis.infra maintainers (@csis-infra)
description:
  - An action plugin. It waits for an async job that a task started with C(async) and no polling (C(poll) set to 0) on a host whose
    connection is local (the C(csis.infra.tofu_root) root hosts start their apply that way).
  - It reads the job's results file on the controller every 0.2 s, so it ends at most 0.2 s after
    the job, and it runs no module per look (Ansible's own polling runs C(async_status) each time and ends up to
    a whole poll interval late).
  - Every O(interval) seconds it prints a progress line with the last line of O(log) (terraform's output as it
    comes). It then returns the job's result as the task's own and removes the results file. In that result, the value of
    every output terraform marks sensitive (or that looks like a secret) in RV(outputs) reads C((sensitive value)),
    because C(community.general.terraform) returns C(terraform output -json), which holds them in clear.
  - The task fails as the job failed. It also fails when O(timeout) passes first. The job then goes on, and terraform's
    own bound (C(csis_apply_timeout)) stops it.
  - While the job says it runs, it looks every 2 s whether a process of the job (Ansible's C(async_wrapper)) still lives.
    When none does any more and the results file still says C(started), the job was killed before it could write a result
    (C(kill -9), the kernel's OOM killer). The task then fails at once, naming the job, and removes its results file. Where
    the controller has no C(/proc) (not Linux) it cannot look, and only O(timeout) ends such a wait.
  - When O(log) was not written since the job said C(started) (the command truncates it when it starts), the command
    never ran. The task then fails with RV(never_began) set, saying nothing was applied. It does so too when the wait
    never saw a process of the job, once O(unseen_grace) seconds have passed since C(started) without the log written
    (the job was gone before the wait's first look). Ansible's C(async_wrapper)
    loses its worker this way on a controller loaded to its limit (ansible-core issue 87387), and the
    C(csis.infra.tofu_root) role then starts the same plan file once more.
extends_documentation_fragment:
  - csis.infra.attributes
  - csis.infra.attributes.platform
options:
  job:
    description: The registered result of the task started with C(async) and no polling (C(poll) set to 0).
    type: dict
    required: true
  log:
    description: A file whose last line is shown with every progress line.
    type: path
  interval:
    description: Seconds between progress lines (at least 1).
    type: float
    default: 15
  timeout:
    description: Seconds to wait at most (V(0) waits without limit).
    type: float
    default: 0
  label:
    description: What the progress lines name (the task's name when unset).
    type: str
  unseen_grace:
    description:
      - When the wait never saw a process of the job (its first look came after they had gone, as on a controller
        loaded to its limit), the seconds after the job said C(started) that its command may take to begin (to
        write O(log)) before the job is called lost, with RV(never_began) set.
      - Applies only with O(log), on a controller whose processes can be read (Linux).
    type: float
    default: 30
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
  check_mode:
    support: full
    details: Waits for a job that exists; starting no job in check mode leaves nothing to wait for (skip the task then).
  diff_mode:
    support: none
  platform:
    details: Runs on the controller only (the action plugin reads the job's results file there).
"""

EXAMPLES = r"""
- name: Apply exactly that plan file
  community.general.terraform:
    project_path: "{{ root_dir }}"
    state: present
    plan_file: "{{ root_dir }}/tfplan"
  async: 14700
  poll: 0
  register: apply_job

- name: Wait for the apply, with progress
  csis.infra.csis_apply_wait:
    job: "{{ apply_job }}"
    log: "{{ root_dir }}/.apply.log"
    interval: 15
  register: apply
"""

RETURN = r"""
seconds:
  description: How long the wait took.
  returned: when the job finished
  type: float
ansible_job_id:
  description: The job's id.
  returned: when the job finished
  type: str
outputs:
  description:
    - The root's outputs after the apply, as the job's C(community.general.terraform) returned them (C(terraform output -json)),
      with the value of every sensitive or secret-shaped output replaced by C((sensitive value)).
  returned: when the job's result has them
  type: dict
  sample: {"sft_enrollment_token": {"sensitive": true, "type": "string", "value": "(sensitive value)"}}
never_began:
  description: The job is gone and its command never started (O(log) not written since the job said C(started)).
  returned: when the job is gone before its command started
  type: bool
"""
