# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The instance-image roots: one per instance builder, with a module call and a launch
script per declared instance, the replacements (upgrade, follow) and detaches it asks for,
and the decommission of launched instances no longer declared."""
from __future__ import annotations

import datetime as _dt
from typing import Any, Dict, List, Mapping, Optional

from .. import aws
from ..config import models as m
from ..state.aliases import AliasPool
from ..state.verify import verdict_of
from .hcl import Block, Raw, comment_lines, document, string, value
from .launch import (MARKER, compute_launch_params, efs_through_public, follow_target, pending_replacement, pending_target,
                     pinned_build, user_data_template)
from .plan import HEADER, PHASES, RootPlan, RootPlanner, list_literal, root_dir
from .series_heads import head_ami


class InstanceRoots(RootPlanner):
    """Plans the instance-image roots."""

    def roots(self) -> List[RootPlan]:
        out = []
        launched = {n: r for n, r in self.records("launch-params.yaml", "instances").items()
                    if isinstance(r, dict) and r.get("launched")}
        for ib in self.t.instance_builders.values():
            if not self.in_scope(ib):
                continue
            declared = [i for i in self.t.instances.values() if self.t.instance_builder_for(i) is ib]
            gone = sorted(n for n, r in launched.items() if n not in self.t.instances
                          and (r.get("builder") in (None, ib.name))
                          and (r.get("runtime") in (None, self.t.builder_runtime(ib).name)))
            if not declared and not gone:
                continue
            out.append(self._instance_root(ib, declared, gone, launched))
        return out

    def take_alias(self, inst: m.Instance, params: Dict[str, Any], rec: Optional[Mapping[str, Any]],
                   replacing: bool, plan: RootPlan) -> None:
        """The alias pool (:mod:`..state.aliases`): a standing durable machine keeps its alias; one
        that launches as a new generation takes the first free name; an ephemeral one gets none."""
        if inst.ephemeral:
            return
        cur = ((((self.meta.get("instance-state.yaml") or {}).get("instances") or {}).get(inst.name) or {})
               .get("current") or {})
        standing = bool(cur) and cur.get("kind", "durable") == "durable" and not replacing
        if standing:
            if rec and rec.get("alias"):
                params["alias"] = rec["alias"]
            return
        pool = getattr(self, "_alias_pool", None)
        if pool is None:
            pool = self._alias_pool = AliasPool(self.t.root, self.meta)
        if not pool.exists:
            return
        name = pool.draw()
        if name:
            params["alias"] = name
        else:
            plan.warnings.append(pool.empty_message(inst.name, params["hostname"]))

    def _instance_root(self, ib: m.InstanceBuilder, declared: List[m.Instance], gone: List[str],
                       launched: Mapping[str, Any]) -> RootPlan:
        d = root_dir("instance-image", ib.name)
        phase = PHASES["instance-image"]
        rt = self.t.builder_runtime(ib)
        net = rt.networking
        backend = self.t.backend_for(ib)
        alias = m.label(ib.name)
        plan = RootPlan("instance-image", ib.name, ib.type, rt.name, d, {}, None, None, self.binary(ib),
                        self.may_apply("instance-image", ib), aws=aws.runtime_access(rt, session_mechanism=True),
                        apply_names=self.apply_names(ib))
        producers: Dict[str, Any] = {}
        has_vpc = bool(net.network) and bool(declared)
        blocks: List[Any] = []
        variables: List[Block] = []
        for inst in declared:
            lab = m.label(inst.name)
            img = self.t.image_of(inst)
            head = head_ami(self.o.series_heads, img.name, rt.name) if img else None
            follow_to = follow_target(self.meta, inst, img, head)
            upgrading = pending_replacement(self.meta, inst.name)
            replacing = upgrading or bool(follow_to)
            params = compute_launch_params(self.t, self.meta, inst, replacing=replacing)
            rec = launched.get(inst.name)
            self.take_alias(inst, params, rec, replacing, plan)
            info: Dict[str, Any] = {"label": lab, "address": "module.instance_%s" % lab, "launch_params": params,
                                    "launched": bool(rec), "ephemeral": inst.ephemeral,
                                    "image_policy": inst.image_policy}
            if replacing and rec:
                info["replacing"] = "upgrade" if upgrading else "follow"
            v = Block("variable", "%s_ami_id" % lab)
            v.attr("description", "AMI of instance %s when neither a pin nor a resolved image names one" % inst.name)
            v.attr("type", Raw("string"))
            v.attr("default", "")
            variables.append(v)
            if inst.ephemeral:
                plan.ephemeral.append(inst.name)
            if replacing and rec:
                plan.replace.append("module.instance_%s.aws_instance.this" % lab)
                plan.allow_destroy += ["module.instance_%s.aws_instance.this" % lab,
                                       "module.instance_%s.aws_volume_attachment.this" % lab]
            # detaches: recorded mounts the declaration dropped
            if rec:
                now = {mp.name for mp in inst.storages}
                for old in rec.get("mounts") or []:
                    if isinstance(old, dict) and old.get("storage") not in now:
                        s = old["storage"]
                        if old.get("type") == "ebs":
                            plan.allow_destroy.append('module.instance_%s.aws_volume_attachment.this[%s]'
                                                      % (lab, string(s)))
                        plan.require_unmounted.append("%s:%s" % (inst.name, s))
                        plan.unmounts.append({"instance": inst.name, "storage": s,
                                              "mount_point": old.get("mount_point"), "type": old.get("type")})
            # module call
            mod = Block("module", "instance_%s" % lab)
            if inst.ephemeral:
                mod.attr("count", Raw("var.ephemeral_present ? 1 : 0"))
            mod.attr("source", self.module_source(d, "aws_instance"))
            mod.attr("providers", Raw("{\n    aws = aws.%s\n  }" % alias))
            mod.attr("name", inst.name)
            pin = pinned_build(self.meta, inst.name)
            upgrade_to = (pending_target(self.meta, inst.name) or head) if upgrading else None
            ami: Optional[str] = None
            if follow_to:
                ami = follow_to
            elif upgrade_to:
                ami = upgrade_to
            elif pin and not replacing:
                ami = pin
            elif img and img.ami_id:
                ami = img.ami_id
            if ami:
                mod.attr("ami_id", ami)
            else:
                mod.attr("ami_id", Raw("var.%s_ami_id" % lab))
                if img and img.name_pattern:
                    mod.attr("ami_name_pattern", img.name_pattern + "*")
                else:
                    plan.warnings.append("No provider-specific image for image '%s' of instance %s; the module call "
                                         "will not resolve an AMI" % (inst.image, inst.name))
            mod.attr("instance_type", params["machine_type"])
            mod.attr("associate_public_ip_address", False)
            if has_vpc:
                mod.attr("vpc_security_group_ids", Raw("concat([aws_security_group.csis_instances.id], %s)"
                                                       % list_literal(net.addl_security_groups)))
            if net.default_subnet_id:
                mod.attr("subnet_id", net.default_subnet_id)
            if rt.session_mechanism == "ssm" and rt.session_instance_profile:
                mod.attr("iam_instance_profile", rt.session_instance_profile)
            mod.attr("tags", self.tags(self.runtime_tags(rt), inst.tags))
            tvars: Dict[str, Any] = {}
            group = params.get("group")
            if group and self.group_builder_of(group) is not None:
                gb = self.group_builder_of(group)
                producers.setdefault(("identity", gb.name), gb)
                tvars["group_gid"] = self.gid_ref(group)
            else:
                tvars["group_gid"] = ""
            ebs: Dict[str, Any] = {}
            efs: Dict[str, Any] = {}
            for mnt in params["mounts"]:
                st = self.t.storages[mnt["storage"]]
                sb = self.t.storage_builder_for(st)
                ref = "data.terraform_remote_state.%s.outputs.storage_%s" % (m.label(sb.name), m.label(st.name))
                if mnt["type"] == "ebs":
                    producers.setdefault(("storage", sb.name), sb)
                    ebs[st.name] = {"volume_id": Raw(ref + ".volume_id"), "device_name": mnt["device"]}
                elif mnt["type"] == "efs":
                    producers.setdefault(("storage", sb.name), sb)
                    ap = (ref + ".public_read_access_point_id") if efs_through_public(st, group) \
                        else "%s.access_point_ids[%s]" % (ref, string(group or ""))
                    efs[st.name] = {"file_system_id": Raw(ref + ".file_system_id"), "access_point_id": Raw(ap)}
            tvars["ebs"] = ebs
            tvars["efs"] = efs
            gb = self.group_builder_of(group) if group else None
            if gb is not None and gb.enrollment_token is not None:
                # the manual's token reference: TF_VAR_sft_enrollment_token overrides the group
                # builder's token, read through remote state (never written into a file)
                tvars["enrollment_token_b64"] = Raw(
                    'base64encode(var.sft_enrollment_token != "" ? var.sft_enrollment_token : '
                    'data.terraform_remote_state.%s.outputs.sft_enrollment_token)' % m.label(gb.name))
            else:
                tvars["enrollment_token_b64"] = Raw("base64encode(var.sft_enrollment_token)")
            tpl = "user-data-%s.sh.tftpl" % lab
            mod.attr("user_data", Raw("templatefile(\"${path.module}/%s\", %s)" % (tpl, value(tvars, 1))))
            if ebs:
                mod.attr("ebs_volumes", {k: {"volume_id": v2["volume_id"], "device_name": v2["device_name"]}
                                         for k, v2 in ebs.items()})
            head = comment_lines("instance %s: builder %s; image %s; owning group %s; policy %s%s"
                                 % (inst.name, ib.name, inst.image, group or "none", inst.image_policy,
                                    "; ephemeral" if inst.ephemeral else ""))
            plan.files["%s-%s-instance-%s.tf" % (ib.name, phase, lab)] = document(HEADER, head, mod)
            plan.files[tpl] = user_data_template(params)
            info["verify"] = self.verify_spec(inst, params, ami, standing_replaced=bool(rec) and replacing)
            if inst.ephemeral:
                info.update(self.ephemeral_policy(inst, rt, bool(rec)))
            plan.instances[inst.name] = info
        for name in gone:
            rec = launched[name]
            lab = m.label(name)
            plan.decommission.append(name)
            plan.allow_destroy.append("module.instance_%s" % lab)
            plan.instances[name] = {"label": lab, "address": "module.instance_%s" % lab, "launched": True,
                                    "decommission": True, "launch_params": rec, "ephemeral": bool(rec.get("ephemeral"))}
        if not declared:
            plan.allow_destroy.append("aws_security_group.csis_instances")
        # root file
        blocks = [HEADER, self.terraform_block(ib, backend)] + self.provider_blocks(ib)
        blocks += variables
        if plan.ephemeral:
            v = Block("variable", "ephemeral_present")
            v.attr("description", "false tears the ephemeral instances of this root down")
            v.attr("type", Raw("bool"))
            v.attr("default", True)
            blocks.append(v)
        v = Block("variable", "sft_enrollment_token")
        v.attr("description", "enrollment token written on the machines (TF_VAR_sft_enrollment_token); never recorded")
        v.attr("type", Raw("string"))
        v.attr("default", "")
        v.attr("sensitive", True)
        blocks.append(v)
        if self.t.config.use_state_backends:
            for (_k, _n), prod in sorted(producers.items()):
                blocks.append(self.remote_state(prod, d))
            plan.reads = {m.label(prod.name): "%s-%s" % (lifecycle, prod.name) for (lifecycle, _n), prod in producers.items()}
        if has_vpc:
            vpc = Block("data", "aws_vpc", "csis_instances")
            vpc.attr("provider", Raw("aws.%s" % alias))
            vpc.attr("id", net.network)
            sg = Block("resource", "aws_security_group", "csis_instances")
            sg.attr("provider", Raw("aws.%s" % alias))
            sg.attr("name_prefix", "csis-instances-")
            sg.attr("description", "csis.infra instances of %s" % ib.name)
            sg.attr("vpc_id", Raw("data.aws_vpc.csis_instances.id"))
            ing = sg.block("ingress")
            ing.attr("description", "SSH")
            ing.attr("from_port", 22)
            ing.attr("to_port", 22)
            ing.attr("protocol", "tcp")
            if net.ssh_ingress_security_group_ids:
                ing.attr("security_groups", list(net.ssh_ingress_security_group_ids))
            else:
                ing.attr("cidr_blocks", Raw("[data.aws_vpc.csis_instances.cidr_block]"))
            eg = sg.block("egress")
            eg.attr("from_port", 0)
            eg.attr("to_port", 0)
            eg.attr("protocol", "-1")
            eg.attr("cidr_blocks", ["0.0.0.0/0"])
            sg.attr("tags", self.tags(self.runtime_tags(rt), {"Name": "csis-instances"}))
            lc = sg.block("lifecycle")
            lc.attr("create_before_destroy", True)
            blocks += [vpc, sg]
        plan.files["%s-%s.tf" % (ib.name, phase)] = document(*blocks)
        plan.endpoint_env = self.endpoint_env(ib)
        bf, btxt = self.backend_file(backend, alias, d, "%s-%s.tfbackend.hcl" % (ib.name, phase))
        if bf:
            plan.files[bf] = btxt
            plan.backend_file, plan.backend_type = bf, backend.type
        return plan

    def verify_spec(self, inst: m.Instance, params: Mapping[str, Any], ami: Optional[str],
                    standing_replaced: bool = False) -> Dict[str, Any]:
        """What csis_verify_instance checks on the machine, and what the booted image must be:
        ``ami``, the build this render launches the machine on, except for a standing machine this
        render replaces (a pending upgrade, or a follow whose series head moved:
        ``standing_replaced``). That one boots its pin (the build recorded for its generation when
        it has none) until an apply replaces it, and verify_instance.yml checks it as it stands: the
        new build is what it will boot, not what it booted."""
        img = self.t.image_of(inst)
        mounts = []
        for mnt in params.get("mounts") or []:
            g = self.t.groups.get(mnt.get("group") or "")
            spec = {"storage": mnt["storage"], "type": mnt["type"], "mount_point": mnt["mount_point"],
                    "group": mnt.get("group"), "gid": g.gid if g is not None else None,
                    "share_mode": mnt.get("share_mode")}
            st = self.t.storages.get(mnt["storage"])
            if mnt["type"] == "efs" and st is not None:
                if efs_through_public(st, mnt.get("group")):
                    spec.update(group=None, gid=None)  # the filesystem's root: no directory of the group's
                else:
                    spec["group_root"] = True  # the group's access point: its directory is the mount itself
            mounts.append(spec)
        expected = ami
        if standing_replaced:
            expected = pinned_build(self.meta, inst.name) or self._current(inst.name).get("ami_id") or None
        return {"marker": MARKER, "mounts": mounts, "tests": list(img.tests.post_bake) if img else [],
                "expected_build": expected, "name_pattern": img.name_pattern if img else None}

    def _current(self, name: str) -> Mapping[str, Any]:
        """The open generation of instance ``name`` in ``instance-state.yaml`` (empty: none)."""
        cur = (self.records("instance-state.yaml", "instances").get(name) or {}).get("current")
        return cur if isinstance(cur, dict) else {}

    def ephemeral_policy(self, inst: m.Instance, rt: m.RuntimeBuilder, standing: bool) -> Dict[str, Any]:
        """on_failure / teardown_after (the instance's, else the runtime's), and whether a
        standing machine whose failed verdict is older than teardown_after is torn down
        without re-verifying. The verdict must be that machine's own (the instance id of its
        generation, :func:`~..state.verify.verdict_of`): a failed verdict of an earlier
        generation, or one naming no instance id, never tears down a machine nothing verified."""
        on_failure = inst.on_failure or rt.on_failure or "keep"
        after = inst.teardown_after or rt.teardown_after
        out: Dict[str, Any] = {"on_failure": on_failure, "teardown_after": after, "skip_verify": False}
        if not (standing and after):
            return out
        last = verdict_of(self.records_list("verifications.yaml", "verifications"), inst.name,
                          self._current(inst.name).get("instance_id"))
        if not last or last.get("ok"):
            return out
        try:
            t = _dt.datetime.fromisoformat(str(last.get("time")).replace("Z", "+00:00"))
        except ValueError:
            return out
        if t.tzinfo is None:
            t = t.replace(tzinfo=_dt.timezone.utc)
        age = (_dt.datetime.now(_dt.timezone.utc) - t).total_seconds()
        if age >= m.parse_duration(after):
            out["skip_verify"] = True
            out["skip_reason"] = ("Ephemeral instance %s: teardown_after elapsed since its failed verification; "
                                  "tearing down without re-verifying" % inst.name)
        return out
