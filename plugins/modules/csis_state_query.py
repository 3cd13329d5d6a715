#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_state_query
short_description: Compare a csis.infra tree's meta-state with what the AWS endpoint reports (the drift report)
version_added: 0.1.0
description:
  - Looks every owned storage (declared or recorded) and every launched instance up at its runtime's
    endpoint, by the ids terraform recorded (C(facts.volume_id), C(facts.file_system_id), the storage's
    bucket name, the instance ids of C(instance-state.yaml)), and scans for resources carrying the tree's
    C(csis_config) tag that meta-state does not record.
  - Writes C(<config_root>/generated/state-report.json) atomically (not in check mode) with one drift line per
    finding, C(missing) (HARD), C(stale), C(foreign), C(changed), plus C(unavailable) lines for lookups that
    failed (a permission or transport error is never read as absent) and C(note) lines.
  - Keeps the report's HARD lines in meta-state (C(drift.yaml), in the tree's local or S3 store), where every
    checkout of the tree reads them, an AWX job's fresh checkout too. The record is written (in one meta-state
    transaction, with the lock and an audit record) only when its HARD lines change; no record and no HARD line writes
    nothing. A store that cannot be written fails the task, after the report was written.
  - While that record or this checkout's report (both count) holds a HARD line every real lifecycle run refuses
    to start (the first task of the C(csis.infra.render) role); correct the record with the forget or state import
    playbooks, then query again (they do it for you).
  - Writes no other meta-state. A runtime with static keys (C(!vault) values) is reached with them,
    decrypted on the controller with the run's vault secrets; otherwise credentials come from the environment (or
    the runtime's profile).
extends_documentation_fragment:
  - csis.infra.controller.tree
  - csis.infra.aws.boto3
  - csis.infra.attributes.worker
options:
  run:
    description: The run id named in the report (default a UTC timestamp).
    type: str
attributes:
  check_mode:
    details: In check mode the lookups run and the lines are returned, but neither the report nor meta-state's record
      is written; C(changed) and C(recorded.changed) say whether they would change.
"""

EXAMPLES = r"""
- name: Query the state (overlay paths are relative to the configuration root unless absolute)
  csis.infra.csis_state_query:
    config_root: /srv/trees/platform
    overlays: [overlays/apply-all.yml]
  register: state

- name: Show it
  ansible.builtin.debug:
    msg: "{{ state.lines }}"
"""

RETURN = r"""
report:
  description: The report as written to C(generated/state-report.json) (run, tree, reality, drift, unavailable, notes, summary).
  returned: success
  type: dict
drift:
  description: The drift lines, each C({kind, name, drift, detail, hard}).
  returned: success
  type: list
  elements: dict
unavailable:
  description: "The lookups that failed, one C(<what>: <error>) string each."
  returned: success
  type: list
  elements: str
notes:
  description: Notes (pending replacements, resources carrying another tree's tag, records without an id).
  returned: success
  type: list
  elements: str
summary:
  description: Counts per drift kind, plus C(hard), C(unavailable) and C(notes).
  returned: success
  type: dict
hard:
  description:
    - The refusal message of every HARD line (what makes a lifecycle run refuse to start), those of RV(recorded.kept)
      included.
  returned: success
  type: list
  elements: str
lines:
  description: The console report, one line per entry.
  returned: success
  type: list
  elements: str
path:
  description: The report file.
  returned: success
  type: str
recorded:
  description: Meta-state's record of the HARD lines (C(drift.yaml)).
  returned: success
  type: dict
  contains:
    where:
      description: The record's file or object (C(meta-state/drift.yaml), C(s3://<bucket>/<prefix>/meta-state/drift.yaml)).
      type: str
    changed:
      description: Whether this query wrote it (its HARD lines changed); in check mode, whether it would.
      type: bool
    revision:
      description: The meta-state revision of that write (null when nothing was written).
      type: int
    kept:
      description:
        - The record's HARD lines about storages or instances this query could not look up (an C(unavailable) line).
          They are kept, since only a query that sees the thing clears its line. Each C({kind, name, drift, detail}).
        - A storage or instance with nothing to look up (its record holds no id any more, as after a forget; marked
          C(nothing_to_look_up) in the report's C(reality)) is no failed lookup, and its line is not kept.
      type: list
      elements: dict
  version_added: 0.2.0
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, ModuleRun, argument_spec, fail_from, reveal_of
from ansible_collections.csis.infra.plugins.module_utils.csis.state.drift import (
    console_lines, drift_text, hard_lines, query, record_hard, report_changes, report_path, write_report)


def _run(module, p):
    try:
        report = query(p["config_root"], overlays=p["overlays"], run=p["run"], reveal=reveal_of(module))
    except CsisError as exc:
        fail_from(module, exc)
    path = report_path(p["config_root"])
    if module.check_mode:
        changed = report_changes(p["config_root"], report)
    else:
        try:
            path, changed = write_report(p["config_root"], report)
        except OSError as exc:
            fail_from(module, exc, prefix="cannot write %s: " % path)
    try:
        recorded = record_hard(p["config_root"], report, write=not module.check_mode)
    except CsisError as exc:
        fail_from(module, exc, prefix="%s, but its HARD lines could not be kept in meta-state, where the lifecycle "
                  "runs of every checkout read them: " % ("the report says" if module.check_mode else
                                                          "the report is written (%s)" % path),
                  lines=console_lines(report), hard=hard_lines(report))
    changed = changed or recorded["changed"]
    lines = console_lines(report) + ["  kept in meta-state (not looked up this time): %s" % drift_text(dict(d, hard=True))
                                     for d in recorded["kept"]]
    return dict(changed=changed, recorded=recorded, report=report, drift=report["drift"], unavailable=report["unavailable"],
                notes=report["notes"], summary=report["summary"], lines=lines, path=path,
                hard=hard_lines(report) + hard_lines({"drift": [dict(d, hard=True) for d in recorded["kept"]]},
                                                     source="meta-state drift.yaml, not looked up this time"))


RUN = ModuleRun(
    _run,
    argument_spec(CONFIG_ARGS, run=dict(type="str")),
    requires=("PyYAML", "pydantic", "boto3"),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
