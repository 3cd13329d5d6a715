# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The roots of a lifecycle: the one entry point of root planning."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Type

from ..config import secrets
from ..config.loader import Tree
from .identity_roots import IdentityRoots
from .instance_roots import InstanceRoots
from .plan import LIFECYCLES, RenderOptions, RootPlan, RootPlanner, endpoint_env_file
from .storage_roots import StorageRoots

PLANNERS: Dict[str, Type[RootPlanner]] = {
    "identity": IdentityRoots,
    "storage": StorageRoots,
    "instance-image": InstanceRoots,
}


def plan_roots(tree: Tree, meta: Mapping[str, Any], lifecycle: str, opts: RenderOptions) -> List[RootPlan]:
    """Every root of ``lifecycle`` as data (pure: nothing is read or written)."""
    planner = PLANNERS.get(lifecycle)
    if planner is None:
        raise ValueError("unknown lifecycle %r (one of %s)" % (lifecycle, ", ".join(LIFECYCLES)))
    roots = planner(tree, meta, opts).roots()
    for root in roots:
        root.required_tags = list(tree.config.required_tags)
        runtime = tree.runtimes.get(root.runtime) if root.runtime else None
        root.secrets = secrets.tf_secrets(runtime) if runtime is not None else {}
        # the endpoint environment, kept in the root for every terraform run there (terraform_env)
        root.files.update(endpoint_env_file(root.endpoint_env))
    return roots
