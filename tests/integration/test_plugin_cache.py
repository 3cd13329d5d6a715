# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The shared provider plugin cache under concurrent ``terraform init`` (hashicorp/terraform#31964,
the reference manual's cache lock): eight roots prepared at once on an EMPTY cache, real
terraform and the AWS provider from the machine's mirror.

The first root's init fills the cache alone (exclusive ``flock`` on the cache's lock file);
the other inits wait for it and then share the lock, so they only link what is cached. A dry
run initialises only the temporary root that validates them together, exclusively.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

_REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
_COLL = os.path.join(_REPO, ".venv", "collections")
if _COLL not in [os.path.normpath(p) for p in sys.path]:
    sys.path.insert(0, _COLL)

import pytest  # noqa: E402

from ansible_collections.csis.infra.plugins.module_utils.csis import terraform  # noqa: E402
from ansible_collections.csis.infra.plugins.module_utils.csis.render.writer import prepare_roots  # noqa: E402

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("terraform") is None or terraform.provider_mirror() is None,
                                 reason="needs terraform and the provider mirror")]

ROOT_TF = textwrap.dedent("""\
    terraform {
      required_providers {
        aws = {
          source  = "hashicorp/aws"
          version = "5.100.0"
        }
      }
    }

    provider "aws" {
      region = "us-east-2"
    }

    resource "aws_s3_bucket" "b" {
      bucket = "csis-cache-test-%d"
    }
    """)


def _roots(tmp_path, count):
    """``count`` one-bucket roots under ``tmp_path``, as prepare_roots takes them."""
    roots = []
    for i in range(count):
        d = tmp_path / ("root%d" % i)
        d.mkdir()
        (d / "main.tf").write_text(ROOT_TF % i)
        roots.append((str(d), "terraform", None))
    return roots


def test_eight_roots_prepared_at_once_on_an_empty_cache(tmp_path):
    cache = tmp_path / "cache"
    env = {"CSIS_CACHE_DIR": str(cache)}
    roots = _roots(tmp_path, 8)
    assert not (cache / "plugin-cache").exists()

    # a real run's preparation: every root initialised, in parallel (the first fills the cache)
    out = prepare_roots(roots, dry_run=False, workers=8, extra_env=env)

    assert sorted(out) == sorted(r[0] for r in roots)
    for d, commands in out.items():
        assert [c["cmd"].split()[1] for c in commands] == ["fmt", "init"], commands
        assert all(c["rc"] == 0 for c in commands), commands
    cached = list((cache / "plugin-cache" / "registry.terraform.io" / "hashicorp" / "aws").iterdir())
    assert [p.name for p in cached] == ["5.100.0"]
    binaries = list((cached[0] / "linux_amd64").glob("terraform-provider-aws_*"))
    assert len(binaries) == 1
    mirror = os.path.join(terraform.provider_mirror(), "registry.terraform.io", "hashicorp", "aws", "5.100.0",
                          "linux_amd64", binaries[0].name)
    if os.path.isfile(mirror):
        assert os.path.getsize(str(binaries[0])) == os.path.getsize(mirror)
    assert (cache / "plugin-cache" / terraform.CACHE_LOCK).exists()


def test_a_dry_run_on_an_empty_cache_fills_it_once_and_validates_the_roots_together(tmp_path):
    """A dry run initialises no root by itself: the one temporary root that calls them all is
    initialised (holding the lock exclusively: it is what fills the cache) and validated."""
    cache = tmp_path / "cache"
    env = {"CSIS_CACHE_DIR": str(cache)}
    roots = _roots(tmp_path, 3)

    out = prepare_roots(roots, dry_run=True, workers=3, extra_env=env)

    for d, commands in out.items():
        assert [c["cmd"] for c in commands][1:] == ["terraform validate -no-color (one run for 3 roots)"], commands
        assert not os.path.exists(os.path.join(d, ".terraform.lock.hcl"))
    cached = list((cache / "plugin-cache" / "registry.terraform.io" / "hashicorp" / "aws").iterdir())
    assert [p.name for p in cached] == ["5.100.0"]


def test_a_fill_excludes_the_linking_inits_of_another_process(tmp_path):
    """The lock is an flock between processes: while one holds it exclusively (a fill), a
    shared holder (an init that only links) waits."""
    env = dict(os.environ, CSIS_CACHE_DIR=str(tmp_path / "cache"))
    released = tmp_path / "released"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""\
        import sys, time
        sys.path.insert(0, %r)
        from ansible_collections.csis.infra.plugins.module_utils.csis import terraform
        with terraform.plugin_cache_lock(exclusive=True):
            print("held", flush=True)
            time.sleep(1)
            open(%r, "w").close()
        """ % (_COLL, str(released)))], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with terraform.plugin_cache_lock(exclusive=False, env=env):
            # only after the filler let go
            assert released.exists()
    finally:
        holder.wait(timeout=30)
