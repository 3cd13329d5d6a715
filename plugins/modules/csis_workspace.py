#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_workspace
short_description: Commit a rendered root to the tree's git workspace, or check that its merge approved it
version_added: 0.2.0
description:
  - Works with the git workspace of the tree (C(workspace:) of C(cfg/_config.yml); docs/operations.md,
    "Git workspace - merge is approval"). The repository is read from the tree (never passed as a
    variable); a relative path is relative to O(config_root). The local clone of each root is
    C(generated/.workspace/<root>/); the repository URL is not stored in it, and its userinfo is masked
    in every message.
  - O(state=committed) (after the gate) commits the root's own files (the rendered files and
    C(.terraform.lock.hcl), no run output) under C(<lifecycle>/<builder>/) on branch C(update_<root>), or
    C(delete_<root>) when the plan destroys anything (O(destroys)), with O(summary) as the commit's subject and
    the rendered digest, O(plan_digest), O(run_id) and who requested the plan (the AWX user and job the run passed,
    else the OS user) in its body, and pushes the branch. A new branch starts
    from the main branch. The same files and summary make no new commit.
  - O(state=merged) (before the approval) refuses, with one line naming the root, the branch to merge and the
    repository, a root whose rendered digest differs from that of C(<lifecycle>/<builder>/) on the workspace's
    main branch (merge is the approval; an unmerged branch approves nothing).
  - Git runs with a timeout and without prompts (C(GIT_TERMINAL_PROMPT=0)); credentials come from git's own
    means (SSH keys, a credential helper).
extends_documentation_fragment:
  - csis.infra.controller.config_root
  - csis.infra.attributes.worker
options:
  state:
    description: V(committed) commits and pushes the root's branch; V(merged) checks that the main branch holds the root.
    type: str
    choices: [committed, merged]
    required: true
  root:
    description: The root's key (C(<lifecycle>-<builder>), C(csis_root_item.key)); it names the branch.
    type: str
    required: true
  lifecycle:
    description: The root's lifecycle (the workspace folder's first part).
    type: str
    required: true
  builder:
    description: The root's builder (the workspace folder's second part).
    type: str
    required: true
  project_path:
    description: The rendered root's directory.
    type: path
    required: true
  destroys:
    description: How many resources the gated plan destroys; more than 0 makes the branch C(delete_<root>).
    type: int
    default: 0
  summary:
    description: The gate's one-line plan summary (the commit's subject).
    type: str
    default: ''
  plan_digest:
    description: The gated plan's digest (in the commit's body).
    type: str
    default: ''
  run_id:
    description: The csis run id (in the commit's body).
    type: str
    default: ''
requirements:
  - git (the command line client)
  - pydantic (reads the tree's C(workspace:) settings)
attributes:
  check_mode:
    support: full
    details: >-
      O(state=committed) fetches the workspace into the local clone and reports what it would commit;
      it commits and pushes nothing. O(state=merged) checks as in a real run.
"""

EXAMPLES = r"""
- name: Commit the rendered root to its branch of the workspace
  csis.infra.csis_workspace:
    config_root: "{{ csis_root }}"
    state: committed
    root: "{{ csis_root_item.key }}"
    lifecycle: "{{ csis_lifecycle }}"
    builder: "{{ csis_root_item.builder }}"
    project_path: "{{ csis_root_item.directory }}"
    destroys: "{{ gate.destroys }}"
    summary: "{{ gate.summary }}"
    plan_digest: "{{ gate.plan_digest }}"
    run_id: "{{ csis_run_id }}"

- name: Apply only what is merged on the workspace's main branch
  csis.infra.csis_workspace:
    config_root: "{{ csis_root }}"
    state: merged
    root: "{{ csis_root_item.key }}"
    lifecycle: "{{ csis_lifecycle }}"
    builder: "{{ csis_root_item.builder }}"
    project_path: "{{ csis_root_item.directory }}"
    destroys: "{{ gate.destroys }}"
"""

RETURN = r"""
branch:
  description: The root's branch (C(update_<root>) or C(delete_<root>)).
  returned: success
  type: str
  sample: update_storage-aws-ebs
path:
  description: The root's folder in the workspace.
  returned: success
  type: str
  sample: storage/aws-ebs/
digest:
  description: The root's rendered digest (sha256 over the names and contents of its own files).
  returned: success
  type: str
repo:
  description: The workspace repository as git is given it, userinfo masked.
  returned: success
  type: str
committed:
  description: A new commit was made (in check mode, would be made).
  returned: O(state=committed)
  type: bool
pushed:
  description: The branch was pushed.
  returned: O(state=committed)
  type: bool
commit:
  description: The branch's head after the call (null in check mode when a commit would be made).
  returned: O(state=committed)
  type: str
main_commit:
  description: The main branch's commit that holds the root.
  returned: O(state=merged)
  type: str
merge_commit:
  description: The commit on the main branch's first-parent line that brought the root's files (the merge).
  returned: O(state=merged)
  type: str
merged_by:
  description:
    - The author (C(name <email>)) of RV(merge_commit) when it is a merge commit - who merged (a forge's web page
      authors it as the person who pressed merge). Null after a fast-forward or a rebase, which leave no merge
      commit and record nobody who merged. The role records both in the audit trail (C(approved by merge)).
  returned: O(state=merged)
  type: str
message:
  description: What was done or found, in one line.
  returned: success
  type: str
  sample: "storage-aws-ebs: committed storage/aws-ebs/ to branch update_storage-aws-ebs of /srv/ws.git (Plan: 1 to add, ...) and pushed it"
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.apply import workspace
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ROOT_ARGS, ModuleRun, argument_spec


def _run(module, p):
    ws = workspace.setting(p["config_root"])
    if ws is None:
        raise CsisError("%s: the tree has no workspace: in cfg/_config.yml" % p["root"])
    common = dict(root=p["root"], lifecycle=p["lifecycle"], builder=p["builder"], project_path=p["project_path"],
                  destroys=p["destroys"], main_branch=ws.main_branch)
    if p["state"] == "committed":
        res = workspace.commit_root(p["config_root"], ws.repo, summary=p["summary"], plan_digest=p["plan_digest"],
                                    run_id=p["run_id"], check_mode=module.check_mode, **common)
        return dict(changed=res["committed"], **res)
    return dict(changed=False, **workspace.check_merged(p["config_root"], ws.repo, **common))


RUN = ModuleRun(
    _run,
    argument_spec(
        CONFIG_ROOT_ARGS,
        state=dict(type="str", required=True, choices=["committed", "merged"]),
        root=dict(type="str", required=True), lifecycle=dict(type="str", required=True),
        builder=dict(type="str", required=True), project_path=dict(type="path", required=True),
        destroys=dict(type="int", default=0), summary=dict(type="str", default=""),
        plan_digest=dict(type="str", default=""), run_id=dict(type="str", default=""),
    ),
    requires=("pydantic", "PyYAML"),
    failure=dict(changed=False),
    options=dict(supports_check_mode=True),
)


def main():
    RUN.main()


if __name__ == "__main__":
    main()
