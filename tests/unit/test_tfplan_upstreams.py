# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Which failed plans are "a root this one reads was never applied" (apply/tfplan.py), read from
terraform's own diagnostics (``-no-color``, as terraform 1.11 prints them). The real plan that
produces them is tests/integration/test_csis_plan.py."""
from __future__ import annotations

from ansible_collections.csis.infra.plugins.module_utils.csis.apply.tfplan import unapplied_upstreams, upstream_message

NO_STATE = """
Error: Unable to find remote state

  with data.terraform_remote_state.%s,
  on main.tf line 30, in data "terraform_remote_state" "%s":
  30: data "terraform_remote_state" "%s" {

No stored state was found for the given workspace in the given backend.
"""
OTHER = """
Error: Reference to undeclared input variable

  on main.tf line 3, in resource "terraform_data" "bad":
   3:   input = var.missing
"""
WARNING = """
Warning: Argument is deprecated

  with module.storage_mnt_data.aws_s3_bucket.this,
  on x.tf line 2: whatever
"""


def no_state(label):
    return NO_STATE % (label, label, label)


def test_only_missing_remote_states_name_their_labels_once_in_terraforms_order():
    assert unapplied_upstreams(no_state("posix_groups")) == ["posix_groups"]
    assert unapplied_upstreams(WARNING + no_state("aws_ebs") + no_state("posix_groups") + no_state("aws_ebs")) == [
        "aws_ebs", "posix_groups"]


def test_any_other_error_is_the_failure_to_show():
    assert unapplied_upstreams(no_state("posix_groups") + OTHER) == []
    assert unapplied_upstreams(OTHER) == []
    assert unapplied_upstreams(WARNING) == []
    assert unapplied_upstreams("") == []
    # the summary without the data source it is about: not taken for one
    assert unapplied_upstreams("\nError: Unable to find remote state\n\nNo stored state was found.\n") == []


def test_the_message_names_the_roots_and_their_apply_flags():
    roots, msg = upstream_message("/t/generated/instance-image/x/instance-generation", ["posix_groups", "aws_ebs"],
                                  {"posix_groups": "identity-posix-groups", "aws_ebs": "storage-aws-ebs"})
    assert roots == ["identity-posix-groups", "storage-aws-ebs"]
    assert msg.startswith("/t/generated/instance-image/x/instance-generation: this root reads the state of "
                          "identity-posix-groups (data.terraform_remote_state.posix_groups), storage-aws-ebs "
                          "(data.terraform_remote_state.aws_ebs), and no state is stored for them")
    assert "those roots were never applied" in msg
    assert "config.apply_identity, config.apply_storage" in msg
    # a label csis_render did not name (a hand-written root) stands for itself
    roots, msg = upstream_message("/r", ["up"], {})
    assert roots == ["up"] and "that root was never applied" in msg and "config." not in msg
