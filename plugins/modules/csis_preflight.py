#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_preflight
short_description: Refuse a real csis.infra run that could not finish safely, before anything is planned
version_added: 0.2.0
description:
  - Runs before a real lifecycle run renders, plans or applies anything (the C(csis.infra.render) role calls it
    first) and fails with every finding, one line each.
  - B(HARD drift.) Fails while the last state query found a HARD line, with one C(state) line per HARD line, ending
    in C((from state-report.json; re-run 'state query' after fixing)). The query keeps its HARD lines in meta-state
    (C(drift.yaml)), which every checkout reads (an AWX job's fresh one too); a line only that record holds (the query
    ran in another checkout) ends in C((from meta-state drift.yaml, state query <run>; ...)). Both the record and this
    checkout's own C(generated/state-report.json) count, so a query whose record could not be written still stops its
    own checkout. Neither holding a HARD line lets the run start; a report or record that cannot be read refuses it.
  - B(Meta-state can be read.) Every meta-state file loads through the store, so its checks run (whole files, the
    known shapes, the files agreeing with each other).
  - B(Meta-state can be written.) With I(write), proves that the run could record what it applies. A probe file
    is created, fsynced and removed in the meta-state directory (in a temporary directory of the configuration
    root while it does not exist yet), no meta-state file may be immutable, and the store's lock is taken and
    released. An unwritable directory (permissions, a read-only mount, C(chattr +i)) or a file where the directory
    belongs fails the run here, naming the directory, instead of after the apply.
  - B(Meta-state outlives the run.) With I(awx_job) (the run is that AWX job), the tree's local meta-state store
    refuses the run. An AWX job runs in a container of its own on any execution node; what it would record there
    (records, plan receipts, approvals, the audit trail) is gone with the container, and its run lock keeps no job on
    another node out. The S3 store is the AWX store.
  - Leaves nothing behind but the store's own lock file (which every meta-state write keeps).
extends_documentation_fragment:
  - csis.infra.controller.config_root
  - csis.infra.attributes.worker
options:
  write:
    description:
      - Check that meta-state can be written and locked. Turn it off for runs that write nothing (a dry run, the
        summary); an AWX plan job writes its plan receipts, so the C(csis.infra.render) role checks it there too.
    type: bool
    default: true
  lock_timeout:
    description:
      - Seconds to wait for the meta-state lock while another run holds it (the roles pass C(csis_lock_timeout)).
    type: float
    default: 600
  awx_job:
    description:
      - The AWX job id of this run (the C(csis.infra.render) role passes C(awx_job_id) unless
        C(csis_awx_local_meta_state) is true, for a checkout that outlives the job). Set, a local meta-state store
        is a finding.
    type: str
    version_added: 0.2.0
  refuse:
    description:
      - Fail the task on any finding (a real run). With C(false) (a dry run, which applies and records nothing), every
        finding is a warning that begins C(a real run would refuse to start:) and the task succeeds, so the dry run
        still previews the plans while telling what the next real run will stop on (a HARD line, a damaged
        C(drift.yaml)).
    type: bool
    default: true
    version_added: 0.2.0
attributes:
  check_mode:
    support: full
    details: The reads and the drift check run; the write probe and the lock are skipped (C(meta_state.writable) is null).
"""

EXAMPLES = r"""
- name: Refuse to start while the last state query found HARD drift or meta-state cannot be recorded
  csis.infra.csis_preflight:
    config_root: "{{ csis_config_root | ansible.builtin.realpath }}"
  register: preflight

- name: A summary writes nothing, so only the reads
  csis.infra.csis_preflight:
    config_root: examples
    write: false
    refuse: false

- name: A dry run warns about what a real run would refuse, and goes on
  csis.infra.csis_preflight:
    config_root: examples
    write: false
    refuse: false
"""

RETURN = r"""
hard_drift:
  description: The HARD lines of the last state query, each C({kind, name, drift, detail, hard}) (empty when none).
  returned: always
  type: list
  elements: dict
report:
  description: >-
    Where they were read: meta-state's C(drift.yaml) (C(meta-state/drift.yaml), C(s3://...)), the state report's path,
    or both joined by C( and ) (null when neither exists yet).
  returned: always
  type: str
meta_state:
  description: What was found of meta-state.
  returned: always
  type: dict
  contains:
    path:
      description: The meta-state directory.
      type: str
    exists:
      description: Whether the directory exists (the first record creates it).
      type: bool
    files:
      description: The meta-state files present (each one read and checked).
      type: list
      elements: str
    writable:
      description: True when the write probe and the lock succeeded, false when they failed, null when not checked.
      type: bool
problems:
  description: Why the run must not start, one line each (also the message; with I(refuse=false), the warnings).
  returned: failure, or success with I(refuse=false) and findings
  type: list
  elements: str
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ROOT_ARGS, ModuleRun, argument_spec, fail_from
from ansible_collections.csis.infra.plugins.module_utils.csis.state.preflight import PreflightError, preflight

#: how a dry run's warning begins (refuse=false)
WOULD_REFUSE = "a real run would refuse to start: "


def _run(module, p):
    try:
        res = preflight(p["config_root"], write=p["write"] and not module.check_mode,
                        lock_timeout=p["lock_timeout"], what="csis_preflight (write probe)", awx_job=p["awx_job"])
    except PreflightError as exc:
        if p["refuse"]:
            fail_from(module, exc, **exc.result)
        problems = [str(x) for x in exc.problems]
        for line in problems:
            module.warn(WOULD_REFUSE + line)
        return dict(changed=False, problems=problems, **exc.result)
    except CsisError as exc:
        fail_from(module, exc, **getattr(exc, "result", {}))
    return dict(changed=False, **res)


RUN = ModuleRun(_run, argument_spec(CONFIG_ROOT_ARGS, write=dict(type="bool", default=True),
                                    lock_timeout=dict(type="float", default=600.0),
                                    refuse=dict(type="bool", default=True), awx_job=dict(type="str")),
                requires=("PyYAML",), options=dict(supports_check_mode=True))


def main():
    RUN.main()


if __name__ == "__main__":
    main()
