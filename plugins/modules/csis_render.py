#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: csis_render
short_description: Render the terraform roots of a csis.infra lifecycle
version_added: 0.1.0
description:
  - Validates the configuration tree (exactly as M(csis.infra.csis_validate); nothing is
    written when any rule fails), plans the roots of the requested lifecycles and writes
    them under C(<config_root>/generated/<lifecycle>/<builder>/<phase>/).
  - Each root is replaced as a whole (staged beside it, compared, then swapped in; the emission is already in C(terraform fmt) form); files that
    csis.infra did not generate (C(.terraform/), local state, plan files) are kept.
  - A render that fails after it wrote roots (a root's C(init) or C(validate) fails, a file cannot be
    written) puts every root it wrote back as it was, without its prepare stamp (a root it created is
    removed), and says so at the end of its message; the next render initialises and validates them again.
  - Without C(module_source_base) in C(cfg/_config.yml), the roots call the collection's own terraform
    modules, copied into C(<config_root>/generated/.modules/<collection version>/) (only when they differ)
    and referenced by relative paths, so a rendered tree plans wherever it is moved or checked out.
  - Then prepares every changed root, in parallel. A dry run runs C(fmt -check) and C(validate); the
    roots to validate are validated in one C(validate) run per binary (a temporary root outside the
    tree calls each of them as a module and is the only one initialised, so the provider's checksum
    and schema load once), and each alone, after its own C(init -backend=false), when that run fails
    (for its own message) or when it is the binary's only root. A root validated together keeps no
    C(.terraform/) of its own but the stamp; run C(terraform init) in it before any terraform command. A root unchanged since its last
    successful fmt/init/validate is not prepared again; one whose files changed only where C(init) does
    not read (a module call's argument, a launch script), or that only lost module calls (a detach, a
    decommission), is not initialised again. Every terraform process gets C(GOGC=400) and
    C(GOMEMLIMIT=1GiB) unless the environment sets either (less CPU for a little more memory; see
    docs/terraform.md). A real run runs C(fmt -check) and C(init -reconfigure -backend-config=<backend file>);
    it does not validate, because its plan validates the same configuration seconds later
    (one provider start less per changed root).
  - Returns, per root, what the playbooks need to plan, gate and apply it.
  - Writes no meta-state; recording happens only after an apply (M(csis.infra.csis_record)).
extends_documentation_fragment:
  - csis.infra.controller.tree
  - csis.infra.config.undeclare
  - csis.infra.attributes.worker
options:
  lifecycle:
    description: The lifecycles to render, in order.
    type: list
    elements: str
    choices: [identity, storage, instance-image]
    required: true
  dry_run:
    description:
      - A dry run renders and validates, with C(init -backend=false) where a root is initialised (no backend is reached).
      - A real run initialises every root against its state backend (and leaves validation to its plan).
    type: bool
    default: true
  only_runtime:
    description: Render only the roots whose builder runs on this runtime; the others emit nothing.
    type: str
  apply_runtime:
    description:
      - Narrow which roots may apply to the roots of this runtime (never turns on an apply flag
        that C(cfg/_config.yml) has off). Implies I(only_runtime).
    type: str
  prepare:
    description: Run fmt/init/validate in each root after writing it.
    type: bool
    default: true
  prepare_ahead:
    description:
      - In a dry run (without I(cascade)), also write the roots of the lifecycles that follow the last one
        in I(lifecycle) (identity, then storage, then instance-image) and validate them in a second
        C(validate) run beside this run's (the two use two cores at once), so those lifecycles' own dry
        runs find them unchanged and run no terraform.
      - They are reported in RV(prepared_ahead), and their files count in C(changed) and the diff. In check
        mode they are compared and not written (RV(prepared_ahead) lists those the dry run would write).
        A following root that cannot be rendered or validated here is left to its own lifecycle's run,
        which reports it; it never fails this one.
    type: bool
    default: false
  workers:
    description: How many roots are prepared in parallel.
    type: int
    default: 4
  series_heads:
    description:
      - Series heads resolved by M(csis.infra.csis_series_heads) (C(<image>@<runtime>) to
        C({ami_id, ...})). A C(follow) instance pinned to another build is replaced onto its
        head; an explicit upgrade without a target goes to the head. Empty (the default)
        means only an image's declared C(ami_id) counts as its head, and nothing is looked up.
    type: dict
    default: {}
  only_roots:
    description:
      - Write and prepare only these roots of the render (their keys, C(<lifecycle>-<builder>), as
        RV(roots) names them); every other root's files are left as they are, and nothing is
        prepared ahead.
      - The C(csis.infra.tofu_root) role renders an instance root once more this way right after its
        record step, when its apply first launched a durable machine, so the files name the AMI the launch pinned
        (the first render named the image's pattern) and the next run renders nothing new.
      - A key the render does not produce is refused.
    type: list
    elements: str
    version_added: 0.2.0
  preview_upgrades:
    description:
      - Check mode only - the pending replacement markers M(csis.infra.csis_upgrade) would leave (instance name to
        its RV(csis.infra.csis_upgrade#module:pending)), rendered as if meta-state held them, so that
        C(playbooks/upgrade_instance.yml --check) shows the replacement it asks for (the module call's AMI, the next
        hostname, the C(-replace) a real run would plan) while nothing was written.
      - Refused outside check mode - a real run plans a replacement only for a marker meta-state holds.
      - A marker of an instance meta-state does not record as launched is refused, as the marker itself would be.
    type: dict
    version_added: 0.2.0
  cascade:
    description:
      - One phase of an environment's cascade destroy, as C(playbooks/destroy_environment.yml) passes it
        (M(csis.infra.csis_cascade)) - C(environment), C(phase) (C(ephemeral), C(durable), C(storage) or
        C(identity)), C(ebs) (C(archived) or C(destroyed)), C(approved) (the destroys the cascade's approval showed).
      - The phase is computed again from meta-state as it is; the declaration is changed for this run only
        (instances undeclared, storages requested C(archived)/C(destroyed), identity roots emptied) and only the
        environment's roots are rendered. A destroy the approval did not show is refused.
    type: dict
attributes:
  check_mode:
    details: Validates and reports which roots and files would change; writes nothing and runs no terraform init.
  diff_mode:
    support: full
    details:
      - Shows a unified diff of every generated file the run writes or would write - the roots' files, the
        vendored modules under C(generated/.modules/) and a new C(generated/.gitignore). A root's own file list,
        C(.csis-manifest.json), is shown only when it is missing and every other file of the root is as rendered
        (the one file the run writes there).
notes:
  - Terraform runs with the collection's CLI configuration (provider mirror and shared plugin cache);
    see C(docs/terraform.md).
"""

EXAMPLES = r"""
- name: Render the storage roots (dry run)
  csis.infra.csis_render:
    config_root: "{{ csis_root }}"
    lifecycle: [storage]

- name: Render the instance roots for a real run, on one runtime
  csis.infra.csis_render:
    config_root: "{{ csis_root }}"
    lifecycle: [instance-image]
    dry_run: false
    apply_runtime: aws-east2-runtime
  register: rendered
"""

RETURN = r"""
roots:
  description: One entry per rendered root, with what the playbooks need to plan, gate and apply it.
  returned: success
  type: list
  elements: dict
  contains:
    key:
      description: C(<lifecycle>-<builder>), unique within a run.
      type: str
    directory:
      description: Absolute path of the root.
      type: str
    lifecycle:
      description: The lifecycle.
      type: str
    builder:
      description: The builder (terraform workspace).
      type: str
    builder_type:
      description: The builder's type.
      type: str
    runtime:
      description: The builder's runtime.
      type: str
    backend_file:
      description: The partial backend file name, or null without state backends.
      type: str
    backend_type:
      description: The state backend's type (for example C(s3) or C(local)), or null without state backends.
      type: str
    binary:
      description: The terraform/tofu binary of the builder's executable.
      type: str
    binary_path:
      description: The binary as found on C(PATH) (its name when it is not found).
      type: str
    may_apply:
      description: Whether the lifecycle's apply flag allows this root (narrowed by O(apply_runtime)).
      type: bool
    allow_destroy:
      description: The destroy whitelist for the gate.
      type: list
      elements: str
    required_tags:
      description:
        - The tree's C(config.required_tags), for the gate's O(csis.infra.csis_gate_plan#module:required_tags).
      type: list
      elements: str
    endpoint_env:
      description:
        - For a runtime with C(endpoints), the C(AWS_ENDPOINT_URL_<SERVICE>) variables and
          C(TF_VAR_csis_endpoints_from_environment=true) that stand in for the provider's endpoints block in the
          collection's terraform runs (also the root's C(csis-endpoint-env.json)); empty when the block stays
          (docs/terraform.md, "Endpoints from the environment"). No secrets.
      type: dict
    replace:
      description: Addresses to plan with C(-replace).
      type: list
      elements: str
    reads:
      description:
        - The roots this root reads the outputs of (its C(data "terraform_remote_state") labels to their root keys);
          M(csis.infra.csis_plan) names them when one has no state yet.
      type: dict
    apply_names:
      description:
        - The names besides the builder's that an apply flag may list to allow this root - the builder's aliases,
          its runtime's name and the runtime's aliases. C(may_apply) was decided by them; the role passes them to
          M(csis.infra.csis_apply_check) as O(csis.infra.csis_apply_check#module:root_alias), so the check after the
          approval allows what the render allowed.
      type: list
      elements: str
    secrets:
      description:
        - The runtime's static credentials, by the terraform variable that carries them (C(TF_VAR_csis_aws_...)) - a
          C(!vault) value as its ciphertext (C(file), C(key), C(vault)), decrypted on the controller by the steps that
          need it (the C(secrets) option of the modules that reach AWS); a field the tree may give in clear (the access
          key id, not a secret) as C(value). Empty for a runtime without static keys.
      type: dict
    require_unmounted:
      description: C(instance:storage) pairs that need an unmount receipt.
      type: list
      elements: str
    unmounts:
      description: The unmounts to run after the gate, the approval and the apply check, before the apply (C(instance), C(storage), C(mount_point), C(type)).
      type: list
      elements: dict
    transitions_before:
      description: Storage transitions to run after the gate and before the apply.
      type: list
      elements: dict
    transitions_after:
      description: Storage transitions to run after a successful apply.
      type: list
      elements: dict
    instances:
      description: Instances of the root with their launch parameters.
      type: dict
    storages:
      description: Storages of the root with their requested and recorded states.
      type: dict
    recorded_storages:
      description:
        - The storages of the root that meta-state records as existing (C(active), C(archived)), which
          O(csis.infra.csis_storage_check#module:storages) looks up before the plan; empty on a first create, when
          the role skips that step.
      type: list
      elements: str
    ephemeral:
      description: The root's ephemeral instances (verified, then torn down through a second gate).
      type: list
      elements: str
    decommission:
      description: Recorded instances of the root that are no longer declared (their destroy is whitelisted).
      type: list
      elements: str
    warnings:
      description: Generation warnings of this root.
      type: list
      elements: str
    files:
      description: The names of the files csis.infra generated in the root.
      type: list
      elements: str
    aws:
      description: How boto3 reaches the root's runtime, for the O(csis.infra.csis_unmount#module:aws) option of other modules. No credentials.
      type: dict
    changed:
      description: Whether this root's files changed.
      type: bool
    added:
      description: Files added to the root.
      type: list
      elements: str
    removed:
      description: Files removed from the root.
      type: list
      elements: str
    modified:
      description: Files of the root whose content changed.
      type: list
      elements: str
    commands:
      description:
        - The terraform commands run to prepare the root (C(fmt), C(init), and C(validate) in a dry run).
        - "C((unchanged since the last successful fmt/init/validate)) for a root prepared before with the same files, and
          C((init: not needed: what it reads is unchanged since the last successful init, or only module calls were removed))
          in place of an C(init) that was not needed."
        - Empty when nothing was prepared (check mode, O(prepare=false)).
      type: list
      elements: str
    deferred:
      description:
        - What a real run executes for the root, in order (init, stale-lock release, storage check,
          plan, gate, approval, apply check, unmounts, binding check, transitions, apply, record,
          ephemeral verification), the reference manual's deferred commands. A dry run prints them.
        - The init is the render's, which a real run skips where what it reads is unchanged since the
          root's last successful init; its line says so.
      type: list
      elements: str
    initialised:
      description:
        - Whether the root is initialised against its state backend (C(init -reconfigure) with the
          backend file, now or by an earlier render of the same files), so the C(csis.infra.tofu_root)
          role does not initialise it again. False in a dry run, in check mode and with O(prepare=false).
      type: bool
prepared_ahead:
  description:
    - The roots of the following lifecycles this run wrote or validated (in check mode, would write; O(prepare_ahead)), each with
      C(key), C(directory), C(changed) and C(commands). One already validated with the same files is not
      listed; one whose C(commands) hold no C(validate) (it failed there) is validated by its own lifecycle's run.
  returned: success
  type: list
  elements: dict
  sample:
    - key: instance-image-open-tofu
      directory: generated/instance-image/open-tofu/instance-generation
      changed: true
      commands: ["terraform fmt -check -no-color", "terraform validate -no-color (one run for 1 root)"]
config_root:
  description: The configuration root, as an absolute path.
  returned: success
  type: str
modules:
  description:
    - The collection's terraform modules vendored into the tree (C(directory), C(version), C(changed)),
      which the roots call when C(module_source_base) is not set; null when it is set.
  returned: success
  type: dict
approvals:
  description: The tree's C(approvals:) settings (C(cfg/_config.yml)), with their defaults.
  returned: success
  type: dict
  sample: {"distinct_approver": false}
workspace:
  description:
    - The tree's C(workspace:) settings (C(cfg/_config.yml)), with their defaults, the repository's userinfo
      masked; null when the tree has no workspace. M(csis.infra.csis_workspace) reads the repository from the tree.
  returned: success
  type: dict
  sample: {"repo": "https://***@git.example.org/platform/workspace.git", "require_merge": true, "main_branch": "main"}
undeclared:
  description: The instances treated as undeclared in this run (O(undeclare)).
  returned: success
  type: list
  elements: str
tf_env:
  description: Environment for terraform tasks (the collection's CLI configuration).
  returned: success
  type: dict
warnings_list:
  description: Generation warnings (for example an instance with no resolvable AMI).
  returned: success
  type: list
  elements: str
problems:
  description: Validation problems (on failure).
  returned: failure
  type: list
  elements: str
"""

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError, CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.module import CONFIG_ARGS, UNDECLARE_ARGS, ModuleRun, argument_spec, fail_from, problems_message
from ansible_collections.csis.infra.plugins.module_utils.csis.render.pipeline import render
from ansible_collections.csis.infra.plugins.module_utils.csis.render.writer import unified


def _run(module, p):
    if p["preview_upgrades"] and not module.check_mode:
        module.fail_json(msg="preview_upgrades previews markers csis_upgrade did not write: check mode only (a real run "
                             "replaces an instance only for a marker meta-state holds)")
    try:
        out = render(p["config_root"], p["lifecycle"], dry_run=p["dry_run"], only_runtime=p["only_runtime"],
                     apply_runtime=p["apply_runtime"], overlays=p["overlays"], undeclare=p["undeclare"],
                     check_mode=module.check_mode, want_diff=module._diff, prepare=p["prepare"], workers=p["workers"],
                     series_heads=p["series_heads"], cascade=p["cascade"], prepare_ahead=p["prepare_ahead"],
                     only_roots=p["only_roots"], preview_upgrades=p["preview_upgrades"])
    except ConfigError as exc:
        fail_from(module, exc, msg=problems_message(exc, p["config_root"], "; nothing was written"))
    except CsisError as exc:
        fail_from(module, exc)
    for w in out["warnings"]:
        module.warn(w)
    result = dict(changed=out["changed"], roots=out["roots"], tf_env=out["tf_env"], warnings_list=out["warnings"],
                  config_root=out["config_root"], undeclared=out["undeclared"], modules=out["modules"],
                  approvals=out["approvals"], workspace=out["workspace"], prepared_ahead=out["prepared_ahead"])
    if module._diff:
        result["diff"] = [{"prepared": unified(d)} for d in out["diff"]]
    return result


RUN = ModuleRun(_run, argument_spec(
    CONFIG_ARGS, UNDECLARE_ARGS,
    lifecycle=dict(type="list", elements="str", required=True, choices=["identity", "storage", "instance-image"]),
    dry_run=dict(type="bool", default=True),
    only_runtime=dict(type="str"),
    apply_runtime=dict(type="str"),
    prepare=dict(type="bool", default=True),
    workers=dict(type="int", default=4),
    prepare_ahead=dict(type="bool", default=False),
    series_heads=dict(type="dict", default={}),
    cascade=dict(type="dict"),
    only_roots=dict(type="list", elements="str"),
    preview_upgrades=dict(type="dict"),
), requires=("PyYAML", "pydantic"), options=dict(supports_check_mode=True))


def main():
    RUN.main()


if __name__ == "__main__":
    main()
