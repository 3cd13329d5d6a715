# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The cross-file rules of the reference manual's "At validate" list, and the one
validation every module runs (:func:`load_and_validate`: csis_validate, csis_render).

Every rule appends :class:`~..errors.Problem` entries; :func:`validate_tree` returns
all of them at once. Offline: the only process started is the declared terraform
binary's ``version -json`` (no network).
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from ..errors import ConfigError, Problem
from ..render.launch import (EBS_DEVICES, HOSTNAME_MAX, HOSTNAME_RE, canonical_hostname, compute_launch_params, hostname_fix,
                             immutability_problems, pending_replacement, user_data_template)
from ..state.aliases import POOL as ALIAS_POOL
from ..state.aliases import pool_problems, read_pool
from ..state.store import MetaState, MetaStateError
from ..terraform import version as terraform_version
from . import hierarchy
from . import models as m
from .loader import Tree, load_tree_partial

#: the most user data EC2 takes (RunInstances: 16 KB, before base64)
USER_DATA_MAX = 16384
S3_LIFECYCLE_CLASSES = ["STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR", "GLACIER", "DEEP_ARCHIVE"]
EFS_IA_DAYS = [1, 7, 14, 30, 60, 90, 180, 270, 365]
EFS_ARCHIVE_DAYS = [90, 180, 270, 365]
#: the S3 storage classes AWS takes no lifecycle transition to earlier than 30 days
S3_IA_CLASSES = ("STANDARD_IA", "ONEZONE_IA")
S3_IA_MIN_DAYS = 30
#: the sizes (GiB, inclusive) CreateVolume takes per EBS volume type
EBS_SIZES = {"gp2": (1, 16384), "gp3": (1, 65536), "io1": (4, 16384), "io2": (4, 65536),
             "st1": (125, 16384), "sc1": (125, 16384), "standard": (1, 1024)}
#: the volume type of a tf-aws-ebs builder that declares none (tfmodules/aws_storage_ebs's default)
EBS_DEFAULT_TYPE = "gp3"
#: EBS volume types that need provisioned IOPS, which the builder has no input for
EBS_PROVISIONED_IOPS = ("io1", "io2")

#: the most tags S3 takes on an object
S3_OBJECT_TAGS_MAX = 10

#: legal (current -> requested) storage transitions; None = never applied
LEGAL_TRANSITIONS: Set[Tuple[Optional[str], str]] = {
    (None, "active"),
    ("active", "active"), ("archived", "archived"), ("destroyed", "destroyed"),
    ("active", "archived"),
    ("archived", "active"),
    ("active", "destroyed"),
    ("archived", "destroyed"),
    ("destroyed", "active"),
}


def _whole(value: Any) -> bool:
    """A whole number as YAML reads one (not a boolean, not ``30.0``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _names(xs: Iterable[str]) -> str:
    return "[" + ", ".join("'%s'" % x for x in sorted(xs)) + "]"


class Validation:
    def __init__(self, tree: Tree, meta: Mapping[str, Any]):
        self.t = tree
        self.meta = meta
        self.problems: List[Problem] = []
        self._launched: Optional[Dict[str, Any]] = None
        self._declared: Optional[Dict[str, Set[str]]] = None
        self._recorded: Optional[Dict[str, Set[str]]] = None

    def add(self, kind: str, name: str, key: str, message: str) -> None:
        f, k = self.t.at(kind, name, key)
        self.problems.append(Problem(f, k, message))

    # ------------------------------------------------------------------ helpers
    def storage_state_records(self) -> Dict[str, Any]:
        return (self.meta.get("storage-state.yaml") or {}).get("storages") or {}

    def launched_records(self) -> Dict[str, Any]:
        if self._launched is None:
            recs = (self.meta.get("launch-params.yaml") or {}).get("instances") or {}
            self._launched = {n: r for n, r in recs.items() if isinstance(r, dict) and r.get("launched")}
        return self._launched

    def _index(self) -> Tuple[Dict[str, Set[str]], Dict[str, Set[str]]]:
        """storage -> declared attachers, storage -> recorded (launched) attachers; built once."""
        if self._declared is None:
            declared: Dict[str, Set[str]] = {}
            for n, i in self.t.instances.items():
                for s in i.storages:
                    declared.setdefault(s.name, set()).add(n)
            recorded: Dict[str, Set[str]] = {}
            for n, rec in self.launched_records().items():
                for mnt in rec.get("mounts") or []:
                    if isinstance(mnt, dict) and isinstance(mnt.get("storage"), str):
                        recorded.setdefault(mnt["storage"], set()).add(n)
            self._declared, self._recorded = declared, recorded
        return self._declared, self._recorded  # type: ignore[return-value]

    def attachers(self, storage: str) -> List[str]:
        """Who attaches ``storage``: declared instances plus launched records (reality)."""
        declared, recorded = self._index()
        return sorted(declared.get(storage, set()) | recorded.get(storage, set()))

    def declared_attachers(self, storage: str) -> List[str]:
        return sorted(self._index()[0].get(storage, set()))

    # ------------------------------------------------------------------ rules
    def unresolved(self, kind: str, ref: str, table: Dict[str, Any]) -> Optional[str]:
        """The message for a reference ``ref`` to a ``kind`` that resolves to nothing,
        or None when it should not be reported (see :meth:`Tree.dangling`)."""
        if not self.t.dangling(kind, ref):
            return None
        if ref == "default":
            defaults = sorted(n for n, b in table.items() if getattr(b, "is_default", False))
            if len(defaults) > 1:
                return None  # reported once, at the builders' is_default
            return ("'default' (or no type) resolves to the %s marked is_default: true, and none is "
                    "(%ss: %s)" % (kind, kind, _names(table)))
        return None if ref in table else ""

    def add_unresolved(self, kind: str, name: str, key: str, ref_kind: str, ref: str, table: Dict[str, Any],
                       missing: str) -> None:
        """Report ``kind`` ``name``'s ``key`` referring to a ``ref_kind`` that resolves to nothing
        (``missing`` is the message when the name is simply not declared)."""
        msg = self.unresolved(ref_kind, ref, table)
        if msg is not None:
            self.add(kind, name, key, msg or missing)

    def builder_and_runtime(self, kind: str, obj: Any, builder: Any, builders: Dict[str, Any]) -> bool:
        """Report a storage's or an instance's builder (``type``) or ``runtime`` that resolves to
        nothing; return whether the runtime resolves."""
        t = self.t
        if builder is None:
            self.add_unresolved(kind, obj.name, "type", "%s builder" % kind, obj.type, builders,
                                "%s builder '%s' is not declared (%s builders: %s)" % (kind, obj.type, kind, _names(builders)))
        elif obj.runtime == "default":
            # no runtime of its own (the key left out, or "default"): its builder's runtime governs, which
            # the builder's own check resolves; a tree without an is_default runtime is no problem here
            return t.builder_runtime(builder) is not None
        if t.runtime(obj.runtime) is None:
            self.add_unresolved(kind, obj.name, "runtime", "runtime", obj.runtime, t.runtimes,
                                "names unknown runtime '%s' (declared: %s)" % (obj.runtime, _names(t.runtimes)))
            return False
        return True

    def references(self) -> None:
        t = self.t
        for kind, table in (("runtime", t.runtimes), ("backend", t.backends), ("instance builder", t.instance_builders),
                            ("storage builder", t.storage_builders), ("group builder", t.group_builders)):
            defaults = [n for n, b in table.items() if getattr(b, "is_default", False)]
            if len(defaults) > 1:
                for n in defaults:
                    self.add(kind, n, "is_default", "more than one %s is marked is_default: %s" % (kind, _names(defaults)))
            # aliases: a name or alias must select exactly one entry
            owner: Dict[str, str] = {n: n for n in table}
            for n, b in table.items():
                for a in getattr(b, "aliases", None) or []:
                    if a in owner and owner[a] != n:
                        self.add(kind, n, "aliases", "alias '%s' of %s '%s' is already the name or an alias of %s '%s'"
                                 % (a, kind, n, kind, owner[a]))
                    else:
                        owner[a] = n
        for rt in t.runtimes.values():
            if rt.state_configuration and rt.state_configuration not in t.backends and t.dangling("backend", rt.state_configuration):
                self.add("runtime", rt.name, "state_configuration",
                         "names state backend '%s', which is not declared in cfg/state-backends.yml (declared: %s)"
                         % (rt.state_configuration, _names(t.backends)))
        builders: List[Tuple[str, Any]] = [("instance builder", b) for b in t.instance_builders.values()]
        builders += [("storage builder", b) for b in t.storage_builders.values()]
        builders += [("group builder", b) for b in t.group_builders.values()]
        for kind, b in builders:
            if t.builder_runtime(b) is None and t.dangling("runtime", b.runtime):
                if b.runtime == "default":
                    msg = "%s %s does not specify a runtime provider (no runtime is is_default)" % (kind.capitalize(), b.name)
                    if len([r for r in t.runtimes.values() if r.is_default]) > 1:
                        msg = None
                else:
                    msg = "%s %s has runtime provider %s which is not configured" % (kind.capitalize(), b.name, b.runtime)
                if msg:
                    self.add(kind, b.name, "runtime", msg)
            if b.executable is not None and b.executable not in t.executables and t.dangling("executable", b.executable):
                self.add(kind, b.name, "executable",
                         "names executable '%s', which is not declared in cfg/executables.yml (declared: %s)"
                         % (b.executable, _names(t.executables)))
            if self.config_known("use_state_backends") and t.config.use_state_backends:
                ref = getattr(b, "state_configuration", "default")
                if t.backend_for(b) is None:
                    rt = t.builder_runtime(b)
                    if ref != "default":
                        msg = ("state_configuration '%s' names no declared state backend (declared: %s)"
                               % (ref, _names(t.backends))) if t.dangling("backend", ref) else None
                    elif rt is None or (rt.state_configuration and rt.state_configuration not in t.backends) \
                            or not t.dangling("backend", "default") \
                            or len([x for x in t.backends.values() if x.is_default]) > 1:
                        msg = None  # the runtime's own reference (or the backends file) is reported
                    else:
                        msg = ("no state backend resolves (neither the builder, its runtime nor an is_default "
                               "backend names one) while config.use_state_backends is on")
                    if msg:
                        self.add(kind, b.name, "state_configuration", msg)
            if kind == "storage builder" and b.type == "tf-aws":
                self.add(kind, b.name, "type",
                         "type 'tf-aws' is the abstract base and emits nothing (TofuStorageBuilder must name its "
                         "terraform module): use tf-aws-ebs, tf-aws-efs or tf-aws-s3")
        for g in t.groups.values():
            if t.group_builder_for(g) is None:
                self.add_unresolved("group", g.name, "type", "group builder", g.type, t.group_builders,
                                    "group builder '%s' is not declared in cfg/group-builders.yml (a group needs an "
                                    "identity builder to publish its gid)" % g.type)
        for img in t.images.values():
            if img.group is not None and img.group not in t.groups and t.dangling("group", img.group):
                self.add("image", img.name, "group", "names unknown group '%s' (declared: %s)" % (img.group, _names(t.groups)))
            for rt in img.runtimes:
                if t.runtime(rt) is None and t.dangling("runtime", rt):
                    self.add("image", img.name, "runtimes", "names unknown runtime '%s' (declared: %s)" % (rt, _names(t.runtimes)))
        for st in t.storages.values():
            self.builder_and_runtime("storage", st, t.storage_builder_for(st), t.storage_builders)
            for g in st.groups:
                if g not in t.groups and t.dangling("group", g):
                    self.add("storage", st.name, "groups", "storage '%s' allows unknown group '%s'" % (st.name, g))
        unknown_att: Dict[str, List[str]] = {}
        for inst in t.instances.values():
            if self.builder_and_runtime("instance", inst, t.instance_builder_for(inst), t.instance_builders):
                b = t.instance_builder_for(inst)
                if b is not None and inst.runtime != "default" and t.builder_runtime(b) is not None \
                        and t.runtime(inst.runtime).name != t.builder_runtime(b).name:
                    self.add("instance", inst.name, "runtime",
                             "runtime '%s' differs from its builder '%s''s runtime '%s' (the builder's runtime launches it)"
                             % (inst.runtime, b.name, t.builder_runtime(b).name))
            if not inst.image:
                self.add("instance", inst.name, "image", "instance '%s' declares no image" % inst.name)
            elif inst.image not in t.images and t.dangling("image", inst.image):
                self.add("instance", inst.name, "image", "names unknown image '%s' (declared: %s)" % (inst.image, _names(t.images)))
            for mp in inst.storages:
                if mp.name not in t.storages and t.dangling("storage", mp.name):
                    unknown_att.setdefault(mp.name, []).append(inst.name)
        for s, insts in unknown_att.items():
            for i in insts:
                self.add("instance", i, "storages", "instances %s attach unknown storage '%s'" % (_names(insts), s))
        # mount points unique per instance
        for inst in t.instances.values():
            seen: Dict[str, str] = {}
            for mp in inst.storages:
                if mp.mount_point in seen:
                    self.add("instance", inst.name, "storages",
                             "storages '%s' and '%s' both mount at %s" % (seen[mp.mount_point], mp.name, mp.mount_point))
                seen[mp.mount_point] = mp.name
            ebs = [mp.name for mp in inst.storages if mp.name in t.storages
                   and t.kind_of(t.storage_builder_for(t.storages[mp.name]))["capability"] == "ebs"]
            if len(ebs) > len(EBS_DEVICES):
                self.add("instance", inst.name, "storages",
                         "instance '%s' mounts %d EBS volumes; at most %d fit its device names (%s to %s)"
                         % (inst.name, len(ebs), len(EBS_DEVICES), EBS_DEVICES[0], EBS_DEVICES[-1]))
        # buckets: one bucket, one storage
        owners: Dict[str, str] = {}
        for st in t.storages.values():
            b = t.storage_builder_for(st)
            if b is None or b.type != "tf-aws-s3":
                continue
            bucket = m.bucket_for(st, b)
            if bucket in owners:
                whence = "" if st.bucket_name else (
                    " (its builder '%s''s default bucket_name; declare the storage's own bucket_name)" % b.name)
                self.add("storage", st.name, "bucket_name",
                         "bucket '%s'%s is already the bucket of storage '%s': each S3 storage needs its own bucket"
                         % (bucket, whence, owners[bucket]))
            owners[bucket] = st.name
        # apply flags that list names: each must name a builder or a runtime
        known = set(t.runtimes) | set(t.instance_builders) | set(t.storage_builders) | set(t.group_builders)
        for table in (t.runtimes, t.instance_builders, t.storage_builders, t.group_builders):
            for b in table.values():
                known.update(getattr(b, "aliases", None) or [])
        if not ({"runtime", "instance builder", "storage builder", "group builder"} & t.unloaded) and not t.broken:
            for key in ("apply_identity", "apply_instances", "apply_storage"):
                flag = getattr(t.config, key)
                if isinstance(flag, list) and self.config_known(key):
                    for i, n in enumerate(flag):
                        if m.normalize_builder_name(n) not in known:
                            self.problems.append(Problem(
                                t.config_source.get(key, "cfg/_config.yml"), "config.%s[%d]" % (key, i),
                                "'%s' names neither a builder nor a runtime (declared: %s)" % (n, _names(known))))

    def config_known(self, key: str) -> bool:
        return "*" not in self.t.config_unknown and key not in self.t.config_unknown

    def labels(self) -> None:
        t = self.t
        for kind, table, prefix in (("instance", t.instances, "instance_"), ("storage", t.storages, "storage_"),
                                    ("instance builder", t.instance_builders, ""),
                                    ("storage builder", t.storage_builders, ""),
                                    ("group builder", t.group_builders, "")):
            seen: Dict[str, str] = {}
            for name in table:
                lab = m.label(name)
                if lab in seen:
                    self.add(kind, name, "name",
                             "%s names '%s' and '%s' both become the terraform label '%s%s': rename one"
                             % (kind, seen[lab], name, prefix, lab))
                seen[lab] = name
        # recorded (undeclared) storages and launched instances keep their labels too: a declared name
        # of the same label is the same module call (a launched machine renamed so would be adopted in
        # place under its new name, never decommissioned)
        instance_note = (": a launched instance keeps its name; name it '%(n)s' again, or decommission '%(n)s' first "
                         "(undeclare it, run playbooks/instance_image.yml)")
        for kind, recorded, table, what, note in (
                ("storage", self.storage_state_records(), t.storages, "the recorded storage", ""),
                ("instance", self.launched_records(), t.instances, "the launched instance", instance_note)):
            for name in recorded:
                if name in table:
                    continue
                for other in table:
                    if m.label(other) == m.label(name):
                        self.add(kind, other, "name", "%s '%s' and %s '%s'%s both become the terraform label '%s_%s'%s"
                                 % (kind, other, what, name, " (meta-state/launch-params.yaml)" if note else "", kind,
                                    m.label(name), note % {"n": name}))
        builder_labels: Dict[str, Tuple[str, str]] = {}
        for kind, table in (("instance builder", t.instance_builders), ("storage builder", t.storage_builders),
                            ("group builder", t.group_builders)):
            for name in table:
                lab = m.label(name)
                if lab in builder_labels and builder_labels[lab][1] != name:
                    self.add(kind, name, "name", "builders '%s' and '%s' both become the workspace label '%s'"
                             % (builder_labels[lab][1], name, lab))
                builder_labels[lab] = (kind, name)

    def attach_rules(self) -> None:
        t = self.t
        for inst in t.instances.values():
            img = t.image_of(inst)
            if img is None and not t.dangling("image", inst.image):
                continue  # its image failed to load (named by its own problem): its group is unknown, not missing
            group = img.group if img else None
            for mp in inst.storages:
                st = t.storages.get(mp.name)
                if st is None:
                    continue
                if st.groups and not st.public_read:
                    if group is None:
                        self.add("instance", inst.name, "storages",
                                 "instance '%s' attaches group-gated storage '%s' but its image '%s' has no owning group"
                                 % (inst.name, st.name, inst.image))
                    elif group not in st.groups:
                        self.add("instance", inst.name, "storages",
                                 "instance '%s' (image '%s', group '%s') may not attach storage '%s': allowed groups are %s (N2)"
                                 % (inst.name, inst.image, group, st.name, _names(st.groups)))
                elif not st.groups and not st.public_read:
                    self.add("instance", inst.name, "storages",
                             "instance '%s' (image '%s', group '%s') may not attach storage '%s': allowed groups are [] (N2)"
                             % (inst.name, inst.image, group, st.name))
                b = t.storage_builder_for(st)
                if b is None or img is None:
                    continue
                cap = t.kind_of(b)["capability"]
                if cap and cap not in img.storage_types:
                    self.add("instance", inst.name, "storages",
                             "instance '%s' (image '%s') attaches storage '%s' of type '%s' which base '%s' does not declare (declared: %s)"
                             % (inst.name, inst.image, st.name, cap, img.name, _names(img.storage_types)))

    def efs_reachable(self) -> None:
        """An EFS file system csis.infra creates gets mount targets only from its runtime's
        networking (``network``, a private subnet per zone, ``addl_security_groups``: the NFS
        clients); without them an instance's mount fails at boot (no mount target to reach), and
        the machine never writes its completion marker. An adopted file system
        (``config.file_system_id``) may have its own."""
        t = self.t
        for st in t.storages.values():
            b = t.storage_builder_for(st)
            if b is None or b.type != "tf-aws-efs" or st.config.get("file_system_id"):
                continue
            users = self.declared_attachers(st.name)
            rt = t.builder_runtime(b)
            if not users or rt is None:
                continue
            net = rt.networking
            missing = [what for what, ok in (("network", bool(net.network)),
                                             ("a private subnet with its availability_zone", bool(net.private_subnets_per_zone())),
                                             ("addl_security_groups", bool(net.addl_security_groups))) if not ok]
            if missing:
                self.add("storage", st.name, "",
                         "storage '%s' (%s) gets no EFS mount targets: its runtime '%s' declares no %s under networking, "
                         "so instances %s could not mount it at boot. Declare them (config.file_system_id adopts a "
                         "file system with mount targets of its own, never one this tree created)"
                         % (st.name, b.name, rt.name, " and no ".join(missing), _names(users)))

    def cardinality(self) -> None:
        t = self.t
        for st in t.storages.values():
            b = t.storage_builder_for(st)
            if b is None or not t.kind_of(b)["single_attach"]:
                continue
            users = self.declared_attachers(st.name)
            if len(users) > 1:
                rt = t.builder_runtime(b)
                multi = sorted(n for n, x in t.storage_builders.items()
                               if not t.kind_of(x)["single_attach"] and x.type != "tf-aws"
                               and (rt is None or t.builder_runtime(x) is rt))
                self.add("storage", st.name, "",
                         "storage '%s' (%s) is single-attach but instances %s all attach it (N16); multi-host storage builders on %s: %s"
                         % (st.name, b.name, _names(users), rt.name if rt else "?", _names(multi)))

    def lifecycles(self) -> None:
        t = self.t
        for st in t.storages.values():
            if st.lifecycle is None:
                continue
            b = t.storage_builder_for(st)
            if b is None:
                continue
            lc = st.lifecycle

            def add(msg: str, name: str = st.name) -> None:
                self.add("storage", name, "lifecycle", msg)

            if b.type == "tf-aws-ebs":
                add("storage '%s' (%s) declares a data lifecycle, which its builder does not realize (no lifecycle on ebs storages)"
                    % (st.name, b.name))
            elif b.type == "tf-aws-efs":
                unknown = sorted(set(lc) - {"ia_days", "archive_days"})
                if unknown:
                    add("storage '%s': unknown lifecycle keys %s (efs: ia_days, archive_days)" % (st.name, _names(unknown)))
                valid = {}
                for k, allowed in (("ia_days", EFS_IA_DAYS), ("archive_days", EFS_ARCHIVE_DAYS)):
                    if k in lc and not (_whole(lc[k]) and lc[k] in allowed):
                        add("storage '%s': lifecycle.%s must be one of %s, got %r" % (st.name, k, allowed, lc[k]))
                    elif k in lc:
                        valid[k] = lc[k]
                if "ia_days" in valid and "archive_days" in valid and valid["archive_days"] <= valid["ia_days"]:
                    add("storage '%s': lifecycle.archive_days must be later than lifecycle.ia_days (AWS moves files to "
                        "Archive only after Infrequent Access), got archive_days %d, ia_days %d"
                        % (st.name, valid["archive_days"], valid["ia_days"]))
                mode = b.variables.performance_mode
                if "archive_days" in lc and mode not in (None, "generalPurpose"):
                    add("storage '%s': lifecycle.archive_days needs performance_mode generalPurpose, but its builder '%s' "
                        "declares %s (AWS archives only file systems in the General Purpose performance mode and the "
                        "Elastic throughput mode)" % (st.name, b.name, mode))
            elif b.type == "tf-aws-s3":
                unknown = sorted(set(lc) - {"transition_days", "storage_class", "expire_days", "prefix"})
                if unknown:
                    add("storage '%s': unknown lifecycle keys %s (s3: transition_days, storage_class, expire_days, prefix)"
                        % (st.name, _names(unknown)))
                for k in ("transition_days", "expire_days"):
                    if k in lc and not (_whole(lc[k]) and lc[k] > 0):
                        add("storage '%s': lifecycle.%s must be a positive int, got %r" % (st.name, k, lc[k]))
                if "storage_class" in lc and lc["storage_class"] not in S3_LIFECYCLE_CLASSES:
                    add("storage '%s': lifecycle.storage_class must be one of [%s], got %r"
                        % (st.name, ", ".join(S3_LIFECYCLE_CLASSES), lc["storage_class"]))
                if "storage_class" in lc and "transition_days" not in lc:
                    add("storage '%s': lifecycle.storage_class needs transition_days" % st.name)
                if "transition_days" in lc and "storage_class" not in lc:
                    add("storage '%s': lifecycle.transition_days needs storage_class" % st.name)
                if "transition_days" not in lc and "expire_days" not in lc:
                    add("storage '%s': lifecycle declares neither transition_days nor expire_days" % st.name)
                days = {k: lc[k] for k in ("transition_days", "expire_days") if k in lc and _whole(lc[k]) and lc[k] > 0}
                if "transition_days" in days and lc.get("storage_class") in S3_IA_CLASSES \
                        and days["transition_days"] < S3_IA_MIN_DAYS:
                    add("storage '%s': lifecycle.transition_days must be at least %d for storage_class %s (AWS takes no "
                        "transition to STANDARD_IA or ONEZONE_IA earlier), got %d"
                        % (st.name, S3_IA_MIN_DAYS, lc["storage_class"], days["transition_days"]))
                if len(days) == 2 and days["expire_days"] <= days["transition_days"]:
                    add("storage '%s': lifecycle.expire_days must be later than lifecycle.transition_days (AWS expires "
                        "objects only after their transition), got expire_days %d, transition_days %d"
                        % (st.name, days["expire_days"], days["transition_days"]))
                if "prefix" in lc and not isinstance(lc["prefix"], str):
                    add("storage '%s': lifecycle.prefix must be a string, got %s" % (st.name, type(lc["prefix"]).__name__))
                elif "prefix" in lc and any(c in lc["prefix"] for c in "\n\r"):
                    add("storage '%s': lifecycle.prefix %r holds a line break (an object key prefix is one line)"
                        % (st.name, lc["prefix"]))

    def ebs_volumes(self) -> None:
        """What CreateVolume takes of a tf-aws-ebs builder: no io1/io2 (they need provisioned IOPS,
        which the builder has no input for: the provider refuses them at plan), and the size its
        volume type allows."""
        for b in self.t.storage_builders.values():
            if b.type != "tf-aws-ebs":
                continue
            vtype = b.variables.volume_type or EBS_DEFAULT_TYPE
            if vtype in EBS_PROVISIONED_IOPS:
                self.add("storage builder", b.name, "variables.volume_type",
                         "storage builder '%s': volume_type %s needs provisioned IOPS, which a tf-aws-ebs builder "
                         "does not take: use gp3 (3000 IOPS included, up to 65536 GiB) or gp2" % (b.name, vtype))
                continue
            low, high = EBS_SIZES[vtype]
            if not low <= b.size <= high:
                self.add("storage builder", b.name, "size",
                         "storage builder '%s': size %d GiB is outside what AWS takes for volume_type %s%s: %d to %d GiB"
                         % (b.name, b.size, vtype, "" if b.variables.volume_type else " (the default)", low, high))

    def s3_group_objects(self) -> None:
        """S3 takes at most 10 tags on an object: the ``<group>/`` object of an S3 storage with groups
        carries its own two (``Name``, ``csis:group``) and, through the provider's default_tags, every
        tag its runtime inherits (config/hierarchy.py ``runtime_tags``)."""
        t = self.t
        for st in t.storages.values():
            b = t.storage_builder_for(st)
            if b is None or b.type != "tf-aws-s3" or not st.groups or st.state != "active":
                continue
            rt = t.builder_runtime(b)
            if rt is None:
                continue
            keys = set(hierarchy.runtime_tags(t, rt)) | {"Name", "csis:group"}
            if len(keys) > S3_OBJECT_TAGS_MAX:
                self.add("storage", st.name, "groups",
                         "storage '%s': its group objects (one <group>/ object per group) would carry %d tags: Name, "
                         "csis:group and the %d tags runtime '%s' inherits (its environment chain's and its own, which the "
                         "provider puts on every resource); S3 takes at most %d on an object: drop some of those tags, "
                         "or the storage's groups" % (st.name, len(keys), len(keys - {"Name", "csis:group"}), rt.name,
                                                      S3_OBJECT_TAGS_MAX))

    def state_machine(self) -> None:
        t = self.t
        if self.meta.get("storage-state.yaml") is None or self.meta.get("launch-params.yaml") is None:
            return  # the meta-state file did not load; its problem is reported
        records = self.storage_state_records()
        for st in t.storages.values():
            rec = records.get(st.name) or {}
            cur = rec.get("state")
            req = st.state
            b = t.storage_builder_for(st)
            if req == "archived" and b is not None and not t.kind_of(b)["archive"]:
                self.add("storage", st.name, "state",
                         "storage '%s' (%s) requests archived, which its builder does not realize (snapshot + restore); "
                         "only builders that support archiving may"
                         % (st.name, b.type))
                continue
            if cur is None and req != "active":
                self.add("storage", st.name, "state",
                         "storage '%s' has never been applied; a new storage must start 'active', not '%s'" % (st.name, req))
                continue
            if (cur, req) not in LEGAL_TRANSITIONS:
                self.add("storage", st.name, "state", "storage '%s': transition %s -> %s is not legal" % (st.name, cur, req))
                continue
            attached = self.attachers(st.name)
            if cur != req and req != "active" and attached:
                self.add("storage", st.name, "state",
                         "storage '%s' cannot move %s -> %s while attached by %s (detach in one run, transition in the next; N21)"
                         % (st.name, cur or "new", req, _names(attached)))
            elif cur == req and req != "active" and self.declared_attachers(st.name):
                self.add("storage", st.name, "state",
                         "storage '%s' is %s but instances attach it: %s" % (st.name, req, _names(self.declared_attachers(st.name))))
        # attachments of non-active storages
        for st in t.storages.values():
            if st.state != "active":
                users = self.declared_attachers(st.name)
                if users and (records.get(st.name) or {}).get("state") in (None, st.state):
                    pass  # reported above ("is <state> but instances attach it")
                elif users:
                    for u in users:
                        self.add("instance", u, "storages",
                                 "instances %s attach storage '%s' which is %s" % (_names(users), st.name, st.state))
        for name, rec in records.items():
            if name in t.storages or not isinstance(rec, dict):
                continue
            if rec.get("state") == "destroyed":
                continue
            facts = rec.get("facts") or {}
            if not facts.get("builder"):
                self.problems.append(Problem(
                    "meta-state/storage-state.yaml", "storages.%s" % name,
                    "storage '%s' is recorded %s but no longer declared, and its record names no storage builder: "
                    "re-declare it (or record it with `state import`) so the destroy can be planned" % (name, rec.get("state"))))
            elif t.storage_builder(facts["builder"]) is None:
                self.problems.append(Problem(
                    "meta-state/storage-state.yaml", "storages.%s" % name,
                    "storage '%s' is recorded %s and no longer declared; its record names storage builder '%s', which is not declared"
                    % (name, rec.get("state"), facts["builder"])))
            else:
                # reality, not declarations: a launched instance keeps its mounts until its
                # own root detaches them, even when it is undeclared in this run
                attached = sorted(n for n, r in self.launched_records().items()
                                  if any(isinstance(x, dict) and x.get("storage") == name for x in r.get("mounts") or []))
                if attached:
                    self.problems.append(Problem(
                        "meta-state/storage-state.yaml", "storages.%s" % name,
                        "storage '%s' cannot move %s -> destroyed while attached by %s (detach in one run, transition in the next; N21)"
                        % (name, rec.get("state"), _names(attached))))

    def destroy_rules(self) -> None:
        """Destroy rules (issue 15): what launched instances still use cannot be undeclared. A
        runtime with launched instances, and an identity group a launched instance runs as (its
        image's owning group, recorded in its launch parameters), stay declared until the
        instances are decommissioned. (Storages: :meth:`state_machine`, N21.) Declared users of
        an undeclared group are reported where they name it (:meth:`references`)."""
        t = self.t
        if self.meta.get("launch-params.yaml") is None:
            return  # the meta-state file did not load; its problem is reported
        on_runtime: Dict[str, Set[str]] = {}
        as_group: Dict[str, Set[str]] = {}
        by_builder: Dict[str, Set[str]] = {}
        for name, rec in self.launched_records().items():
            rt = rec.get("runtime")
            if isinstance(rt, str) and rt and t.runtime(rt) is None and t.dangling("runtime", rt):
                on_runtime.setdefault(rt, set()).add(name)
            # an undeclared instance's destroy is planned in its builder's root (render/instance_roots.py):
            # without the builder nothing would ever plan it, and the machine would run on, unrecorded
            b = rec.get("builder")
            if name not in t.instances and isinstance(b, str) and b and t.instance_builder(b) is None \
                    and t.dangling("instance builder", b):
                by_builder.setdefault(b, set()).add(name)
            g = rec.get("group")
            if isinstance(g, str) and g and g not in t.groups and t.dangling("group", g):
                as_group.setdefault(g, set()).add(name)
        # (who is still used, the file and key to keep it at, the message: its name, then the instances)
        for used, file, key, message in (
                (on_runtime, "cfg/runtime-builders.yml", "runtime_builders (%s)",
                 "runtime '%s' cannot be undeclared while launched instances %s run on it (meta-state/launch-params.yaml): "
                 "decommission them first (undeclare them and run playbooks/instance_image.yml, or "
                 "playbooks/destroy_environment.yml), then remove the runtime"),
                (by_builder, "cfg/instance-builders.yml", "instance_builders (%s)",
                 "instance builder '%s' cannot be undeclared while launched instances %s it built are no longer declared "
                 "(meta-state/launch-params.yaml): its root is what plans their destroy; keep the builder until "
                 "playbooks/instance_image.yml has decommissioned them, then remove it"),
                (as_group, "groups/*.y*ml", "groups (%s)",
                 "group '%s' cannot be undeclared (its identity root would destroy it) while launched instances %s run "
                 "as it (meta-state/launch-params.yaml): decommission them first, then remove the group")):
            for name, users in sorted(used.items()):
                self.problems.append(Problem(file, key % name, message % (name, _names(users))))

    def tree_name(self) -> None:
        """The tree's name (``id:``, else its directory's name) is the ``csis_config`` tag of every
        resource and part of each EFS creation token: once applied, it must stay what the resources
        carry (meta-state records it per storage and machine, from the applied state). A tree without
        ``id:`` checked out under another directory name (an AWX project, a second clone) would
        otherwise re-tag every resource and replace every EFS filesystem."""
        t = self.t
        mine = t.resource_tag()["csis_config"]
        carried: Dict[str, Set[str]] = {}
        for name, rec in ((self.meta.get("storage-state.yaml") or {}).get("storages") or {}).items():
            tag = (rec.get("facts") or {}).get("csis_config") if rec.get("state") in ("active", "archived") else None
            if isinstance(tag, str) and tag and tag != mine:
                carried.setdefault(tag, set()).add("storage %s" % name)
        for name, rec in ((self.meta.get("instance-state.yaml") or {}).get("instances") or {}).items():
            tag = (rec.get("current") or {}).get("csis_config")
            if isinstance(tag, str) and tag and tag != mine:
                carried.setdefault(tag, set()).add("instance %s" % name)
        for tag, users in sorted(carried.items()):
            where = "its id" if t.config_file.id else "its directory's name (cfg/_config.yml sets no id:)"
            self.problems.append(Problem(
                "cfg/_config.yml", "id",
                "the tree names itself '%s' (from %s), but its applied resources carry csis_config '%s' (%s, "
                "meta-state): its plans would re-tag every resource and replace every EFS filesystem (the name is "
                "part of the creation token); set `id: %s` in cfg/_config.yml"
                % (mine, where, tag, ", ".join(sorted(users)[:5]) + (", ..." if len(users) > 5 else ""), tag)))

    def policies(self) -> None:
        for inst in self.t.instances.values():
            if inst.image_policy not in ("pinned", "follow"):
                self.add("instance", inst.name, "image_policy",
                         "image_policy %r must be one of ['pinned', 'follow']" % inst.image_policy)
            if inst.on_failure is not None and inst.on_failure not in ("keep", "teardown"):
                self.add("instance", inst.name, "on_failure", "on_failure %r must be one of ['keep', 'teardown']" % inst.on_failure)
            if inst.teardown_after is not None:
                try:
                    m.parse_duration(inst.teardown_after)
                except ValueError as exc:
                    self.add("instance", inst.name, "teardown_after", str(exc))
            if not inst.ephemeral and (inst.on_failure is not None or inst.teardown_after is not None):
                self.add("instance", inst.name, "ephemeral",
                         "on_failure/teardown_after only apply to ephemeral instances; set ephemeral: true or remove them")

    def zones(self) -> None:
        t = self.t
        for inst in t.instances.values():
            b = t.instance_builder_for(inst)
            rt = t.builder_runtime(b) if b else None
            claims: List[Tuple[str, str]] = []
            if inst.availability_zone:
                claims.append(("instance '%s'" % inst.name, inst.availability_zone))
            if rt is not None:
                z = rt.networking.effective_zone()
                if z:
                    claims.append(("runtime '%s' subnet %s" % (rt.name, rt.networking.default_subnet_id or "(default zone)"), z))
            for mp in inst.storages:
                st = t.storages.get(mp.name)
                sb = t.storage_builder_for(st) if st else None
                if st is None or sb is None or not t.kind_of(sb)["zonal"]:
                    continue
                srt = t.builder_runtime(sb)
                z = st.availability_zone or (srt.networking.default_availability_zone if srt else None) \
                    or (srt.networking.effective_zone() if srt else None)
                if z:
                    claims.append(("storage '%s'" % st.name, z))
            zones = {z for _what, z in claims}
            if len(zones) > 1:
                self.add("instance", inst.name, "availability_zone",
                         "instance '%s' spans availability zones %s: %s; an instance, its zonal storages and its runtime's subnet must share one zone"
                         % (inst.name, _names(zones), ", ".join("%s in %s" % c for c in claims)))

    def remote_state_needs(self) -> None:
        """Roots read group gids and storage ids through terraform_remote_state: with
        ``use_state_backends`` off they would not validate, so refuse here instead."""
        t = self.t
        if not self.config_known("use_state_backends") or t.config.use_state_backends:
            return
        where = t.config_source.get("use_state_backends", "cfg/_config.yml")
        for inst in t.instances.values():
            g = t.owning_group(inst)
            needs = []
            if g:
                needs.append("owning group '%s'" % g)
            if inst.storages:
                needs.append("mounts %s" % _names(x.name for x in inst.storages))
            if needs:
                self.add("instance", inst.name, "storages" if inst.storages else "image",
                         "instance '%s' needs remote state (%s) but config.use_state_backends is off in %s: "
                         "turn it on and declare a state backend" % (inst.name, ", ".join(needs), where))
        for st in t.storages.values():
            if st.groups:
                self.add("storage", st.name, "groups",
                         "storage '%s' allows groups %s, whose gids come from the identity root's remote state, but config.use_state_backends is off in %s"
                         % (st.name, _names(st.groups), where))

    def module_sources(self) -> None:
        """A local ``module_source_base`` must hold the modules the roots call (terraform init
        would fail with ``lstat ...: no such file or directory``). Unset: the collection's own
        modules, vendored by csis_render; a module URL is fetched by init."""
        t = self.t
        base = t.config.module_source_base
        if base is None or not self.config_known("module_source_base") or m.is_module_url(base):
            return
        where = t.config_source.get("module_source_base", "cfg/_config.yml")
        target = os.path.normpath(base if os.path.isabs(base) else os.path.join(t.root, base))
        used = {m.STORAGE_KINDS.get(b.type, {}).get("module") for b in t.storage_builders.values()}
        used.update(["aws_instance"] if t.instance_builders else [])
        used.update(["identity_groups"] if t.group_builders else [])
        if not os.path.isdir(target):
            self.problems.append(Problem(where, "config.module_source_base",
                                         "'%s' is not a directory%s: terraform could not load the modules %s from it; "
                                         "remove the key to use the collection's own modules"
                                         % (base, "" if os.path.isabs(base) else " (relative to the configuration root)", _names(x for x in used if x))))
            return
        for module in sorted(x for x in used if x):
            if not os.path.isdir(os.path.join(target, module)):
                self.problems.append(Problem(where, "config.module_source_base",
                                             "'%s' has no module '%s' (a directory %s/%s)" % (base, module, base.rstrip("/"), module)))

    def alias_pool(self) -> None:
        """The alias pool (meta-state/aliases.txt): every free line a legal hostname label, no
        repeats, no declared instance's name (the manual's rules)."""
        try:
            pool = read_pool(self.t.root)
        except MetaStateError as exc:
            self.problems.append(Problem("meta-state/%s" % ALIAS_POOL, "", str(exc)))
            return
        for line, message in pool_problems(pool, self.t.instances):
            self.problems.append(Problem("meta-state/%s" % ALIAS_POOL, "line %d" % line, message))

    def released_builds(self) -> None:
        """``config.require_released_builds``: an instance's pin (and the build a pending upgrade
        moves it to) must be one of its image's ``released_builds``, unless the release grace
        admits it: the build is the image's series head (its declared ``ami_id``; validation is
        offline) and no failed verification of that build is recorded (the instance stands on the
        build it is pinned to, or is a pending replacement onto the build checked)."""
        if not self.t.config.require_released_builds or self.meta.get("pins.yaml") is None:
            return
        pins = self.meta.get("pins.yaml") or {}
        pinned = pins.get("instances") or {}
        pending = pins.get("pending_replacements") or {}
        failed: Dict[str, Any] = {}
        for v in (self.meta.get("verifications.yaml") or {}).get("verifications") or []:
            if isinstance(v, dict) and v.get("build") and v.get("ok") is False:
                failed.setdefault(v["build"], v)
        # the manual's per-build post-bake record: a build whose latest post-bake tests failed
        # gets no grace either
        post_bake_failed: Dict[str, Any] = {}
        for build, rec in ((self.meta.get("image-tests.yaml") or {}).get("builds") or {}).items():
            results = rec.get("results") if isinstance(rec, dict) else None
            if results and isinstance(results[-1], dict) and results[-1].get("ok") is False:
                post_bake_failed[build] = results[-1]
        for name, inst in sorted(self.t.instances.items()):
            img = self.t.image_of(inst)
            if img is None:
                continue
            builds = []
            pin = pinned.get(name)
            if isinstance(pin, str) and pin:
                builds.append((pin, True))
            entry = pending.get(name)
            to = entry.get("to") if isinstance(entry, dict) else entry
            if isinstance(to, str) and to and to != pin:
                builds.append((to, False))
            for build, is_pin in builds:
                if build in img.released_builds:
                    continue
                missing = []
                if not img.ami_id:
                    missing.append("'%s' declares no series head (ami_id)" % img.name)
                elif build != img.ami_id:
                    missing.append("it is not the series head %s of '%s'" % (img.ami_id, img.name))
                if build in failed:
                    missing.append("a failed verification of it is recorded (instance %s, run %s)"
                                   % (failed[build].get("instance"), failed[build].get("run")))
                if build in post_bake_failed:
                    missing.append("its latest post-bake tests failed (meta-state/image-tests.yaml: instance %s, run %s)"
                                   % (post_bake_failed[build].get("instance"), post_bake_failed[build].get("run")))
                if not missing:
                    continue  # the release grace: the series head while its own proof is under way
                what = "pinned to build %s" % build if is_pin else "being upgraded to build %s" % build
                self.add("instance", name, "image",
                         "instance '%s' is %s of '%s', which is not a released build "
                         "(config.require_released_builds; no grace: %s); release it (the image's released_builds) "
                         "or upgrade the instance onto a released build" % (name, what, img.name, "; ".join(missing)))

    def immutability(self) -> None:
        """N26: a launched instance's launch parameters, computed now, match the recorded ones
        (instances whose builder, image or storages do not resolve are left to the rules above;
        those not recorded as launched, or being replaced, have nothing to match)."""
        computed = {}
        replacing = {}
        recorded = (self.meta.get("launch-params.yaml") or {}).get("instances") or {}
        for name, inst in self.t.instances.items():
            rec = recorded.get(name)
            if not isinstance(rec, dict) or not rec.get("launched") or not self._resolves(inst):
                continue
            replacing[name] = pending_replacement(self.meta, name)
            if not replacing[name]:
                computed[name] = compute_launch_params(self.t, self.meta, inst, replacing=False, user_data=False)
        self.problems.extend(immutability_problems(self.t, self.meta, computed, replacing))

    def _resolves(self, inst: Any) -> bool:
        """Whether the instance's builder, image and storages resolve (an instance whose do not is
        left to the reference rules, which name what is missing): its launch parameters can be computed."""
        if self.t.instance_builder_for(inst) is None or self.t.image_of(inst) is None:
            return False
        return not any(s.name not in self.t.storages or self.t.storage_builder_for(self.t.storages[s.name]) is None
                       for s in inst.storages)

    def hostnames(self) -> None:
        """The canonical hostname (``<name>-NNN``) of a machine still to be launched (not launched
        yet, being replaced, an ephemeral one's next) is a legal hostname, 63 characters at most
        (RFC 1123, the rule the alias pool's names follow): a longer one is cut by hostnamectl and is
        no name DNS or the access server takes; one with a character a hostname may not hold (``_``,
        a dot beside a hyphen or another dot) is changed by hostnamectl (which drops it, or refuses
        the name, and the launch script's fallback then lasts until a reboot). A machine standing keeps the hostname it has. Not checked when the launch
        records could not be read (their rule reports that)."""
        if self.meta.get("launch-params.yaml") is None:
            return
        recorded = (self.meta.get("launch-params.yaml") or {}).get("instances") or {}
        # names that differ only in letter case (Test, test) give hostnames DNS takes for one name
        by_fold: Dict[str, List[str]] = {}
        for name in sorted(set(self.t.instances) | {n for n, r in recorded.items() if isinstance(r, dict) and r.get("launched")}):
            by_fold.setdefault(name.lower(), []).append(name)
        for name, inst in sorted(self.t.instances.items()):
            rec = recorded.get(name)
            replacing = pending_replacement(self.meta, name)
            if isinstance(rec, dict) and rec.get("launched") and not replacing:
                continue
            host = canonical_hostname(self.meta, name, inst.ephemeral, replacing)
            twins = [n for n in by_fold[name.lower()] if n != name]
            if twins:
                self.add("instance", name, "name",
                         "instance '%s' and instance '%s' differ only in letter case: their machines' hostnames "
                         "('%s', '%s-NNN') are one name to DNS; give the instance another name"
                         % (name, twins[0], host, twins[0]))
            elif not HOSTNAME_RE.match(host):
                self.add("instance", name, "name",
                         "instance '%s': its machine's canonical hostname '%s' is not a valid hostname (letters, "
                         "digits and hyphens, single dots between them): the machine would not get it as written "
                         "(hostnamectl changes or refuses it); give the instance a name such as '%s'"
                         % (name, host, hostname_fix(name)))
            elif len(host) > HOSTNAME_MAX:
                self.add("instance", name, "name",
                         "instance '%s': its machine's canonical hostname '%s' would be %d characters, over the %d "
                         "characters a hostname label may have (RFC 1123); give the instance a name of at most %d "
                         "characters" % (name, host, len(host), HOSTNAME_MAX, HOSTNAME_MAX - (len(host) - len(name))))

    def user_data_size(self) -> None:
        """An instance's ``userdata`` with csis.infra's launch script must fit EC2's user data
        (16,384 bytes): refused here, not by the launch's RunInstances."""
        for name, inst in sorted(self.t.instances.items()):
            if not inst.userdata or not self._resolves(inst):
                continue
            # the template as terraform renders it: its escapes ($${, %%{) are one character shorter (the
            # enrollment token, a few hundred bytes at most, is left out: the check is the userdata's)
            template = user_data_template(compute_launch_params(self.t, self.meta, inst, user_data=False))
            size = len(template.replace("$${", "${").replace("%%{", "%{").encode("utf-8"))
            if size > USER_DATA_MAX:
                self.add("instance", name, "userdata",
                         "the machine's user data would be %d bytes (csis.infra's launch script and this userdata), "
                         "over the %d EC2 takes; keep the userdata short (fetch a larger script from S3 in it)"
                         % (size, USER_DATA_MAX))

    def meta_state_backend(self) -> None:
        """``meta_state: {backend: s3, state_backend: <name>}`` names a declared S3 state backend."""
        setting = self.t.config_file.meta_state
        if setting is None or setting.backend != "s3" or not setting.state_backend:
            return
        backend = self.t.backends.get(setting.state_backend)
        if backend is None:
            self.problems.append(Problem("cfg/_config.yml", "meta_state.state_backend",
                                         "names state backend '%s', which is not declared in cfg/state-backends*.yml "
                                         "(declared: %s)" % (setting.state_backend, _names(self.t.backends))))
        elif backend.type != "s3":
            self.problems.append(Problem("cfg/_config.yml", "meta_state.state_backend",
                                         "names state backend '%s', which is a %s backend; the s3 meta-state needs "
                                         "an s3 one (its bucket, region and endpoint hold the records)"
                                         % (setting.state_backend, backend.type)))

    def meta_state_shares_states(self) -> None:
        """With the s3 meta-state, every root's terraform state is shared too. A record in the
        store that points at a state on one controller's disk makes every other checkout plan
        to create again what exists (a second volume beside the recorded one)."""
        t = self.t
        setting = t.config_file.meta_state
        if setting is None or setting.backend != "s3" or not self.config_known("use_state_backends"):
            return
        why = ("the s3 meta-state (cfg/_config.yml meta_state) shares records between checkouts, so every root's "
               "terraform state must be shared too")
        if not t.config.use_state_backends:
            where = t.config_source.get("use_state_backends", "cfg/_config.yml")
            self.problems.append(Problem(where, "config.use_state_backends",
                                         "is off: each root would keep terraform.tfstate in its directory on this "
                                         "controller; %s (turn it on and use an s3 state backend)" % why))
            return
        used: Dict[Tuple[str, str], Any] = {}
        for inst in t.instances.values():
            b = t.instance_builder_for(inst)
            if b is not None:
                used[("instance builder", b.name)] = b
        for st in t.storages.values():
            b = t.storage_builder_for(st)
            if b is not None:
                used[("storage builder", b.name)] = b
        for g in t.groups.values():
            b = t.group_builder_for(g)
            if b is not None:
                used[("group builder", b.name)] = b
        for (kind, name), b in sorted(used.items()):
            backend = t.backend_for(b)
            if backend is not None and backend.type != "s3":
                self.add(kind, name, "state_configuration",
                         "keeps its terraform state in the %s state backend '%s' (on one controller's disk); %s: "
                         "name an s3 state backend" % (backend.type, backend.name, why))

    def executables(self, run: Callable[[str], Tuple[Optional[str], Optional[str]]]) -> None:
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version
        for ex in self.t.executables.values():
            version, err = run(ex.binary)
            if err:
                self.add("executable", ex.name, "binary", err)
                continue
            if ex.version and version:
                try:
                    ok = Version(version) in SpecifierSet(ex.version)
                except InvalidVersion:
                    ok = False
                if not ok:
                    self.add("executable", ex.name, "version",
                             "%s reports version %s, which does not satisfy '%s'" % (ex.binary, version, ex.version))


def validate_tree(tree: Tree, meta: Mapping[str, Any],
                  run_version: Optional[Callable[[str], Tuple[Optional[str], Optional[str]]]] = None,
                  extra: Iterable[Callable[[Validation], None]] = ()) -> List[Problem]:
    """Run every rule; return every problem (empty list = valid)."""
    v = Validation(tree, meta)
    v.references()
    if v.config_known("required_tags"):
        v.problems.extend(hierarchy.required_tag_problems(tree))
    v.labels()
    v.attach_rules()
    v.efs_reachable()
    v.cardinality()
    v.lifecycles()
    v.ebs_volumes()
    v.s3_group_objects()
    v.state_machine()
    v.destroy_rules()
    v.tree_name()
    v.policies()
    v.zones()
    v.remote_state_needs()
    v.module_sources()
    v.meta_state_backend()
    v.meta_state_shares_states()
    v.executables(run_version or terraform_version)
    v.immutability()
    v.hostnames()
    v.user_data_size()
    v.released_builds()
    v.alias_pool()
    for rule in extra:
        rule(v)
    # one message once
    seen = set()
    out = []
    for p in v.problems:
        if (p.file, p.key, p.message) not in seen:
            seen.add((p.file, p.key, p.message))
            out.append(p)
    return out


#: meta-state files the validators read
VALIDATE_META = ("storage-state.yaml", "launch-params.yaml", "pins.yaml", "instance-state.yaml", "verifications.yaml",
                 "image-tests.yaml")


def _meta_problem(name: str, exc: MetaStateError) -> Problem:
    """A meta-state error as a problem naming meta-state/<file> and, when known, the key."""
    text = str(exc)
    label = "meta-state/%s" % name
    # the file, or one record object of it (whose name may hold a space: "test2 copy.yaml")
    named = re.match(r"^((?:meta-state|s3:)/.*?): ", text)
    if named:
        label, text = named.group(1), text[named.end():]
    key = ""
    mk = re.match(r"^'([^']+)' (.*)$", text, re.S)
    if mk:
        key, text = mk.group(1), mk.group(2)
    else:
        mk = re.match(r"^top-level key '([^']+)' (.*)$", text, re.S)
        if mk:
            key, text = mk.group(1), mk.group(2)
    return Problem(label, key, text)


def read_meta(root: str, names: Iterable[str] = VALIDATE_META) -> Tuple[Dict[str, Any], List[Problem]]:
    """Read the meta-state files the validators use. A file that does not load is
    reported and left out of the result (the rules that need it do not run)."""
    ms = MetaState(root)
    out: Dict[str, Any] = {}
    problems: List[Problem] = []
    try:
        ms.open()  # where meta-state lives (cfg/_config.yml meta_state)
    except MetaStateError as exc:
        text = str(exc)
        return out, [Problem("cfg/_config.yml", "meta_state", text.split(": ", 1)[1] if text.startswith("cfg/") else text)]
    try:
        return ms.load_many(names), problems  # each file read once (their invariants relate them)
    except MetaStateError:
        pass  # one at a time below, so each file that does not load is named and the others still are read
    for n in names:
        try:
            out[n] = ms.load(n)
        except MetaStateError as exc:
            problem = _meta_problem(n, exc)
            if problem not in problems:  # a store that cannot be read at all is named once
                problems.append(problem)
    return out, problems


def load_and_validate(root: str, overlays: Iterable[str] = (), undeclare: Iterable[str] = (),
                      run_version: Optional[Callable[[str], Tuple[Optional[str], Optional[str]]]] = None,
                      extra: Iterable[Callable[[Validation], None]] = (),
                      adjust: Optional[Callable[[Tree, Dict[str, Any]], List[Problem]]] = None) -> Tuple[Tree, Dict[str, Any]]:
    """Return (tree, meta) or raise :class:`ConfigError` listing every problem.

    ``adjust(tree, meta)``: a change of the declaration for this run only, made on the loaded
    tree before the rules run (the cascade's phase, :func:`..render.cascade.apply_phase`); it
    returns its own problems.

    Reads only: the configuration tree, the overlays and meta-state (``meta-state/``, or
    the S3 store ``cfg/_config.yml`` names: its only network calls). Writes nothing; the only process started is each declared executable's
    ``<binary> version -json`` (``run_version`` replaces it, e.g. in tests).
    """
    tree, problems = load_tree_partial(root, overlays=overlays, undeclare=undeclare)
    if not os.path.isdir(tree.root):
        raise ConfigError(problems)
    meta, meta_problems = read_meta(tree.root)
    # a meta_state setting the loader refused is refused again by the store it names: once is enough
    if any(p.file == "cfg/_config.yml" and p.key.split(".")[0] == "meta_state" for p in problems):
        meta_problems = [p for p in meta_problems if not (p.file == "cfg/_config.yml" and p.key == "meta_state")]
    problems += meta_problems
    if adjust is not None and not problems:
        problems += adjust(tree, meta)
    # cross-file rules also run over what did load, so every error shows at once
    # (references into a file that did not load are not reported as dangling)
    problems += validate_tree(tree, meta, run_version=run_version, extra=extra)
    if problems:
        raise ConfigError(problems)
    return tree, meta
