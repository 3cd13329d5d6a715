#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_state_import
short_description: Record an existing volume, filesystem or bucket as a csis.infra storage
version_added: 0.1.0
description:
  - Records the declared storage I(storage) as C(active) in C(storage-state.yaml), with the facts of the existing
    resource I(storage_id) (a C(vol-) id for an EBS storage, an C(fs-) id for EFS, a bucket name for S3), after
    checking at the storage runtime's endpoint that it exists and is available.
  - Refuses an undeclared storage (a recorded storage that is not declared is planned as destroyed), an id of the
    wrong shape, an id already recorded for another storage, and an id the endpoint does not know or cannot be
    asked about.
  - Writes through a meta-state transaction; terraform state is not touched.
author:
  - csis.infra maintainers
extends_documentation_fragment:
  - csis.infra.config
options:
  storage:
    description: The declared storage to record.
    type: str
    required: true
  storage_id:
    description: The volume id, filesystem id or bucket name.
    type: str
    required: true
  run:
    description: The run id recorded in the history.
    type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Record a restored volume as storage mnt_data
  csis.infra.csis_state_import:
    config_root: examples
    storage: mnt_data
    storage_id: vol-0123456789abcdef0
"""

RETURN = r"""
result:
  description: The storage, its type, the id, the facts recorded and the meta-state files written.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.csis.infra.plugins.module_utils.csis.loader import ConfigError
from ansible_collections.csis.infra.plugins.module_utils.csis.metastate import MetaStateError
from ansible_collections.csis.infra.plugins.module_utils.csis.stateops import StateOpError, import_storage


def main():
    module = AnsibleModule(
        argument_spec=dict(config_root=dict(type="path", required=True),
                           overlays=dict(type="list", elements="path", default=[]),
                           storage=dict(type="str", required=True), storage_id=dict(type="str", required=True),
                           run=dict(type="str")),
        supports_check_mode=True,
    )
    p = module.params
    try:
        res = import_storage(p["config_root"], p["storage"], p["storage_id"], overlays=p["overlays"], run=p["run"],
                             check=module.check_mode)
    except ConfigError as exc:
        module.fail_json(msg=str(exc), problems=[str(x) for x in exc.problems])
    except (StateOpError, MetaStateError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=res["changed"], result=res)


if __name__ == "__main__":
    main()
