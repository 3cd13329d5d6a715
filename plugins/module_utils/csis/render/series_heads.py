# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Series heads: the newest self-owned AMI whose name starts with an image's
``name_pattern`` on a runtime. A network call, so it runs in its own step of the render
role (``csis.infra.csis_series_heads``) and reaches ``csis_render`` as a parameter:
validation stays offline.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from .. import aws
from ..config.loader import Tree
from ..config.secrets import Reveal
from ..errors import CsisError


def head_key(image: str, runtime: str) -> str:
    return "%s@%s" % (image, runtime)


def image_and_runtime(tree: Tree, inst: Any) -> Tuple[Any, Any]:
    """(image, runtime) an instance is launched from and on: either None when not declared."""
    b = tree.instance_builder_for(inst) if inst is not None else None
    return (tree.image_of(inst) if inst is not None else None), (tree.builder_runtime(b) if b else None)


def wanted_series(tree: Tree, instances: Optional[Iterable[str]] = None, everything: bool = False
                  ) -> List[Tuple[str, str, str]]:
    """(image, runtime, name_pattern) of the images whose head matters: those of ``follow``
    instances (and of ``instances``, e.g. an explicit upgrade), or all with ``everything``."""
    names = set(instances or ())
    out = set()
    for inst in tree.instances.values():
        if not (everything or inst.image_policy == "follow" or inst.name in names):
            continue
        img, rt = image_and_runtime(tree, inst)
        if img is None or rt is None or not img.name_pattern:
            continue
        out.add((img.name, rt.name, img.name_pattern))
    return sorted(out)


def newest_image(ec2: Any, pattern: str) -> Optional[Dict[str, Any]]:
    imgs = ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [pattern + "*"]},
                                                         {"Name": "state", "Values": ["available"]}]).get("Images") or []
    imgs = [i for i in imgs if str(i.get("Name", "")).startswith(pattern)]
    if not imgs:
        return None
    return sorted(imgs, key=lambda i: (str(i.get("CreationDate") or ""), str(i.get("Name") or "")))[-1]


def series_heads(tree: Tree, instances: Optional[Iterable[str]] = None, everything: bool = False,
                 client_for: Any = None, reveal: Optional[Reveal] = None) -> Dict[str, Any]:
    """``{"<image>@<runtime>": {"ami_id", "name", "creation_date"}}`` for every wanted series
    (a runtime's static keys revealed by ``reveal``: ``aws.tree_access``)."""
    heads: Dict[str, Any] = {}
    clients: Dict[str, Any] = {}
    for image, runtime, pattern in wanted_series(tree, instances, everything):
        if runtime not in clients:
            clients[runtime] = client_for(runtime) if client_for else aws.client("ec2", aws.tree_access(tree, runtime, reveal))
        got = newest_image(clients[runtime], pattern)
        if got:
            heads[head_key(image, runtime)] = {"ami_id": got["ImageId"], "name": got.get("Name"),
                                               "creation_date": got.get("CreationDate")}
    return heads


class UpgradeTargetError(CsisError):
    """The build an upgrade asks for cannot be what the instance is replaced onto."""


def check_upgrade_target(tree: Tree, instance: str, ami: str, client_for: Any = None,
                         reveal: Optional[Reveal] = None, outcome: str = "not marked",
                         unchecked: Optional[str] = None) -> Dict[str, Any]:
    """Refuse (:class:`UpgradeTargetError`) an upgrade's ``to`` build that the instance's
    replacement cannot boot: not an AMI of the instance's runtime (a typo: the instance module
    replaces delete-then-create, so the apply would terminate the machine, then fail to launch
    its successor), not ``available``, or not a build of the instance's image (its name does
    not start with the image's ``name_pattern``, as the series heads read it). Returns the
    image's ``{ami_id, name, creation_date}``. ``outcome`` ends each message (what was not done);
    ``unchecked`` (default ``outcome``) ends the message of a lookup that failed (no access, the
    endpoint down): the build may well be there."""
    inst = tree.instances.get(instance)
    if inst is None:
        raise UpgradeTargetError("instance '%s' is not declared: nothing to check the build %s against" % (instance, ami))
    img, rt = image_and_runtime(tree, inst)
    if img is None or rt is None:
        raise UpgradeTargetError("instance '%s': its image or runtime is not declared: nothing to check the build %s "
                                 "against" % (instance, ami))
    try:
        ec2 = client_for(rt.name) if client_for else aws.client("ec2", aws.tree_access(tree, rt.name, reveal))
        imgs = ec2.describe_images(ImageIds=[ami]).get("Images") or []
    except Exception as exc:  # noqa: BLE001 - absent, or said as it is
        if aws.error_code(exc) in ("InvalidAMIID.NotFound", "InvalidAMIID.Malformed", "InvalidAMIID.Unavailable"):
            imgs = []
        else:
            raise UpgradeTargetError("instance '%s': the build %s cannot be looked up on runtime %s: %s; %s"
                                     % (instance, ami, rt.name, aws.error_text(exc),
                                        outcome if unchecked is None else unchecked)) from exc
    if not imgs:
        raise UpgradeTargetError("instance '%s': there is no AMI %s on runtime %s (region %s): replaced onto it, the "
                                 "machine would be terminated and its successor never launched; %s"
                                 % (instance, ami, rt.name, rt.region, outcome))
    got = imgs[0]
    if got.get("State") != "available":
        raise UpgradeTargetError("instance '%s': AMI %s (%s) is %s, not available; %s"
                                 % (instance, ami, got.get("Name"), got.get("State"), outcome))
    name = str(got.get("Name") or "")
    if img.name_pattern and not name.startswith(img.name_pattern):
        raise UpgradeTargetError("instance '%s': AMI %s is %r, not a build of its image '%s' (whose builds' names start "
                                 "with %r); %s" % (instance, ami, name, img.name, img.name_pattern, outcome))
    return {"ami_id": ami, "name": name, "creation_date": got.get("CreationDate")}


def onto_the_same_build(tree: Tree, instance: str, pin: Optional[str], to: Optional[str] = None,
                        client_for: Any = None, reveal: Optional[Reveal] = None) -> Optional[str]:
    """The warning for an upgrade that replaces ``instance`` onto the build it runs (``pin``): ``to``,
    or without it the image's series head, as the next run reads it. A replacement onto the same
    build is a new machine all the same (a re-provision), so it is said, not refused. None when the
    build differs or the head cannot be told."""
    if not pin:
        return None
    if to:
        target, which = to, "the build asked for"
    else:
        img, rt = image_and_runtime(tree, tree.instances.get(instance))
        if img is None or rt is None:
            return None
        target = head_ami(series_heads(tree, instances=[instance], client_for=client_for, reveal=reveal),
                          img.name, rt.name)
        which = "its image's series head"
    if target != pin:
        return None
    return ("instance '%s' runs %s already, %s: the upgrade replaces the machine onto the same build (a new "
            "generation: a new machine, its root disk afresh); cancel it with -e cancel=true if that is not what "
            "you meant" % (instance, pin, which))


def head_ami(heads: Optional[Mapping[str, Any]], image: str, runtime: str) -> Optional[str]:
    h = (heads or {}).get(head_key(image, runtime))
    if isinstance(h, dict):
        return h.get("ami_id")
    return h if isinstance(h, str) else None
