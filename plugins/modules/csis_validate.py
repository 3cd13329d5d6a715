#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_validate
short_description: Validate a csis.infra configuration tree
version_added: 0.1.0
description:
  - Loads every file of a configuration tree (C(cfg/*.yml), C(groups/), C(images/),
    C(storages/), C(instances/)) into strict models and runs every validation rule
    (references, attach rules, cardinality, data lifecycles, the storage state machine
    against C(meta-state/storage-state.yaml), capability types, policies, availability
    zones, remote-state needs, executables and their versions).
  - Reports every problem at once, each naming the file and the key path.
  - >-
    Shows, for every runtime that belongs to an environment of C(cfg/hierarchy.yml), each effective
    dependency tag and dependency config with the node or file it came from (RV(inheritance),
    RV(inheritance_lines)). Refuses a storage or instance whose effective tags lack one of C(config.required_tags).
  - Writes nothing. Makes no network call, except reading meta-state from an S3 store (C(meta_state) of C(cfg/_config.yml)).
  - >-
    An action plugin runs first on the controller: it decrypts the tree's C(!vault) values (the secret
    fields of docs/configuration.md) with the run's vault secrets and passes the module those that do not
    decrypt as O(vault_problems). No clear value reaches the module.
extends_documentation_fragment:
  - csis.infra.controller.tree_read_only
  - csis.infra.config.undeclare
  - csis.infra.attributes.worker
options:
  vault_problems:
    description:
      - Set by the action plugin, not by hand - the C(!vault) values of the tree that the run's vault secrets do
        not decrypt (C(file), C(key), C(message) each), reported with the other problems.
    type: list
    elements: dict
    default: []
attributes:
  check_mode:
    details: Read-only; the same rules run in check mode.
notes:
  - The messages keep the reference manual's wording so operators can search for them.
"""

EXAMPLES = r"""
- name: Validate the tree
  csis.infra.csis_validate:
    config_root: "{{ csis_config_root }}"
    overlays: "{{ csis_overlays | default([]) }}"
"""

RETURN = r"""
problems:
  description: "Every problem found, one string each: C(<file>: <key>: <message>)."
  returned: always
  type: list
  elements: str
  sample: ["storages/storage0.yaml: storages[0] (mnt_data).share_mode: share_mode '2700': expected one of ('2770', '2775') (N15)"]
summary:
  description: Counts of what the tree declares.
  returned: success
  type: dict
  sample: {instances: 2, storages: 3, runtimes: 1}
inheritance:
  description:
    - >-
      Per runtime (all of them; a runtime of no environment has an empty chain): its C(environment), its
      C(chain) of C(cfg/hierarchy.yml) nodes (farthest first), and its effective C(tags) and C(configs)
      (C(region), C(account_id), C(default_machine_type)).
    - >-
      Each effective value is C({value, from, file}): C(from) is the node (C(account 'x'), C(environment 'y')),
      C(runtime), C(overlay) or C(default); C(overrides) lists what nearer layers replaced, nearest first.
  returned: success
  type: dict
  sample:
    aws-east2-runtime:
      environment: example-us-east-2
      chain: [example-account, example-us-east-2]
      tags:
        BillingCode: {value: CSIS-0001, from: "account 'example-account'", file: cfg/hierarchy.yml}
        Owner:
          value: coastal-ops
          from: "environment 'example-us-east-2'"
          file: cfg/hierarchy.yml
          overrides: [{value: platform-team, from: "account 'example-account'", file: cfg/hierarchy.yml}]
      configs:
        region: {value: us-east-2, from: "environment 'example-us-east-2'", file: cfg/hierarchy.yml}
inheritance_lines:
  description: The same, one line per effective tag and config of each runtime that belongs to an environment.
  returned: success
  type: list
  elements: str
  sample: ["runtime 'aws-east2-runtime': tag BillingCode = 'CSIS-0001' from account 'example-account' (cfg/hierarchy.yml)"]
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.config.hierarchy import effective, effective_lines
from ansible_collections.csis.infra.plugins.module_utils.csis.config.secrets import problems_rule
from ansible_collections.csis.infra.plugins.module_utils.csis.config.validate import load_and_validate
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, UNDECLARE_ARGS, ModuleRun, argument_spec, fail_from, problems_message


def _run(module, p):
    try:
        tree, _meta = load_and_validate(p["config_root"], overlays=p["overlays"], undeclare=p["undeclare"],
                                        extra=[problems_rule(p["vault_problems"])])
    except ConfigError as exc:
        fail_from(module, exc, msg=problems_message(exc, p["config_root"]))
    return dict(changed=False, problems=[], summary=dict(
        instances=len(tree.instances), storages=len(tree.storages), runtimes=len(tree.runtimes),
        instance_builders=len(tree.instance_builders), storage_builders=len(tree.storage_builders),
        groups=len(tree.groups), images=len(tree.images), hierarchy_nodes=len(tree.hierarchy)),
        inheritance={name: effective(tree, rt) for name, rt in sorted(tree.runtimes.items())},
        inheritance_lines=effective_lines(tree))


RUN = ModuleRun(_run, argument_spec(CONFIG_ARGS, UNDECLARE_ARGS, vault_problems=dict(type="list", elements="dict", default=[])),
                requires=("PyYAML", "pydantic"), options=dict(supports_check_mode=True))


def main():
    RUN.main()


if __name__ == "__main__":
    main()
