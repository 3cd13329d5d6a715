#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

DOCUMENTATION = r'''
---
module: csis_state_lock
short_description: Release an S3 state lock left by a killed run on this machine, or one the operator names; refuse any other
version_added: 0.1.0
description:
  - For an initialised root whose backend is C(s3) with C(use_lockfile), reads the lock object
    C(<key>.tflock) from the state bucket.
  - No lock, or another backend, is a no-op.
  - >-
    A lock taken by this user on this machine (C(Who) is C(user@host)), while no C(terraform)/C(tofu)
    process on this machine works on a root with the same bucket and key, was left by a killed run.
    It is released with C(force-unlock -force <ID>) (terraform refuses when the lock changed meanwhile)
    and the module reports C(changed).
  - Any other lock (a live local run, another machine or user) fails with the lock's holder, time,
    operation and ID, and how to release it once that run is known to be gone (O(force_unlock) with its ID,
    or C(terraform force-unlock)).
  - The processes of this machine are read from C(/proc) (Linux). Where there is none, a lock of this machine is
    not released either (whether its holder lives cannot be told) and fails the same way, unless O(force_unlock)
    names it (the operator's word).
  - Inside an AWX job (C(CSIS_AWX_JOB_ID) or C(AWX_JOB_ID) in the environment) such a lock is not released on its own
    either; a container sees only its own processes, and another job's container can carry the same host name.
    O(force_unlock) still releases it.
  - The refusal of a lock an apply held (operation C(OperationTypeApply)) adds that the state may be behind reality
    (a killed apply) and to run C(playbooks/state_query.yml) before the next plan.
extends_documentation_fragment:
  - csis.infra.controller
  - csis.infra.aws.boto3
  - csis.infra.attributes.worker
options:
  project_path:
    description: The terraform root (after C(init)).
    type: path
    required: true
  binary_path:
    description: The terraform or tofu binary.
    type: str
    default: terraform
  release:
    description: Release a lock whose local holder is gone (V(false) only reports it and fails).
    type: bool
    default: true
  force_unlock:
    description:
      - The IDs of locks the operator found left by runs that are gone (a refusal names the lock's ID). Such a lock is
        released whoever took it (another machine, a killed AWX job), but for one a live process of this machine
        works on (where its processes can be read); an ID that is not the lock's releases nothing.
      - Null (what AWX passes for a survey question left blank) is read as none.
    type: list
    elements: str
notes:
  - Uses the controller's boto3 with the AWS credentials of the environment (as terraform does).
  - In check mode nothing is released; a stale lock is reported as a change that would be made (with O(release) off,
    check mode fails as a real run does).
attributes:
  check_mode:
    details: Nothing is released; a stale lock (or one named in I(force_unlock)) is reported as a change that would be
      made, C(msg) saying C(would release the state lock ...) and C(lock) holding the lock's content; with O(release) off
      it fails with the refusal a real run gives.
'''

EXAMPLES = r'''
- name: Release a state lock left by a killed run (before the plan)
  csis.infra.csis_state_lock:
    project_path: "{{ root_dir }}"
    binary_path: terraform

- name: Release the lock of a killed AWX job, whose ID the refusal named, once that job is known to be gone
  csis.infra.csis_state_lock:
    project_path: "{{ root_dir }}"
    force_unlock: [0b6a6a7e-5d3c-4a9e-9f7e-2d1f3c4b5a69]
'''

RETURN = r'''
locked:
  description: Whether the state was locked when the module looked.
  returned: always
  type: bool
released:
  description: Whether the module released the lock.
  returned: always
  type: bool
msg:
  description: What was found and done (or, in check mode, would be done).
  returned: always
  type: str
lock:
  description:
    - The lock object's content (ID, Operation, Who, Created, Path, lock_object), or null.
    - C(lock_age) is the seconds since the lock object was written, by the store's clock (when its answer tells it).
  returned: always
  type: dict
'''

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.statelock import StateLockError, check_and_release
from ansible_collections.csis.infra.plugins.module_utils.csis.module import ModuleRun

# how a refusal tells the caller to name the lock: this module's own option
CONFIRM = "run the module again with force_unlock: [{id}]"


def _release(module, p):
    if module.check_mode:
        try:
            return check_and_release(p['project_path'], p['binary_path'], release=False,
                                     confirmed_gone=p['force_unlock'], confirm_with=CONFIRM)
        except StateLockError as exc:
            # what a real run would do: release a lock it may release (with release on), else the refusal it gives
            if exc.releasable and p['release']:
                return dict(changed=True, locked=True, released=False, lock=exc.content,
                            msg="would release the state lock: %s" % exc.lock if exc.lock else str(exc))
            raise
    result = check_and_release(p['project_path'], p['binary_path'], release=p['release'],
                               confirmed_gone=p['force_unlock'], confirm_with=CONFIRM)
    if result.get("released"):
        module.warn(result["msg"])
    return result


RUN = ModuleRun(
    _release,
    dict(project_path=dict(type='path', required=True), binary_path=dict(type='str', default='terraform'),
         release=dict(type='bool', default=True), force_unlock=dict(type='list', elements='str')),
    failure=dict(changed=False),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == '__main__':
    main()
