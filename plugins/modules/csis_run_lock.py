#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_run_lock
short_description: Hold a configuration tree for the whole ansible-playbook run (one run per tree at a time)
version_added: 0.2.0
description:
  - Takes the tree's run lock, C(meta-state/.run.lock) in the meta-state store (a C(flock) on the local backend; on
    the S3 backend an object created with C(If-None-Match) that expires unless renewed), so that a second run on the
    same tree, on this machine or on another AWX execution node, cannot render, plan or apply while this one does.
  - The lock is held by a small watcher process the module leaves behind. It holds the lock for as long as the
    C(ansible-playbook) process that ran the module lives, and releases it when that run ends, whether it
    finished, failed or was killed. No task has to release it.
  - Re-entrant within one run. The lifecycles of C(site.yml) take it once each and find it their own.
  - A second run waits up to O(timeout) seconds, then fails with one line naming the holder (its
    C(ansible-playbook) pid and host, since when, its playbooks, user, csis run id and AWX job).
  - The C(csis.infra.render) role runs it right after the preflight, before anything is rendered, in every
    lifecycle run (dry runs included); the playbooks that change meta-state by themselves (C(forget.yml), C(state_import.yml),
    C(upgrade_instance.yml)) run it too.
extends_documentation_fragment:
  - csis.infra.controller.config_root
  - csis.infra.attributes.worker
options:
  timeout:
    description:
      - Seconds to wait while another run holds the tree (the roles pass C(csis_run_lock_timeout)).
      - V(0) refuses at once.
    type: float
    default: 90
  what:
    description: What this run is, as a second run's message names it (the playbooks are added).
    type: str
    default: csis.infra run
  run_id:
    description: The csis run id, recorded in the lock's description.
    type: str
    default: ''
  required:
    description:
      - With V(false), a store where the lock cannot be taken (an unwritable meta-state directory, an unreachable
        bucket) is a warning and the run goes on without the lock (a dry run, which plans and records nothing).
        A tree held by another run still fails.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details:
      - Takes no lock and writes nothing, and does not wait.
      - When another run holds the tree it returns that run as RV(holder) and warns (a real run would wait O(timeout)
        seconds for it, then fail naming it), so a check run never reads a tree another run is changing unsaid.
"""

EXAMPLES = r"""
- name: Hold this tree for the whole run
  csis.infra.csis_run_lock:
    config_root: "{{ csis_config_root | ansible.builtin.realpath }}"
    what: "csis.infra storage run"
    timeout: 300
"""

RETURN = r"""
where:
  description: The lock (C(meta-state/.run.lock) or its S3 URL).
  returned: always
  type: str
  sample: meta-state/.run.lock
reentered:
  description: True when this run already held the tree (a later lifecycle of C(site.yml)).
  returned: success, not in check mode
  type: bool
held:
  description: Whether this run holds the tree (false only when O(required=false) let it go on without the lock).
  returned: success (false in check mode, which takes nothing)
  type: bool
holder:
  description: >-
    The holder's description (this run's when the lock was taken; in check mode the other run's, or null):
    C(pid) (its ansible-playbook), C(host), C(user), C(playbooks), C(csis_run_id), C(watcher_pid), AWX ids.
  returned: always
  type: dict
waited:
  description: Seconds this run waited for the lock (another run held the tree; a warning then names that run).
  returned: when this run took the lock
  type: float
  sample: 0.1
controller:
  description: >-
    The C(ansible-playbook) process of this run, whose end releases the lock: C(pid), C(start) (the kernel's start
    time) and C(watch) (C(<pid>:<start>), what C(csis.infra.tofu_root) gives its terraform supervisor to watch).
  returned: success
  type: dict
  sample: {"pid": 4242, "start": "1234567", "watch": "4242:1234567"}
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ROOT_ARGS, ModuleRun, argument_spec, fail_from
from ansible_collections.csis.infra.plugins.module_utils.csis.state import runlock


def _run(module, p):
    try:
        if module.check_mode:  # nothing taken; another run holding the tree is said, as a real run would wait for it
            seen = runlock.peek(p["config_root"], timeout=max(0.0, p["timeout"]))
            for notice in seen.pop("notices"):
                module.warn(notice)
            return dict(changed=False, held=False, **seen)
        res = runlock.acquire(p["config_root"], timeout=max(0.0, p["timeout"]), what=p["what"], csis_run_id=p["run_id"])
    except runlock.RunLockBusy as exc:
        fail_from(module, exc)
    except CsisError as exc:
        if p["required"]:
            fail_from(module, exc)
        module.warn("running without the run lock: %s" % exc)
        return dict(changed=False, held=False, where=runlock.RUN_LOCK_NAME, holder=None, reentered=False,
                    controller=runlock.controller_info())
    for notice in res.pop("notices", []):
        module.warn(notice)
    return dict(changed=False, held=True, **res)


RUN = ModuleRun(
    _run,
    argument_spec(CONFIG_ROOT_ARGS, timeout=dict(type="float", default=runlock.DEFAULT_TIMEOUT),
                  what=dict(type="str", default="csis.infra run"),
                  run_id=dict(type="str", default=""), required=dict(type="bool", default=True)),
    requires=("PyYAML",),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
