# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The ephemeral machines of one applied instance root, as hosts to verify.

After the apply and its record, the ``csis.infra.tofu_root`` role verifies every ephemeral
machine still standing where it runs, then tears them down. :func:`targets` computes its
lists from the root as rendered (its ``ephemeral`` names and each instance's policy:
``on_failure``, ``skip_verify``/``skip_reason``), what the record step said of each
instance (``launched``/``standing``: the machine is up) and ``instance-state.yaml`` (the
recorded private address), read through the store. Reads only. Plain Python.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from .store import MetaState

#: what csis_record returns for an instance whose machine is up after the apply
STANDING = ("launched", "standing")


def host_vars_for(name: str, defaults: Optional[Mapping[str, Any]] = None,
                  per_host: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Dict[str, Any]:
    """The host variables of machine ``name``: ``defaults``, then its own ``per_host[name]``
    over them (key by key, not deep)."""
    out = dict(defaults or {})
    out.update((per_host or {}).get(name) or {})
    return out


def targets(config_root: str, root: Mapping[str, Any], recorded: Optional[Mapping[str, Any]] = None,
            connection: str = "ssh", defaults: Optional[Mapping[str, Any]] = None,
            per_host: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Dict[str, Any]:
    """The ephemeral machines of ``root`` (an element of csis_render's ``roots``).

    ``recorded``: the record step's ``instances`` (name -> what was recorded). Returns

    * ``standing``: the ephemeral machines up after the apply (the teardown's subjects);
    * ``verify``: those to verify, each ``{name, address, connection, instance_id, vars}``
      (``address``: the recorded private IP, else the name; ``vars``: :func:`host_vars_for`;
      ``connection``: ``vars.ansible_connection``, else ``connection``);
    * ``host_vars``: every ``{host, key, value}`` of the ``verify`` machines' ``vars``;
    * ``skipped``: the standing machines torn down without re-verifying, ``{name, reason}``;
    * ``keep_on_failure``: the ephemeral machines whose failed verdict keeps them standing.
    """
    names: List[str] = list(root.get("ephemeral") or [])
    policy: Mapping[str, Any] = root.get("instances") or {}
    recorded = recorded or {}
    standing = [n for n in names if recorded.get(n) in STANDING]
    skipped = [{"name": n, "reason": (policy.get(n) or {}).get("skip_reason")
                or "Ephemeral instance %s: torn down without re-verifying" % n}
               for n in standing if (policy.get(n) or {}).get("skip_verify")]
    skip = {s["name"] for s in skipped}
    to_verify = [n for n in standing if n not in skip]
    states = MetaState(config_root).load("instance-state.yaml")["instances"] if to_verify else {}
    verify = []
    for name in to_verify:
        current = (states.get(name) or {}).get("current") or {}
        hvars = host_vars_for(name, defaults, per_host)
        verify.append({"name": name, "address": current.get("private_ip") or name,
                       "connection": hvars.get("ansible_connection") or connection,
                       "instance_id": current.get("instance_id"), "vars": hvars})
    return {
        "standing": standing,
        "verify": verify,
        "host_vars": [{"host": t["name"], "key": k, "value": v} for t in verify for k, v in t["vars"].items()],
        "skipped": skipped,
        "keep_on_failure": [n for n in names if (policy.get(n) or {}).get("on_failure") == "keep"],
    }
