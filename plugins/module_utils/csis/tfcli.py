# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Terraform/OpenTofu CLI configuration used for every call the collection makes.

Every terraform process csis.infra starts gets ``TF_CLI_CONFIG_FILE`` pointing at a
CLI configuration written here, so that

* ``init`` works offline from a filesystem mirror of the providers when one exists
  (``CSIS_PROVIDER_MIRROR``, else the first of :data:`MIRROR_CANDIDATES` that exists);
* every root shares one ``plugin_cache_dir`` (``CSIS_PLUGIN_CACHE_DIR``, else
  ``<cache>/plugin-cache``), so a root gets a link to the provider, not a 700 MB copy.

The machine's environment may set ``TF_CLI_CONFIG_FILE`` to a missing file; we never
inherit it. ``CSIS_TF_CLI_CONFIG_FILE`` names an operator-provided file to use as is.

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import os
import sys
import tempfile
from typing import Dict, Mapping, Optional

MIRROR_CANDIDATES = (
    "/opt/tf-plugins",
    "/usr/share/terraform/plugins",
    "/usr/local/share/terraform/plugins",
    os.path.expanduser("~/.terraform.d/plugins"),
)


def cache_dir(env: Optional[Mapping[str, str]] = None) -> str:
    env = os.environ if env is None else env
    base = env.get("CSIS_CACHE_DIR") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "csis-infra")
    return os.path.abspath(base)


def provider_mirror(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    env = os.environ if env is None else env
    explicit = env.get("CSIS_PROVIDER_MIRROR")
    if explicit:
        return os.path.abspath(explicit)
    for cand in MIRROR_CANDIDATES:
        if os.path.isdir(os.path.join(cand, "registry.terraform.io")):
            return cand
    return None


def render_cli_config(mirror: Optional[str], plugin_cache: str) -> str:
    lines = [
        "# csis.infra terraform CLI configuration (written by csis.infra; do not edit)",
        'plugin_cache_dir = "%s"' % plugin_cache.replace("\\", "\\\\").replace('"', '\\"'),
        "plugin_cache_may_break_dependency_lock_file = true",
        "disable_checkpoint = true",
    ]
    if mirror:
        esc = mirror.replace("\\", "\\\\").replace('"', '\\"')
        lines += [
            "provider_installation {",
            "  filesystem_mirror {",
            '    path    = "%s"' % esc,
            '    include = ["registry.terraform.io/*/*", "registry.opentofu.org/*/*"]',
            "  }",
            "  direct {",
            '    exclude = ["registry.terraform.io/*/*", "registry.opentofu.org/*/*"]',
            "  }",
            "}",
        ]
    return "\n".join(lines) + "\n"


def ensure_cli_config(env: Optional[Mapping[str, str]] = None) -> str:
    """Write (if changed) and return the path of the CLI configuration file."""
    env = os.environ if env is None else env
    own = env.get("CSIS_TF_CLI_CONFIG_FILE")
    if own:
        return os.path.abspath(own)
    base = cache_dir(env)
    plugin_cache = os.path.abspath(env.get("CSIS_PLUGIN_CACHE_DIR") or os.path.join(base, "plugin-cache"))
    os.makedirs(plugin_cache, exist_ok=True)
    text = render_cli_config(provider_mirror(env), plugin_cache)
    path = os.path.join(base, "terraformrc")
    try:
        with open(path, "r", encoding="utf-8") as fh:
            if fh.read() == text:
                return path
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=base, prefix=".terraformrc.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def terraform_env(base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Environment for a terraform subprocess: ``base`` plus our CLI configuration."""
    env = dict(os.environ if base is None else base)
    env["TF_CLI_CONFIG_FILE"] = ensure_cli_config(env)
    env.setdefault("TF_IN_AUTOMATION", "1")
    env.setdefault("CHECKPOINT_DISABLE", "1")
    return env


def env_overrides(base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Only the variables :func:`terraform_env` adds (for an Ansible ``environment:``)."""
    full = terraform_env(base)
    return {k: full[k] for k in ("TF_CLI_CONFIG_FILE", "TF_IN_AUTOMATION", "CHECKPOINT_DISABLE")}


if __name__ == "__main__":  # pragma: no cover - used by scripts/bootstrap
    if "--write" in sys.argv:
        print(ensure_cli_config())
