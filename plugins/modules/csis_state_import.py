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
    wrong shape, an id already recorded for another storage, a storage recorded C(archived) (the import would leave
    its archive snapshot unreferenced; restore it, or destroy it, through its lifecycle), and an id the endpoint does
    not know or cannot be asked about.
  - Refuses what cannot be the storage's - a resource tagged with another tree's C(csis_config), a bucket of another
    name than the storage's (its C(bucket_name), else its builder's, else its name), a volume that is an instance's
    root volume - and an id that would take the place of the storage's recorded resource while that one still exists
    (or cannot be looked up) - forget the storage first (C(playbooks/forget.yml ... confirm=true)) and remove the old
    resource from the root's terraform state (C(state rm), the message gives the command) to mean it.
  - Writes through a meta-state transaction. When the storage root's terraform state
    (C(generated/storage/<builder>/storage-generation/)) does not hold the resource, the resource is imported there
    first (C(terraform import module.storage_<label>.<resource> <id>), with the runtime's static keys), so the next
    storage run manages it instead of planning its create; a state holding another id at that address is refused,
    unless that id is gone from the endpoint (it is then removed from the state first). A root that is not
    initialised against its backend (never rendered, rendered only by a dry run, an AWX job's fresh checkout) or
    whose files do not declare the storage yet is rendered and initialised first, that root only, as a storage run's
    render does it; a module call rendered since the root's last C(init) is installed first (C(terraform get)). A
    failed import records nothing, and says what it did to the root before it failed.
  - Before anything is done to the root (when its state does not hold the resource yet), its S3 state lock is
    checked as the lifecycles' plan step checks it (docs/operations.md, "State is locked"). A lock left by a killed
    run of this machine (no process of this machine uses that state) is released, and so is a lock whose ID is in
    I(force_unlock) (a run on another machine, a killed AWX job, that the operator found gone); each release is put
    in the audit trail (V(state lock released), C(playbooks/history.yml)), and a step that fails after it says so.
    Any other lock refuses the import, naming its holder, its age and its ID. A root whose state already holds the
    resource is not looked at.
extends_documentation_fragment:
  - csis.infra.controller.tree
  - csis.infra.aws.boto3
  - csis.infra.attributes.worker
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
  force_unlock:
    description:
      - IDs of state locks the operator found left by runs that are gone (C(playbooks/state_import.yml) passes the
        run variable C(csis_force_unlock), a list or a comma-separated string). The root's lock is released when its
        ID is one of them, whoever took it, but not while a process of this machine works on that state.
      - An ID that is not the lock's releases nothing.
      - Null (what AWX passes for a survey question left blank) is read as none.
    type: list
    elements: str
attributes:
  check_mode:
    details: Checks the resource and the root's state lock and reports what it would record, render, import and
      release; writes nothing. A lock a real run would refuse on is refused in check mode too, in a root initialised
      against its backend here (check mode initialises nothing).
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
  description: The storage, its type, the id, the facts recorded, the meta-state files written, and what was done
    to the root's terraform state (C(terraform)).
  returned: success
  type: dict
  contains:
    storage:
      description: The storage's name.
      type: str
      sample: mnt_data
    type:
      description: The storage's type (C(ebs), C(efs) or C(s3)).
      type: str
      sample: ebs
    id:
      description: The id imported (the volume id, the file system id or the bucket name).
      type: str
      sample: vol-0123456789abcdef0
    facts:
      description: The facts recorded for the storage in C(storage-state.yaml).
      type: dict
    written:
      description: The meta-state files the transaction wrote (empty in check mode and when nothing changed).
      type: list
      elements: str
    changed:
      description: Whether meta-state or the terraform state was (or, in check mode, would be) changed.
      type: bool
    terraform:
      description:
        - "One line on the root's terraform state. C(imported <id> into the terraform state of <root> as <address>),
          followed by what the import needed first, each in parentheses, when it did (an entry of a deleted
          resource removed, the module call installed, and C(released a stale state lock ...) or C(released the
          state lock ...) when the root's S3 state lock was released); C(would import ...) in check mode (its last
          parenthesis C(after releasing the state lock ...) when a real run would release it first), or
          C(would render and initialise <root> (<why>), then import ...) for a root not initialised or not declaring
          the storage yet; C(terraform state already holds ...); C(after rendering and initialising the root ...)
          follows what was done when the import rendered it."
      type: str
      sample: "imported vol-0123456789abcdef0 into the terraform state of /srv/tree/generated/storage/aws-ebs/storage-generation
        as module.storage_mnt_data.aws_ebs_volume.this (released a stale state lock: ...)"
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, ModuleRun, argument_spec, reveal_of
from ansible_collections.csis.infra.plugins.module_utils.csis.state.ops import import_storage


def _import(module, p):
    res = import_storage(p["config_root"], p["storage"], p["storage_id"], overlays=p["overlays"], run=p["run"],
                         check=module.check_mode, reveal=reveal_of(module), force_unlock=p["force_unlock"],
                         render_root=True)
    return dict(changed=res["changed"], result=res)


RUN = ModuleRun(
    _import,
    argument_spec(CONFIG_ARGS, storage=dict(type="str", required=True),
                  storage_id=dict(type="str", required=True), run=dict(type="str"),
                  force_unlock=dict(type="list", elements="str")),
    requires=("PyYAML", "pydantic"),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
