# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The identity roots: one per group builder, publishing the gid of every group it owns
(``group_gids``, read by the storage and instance roots through remote state) and, when the
builder names one (``enrollment_token.ssm_parameter``), its enrollment token
(``sft_enrollment_token``, a sensitive output read from SSM at plan time: only the
parameter's name is ever written into the root)."""
from __future__ import annotations

from typing import List

from ..config import models as m
from .hcl import Block, Raw, document
from .plan import HEADER, PHASES, RootPlan, RootPlanner, root_dir


class IdentityRoots(RootPlanner):
    """Plans the identity roots."""

    def roots(self) -> List[RootPlan]:
        out = []
        for gb in self.t.group_builders.values():
            if not self.in_scope(gb):
                continue
            groups = {g.name: g.gid for g in self.t.groups.values() if self.t.group_builder_for(g) is gb}
            if not groups:
                continue
            d = root_dir("identity", gb.name)
            phase = PHASES["identity"]
            backend = self.t.backend_for(gb)
            main = "%s-%s.tf" % (gb.name, phase)
            mod = Block("module", "identity")
            mod.attr("source", self.module_source(d, "identity_groups"))
            mod.attr("groups", dict(sorted(groups.items())))
            outp = Block("output", "group_gids")
            outp.attr("description", "gid of every group this identity builder owns")
            outp.attr("value", Raw("module.identity.group_gids"))
            blocks = [HEADER, self.terraform_block(gb, backend, needs_aws=gb.enrollment_token is not None)]
            if gb.enrollment_token is not None:
                blocks += self.provider_blocks(gb)
            blocks += [mod, outp]
            if gb.enrollment_token is not None:
                tok = Block("data", "aws_ssm_parameter", "enrollment_token")
                tok.attr("provider", Raw("aws.%s" % m.label(gb.name)))
                tok.attr("name", gb.enrollment_token.ssm_parameter)
                tok.attr("with_decryption", True)
                touts = Block("output", "sft_enrollment_token")
                touts.attr("description", "the enrollment token of this builder's groups (the instance roots' token reference)")
                touts.attr("value", Raw("data.aws_ssm_parameter.enrollment_token.value"))
                touts.attr("sensitive", True)
                blocks += [tok, touts]
            files = {main: document(*blocks)}
            bf, btxt = self.backend_file(backend, m.label(gb.name), d, "%s-%s.tfbackend.hcl" % (gb.name, phase))
            if bf:
                files[bf] = btxt
            out.append(RootPlan("identity", gb.name, gb.type, self.t.builder_runtime(gb).name, d, files, bf,
                                backend.type if bf else None, self.binary(gb), self.may_apply("identity", gb),
                                endpoint_env=self.endpoint_env(gb) if gb.enrollment_token is not None else {},
                                apply_names=self.apply_names(gb)))
        return out
