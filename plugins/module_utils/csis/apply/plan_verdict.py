# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What a saved plan would do, read from its ``show -json``: every resource change
classified (create, update, delete, replace, forget), every destroy checked against the
whitelist, the summary line, the diff-mode text and the digest of the changes.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from ..errors import GateError
from ..state.store import find_secrets
from .whitelist import Whitelist, parse_address

KNOWN_ACTIONS = {"no-op", "create", "read", "update", "delete", "forget"}

#: what the approver reads instead of a value terraform marks sensitive (or that looks like a secret)
MASKED = "(sensitive value)"
#: an attribute whose new value terraform will only know after the apply
UNKNOWN = "(known after apply)"
#: a shown value is cut at this many characters
VALUE_WIDTH = 160
#: the approver's listing shows at most this many lines per root (the artifact has every change)
CHANGE_LINES_MAX = 400
_SIGNS = {"create": "+", "update": "~", "delete": "-", "replace": "-/+", "forget": ".", "move": ">", "import": "<="}
_WORDS = {"create": "create", "update": "update in place", "delete": "destroy", "forget": "forget (removed from state, left in place)",
          "move": "move (the same object under a new address)", "import": "import (an existing object taken into the state)"}
#: why terraform destroys or replaces (``action_reason``), as the approver reads it; a replacement
#: forced by an attribute says which (``replace_paths``) instead
REASONS = {
    "replace_because_tainted": "tainted",
    "replace_by_request": "replacement requested (-replace)",
    "replace_by_triggers": "replace_triggered_by",
    "delete_because_no_resource_config": "no longer in the configuration",
    "delete_because_no_module": "its module is no longer in the configuration",
    "delete_because_wrong_repetition": "count or for_each changed how it repeats",
    "delete_because_count_index": "its count index is past the count",
    "delete_because_each_key": "its for_each key is gone",
    "delete_because_no_move_target": "moved to an address the configuration does not have",
}


@dataclass
class PlanVerdict:
    creates: List[str] = field(default_factory=list)
    updates: List[str] = field(default_factory=list)
    deletes: List[str] = field(default_factory=list)      # pure destroys
    replaces: List[str] = field(default_factory=list)     # delete+create in either order
    forgets: List[str] = field(default_factory=list)      # removed from state, object kept
    moves: List[str] = field(default_factory=list)        # moved, no other change ("<address> (moved from <old>)")
    imports: List[str] = field(default_factory=list)      # imported (some also updated: in updates too)
    outputs: List[str] = field(default_factory=list)      # root outputs the apply changes
    output_actions: Dict[str, List[str]] = field(default_factory=dict)  # their terraform actions (the listing's word)
    failed_checks: List[str] = field(default_factory=list)  # check blocks and conditions that fail (warnings)
    whitelisted: List[Dict[str, str]] = field(default_factory=list)
    violations: List[str] = field(default_factory=list)
    details: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def adds(self) -> int:
        return len(self.creates) + len(self.replaces)

    @property
    def changes(self) -> int:
        return len(self.updates)

    @property
    def destroys(self) -> int:
        return len(self.deletes) + len(self.replaces)

    @property
    def outputs_only(self) -> bool:
        """Whether root outputs are all the plan changes (the summary and the listing name them then;
        beside resource changes they follow from those, as terraform's own summary line leaves them out)."""
        return bool(self.outputs) and not (self.details or self.forgets)

    def summary(self) -> str:
        text = "Plan: %d to add, %d to change, %d to destroy" % (self.adds, self.changes, self.destroys)
        if self.replaces:
            text += " (%d replacement%s)" % (len(self.replaces), "" if len(self.replaces) == 1 else "s")
        extra: List[str] = []
        if self.forgets:
            extra.append("%d to forget (removed from state, not destroyed)" % len(self.forgets))
        if self.imports:
            extra.append("%d to import" % len(self.imports))
        if self.moves:
            extra.append("%d to move" % len(self.moves))
        if self.outputs_only:
            extra.append("output%s changed: %s" % ("" if len(self.outputs) == 1 else "s", ", ".join(self.outputs)))
        if self.failed_checks:
            n = len(self.failed_checks)
            extra.append("%d check%s failing: %s" % (n, "" if n == 1 else "s", ", ".join(self.failed_checks)))
        if self.whitelisted:
            by: List[str] = []
            for w in self.whitelisted:
                if w["entry"] not in by:
                    by.append(w["entry"])
            n = len(self.whitelisted)
            extra.append("%d destroy%s whitelisted by %s" % (n, "" if n == 1 else "s", ", ".join(by)))
        destroy_violations = [v for v in self.violations if v.startswith("DESTROY NOT WHITELISTED")]
        if destroy_violations:
            n = len(destroy_violations)
            extra.append("%d destroy%s NOT whitelisted" % (n, "" if n == 1 else "s"))
        if extra:
            text += "; " + "; ".join(extra)
        return text

    def as_result(self) -> Dict[str, Any]:
        return {
            "adds": self.adds,
            "changes": self.changes,
            "destroys": self.destroys,
            "replacements": len(self.replaces),
            "forgets": len(self.forgets),
            "moves": len(self.moves),
            "imports": len(self.imports),
            "outputs": list(self.outputs),
            "failed_checks": list(self.failed_checks),
            "addresses": {
                "create": list(self.creates),
                "update": list(self.updates),
                "delete": list(self.deletes),
                "replace": list(self.replaces),
                "forget": list(self.forgets),
                "move": list(self.moves),
                "import": list(self.imports),
            },
            "whitelisted": [dict(w) for w in self.whitelisted],
            "violations": list(self.violations),
            "summary": self.summary(),
        }


def recorded_create_message(shown: str) -> str:
    return ("RECORDED STORAGE WOULD BE CREATED: %s: meta-state records this storage as existing, so its "
            "resource is gone from reality or from the terraform state; a new one would be empty. Run "
            "playbooks/state_query.yml, then forget.yml (gone for good) or state_import.yml (replaced) "
            "(docs/drift.md)" % shown)


#: the attributes that make a planned resource taggable (``tags_all``: with the provider's default tags)
TAG_ATTRIBUTES = ("tags_all", "tags")


def missing_tags_message(shown: str, lacking: Iterable[str]) -> str:
    return "MISSING REQUIRED TAGS: %s lacks %s" % (shown, ", ".join(lacking))


def missing_tags(change: Mapping[str, Any], required: Iterable[str]) -> List[str]:
    """The keys of ``required`` that the planned object of ``change`` lacks, when it is taggable
    (its ``after`` has a ``tags_all`` or ``tags`` attribute, known or not); else none.

    A key counts when it is in the known ``tags_all`` or ``tags`` with a value that is not empty,
    or marked in ``after_unknown`` as a key whose value is known only after the apply; a whole map
    known only after the apply names no key (the plan cannot show the tag is there)."""
    after = change.get("after") if isinstance(change.get("after"), Mapping) else {}
    unknown = change.get("after_unknown") if isinstance(change.get("after_unknown"), Mapping) else {}
    if not any(a in after or a in unknown for a in TAG_ATTRIBUTES):
        return []
    keys = set()
    for a in TAG_ATTRIBUTES:
        known, later = after.get(a), unknown.get(a)
        if isinstance(known, Mapping):
            keys.update(str(k) for k, v in known.items() if str(v if v is not None else "").strip())
        if isinstance(later, Mapping):
            keys.update(str(k) for k, v in later.items() if v)
    return [k for k in required if k not in keys]


def _covers(entry: str, address: str) -> bool:
    return address == entry or address.startswith(entry + "[")


def evaluate_plan(plan: Mapping[str, Any], allow_destroy: Iterable[str] = (),
                  refuse_create: Iterable[str] = (), required_tags: Iterable[str] = ()) -> PlanVerdict:
    """Classify ``plan["resource_changes"]`` and check every destroy against ``allow_destroy``.

    ``refuse_create``: addresses of resources that must never be created (the volume, filesystem
    or bucket of a storage meta-state records as existing): a create of one is a violation
    (a replacement is a destroy, and the whitelist decides).
    ``required_tags``: tag keys every taggable resource being created, updated or replaced must
    carry (:func:`missing_tags`); each that lacks one is a violation."""
    if not isinstance(plan, Mapping) or "format_version" not in plan:
        raise GateError("not a terraform plan in JSON (no format_version): pass the output of `show -json <plan>`")
    if str(plan["format_version"]).split(".", maxsplit=1)[0] != "1":
        raise GateError("plan JSON format_version %r is not one this gate reads (1.x): pass the output of "
                        "`show -json <plan>` of terraform or OpenTofu 1.x" % (plan["format_version"],))
    if "values" in plan and "planned_values" not in plan and "resource_changes" not in plan:
        raise GateError("this is a state in JSON (`show -json` without a plan file), not a plan: pass the output of "
                        "`show -json <plan>`")
    if "errored" in plan and not isinstance(plan["errored"], bool):
        raise GateError("the plan's errored must be true or false, got %s" % type(plan["errored"]).__name__)
    failing = failed_checks(plan)
    if plan.get("errored"):
        raise GateError("the plan is marked errored: terraform could not finish planning%s"
                        % ("; failing: %s" % ", ".join(failing) if failing else ""))
    entries = list(allow_destroy or ())
    for e in entries:
        try:
            parse_address(e)
        except ValueError as exc:
            raise GateError("allow_destroy entry %r is not a terraform address: %s" % (e, exc))
    whitelist = Whitelist(entries)
    refuse = [e for e in refuse_create or () if e]
    required = [t for t in required_tags or () if t]
    verdict = PlanVerdict(failed_checks=failing, outputs=changed_outputs(plan), output_actions=_output_actions(plan))
    changes = plan.get("resource_changes")
    if changes is None:
        changes = []
    if not isinstance(changes, list):
        raise GateError("resource_changes must be a list of objects, got %s" % type(changes).__name__)
    for index, rc in enumerate(changes):
        if not isinstance(rc, Mapping):  # (never its value in a message: it may hold a secret)
            raise GateError("resource_changes[%d] is a %s, not an object" % (index, type(rc).__name__))
        address = rc.get("address")
        if not isinstance(address, str) or not address:
            raise GateError("resource_changes[%d] has no address (its keys: %s)" % (index, ", ".join(sorted(map(str, rc)))))
        previous = rc.get("previous_address")
        moved = previous if isinstance(previous, str) and previous and previous != address else None
        change = rc.get("change") or {}
        if not isinstance(change, Mapping):
            raise GateError("resource_changes[%d] (%s): change must be an object, got %s"
                            % (index, address, type(change).__name__))
        raw_actions = change.get("actions") or []
        if not isinstance(raw_actions, list) or not all(isinstance(a, str) for a in raw_actions):
            raise GateError("resource_changes[%d] (%s): change.actions must be a list of strings, got %s"
                            % (index, address, json.dumps(raw_actions, default=str)))
        if not isinstance(change.get("replace_paths") or [], list):
            raise GateError("resource_changes[%d] (%s): change.replace_paths must be a list, got %s"
                            % (index, address, type(change["replace_paths"]).__name__))
        actions = list(raw_actions)
        deposed = rc.get("deposed")
        shown = address + (" (deposed object %s)" % deposed if deposed else "") + (" (moved from %s)" % moved if moved else "")
        importing = change.get("importing") if isinstance(change.get("importing"), Mapping) else None
        unknown = [a for a in actions if a not in KNOWN_ACTIONS]
        if unknown or not actions:
            verdict.violations.append(
                "PLAN ACTION NOT UNDERSTOOD: %s has actions %s; refusing" % (shown, json.dumps(actions)))
            continue
        acts = set(actions)
        kind: Optional[str] = None
        if "delete" in acts:
            kind = "replace" if "create" in acts else "delete"
        elif "forget" in acts:
            kind = "forget"
            if "create" in acts:  # create-then-forget (lifecycle destroy = false + replace)
                verdict.creates.append(shown)
        elif "create" in acts:
            kind = "create"
        elif "update" in acts:
            kind = "update"
        elif importing is not None and "read" not in acts:
            kind = "import"
        elif moved and "read" not in acts:
            kind = "move"
        else:  # read / no-op
            continue
        if importing is not None and kind != "import":
            verdict.imports.append(shown)
        {"create": verdict.creates, "update": verdict.updates, "delete": verdict.deletes,
         "replace": verdict.replaces, "forget": verdict.forgets, "move": verdict.moves,
         "import": verdict.imports}[kind].append(shown)
        detail = {"address": shown, "actions": actions, "kind": kind,
                  "attributes": attribute_changes(change, kind)}
        if rc.get("action_reason"):
            detail["action_reason"] = rc.get("action_reason")
        if importing is not None and kind != "import":
            detail["imported"] = True
        if change.get("replace_paths"):
            detail["replace_paths"] = [".".join(str(x) for x in p) for p in change["replace_paths"] if isinstance(p, list)]
        verdict.details.append(detail)
        if "create" in acts and kind != "replace" and any(_covers(e, address) for e in refuse):
            verdict.violations.append(recorded_create_message(shown))
        if required and kind in ("create", "update", "replace") and rc.get("mode", "managed") == "managed":
            lacking = missing_tags(change, required)
            if lacking:
                verdict.violations.append(missing_tags_message(shown, lacking))
        if kind in ("delete", "replace"):
            # a moved object is destroyed where it was: the whitelist must cover that address too
            # (a moved block into a whitelisted address would otherwise carry any object out)
            try:
                entry = whitelist.covering(address)
                before_move = whitelist.covering(moved) if moved else entry
            except ValueError as exc:
                raise GateError("cannot parse plan address %r: %s" % (moved or address, exc))
            reason = REASONS.get(str(rc.get("action_reason") or ""))
            if entry is None or before_move is None:
                verdict.violations.append("DESTROY NOT WHITELISTED: %s%s" % (shown, " (%s)" % reason if reason else ""))
            else:
                verdict.whitelisted.append({"address": shown, "entry": entry, "kind": kind})
    return verdict


def failed_checks(plan: Mapping[str, Any]) -> List[str]:
    """The addresses of the check blocks and conditions terraform found failing (``checks``:
    ``status`` ``fail`` or ``error``), for the approver: terraform applies in spite of them."""
    out: List[str] = []
    checks = plan.get("checks")
    for check in checks if isinstance(checks, list) else []:
        if not isinstance(check, Mapping):
            continue
        instances = check.get("instances")
        for inst in instances if isinstance(instances, list) and instances else [check]:
            if isinstance(inst, Mapping) and inst.get("status") in ("fail", "error"):
                name = _display(inst.get("address")) or _display(check.get("address"))
                if name and name not in out:
                    out.append(name)
    return out


def _display(address: Any) -> Optional[str]:
    """A check's ``to_display`` when it is an address (a short string), else None."""
    shown = address.get("to_display") if isinstance(address, Mapping) else None
    return shown if isinstance(shown, str) and 0 < len(shown) <= 300 else None


def _output_actions(plan: Mapping[str, Any]) -> Dict[str, List[str]]:
    """``{name: actions}`` of the root outputs the apply would change (``output_changes`` other
    than no-op)."""
    changes = plan.get("output_changes")
    if not isinstance(changes, Mapping):
        return {}
    out = {}
    for name, oc in changes.items():
        actions = oc.get("actions") if isinstance(oc, Mapping) else None
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise GateError("output_changes[%s].actions must be a list of strings" % json.dumps(str(name)))
        if actions not in ([], ["no-op"]):
            out[str(name)] = list(actions)
    return out


def changed_outputs(plan: Mapping[str, Any]) -> List[str]:
    """The root outputs the apply would change: a plan of only those still has something to apply
    (a module's new output a later root reads)."""
    return sorted(_output_actions(plan))


def _output_line(name: str, actions: Sequence[str]) -> str:
    """The listing's line of a changed root output: added, removed, or changes."""
    if list(actions) == ["create"]:
        return "+ output.%s: added" % name
    if list(actions) == ["delete"]:
        return "- output.%s: removed" % name
    return "~ output.%s: changes" % name


def _marked(marks: Any) -> bool:
    """Whether a ``*_sensitive`` / ``after_unknown`` mark structure marks anything."""
    if marks is True:
        return True
    if isinstance(marks, Mapping):
        return any(_marked(v) for v in marks.values())
    if isinstance(marks, list):
        return any(_marked(v) for v in marks)
    return False


def masked_outputs(outputs: Any) -> Any:
    """``terraform output -json`` as ``community.general.terraform`` returns it after an apply
    (``{name: {sensitive, type, value}}``), with the value of every output terraform marks
    sensitive, or that looks like a secret, replaced by :data:`MASKED`: terraform prints those
    values in clear, and the apply's result goes to the console at ``-v`` and to AWX's job
    events. Anything else is returned as it is."""
    if not isinstance(outputs, Mapping):
        return outputs
    shown: Dict[str, Any] = {}
    for name, output in outputs.items():
        if isinstance(output, Mapping) and "value" in output and (
                output.get("sensitive") or find_secrets({str(name): output.get("value")})):
            output = dict(output, value=MASKED)
        shown[name] = output
    return shown


def _shown_value(name: str, value: Any, sensitive: bool) -> str:
    if sensitive or find_secrets({name: value}):
        return MASKED
    text = json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str)
    if len(text) > VALUE_WIDTH:
        text = "%s... (%d characters)" % (text[:VALUE_WIDTH], len(text))
    return text


def attribute_changes(change: Mapping[str, Any], kind: str) -> List[Dict[str, str]]:
    """The top-level attributes a change sets or changes, as the approver reads them:
    ``[{"name", "before", "after"}]`` (shown text; sensitive values and secret-shaped ones
    :data:`MASKED`, values terraform knows only after the apply :data:`UNKNOWN`).

    A create lists the values it sets (not the null ones, nor those only known after the
    apply); an update or a replacement what differs; a destroy or a forget nothing."""
    if kind in ("delete", "forget"):
        return []
    before = change.get("before") if isinstance(change.get("before"), Mapping) else {}
    after = change.get("after") if isinstance(change.get("after"), Mapping) else {}
    unknown = change.get("after_unknown") if isinstance(change.get("after_unknown"), Mapping) else {}
    b_sens, a_sens = change.get("before_sensitive"), change.get("after_sensitive")
    out: List[Dict[str, str]] = []
    for name in sorted(set(before) | set(after) | set(unknown)):
        b, a, u = before.get(name), after.get(name), _marked(unknown.get(name))
        sens = (b_sens is True or a_sens is True
                or (isinstance(b_sens, Mapping) and _marked(b_sens.get(name)))
                or (isinstance(a_sens, Mapping) and _marked(a_sens.get(name))))
        if kind == "create":
            if u or a is None or a == {} or a == []:
                continue
            out.append({"name": name, "before": "", "after": _shown_value(name, a, sens)})
        elif b != a or u:
            out.append({"name": name, "before": "null" if b is None and not sens else _shown_value(name, b, sens),
                        "after": UNKNOWN if u else _shown_value(name, a, sens)})
    return out


def change_lines(verdict: "PlanVerdict", limit: int = CHANGE_LINES_MAX) -> List[str]:
    """Every touched address with its action and the attributes it changes (what the approver
    reads; at most ``limit`` lines, the last one saying how many were left out)."""
    lines: List[str] = []
    for d in sorted(verdict.details, key=lambda x: x["address"]):
        kind = d["kind"]
        word = _WORDS.get(kind) or ("replace (%s)" % " then ".join(d["actions"]))
        head = "%s %s: %s" % (_SIGNS.get(kind, "?"), d["address"], word)
        if d.get("imported"):
            head += ", imported first"
        if d.get("replace_paths"):
            head += "; forced by %s" % ", ".join(d["replace_paths"])
        elif kind in ("delete", "replace") and REASONS.get(str(d.get("action_reason") or "")):
            head += "; because %s" % REASONS[str(d["action_reason"])]
        lines.append(head)
        for a in d.get("attributes") or []:
            if kind == "create":
                lines.append("    %s = %s" % (a["name"], a["after"]))
            else:
                lines.append("    %s: %s -> %s" % (a["name"], a["before"], a["after"]))
    lines += [_output_line(name, verdict.output_actions.get(name) or ["update"])
              for name in (verdict.outputs if verdict.outputs_only else [])]
    lines += ["! %s: check failing (terraform applies in spite of it)" % name for name in verdict.failed_checks]
    if len(lines) > limit:
        cut = len(lines) - (limit - 1)
        lines = lines[:limit - 1] + ["... %d more line(s): the plan job's csis_plan_changes artifact has every change" % cut]
    return lines


def plan_content_digest(plan: Mapping[str, Any], storage_steps: Iterable[Mapping[str, Any]] = ()) -> str:
    """sha256 over what the plan would do: every resource change that is not a no-op (a move or
    an import is one), with its address, actions and before/after values (unknowns and
    sensitivity marks included; the address it is moved from, what it imports), the root outputs
    when they are all the plan changes (beside resource changes they follow from those: left out,
    so an ordinary plan digests as it did before outputs were read), and the root's storage
    steps that touch data (``storage_steps``: the render's transitions other than ``record``,
    such as ``delete_archive_snapshot``, which the plan does not show).

    Two plans with equal digests make the same changes; the AWX approval binds the apply job
    to the plan job's digest (a plan that creates the same address with other values differs,
    and so does an empty plan whose root would delete an archive snapshot). Without storage
    steps the digest is the plan's alone, as before they were part of it."""
    changes: Any = []
    for rc in plan.get("resource_changes") or []:
        change = rc.get("change") or {}
        actions = list(change.get("actions") or [])
        moved = rc.get("previous_address") if rc.get("previous_address") != rc.get("address") else None
        if actions == ["no-op"] and not moved and not change.get("importing"):
            continue
        changes.append({k: v for k, v in (
            ("address", rc.get("address")), ("deposed", rc.get("deposed")), ("actions", actions),
            ("previous_address", moved), ("importing", change.get("importing")),
            ("before", change.get("before")), ("after", change.get("after")),
            ("after_unknown", change.get("after_unknown")), ("before_sensitive", change.get("before_sensitive")),
            ("after_sensitive", change.get("after_sensitive"))) if v is not None})
    changes.sort(key=lambda c: (str(c.get("address")), str(c.get("deposed") or "")))
    outputs = plan.get("output_changes") if isinstance(plan.get("output_changes"), Mapping) else {}
    for name in ([] if changes else changed_outputs(plan)):
        oc = outputs[name]
        changes.append({k: v for k, v in (
            ("output", name), ("actions", list(oc.get("actions") or [])), ("after", oc.get("after")),
            ("after_unknown", oc.get("after_unknown")), ("after_sensitive", oc.get("after_sensitive"))) if v is not None})
    steps = sorted(json.dumps(dict(step), sort_keys=True, separators=(",", ":"), default=str)
                   for step in storage_steps or ())
    if steps:
        changes = {"changes": changes, "storage_steps": steps}
    blob = json.dumps(changes, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def plan_diff(verdict: PlanVerdict) -> Dict[str, str]:
    """``before``/``after`` text for Ansible's diff mode (one line per touched address)."""
    before: List[str] = []
    after: List[str] = []
    for d in verdict.details:
        a, kind = d["address"], d["kind"]
        if kind == "create":
            after.append("%s (created)" % a)
        elif kind == "update":
            before.append(a)
            after.append("%s (updated in place)" % a)
        elif kind == "delete":
            before.append(a)
        elif kind == "replace":
            before.append(a)
            after.append("%s (replaced: %s)" % (a, " then ".join(d["actions"])))
        elif kind == "forget":
            before.append(a)
            after.append("%s (forgotten: left in place, no longer managed)" % a)
        elif kind == "move":
            after.append("%s (moved)" % a)
        elif kind == "import":
            after.append("%s (imported)" % a)
    return {
        "before_header": "resources touched by the plan (now)",
        "after_header": "resources after the plan (%s)" % verdict.summary(),
        "before": "".join(x + "\n" for x in sorted(before)),
        "after": "".join(x + "\n" for x in sorted(after)),
    }
