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
  - csis.infra maintainers (@csis-infra)
requirements:
  - pydantic >= 2.7 (the configuration models)
  - boto3 >= 1.34 (the AWS calls)
extends_documentation_fragment:
  - csis.infra.config
  - csis.infra.attributes
  - csis.infra.attributes.platform
  - csis.infra.attributes.action_group
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
    details: Checks the resource and reports what it would record; writes nothing.
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

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, argument_spec, csis_module, fail_from
from ansible_collections.csis.infra.plugins.module_utils.csis.state.ops import import_storage


def main():
    module = csis_module(
        argument_spec=argument_spec(CONFIG_ARGS, storage=dict(type="str", required=True),
                                    storage_id=dict(type="str", required=True), run=dict(type="str")),
        requires=("PyYAML", "pydantic"),
        supports_check_mode=True,
    )
    p = module.params
    try:
        res = import_storage(p["config_root"], p["storage"], p["storage_id"], overlays=p["overlays"], run=p["run"],
                             check=module.check_mode)
    except CsisError as exc:
        fail_from(module, exc)
    module.exit_json(changed=res["changed"], result=res)


if __name__ == "__main__":
    main()
