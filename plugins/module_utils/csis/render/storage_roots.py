# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The storage roots: one per storage builder, with a module call per live storage, and the
transitions (archive snapshot, bucket wipe, snapshot deletion) and whitelisted destroys of
the storages that leave ``active``."""
from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import aws
from ..config import models as m
from .hcl import Block, Raw, comment_lines, document
from .plan import HEADER, PHASES, RootPlan, RootPlanner, root_dir


class StorageRoots(RootPlanner):
    """Plans the storage roots."""

    def roots(self) -> List[RootPlan]:
        out = []
        records = self.records("storage-state.yaml", "storages")
        for sb in self.t.storage_builders.values():
            if sb.type == "tf-aws" or not self.in_scope(sb):
                continue
            declared = [s for s in self.t.storages.values() if self.t.storage_builder_for(s) is sb]
            undeclared = [(n, r) for n, r in records.items()
                          if n not in self.t.storages and isinstance(r, dict)
                          and (r.get("facts") or {}).get("builder") == sb.name and r.get("state") != "destroyed"]
            if not declared and not undeclared:
                continue
            out.append(self._storage_root(sb, declared, undeclared, records))
        return out

    def _storage_root(self, sb: Any, declared: List[m.Storage], undeclared: List[Tuple[str, Any]],
                      records: Mapping[str, Any]) -> RootPlan:
        kind = self.t.kind_of(sb)
        d = root_dir("storage", sb.name)
        phase = PHASES["storage"]
        backend = self.t.backend_for(sb)
        rt = self.t.builder_runtime(sb)
        plan = RootPlan("storage", sb.name, sb.type, rt.name, d, {}, None, None, self.binary(sb),
                        self.may_apply("storage", sb), aws=aws.runtime_access(rt, session_mechanism=True),
                        apply_names=self.apply_names(sb))
        identity_ws: Dict[str, Any] = {}
        for st in declared:
            cur = (records.get(st.name) or {}).get("state")
            live = st.state == "active"
            lab = m.label(st.name)
            fname = "%s-%s-storage-%s.tf" % (sb.name, phase, lab)
            info = {"builder": sb.name, "type": kind["capability"], "requested_state": st.state, "current_state": cur,
                    "label": lab, "address": "module.storage_%s" % lab}
            if kind["capability"] == "s3":
                info["bucket_name"] = m.bucket_for(st, sb)
            if kind["archive"]:
                info["archive_snapshot"] = archive_name(st.name, records.get(st.name))
            plan.storages[st.name] = info
            if live:
                if kind["posix"] and st.groups and kind["capability"] == "efs":
                    for g in st.groups:
                        gb = self.group_builder_of(g)
                        if gb is not None:
                            identity_ws[gb.name] = gb
                restore = cur == "archived"
                args = self.storage_args(sb, st, restore=restore,
                                         snapshot_name=info.get("archive_snapshot") if restore else None)
                mod = Block("module", "storage_%s" % lab)
                mod.attr("source", self.module_source(d, kind["module"]))
                mod.attr("providers", Raw("{\n    aws = aws.%s\n  }" % m.label(sb.name)))
                mod.attrs(args)
                outp = Block("output", "storage_%s" % lab)
                outp.attr("description", "outputs of storage %s, read by the instance roots" % st.name)
                outp.attr("value", Raw("module.storage_%s" % lab))
                head = comment_lines("storage %s (%s): allowed groups: %s; public_read=%s; requested state: %s"
                                     % (st.name, kind["capability"], ", ".join(st.groups) or "none",
                                        str(st.public_read).lower(), st.state))
                plan.files[fname] = document(HEADER, head, mod, outp)
                if restore:
                    plan.transitions_after.append({"storage": st.name, "action": "delete_archive_snapshot",
                                                   "from": "archived", "to": "active",
                                                   "snapshot_name": info["archive_snapshot"], "tags": self.t.resource_tag()})
                elif cur == "destroyed":
                    plan.transitions_after.append({"storage": st.name, "action": "record", "from": "destroyed",
                                                   "to": "active"})
                elif cur is None:
                    plan.transitions_after.append({"storage": st.name, "action": "record", "from": None, "to": "active"})
            else:
                plan.files[fname] = document(HEADER, comment_lines(
                    "storage %s is requested %s (recorded: %s): no module call.%s" % (
                        st.name, st.state, cur or "never applied",
                        " Archive snapshot: %s." % info["archive_snapshot"] if st.state == "archived" else "")))
                self._leave(plan, st.name, cur, st.state, kind, info, records.get(st.name),
                            self.tags(self.runtime_tags(rt), sb.variables.tags, st.tags))
        for name, rec in undeclared:
            lab = m.label(name)
            facts = rec.get("facts") or {}
            info = {"builder": sb.name, "type": kind["capability"], "requested_state": "destroyed",
                    "current_state": rec.get("state"), "label": lab, "address": "module.storage_%s" % lab,
                    "undeclared": True}
            if kind["capability"] == "s3":
                info["bucket_name"] = facts.get("bucket_name") or name
            if kind["archive"]:
                info["archive_snapshot"] = archive_name(name, rec)
            plan.storages[name] = info
            self._leave(plan, name, rec.get("state"), "destroyed", kind, info, rec)
        main = "%s-%s.tf" % (sb.name, phase)
        blocks: List[Any] = [HEADER, self.terraform_block(sb, backend)] + self.provider_blocks(sb)
        if self.t.config.use_state_backends:
            blocks += [self.remote_state(gb, d) for _name, gb in sorted(identity_ws.items())]
            plan.reads = {m.label(gb.name): "identity-%s" % gb.name for gb in identity_ws.values()}
        plan.files[main] = document(*blocks)
        plan.endpoint_env = self.endpoint_env(sb)
        bf, btxt = self.backend_file(backend, m.label(sb.name), d, "%s-%s.tfbackend.hcl" % (sb.name, phase))
        if bf:
            plan.files[bf] = btxt
            plan.backend_file, plan.backend_type = bf, backend.type
        return plan

    def _leave(self, plan: RootPlan, name: str, cur: Optional[str], req: str, kind: Mapping[str, Any],
               info: Mapping[str, Any], rec: Optional[Mapping[str, Any]] = None,
               effective_tags: Optional[Mapping[str, str]] = None) -> None:
        """A storage leaving 'active': transitions before the apply and the whitelisted destroy.
        ``effective_tags``: the declared storage's tags as its module call gets them (the hierarchy's,
        its runtime's, its builder's, its own), which its archive snapshot carries too (cost tags)."""
        if cur == req or cur is None:
            return
        addr = info["address"]
        if req == "archived" and cur == "active":
            # the volume meta-state records: the archive's own snapshot is of it, also once the apply
            # destroyed it (the state then holds none: transitions.reusable)
            # "tags" find the archive again (csis_config); "cost_tags" only label it, as its volume was
            plan.transitions_before.append({"storage": name, "action": "snapshot", "from": cur, "to": "archived",
                                            "snapshot_name": info["archive_snapshot"], "tags": self.t.resource_tag(), "address": addr,
                                            "volume_id": ((rec or {}).get("facts") or {}).get("volume_id"),
                                            "cost_tags": {k: v for k, v in sorted((effective_tags or {}).items())
                                                          if k not in ("Name", "csis_storage")}})
            plan.allow_destroy.append(addr)
        elif req == "destroyed":
            if cur == "archived" and kind["archive"]:
                plan.transitions_after.append({"storage": name, "action": "delete_archive_snapshot", "from": cur,
                                               "to": "destroyed", "snapshot_name": info["archive_snapshot"], "tags": self.t.resource_tag()})
                return
            if kind["capability"] == "s3":
                plan.transitions_before.append({"storage": name, "action": "empty_bucket", "from": cur,
                                                "to": "destroyed", "bucket": info["bucket_name"], "address": addr})
            else:
                plan.transitions_before.append({"storage": name, "action": "record", "from": cur, "to": "destroyed",
                                                "address": addr})
            plan.allow_destroy.append(addr)

    def storage_args(self, sb: Any, st: m.Storage, restore: bool = False,
                     snapshot_name: Optional[str] = None) -> List[Tuple[str, Any]]:
        rt = self.t.builder_runtime(sb)
        net = rt.networking
        args: List[Tuple[str, Any]] = []
        declared = {k: v for k, v in sb.variables.model_dump().items() if k != "tags" and v is not None}
        tags = self.tags(self.runtime_tags(rt), sb.variables.tags, st.tags)
        if sb.type == "tf-aws-ebs":
            args += [(k, declared[k]) for k in ("volume_type", "encrypted") if k in declared]
            args.append(("name", st.name))
            args.append(("size", sb.size))
            if restore:
                args.append(("snapshot_name", snapshot_name or m.archive_snapshot_name(st.name)))
                args.append(("snapshot_tags", dict({"csis_storage": st.name}, **self.t.resource_tag())))
            zone = st.availability_zone or net.default_availability_zone
            if zone:
                args.append(("availability_zone", zone))
            elif net.default_subnet_id:
                args.append(("subnet_id", net.default_subnet_id))
        elif sb.type == "tf-aws-efs":
            args += [(k, declared[k]) for k in ("performance_mode", "encrypted") if k in declared]
            args.append(("name", st.name))
            fsid = st.config.get("file_system_id")
            if fsid:
                args.append(("existing_file_system_id", fsid))
            else:
                # the creation token is unique per account and region: scope it to the tree
                # so two trees with an EFS storage of the same name never collide
                args.append(("creation_token", efs_creation_token(self.t.resource_tag()["csis_config"], st.name)))
            lc = st.lifecycle or {}
            if "ia_days" in lc and not fsid:
                args.append(("transition_to_ia", aws.efs_transition(lc["ia_days"])))
            if "archive_days" in lc and not fsid:
                args.append(("transition_to_archive", aws.efs_transition(lc["archive_days"])))
            if st.groups:
                args.append(("access_points", {g: {"gid": self.gid_ref(g), "path": "/%s" % g,
                                                   "permissions": st.share_mode} for g in sorted(st.groups)}))
            if st.public_read:
                args.append(("public_read", True))
            subnets = net.private_subnets_per_zone()
            if net.network and subnets and net.addl_security_groups:
                args += [("vpc_id", net.network), ("mount_target_subnet_ids", subnets),
                         ("client_security_group_ids", list(net.addl_security_groups))]
        elif sb.type == "tf-aws-s3":
            args += [(k, declared[k]) for k in ("force_destroy",) if k in declared]
            args.append(("bucket_name", m.bucket_for(st, sb)))
            lc = st.lifecycle
            if lc:
                args.append(("lifecycle_rules", [{
                    "id": "csis", "prefix": lc.get("prefix", ""), "transition_days": lc.get("transition_days", 0),
                    "storage_class": lc.get("storage_class", ""), "expire_days": lc.get("expire_days", 0)}]))
            if st.groups:
                args.append(("group_prefixes", sorted(st.groups)))
            if st.public_read:
                args.append(("public_read", True))
        args.append(("tags", tags))
        return args


def archive_name(storage: str, record: Any) -> str:
    """The archive snapshot of ``storage``: while it is recorded ``archived``, the name its record
    holds (``facts.archive``: a storage archived before 0.1.0 keeps its snapshot
    ``csis-mnt-data-archive``, restored and deleted by that name); else ``csis-<label>-archive``."""
    if isinstance(record, dict) and record.get("state") == "archived":
        recorded = (record.get("facts") or {}).get("archive")
        if isinstance(recorded, str) and recorded:
            return recorded
    return m.archive_snapshot_name(storage)


def efs_creation_token(tree_tag: str, storage: str) -> str:
    """``<tree>-<storage>``, at most 64 characters (a hash keeps long ones unique)."""
    token = "%s-%s" % (tree_tag, storage)
    if len(token) <= 64:
        return token
    return token[:51] + "-" + hashlib.sha256(token.encode("utf-8")).hexdigest()[:12]
