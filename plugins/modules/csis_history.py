#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_history
short_description: The audit trail of a csis.infra meta-state, and a record as of a revision
version_added: 0.2.0
description:
  - Every committed meta-state transaction has a revision number and one audit record (who, when, what,
    which records changed with a short diff). This module lists them, oldest first, filtered by instance,
    storage or root, and shows the records of an instance or a storage as they were right after a revision.
  - Reads through the meta-state store (local C(meta-state/) or the S3 store C(cfg/_config.yml) declares);
    writes nothing.
extends_documentation_fragment:
  - csis.infra.controller.config_root
  - csis.infra.attributes.worker
options:
  instance:
    description:
      - Only the revisions that changed this instance's records, or a HARD line of the state query about it
        (meta-state's C(drift.yaml)), its upgrade requests, cancels and verifications, and the refusals and
        failures of the root that declares it. At most one of I(instance) and I(storage).
    type: str
  storage:
    description:
      - Only the revisions that changed this storage's records, or a HARD line of the state query about it, its
        forget and state import, and the refusals and failures of the root that declares it.
    type: str
  root:
    description: Only the revisions whose writer, context or audit event names this terraform root (its whole name).
    type: str
  since:
    description: Only the revisions after this one.
    type: int
    default: 0
  revision:
    description:
      - With I(instance) or I(storage), return its records as they were right after this revision (C(as_of)).
      - Without either, the task fails (there is no record to show as of it).
    type: int
  details:
    description: Return each changed record's full C(before) and C(after) in the trail.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Show what happened to test2
  csis.infra.csis_history:
    config_root: examples
    instance: test2

- name: Show test2's records as of revision 12
  csis.infra.csis_history:
    config_root: examples
    instance: test2
    revision: 12
"""

RETURN = r"""
where:
  description: Where the meta-state lives (a directory, or C(s3://bucket/prefix/meta-state)).
  returned: success
  type: str
revision:
  description: The revision of the last committed transaction (0 when none).
  returned: success
  type: int
trail:
  description: The audit records, oldest first (C(revision), C(time), C(who), C(what), C(context), C(changes)).
  returned: success
  type: list
  elements: dict
lines:
  description: One line per change, for people.
  returned: success
  type: list
  elements: str
as_of:
  description: C({revision, records}) with the records of I(instance) or I(storage) as of I(revision) (null otherwise).
  returned: success
  type: dict
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ROOT_ARGS, ModuleRun, argument_spec
from ansible_collections.csis.infra.plugins.module_utils.csis.state.backends import require_tree
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import history_report


def _history(module, p):
    if p["revision"] is not None and not (p["instance"] or p["storage"]):
        # the records as of a revision are an instance's or a storage's: without one nothing would show it
        module.fail_json(msg="revision %d needs an instance or a storage whose records to show as of it (history.yml: "
                             "-e history_revision=%d with -e history_instance=<name> or -e history_storage=<name>)"
                             % (p["revision"], p["revision"]))
    require_tree(p["config_root"])  # a mistyped csis_config_root is no empty history
    out = history_report(p["config_root"], instance=p["instance"], storage=p["storage"], root=p["root"],
                         since=p["since"], revision=p["revision"], details=p["details"])
    return dict(changed=False, **out)


RUN = ModuleRun(
    _history,
    argument_spec(CONFIG_ROOT_ARGS, instance=dict(type="str"), storage=dict(type="str"),
                  root=dict(type="str"), since=dict(type="int", default=0),
                  revision=dict(type="int"), details=dict(type="bool", default=False)),
    requires=("PyYAML",),
    options=dict(mutually_exclusive=[("instance", "storage")], supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
