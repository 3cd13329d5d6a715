# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The cascade destroy of an environment (``playbooks/destroy_environment.yml``), leaves first.

Every runtime whose environment chain (``cfg/hierarchy.yml``) holds the environment is in the
cascade. Its four phases are ordinary lifecycle runs over a declaration changed for that run
only (nothing in the tree is edited):

1. ``ephemeral`` (instance-image): the environment's ephemeral instances are undeclared (and
   the instances never launched, so that nothing launches); their roots decommission them;
2. ``durable`` (instance-image): every instance of the environment is undeclared;
3. ``storage`` (storage): EBS storages are requested ``archived`` (snapshot, then the volume's
   destroy) unless the cascade is told ``destroyed``; EFS and S3 storages, which cannot be
   archived, only when the tree declares it (``state: destroyed``, or ``force_destroy: true``
   on the S3 builder): otherwise the cascade is refused; storages never applied are left out;
4. ``identity`` (identity): the identity roots of the environment's group builders are
   destroyed (no module call, the whitelist ``module.identity``).

:func:`plan_cascade` computes the whole cascade from the tree and meta-state as they are (the
order, what each phase undeclares and requests, every destroy), and every refusal at once: a
storage of the environment that an instance outside it attaches, an EFS/S3 storage the tree
does not declare destroyed, a group of the environment's identity builders still used outside
it. :func:`apply_phase` is what ``csis_render`` does with one phase (``cascade`` option): it
computes the phase again from the current meta-state (a killed cascade resumes where reality
is), changes the loaded tree accordingly, narrows the roots to the environment's runtimes, and
refuses a destroy the cascade's approval did not show; :func:`narrow` then keeps the rendered
roots of the environment's runtimes and turns the identity roots it destroys into roots with no
module call (their whitelist: ``module.identity``).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..config import hierarchy
from ..config import models as m
from ..errors import Problem
from ..terraform import ENDPOINT_ENV_FILE
from .hcl import comment_lines, document
from .plan import HEADER, PHASES as ROOT_PHASES, RenderOptions, RootPlan, RootPlanner

#: the phases, leaves first, and the lifecycle each runs
PHASES: Tuple[str, ...] = ("ephemeral", "durable", "storage", "identity")
LIFECYCLE = {"ephemeral": "instance-image", "durable": "instance-image", "storage": "storage", "identity": "identity"}
#: what the cascade requests of an EBS storage (``csis_cascade_ebs``)
EBS_CHOICES = ("archived", "destroyed")
WHERE = "destroy_environment"


def _names(xs: Any) -> str:
    return "[" + ", ".join("'%s'" % x for x in sorted(xs)) + "]"


def environment_runtimes(tree: Any, environment: str) -> List[str]:
    """The runtimes whose environment chain holds ``environment`` (nearest first or farther)."""
    out = []
    for name, rt in tree.runtimes.items():
        if rt.environment and environment in [n.name for n in hierarchy.chain(tree.hierarchy, rt.environment)]:
            out.append(name)
    return sorted(out)


class _State:
    """The tree and meta-state as one phase sees them."""

    def __init__(self, tree: Any, meta: Mapping[str, Any], runtimes: Sequence[str]):
        self.t = tree
        self.runtimes = set(runtimes)
        lps = (meta.get("launch-params.yaml") or {}).get("instances") or {}
        self.launched = {n: r for n, r in lps.items() if isinstance(r, dict) and r.get("launched")}
        self.records = (meta.get("storage-state.yaml") or {}).get("storages") or {}

    def runtime_of(self, builder: Any) -> Optional[str]:
        rt = self.t.builder_runtime(builder) if builder is not None else None
        return rt.name if rt is not None else None

    def inside(self, builder: Any) -> bool:
        return self.runtime_of(builder) in self.runtimes

    # instances ----------------------------------------------------------------
    def instances(self) -> List[str]:
        """Declared instances of the environment."""
        return sorted(n for n, i in self.t.instances.items() if self.inside(self.t.instance_builder_for(i)))

    def launched_inside(self) -> Dict[str, Mapping[str, Any]]:
        out = {}
        for n, r in self.launched.items():
            inst = self.t.instances.get(n)
            rt = self.runtime_of(self.t.instance_builder_for(inst)) if inst is not None else r.get("runtime")
            if rt in self.runtimes:
                out[n] = r
        return out

    def instance_root(self, name: str, rec: Mapping[str, Any]) -> str:
        inst = self.t.instances.get(name)
        b = self.t.instance_builder_for(inst) if inst is not None else None
        return "instance-image-%s" % (b.name if b is not None else rec.get("builder"))

    # storages -----------------------------------------------------------------
    def storages(self) -> List[str]:
        return sorted(n for n, s in self.t.storages.items() if self.inside(self.t.storage_builder_for(s)))

    def undeclared_records(self) -> List[str]:
        out = []
        for n, r in self.records.items():
            if n in self.t.storages or not isinstance(r, dict) or r.get("state") == "destroyed":
                continue
            b = self.t.storage_builder((r.get("facts") or {}).get("builder") or "")
            if b is not None and self.inside(b):
                out.append(n)
        return sorted(out)

    def identity_builders(self) -> List[str]:
        return sorted(n for n, gb in self.t.group_builders.items() if self.inside(gb)
                      and any(self.t.group_builder_for(g) is gb for g in self.t.groups.values()))


def _storage_request(s: _State, name: str, ebs: str) -> Tuple[Optional[str], Optional[str]]:
    """(requested state, refusal) of a declared storage of the environment in the storage phase;
    requested None: left out of the phase (never applied)."""
    st = s.t.storages[name]
    sb = s.t.storage_builder_for(st)
    cur = (s.records.get(name) or {}).get("state")
    kind = s.t.kind_of(sb)
    if cur is None:
        return None, None
    if kind["archive"]:
        if st.state == "destroyed" or ebs == "destroyed" or cur == "destroyed":
            return "destroyed", None
        return "archived", None
    declared = st.state == "destroyed" or cur == "destroyed"
    if kind["capability"] == "s3" and getattr(sb.variables, "force_destroy", None):
        declared = True
    if declared:
        return "destroyed", None
    where = "%s: %s" % s.t.at("storage", name, "state")
    how = ("state: destroyed there (its objects are wiped), or force_destroy: true on its builder '%s'" % sb.name
           if kind["capability"] == "s3" else "state: destroyed there (its files are deleted)")
    return None, ("storage '%s' (%s) cannot be archived, and the tree does not declare it destroyed (%s is %s): "
                  "declare %s, or move it out of the environment" % (name, kind["capability"], where, st.state, how))


def _phase(s: _State, phase: str, ebs: str) -> Dict[str, Any]:
    """One phase as the current state gives it: what it undeclares or requests, and its destroys
    (``<root key>: <address>``) and data steps."""
    out: Dict[str, Any] = {"phase": phase, "lifecycle": LIFECYCLE[phase], "undeclare": [], "storage_states": {},
                           "destroy_identity": [], "destroys": [], "steps": [], "refusals": []}
    if phase in ("ephemeral", "durable"):
        declared = s.instances()
        launched = s.launched_inside()
        if phase == "ephemeral":
            out["undeclare"] = [n for n in declared if s.t.instances[n].ephemeral or n not in launched]
            # a launched instance no longer declared is decommissioned by its root's first run
            going = [n for n in launched if n not in s.t.instances or n in out["undeclare"]]
        else:
            out["undeclare"] = declared
            going = list(launched)
        for n in sorted(going):
            out["destroys"].append("%s: module.instance_%s" % (s.instance_root(n, launched[n]), m.label(n)))
        # a root left without a declared instance destroys its security group
        kept = {s.instance_root(n, {}) for n in declared if n not in out["undeclare"]}
        for root in sorted({s.instance_root(n, r) for n, r in launched.items()} - kept):
            out["destroys"].append("%s: aws_security_group.csis_instances" % root)
    elif phase == "storage":
        for n in s.storages():
            st = s.t.storages[n]
            sb = s.t.storage_builder_for(st)
            req, refusal = _storage_request(s, n, ebs)
            if refusal:
                out["refusals"].append(Problem(*s.t.at("storage", n, "state"), message=refusal))
                continue
            if req is None:
                if (s.records.get(n) or {}).get("state") is None:
                    out["undeclare"].append(n)  # never applied: nothing to destroy, nothing to create
                continue
            out["storage_states"][n] = req
            _storage_destroys(out, "storage-%s" % sb.name, n, (s.records.get(n) or {}), req, s.t.kind_of(sb),
                              m.bucket_for(st, sb) if s.t.kind_of(sb)["capability"] == "s3" else None)
        for n in s.undeclared_records():
            rec = s.records[n]
            sb = s.t.storage_builder(rec["facts"]["builder"])
            kind = s.t.kind_of(sb)
            _storage_destroys(out, "storage-%s" % sb.name, n, rec, "destroyed", kind,
                              (rec.get("facts") or {}).get("bucket_name") or n if kind["capability"] == "s3" else None)
    else:
        for gb in s.identity_builders():
            out["destroy_identity"].append(gb)
            out["destroys"].append("identity-%s: module.identity" % gb)
    return out


def _storage_destroys(out: Dict[str, Any], root: str, name: str, rec: Mapping[str, Any], req: str,
                      kind: Mapping[str, Any], bucket: Optional[str]) -> None:
    cur = rec.get("state")
    if cur == req:
        return
    lab = m.label(name)
    snap = (rec.get("facts") or {}).get("archive") or m.archive_snapshot_name(name)
    if cur == "archived":
        out["steps"].append("%s: delete the archive snapshot %s of storage '%s'" % (root, snap, name))
        return
    if req == "archived":
        out["steps"].append("%s: snapshot storage '%s' as %s (kept)" % (root, name, m.archive_snapshot_name(name)))
    elif kind["capability"] == "s3":
        out["steps"].append("%s: wipe bucket %s of storage '%s' (every object version)" % (root, bucket, name))
    out["destroys"].append("%s: module.storage_%s" % (root, lab))


def _group_users(tree: Any, meta: Mapping[str, Any], s: _State, group: str, gone_storages: Set[str],
                 gone_instances: Set[str]) -> List[str]:
    """Who still uses ``group`` once the cascade's instances and storages are gone."""
    users = []
    for n, inst in sorted(tree.instances.items()):
        img = tree.image_of(inst)
        if n not in gone_instances and img is not None and img.group == group:
            users.append("instance '%s' (%s)" % (n, "%s: %s" % tree.at("instance", n, "image")))
    for n, st in sorted(tree.storages.items()):
        if n not in gone_storages and st.state == "active" and group in st.groups \
                and (s.records.get(n) or {}).get("state") in ("active", None):
            users.append("storage '%s' (%s)" % (n, "%s: %s" % tree.at("storage", n, "groups")))
    for n, r in sorted(s.launched.items()):
        if n not in gone_instances and r.get("group") == group:
            users.append("launched instance '%s' (meta-state/launch-params.yaml)" % n)
    return users


def plan_cascade(tree: Any, meta: Mapping[str, Any], environment: str, ebs: str = "archived") -> Dict[str, Any]:
    """The whole cascade of ``environment``: ``{"environment", "runtimes", "phases": [...], "problems"}``
    (``problems``: every refusal, as :class:`Problem`; empty = the cascade may run)."""
    problems: List[Problem] = []
    node = tree.hierarchy.get(environment)
    if node is None or node.kind != "environment":
        envs = sorted(n for n, x in tree.hierarchy.items() if x.kind == "environment")
        problems.append(Problem(hierarchy.HIERARCHY_REL, "", "'%s' is not an environment declared in %s (environments: %s)"
                                % (environment, hierarchy.HIERARCHY_REL, ", ".join(envs) or "none")))
        return {"environment": environment, "runtimes": [], "phases": [], "problems": problems}
    if ebs not in EBS_CHOICES:
        problems.append(Problem("", WHERE, "csis_cascade_ebs must be one of %s, got %r" % (list(EBS_CHOICES), ebs)))
    runtimes = environment_runtimes(tree, environment)
    s = _State(tree, meta, runtimes)
    phases = [_phase(s, p, ebs) for p in PHASES]
    for ph in phases:
        problems.extend(ph.pop("refusals"))
    # what stays attaches nothing that goes
    inside_storages = set(s.storages()) | set(s.undeclared_records())
    inside_instances = set(s.instances()) | set(s.launched_inside())
    seen = set()
    for n, inst in sorted(tree.instances.items()):
        if n in inside_instances:
            continue
        for mp in inst.storages:
            if mp.name in inside_storages:
                seen.add((n, mp.name))
                problems.append(Problem(*tree.at("instance", n, "storages"), message=(
                    "instance '%s' (outside environment '%s') attaches storage '%s', which the cascade of '%s' would "
                    "%s: detach it first" % (n, environment, mp.name, environment,
                                             phases[2]["storage_states"].get(mp.name, "destroy")))))
    # what a machine outside mounts now is its launch record's: a declaration that dropped the mount
    # is a detach not applied yet, and the storage phase would be refused with the instances gone
    for n, r in sorted(s.launched.items()):
        if n in inside_instances:
            continue
        for mnt in r.get("mounts") or []:
            if isinstance(mnt, dict) and mnt.get("storage") in inside_storages and (n, mnt["storage"]) not in seen:
                seen.add((n, mnt["storage"]))
                fix = ("apply its detach first (the instance-image lifecycle of its runtime)" if n in tree.instances
                       else "decommission it first")
                problems.append(Problem("meta-state/launch-params.yaml", "instances.%s" % n, (
                    "launched instance '%s' (outside environment '%s') mounts storage '%s', which the cascade would "
                    "destroy: %s" % (n, environment, mnt["storage"], fix))))
    for gb in phases[3]["destroy_identity"]:
        for g in sorted(x.name for x in tree.groups.values() if tree.group_builder_for(x) is tree.group_builders[gb]):
            users = _group_users(tree, meta, s, g, inside_storages, inside_instances)
            if users:
                problems.append(Problem(*tree.at("group", g), message=(
                    "group '%s' cannot be destroyed with the identity root of '%s' (environment '%s') while %s use "
                    "it: move them out of the group, or leave the group builder out of the environment"
                    % (g, gb, environment, ", ".join(users)))))
    return {"environment": environment, "runtimes": runtimes, "ebs": ebs, "phases": phases, "problems": problems}


def order_lines(cascade: Mapping[str, Any]) -> List[str]:
    """The cascade as the dry run prints it: the phases in order, each with its destroys and data steps."""
    lines = ["cascade of environment '%s' (runtimes: %s), leaves first:"
             % (cascade["environment"], ", ".join(cascade["runtimes"]) or "none")]
    for i, ph in enumerate(cascade["phases"], 1):
        what = []
        if ph["undeclare"]:
            what.append(("leave out %s (never applied)" if ph["phase"] == "storage" else "undeclare %s")
                        % ", ".join(ph["undeclare"]))
        if ph["storage_states"]:
            what.append("request %s" % ", ".join("%s %s" % kv for kv in sorted(ph["storage_states"].items())))
        if ph["destroy_identity"]:
            what.append("destroy the identity roots of %s" % ", ".join(ph["destroy_identity"]))
        lines.append("%d. %s (%s): %s" % (i, ph["phase"], ph["lifecycle"], "; ".join(what) or "nothing to do"))
        lines += ["     %s" % x for x in ph["steps"]]
        lines += ["     destroy %s" % x for x in ph["destroys"]]
    return lines


def apply_phase(tree: Any, meta: Mapping[str, Any], spec: Mapping[str, Any]) -> Tuple[Set[str], List[str], List[Problem]]:
    """Change the loaded ``tree`` for one phase of the cascade ``spec`` (``environment``, ``phase``,
    ``ebs``, ``approved``: the destroys the cascade's approval showed, or None). Returns the
    runtimes whose roots the phase renders (empty when it has nothing to do), the identity
    builders whose roots it destroys, and its problems."""
    phase = spec.get("phase")
    if phase not in PHASES:
        return set(), [], [Problem("", "cascade.phase", "phase must be one of %s, got %r" % (list(PHASES), phase))]
    full = plan_cascade(tree, meta, str(spec.get("environment")), str(spec.get("ebs") or "archived"))
    if full["problems"]:
        return set(), [], full["problems"]
    ph = full["phases"][PHASES.index(phase)]
    approved = spec.get("approved")
    if approved is not None:
        # its data steps too (an archive snapshot deleted, a bucket wiped): they destroy data as the destroys do
        extra = sorted(set(ph["destroys"] + ph["steps"]) - set(approved))
        if extra:
            return set(), [], [Problem("", "cascade.approved", (
                "the %s phase of the cascade of '%s' would %s, which its approval did not show (meta-state "
                "changed since): run playbooks/destroy_environment.yml again"
                % (phase, spec.get("environment"), "; ".join(("destroy " + x) if x in ph["destroys"] else x for x in extra))))]
    # a phase runs over what the earlier phases left: their changes hold in it too
    for earlier in full["phases"][:PHASES.index(phase) + 1]:
        for n in earlier["undeclare"]:
            if n in tree.instances:
                del tree.instances[n]
                if n not in tree.undeclared:
                    tree.undeclared.append(n)
            elif n in tree.storages:
                del tree.storages[n]
        for n, state in earlier["storage_states"].items():
            if n in tree.storages:
                tree.storages[n] = tree.storages[n].model_copy(update={"state": state})
    busy = bool(ph["destroys"] or ph["steps"])
    return (set(full["runtimes"]) if busy else set()), list(ph["destroy_identity"]), []


def narrow(tree: Any, meta: Mapping[str, Any], plans: List[RootPlan], runtimes: Set[str],
           destroy_identity: Sequence[str], environment: str) -> Tuple[List[RootPlan], List[Problem]]:
    """The roots one phase runs: those of the environment's ``runtimes``; an identity root of a
    builder in ``destroy_identity`` is emptied (no module call: its plan destroys
    ``module.identity``, whitelisted). A root that would replace something is refused (a
    cascade only destroys: finish or cancel the pending upgrade first)."""
    planner = RootPlanner(tree, meta, RenderOptions(dry_run=True))
    out, problems = [], []
    for p in plans:
        if p.runtime not in runtimes:
            continue
        if p.replace:
            problems.append(Problem("", p.directory, "the cascade of '%s' would replace %s in root %s-%s: a cascade "
                                    "only destroys; finish or cancel the pending upgrade first"
                                    % (environment, ", ".join(p.replace), p.lifecycle, p.builder)))
        if p.lifecycle == "identity" and p.builder in destroy_identity:
            gb = tree.group_builders[p.builder]
            main = "%s-%s.tf" % (gb.name, ROOT_PHASES["identity"])
            p.files[main] = document(HEADER, planner.terraform_block(gb, tree.backend_for(gb), needs_aws=False),
                                     comment_lines("identity builder %s is destroyed by the cascade of environment "
                                                   "'%s': no module call" % (gb.name, environment)))
            p.allow_destroy = ["module.identity"]
            # no provider left: nothing for the endpoint environment to stand in for
            p.endpoint_env = {}
            p.files.pop(ENDPOINT_ENV_FILE, None)
        out.append(p)
    return out, problems


def _root_builder(tree: Any, key: str) -> Tuple[str, Any]:
    for lifecycle, table in (("instance-image", tree.instance_builders), ("storage", tree.storage_builders),
                             ("identity", tree.group_builders)):
        if key.startswith(lifecycle + "-") and key[len(lifecycle) + 1:] in table:
            return lifecycle, table[key[len(lifecycle) + 1:]]
    return "", None


def cascade_of(config_root: str, environment: str, overlays: Sequence[str] = (), ebs: str = "archived",
               run_version: Any = None) -> Dict[str, Any]:
    """What ``csis_cascade`` returns: the tree validated as it is, then the cascade of
    ``environment`` (:func:`plan_cascade`), its order as printed lines, every destroy
    (``approved``: what the one approval covers), and the roots whose apply flag is off
    (``blocked``: a real cascade would plan them and stop). Raises :class:`ConfigError` with
    every refusal. Reads only."""
    from ..config.validate import load_and_validate
    from ..errors import ConfigError

    tree, meta = load_and_validate(config_root, overlays=overlays, run_version=run_version)
    full = plan_cascade(tree, meta, environment, ebs)
    if full["problems"]:
        raise ConfigError(full["problems"])
    planner = RootPlanner(tree, meta, RenderOptions())
    blocked = set()
    for ph in full["phases"]:
        for line in ph["destroys"] + ph["steps"]:
            key = line.split(":", 1)[0]
            lifecycle, builder = _root_builder(tree, key)
            if builder is not None and not planner.may_apply(lifecycle, builder):
                blocked.add(key)
    # what the one approval covers: every destroy and every data step (a cascade whose only work is
    # deleting archive snapshots destroys data all the same: it is asked for, audited, refused without)
    approved = [d for ph in full["phases"] for d in ph["destroys"] + ph["steps"]]
    # the cascade's one approval is its runner's own (each phase runs with csis_auto_approve): a tree
    # whose approval rules ask for another person, or for a merge, cannot run it to the end
    rules = []
    if tree.config_file.approvals.distinct_approver:
        rules.append("approvals.distinct_approver is set (cfg/_config.yml): every phase would be refused as "
                     "self-approved; destroy the environment's declarations through plan and apply jobs launched "
                     "by different people instead (docs/awx.md)")
    ws = tree.config_file.workspace
    if ws is not None and ws.require_merge:
        rules.append("workspace.require_merge is set (cfg/_config.yml): every phase would stop at its unmerged "
                     "delete_ branch; undeclare the environment's instances and storages and run the lifecycles, "
                     "merging each branch, instead")
    return {"environment": environment, "runtimes": full["runtimes"], "ebs": ebs, "phases": full["phases"],
            "lines": order_lines(full), "approved": approved, "blocked": sorted(blocked),
            "approval_rules": rules, "config_root": tree.root}
