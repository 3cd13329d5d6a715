#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_apply_start
short_description: Run community.general.terraform with a root's secrets in terraform's environment
version_added: 0.2.0
author:
  - csis.infra maintainers (@csis-infra)
description:
  - An action plugin. It runs C(community.general.terraform) with O(terraform) as its arguments, as an async job when the
    task says C(async) (the C(csis.infra.tofu_root) role starts its apply that way and waits with M(csis.infra.csis_apply_wait)).
  - >-
    O(secrets) are the root's secret values (M(csis.infra.csis_render)'s C(roots[].secrets): vault ciphertext of the
    tree's secret fields). They are decrypted on the controller with the run's vault secrets and put in the
    environment of the task's own worker process, which the module and the terraform under it inherit: terraform
    gets them as C(TF_VAR_<name>), the rendered root's C(sensitive) and C(ephemeral) variables.
  - >-
    They are never in an C(environment) keyword (Ansible prints it with the command line at C(-vvv)) nor in the
    module's arguments (C(community.general.terraform) echoes C(-var) values). A value that does not decrypt fails
    the task naming its file and key, before terraform runs.
  - >-
    As an async job, the module's result (C(terraform output -json), sensitive outputs in clear) passes through a
    results file in Ansible's async directory (C(ansible_async_dir), default C(~/.ansible_async)), which this plugin
    makes its owner's only (mode C(0700)) before the job starts; M(csis.infra.csis_apply_wait) removes the file once
    read and masks the outputs it returns.
extends_documentation_fragment:
  - csis.infra.attributes
  - csis.infra.attributes.platform
options:
  terraform:
    description: The arguments of C(community.general.terraform) (for example C(project_path), C(binary_path), C(state), C(plan_file)).
    type: dict
    required: true
  secrets:
    description:
      - C(TF_VAR_<name>) to C({vault, file, key}) (a C(!vault) ciphertext, with where the tree holds it) or to C({value})
        (a secret field given in clear text).
    type: dict
    default: {}
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
  async:
    support: full
    description: Starts C(community.general.terraform) as an async job when the task has C(async).
  check_mode:
    support: full
    details: As C(community.general.terraform) supports it.
  diff_mode:
    support: none
    details: >-
      The module runs without diff mode whatever the task's (its diff would be the plan's every before and after
      value, sensitive ones in clear); M(csis.infra.csis_gate_plan) shows the plan's changes, masked.
  platform:
    details: Runs on the controller only (the host must use the local connection when O(secrets) is set).
"""

EXAMPLES = r"""
- name: Start the apply of exactly that plan file
  csis.infra.csis_apply_start:
    terraform:
      project_path: "{{ root_dir }}"
      state: present
      plan_file: "{{ root_dir }}/tfplan"
    secrets: "{{ csis_root_item.secrets }}"
  async: 14700
  poll: 0
  register: apply_job

- name: Wait for the apply, with progress
  csis.infra.csis_apply_wait:
    job: "{{ apply_job }}"
"""

RETURN = r"""
ansible_job_id:
  description: The async job's id (with C(async) and no polling).
  returned: when started as an async job
  type: str
results_file:
  description: The async job's results file (with C(async) and no polling).
  returned: when started as an async job
  type: str
outputs:
  description:
    - Without C(async) (or when it is polled), the task returns M(community.general.terraform)'s own result, as that
      module documents it; this is its root's outputs (C(terraform output -json)).
  returned: when not started as an async job
  type: dict
command:
  description: Without C(async), the terraform command M(community.general.terraform) ran.
  returned: when not started as an async job
  type: str
"""
