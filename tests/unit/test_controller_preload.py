# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""What the controller does before it forks a task's worker (plugins/plugin_utils/controller.py,
module_utils/csis/aws.py ``preload``): defining an action plugin's class imports its module, and
a plugin that names AWS services leaves boto3's models in the process's one data loader, which
every later client uses. No endpoint is reached: building a client makes no call."""
from __future__ import annotations

import importlib
import sys

from ansible_collections.csis.infra.plugins.module_utils.csis import aws

MODULES = "ansible_collections.csis.infra.plugins.modules."


def test_defining_the_action_class_imports_its_module() -> None:
    sys.modules.pop(MODULES + "csis_gate_plan", None)
    importlib.reload(importlib.import_module("ansible_collections.csis.infra.plugins.action.csis_gate_plan"))
    assert MODULES + "csis_gate_plan" in sys.modules


def test_clients_share_one_loader_with_the_preloaded_models() -> None:
    importlib.import_module("ansible_collections.csis.infra.plugins.action.csis_storage_check")  # preloads ec2, efs, s3
    loader = aws._LOADER["loader"]  # pylint: disable=protected-access
    paths = list(loader.search_paths)
    for _attempt in range(3):
        ec2 = aws.client("ec2", {"region": "us-east-2", "endpoints": {"ec2": "http://127.0.0.1:9"}})
    s3 = aws.client("s3", {"region": "us-east-2"})
    # the clients' sessions read their models from the loader the controller filled
    assert ec2._loader is loader and s3._loader is loader  # pylint: disable=protected-access
    assert loader.search_paths == paths  # boto3's own data directory is not appended per client
    assert ec2.meta.endpoint_url == "http://127.0.0.1:9" and ec2.meta.region_name == "us-east-2"


def test_each_service_is_preloaded_once_per_process(monkeypatch) -> None:
    """Five action plugins name s3 or ec2: the controller builds one placeholder client per
    service, not one per plugin (about 0.2 s of CPU each)."""
    built = []
    monkeypatch.setattr(aws, "_PRELOADED", set())
    monkeypatch.setattr(aws, "client", lambda service, access: built.append(service))
    aws.preload(("ec2", "efs", "s3"))
    aws.preload(("s3",))
    aws.preload(("ec2", "s3"))
    assert built == ["ec2", "efs", "s3"]


def test_defining_the_action_class_freezes_what_the_controller_holds() -> None:
    """After the imports, ``gc.freeze()``: the controller's heap (the library and boto3's models
    above all) is out of the cyclic collector's walks, in the controller and in the workers it
    forks. A fresh interpreter, as ``ansible-playbook`` is: nothing frozen before, the imported
    module's objects frozen after."""
    import os
    import subprocess
    import textwrap

    # the directory that holds this collection's ansible_collections/csis/infra
    collections = os.path.abspath(os.path.join(os.path.dirname(aws.__file__), *[os.pardir] * 6))
    code = textwrap.dedent("""\
        import gc, importlib, sys
        sys.path.insert(0, %r)
        assert gc.get_freeze_count() == 0
        importlib.import_module("ansible_collections.csis.infra.plugins.action.csis_gate_plan")
        gate = sys.modules["ansible_collections.csis.infra.plugins.module_utils.csis.apply.gate"]
        frozen = gc.get_freeze_count()
        gc.collect()
        print(frozen, gc.is_tracked(gate.__dict__), gate.__dict__ in gc.get_objects())
        """ % collections)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) > 10000 and out[1:] == ["True", "False"], out  # tracked, but in no generation the collector walks
