#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_forget
short_description: Drop a csis.infra instance's or storage's meta-state records
version_added: 0.1.0
description:
  - Forgets one launched instance (its C(launch-params.yaml) record, its pin and pending replacement; its open
    generation in C(instance-state.yaml) is closed into the history with C(why=forgotten)) or one storage (its
    C(storage-state.yaml) record). The C(storage.yaml) read-model follows.
  - Writes through a meta-state transaction (lock, atomic replace), never by editing files.
  - Looks the recorded resource up first, by its recorded id, and refuses to forget something that still exists at
    the endpoint, or whose existence cannot be checked (endpoint down, permission refused), unless I(confirm) is true.
  - Destroy before delete. A storage recorded C(destroyed) is forgotten without a lookup. A record that still says the
    thing exists (a launched instance, a storage recorded C(active) or C(archived)) is forgotten only with I(force)
    (the endpoint shows it gone) or I(confirm). Where nothing looked it up (no id of it is recorded, or a storage type
    without a lookup, such as a generic C(tf-aws) one), only I(confirm), as nothing showed it gone.
  - >-
    A storage still declared C(destroyed) or C(archived) is refused - forgotten, it would be a new storage, which must
    start C(active) (the tree would no longer validate). Remove its declaration first.
  - Terraform state is not touched.
  - Idempotent. Forgetting again what was forgotten last (the instance's last generation closed C(why=forgotten),
    the storage's last audit record its forget) changes nothing and reports C(already_forgotten); an instance whose
    last machine went through its lifecycle (decommissioned or torn down, so no record says it stands; its generation
    history stays in C(instance-state.yaml)) changes nothing either and reports C(closed_as); a name that nothing ever
    recorded fails
    (C(nothing is recorded for it)), as a misspelt name should.
extends_documentation_fragment:
  - csis.infra.controller.tree
  - csis.infra.aws.boto3
  - csis.infra.attributes.worker
options:
  instance:
    description: The instance to forget. Exactly one of I(instance) and I(storage).
    type: str
  storage:
    description: The storage to forget. Exactly one of I(instance) and I(storage).
    type: str
  confirm:
    description: Forget even though the resource still exists (or its existence cannot be checked).
    type: bool
    default: false
  force:
    description:
      - Forget a record that is not C(destroyed) (a launched instance, a storage recorded C(active) or C(archived))
        whose resource the endpoint shows gone (the record of a thing destroyed outside the system).
      - Not needed for a storage recorded C(destroyed). Does not override the refusal for a resource that still
        exists, or whose existence cannot be checked or was not looked up (that is I(confirm)).
    type: bool
    default: false
  run:
    description: The run id recorded in the history.
    type: str
attributes:
  check_mode:
    details: Reports what it would forget; writes nothing.
"""

EXAMPLES = r"""
- name: Forget a storage whose volume was deleted behind the system's back
  csis.infra.csis_forget:
    config_root: examples
    storage: mnt_data
    force: true
"""

RETURN = r"""
result:
  description: What was forgotten, what the endpoint said (C(checked)), and the meta-state files written.
  returned: success
  type: dict
  contains:
    instance:
      description: The instance forgotten (with I(instance)).
      type: str
      sample: test2
    storage:
      description: The storage forgotten (with I(storage)).
      type: str
      sample: mnt_data
    instance_id:
      description: The forgotten instance's recorded machine id (with I(instance); null when none was recorded).
      type: str
      returned: with I(instance)
      sample: i-0123456789abcdef0
    was:
      description: The state the storage was recorded in (with I(storage)).
      type: str
      returned: with I(storage), unless already forgotten
      sample: active
    mounted_by:
      description: Launched instances whose launch parameters still mount the storage (their records are kept).
      type: list
      elements: str
      returned: with I(storage), unless already forgotten
    checked:
      description:
        - >-
          What the endpoint said of the recorded resource, C(not looked up (<why>)) when nothing looked it up,
          C(already forgotten (...); nothing to do), or why an instance has nothing to forget
          (C(its last machine (<id>\) was closed as <why> in run <id>, <time>...)).
      type: str
      sample: vol-0123456789abcdef0 is gone
    already_forgotten:
      description: True when the record had already been forgotten (nothing was written).
      type: bool
      returned: when true
    closed_as:
      description:
        - >-
          With I(instance) whose last machine went through its lifecycle and no record says it stands: why
          its last generation was closed (C(decommission), C(ephemeral), C(gone), C(replaced)); nothing was written.
      type: str
      returned: then
      sample: decommission
    written:
      description: The meta-state files written (empty in check mode and when already forgotten).
      type: list
      elements: str
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, ModuleRun, argument_spec, reveal_of
from ansible_collections.csis.infra.plugins.module_utils.csis.state.ops import forget_instance, forget_storage


def _forget(module, p):
    fn, name = (forget_instance, p["instance"]) if p["instance"] else (forget_storage, p["storage"])
    res = fn(p["config_root"], name, overlays=p["overlays"], confirm=p["confirm"], run=p["run"], check=module.check_mode,
             force=p["force"], reveal=reveal_of(module))
    nothing = res.get("already_forgotten") or res.get("closed_as")
    return dict(changed=bool(res["written"]) or (module.check_mode and not nothing), result=res)


RUN = ModuleRun(
    _forget,
    argument_spec(CONFIG_ARGS, instance=dict(type="str"), storage=dict(type="str"),
                  confirm=dict(type="bool", default=False), force=dict(type="bool", default=False),
                  run=dict(type="str")),
    requires=("PyYAML", "pydantic"),
    options=dict(required_one_of=[("instance", "storage")], mutually_exclusive=[("instance", "storage")], supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
