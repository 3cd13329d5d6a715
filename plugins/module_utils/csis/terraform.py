# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The terraform/OpenTofu adapter: every terraform process csis.infra starts, and the
environment each one gets.

Commands: :func:`run` (any command, output captured), :func:`prepare_steps` (the
``fmt -check``/``init``/``validate`` of a rendered root), :func:`show_json` (a saved
plan as JSON), :func:`state_pull` (a root's raw state), :func:`force_unlock` and
:func:`version` (``version -json``, offline and write-free). Failures raise
:class:`TerraformError` naming the command.

Environment: every process gets ``TF_CLI_CONFIG_FILE`` pointing at a CLI configuration
written here, so that

* ``init`` works offline from a filesystem mirror of the providers when one exists
  (``CSIS_PROVIDER_MIRROR``, else the first of :data:`MIRROR_CANDIDATES` that exists);
* every root shares one ``plugin_cache_dir`` (``CSIS_PLUGIN_CACHE_DIR``, else
  ``<cache>/plugin-cache``), so a root gets a link to the provider, not a 700 MB copy.

The machine's environment may set ``TF_CLI_CONFIG_FILE`` to a missing file; we never
inherit it. ``CSIS_TF_CLI_CONFIG_FILE`` names an operator-provided file to use as is.

Unless the environment sets ``GOGC`` or ``GOMEMLIMIT``, every process also gets
``GOGC=400`` and ``GOMEMLIMIT=1GiB`` (:data:`GO_DEFAULTS`). terraform and the AWS provider it
starts (which inherits them) are Go programs whose collector, at Go's default, spends about a
third of a plan's CPU: the provider builds its whole schema on each of its starts, three per
plan. At 400 a one-volume plan takes about 30% less CPU for about a quarter more memory at
its peak (0.77 GB against 0.62 GB); the soft limit makes the collector work harder again as
a process nears 1 GiB, so a large root costs no more memory than at Go's default
(benchmarks/README.md, "terraform and GOGC"). ``GOGC=100`` in the environment restores Go's
default.

Plain Python: importable without Ansible.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from .errors import CsisError


class TerraformError(CsisError):
    """A terraform command could not run or failed; the message names it."""


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


def plugin_cache_dir(env: Optional[Mapping[str, str]] = None) -> str:
    """The provider plugin cache every terraform process of csis.infra shares."""
    env = os.environ if env is None else env
    return os.path.abspath(env.get("CSIS_PLUGIN_CACHE_DIR") or os.path.join(cache_dir(env), "plugin-cache"))


CACHE_LOCK = ".csis-cache.lock"


@contextlib.contextmanager
def plugin_cache_lock(exclusive: bool, env: Optional[Mapping[str, str]] = None) -> Iterator[None]:
    """Serialise writes into the shared plugin cache (hashicorp/terraform#31964: concurrent
    ``terraform init`` runs that both fill the cache can leave a provider half-written).

    An init that may fill the cache (the first of a batch) holds the lock exclusively; inits
    that only link what the cache already holds share it, so they run in parallel with each
    other but never beside a fill, in this process or any other (``fcntl.flock``)."""
    directory = plugin_cache_dir(env)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, CACHE_LOCK), "a", encoding="utf-8") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_cli_config(env: Optional[Mapping[str, str]] = None) -> str:
    """Write (if changed) and return the path of the CLI configuration file."""
    env = os.environ if env is None else env
    own = env.get("CSIS_TF_CLI_CONFIG_FILE")
    if own:
        return os.path.abspath(own)
    base = cache_dir(env)
    plugin_cache = plugin_cache_dir(env)
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


#: Go's collector settings for every terraform process (and its providers) unless the
#: environment sets GOGC or GOMEMLIMIT (see the module docstring)
GO_DEFAULTS = {"GOGC": "400", "GOMEMLIMIT": "1GiB"}

#: a rendered root whose runtime declares ``endpoints`` keeps here the environment that stands
#: in for its provider's ``endpoints`` block in csis.infra's terraform runs
#: (render/plan.py ``RootPlanner.endpoint_env``): the provider spends about 3 s of CPU
#: validating such a block at each start (two per plan), the same URLs in the environment cost
#: nothing. The root's ephemeral variable :data:`ENDPOINT_ENV_VARIABLE` drops the block only
#: when set, so a hand-run terraform in the root still reaches the declared endpoints.
ENDPOINT_ENV_FILE = "csis-endpoint-env.json"
ENDPOINT_ENV_VARIABLE = "csis_endpoints_from_environment"


def root_endpoint_env(root: Optional[str]) -> Dict[str, str]:
    """The environment of ``root``'s :data:`ENDPOINT_ENV_FILE`, or ``{}`` (no file, or one that
    is not the expected shape: then the root's provider block names the endpoints itself,
    which is slower and as correct)."""
    if not root:
        return {}
    try:
        with open(os.path.join(root, ENDPOINT_ENV_FILE), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return {}
    flag = "TF_VAR_%s" % ENDPOINT_ENV_VARIABLE
    if (not isinstance(data, dict) or data.get(flag) != "true"
            or not all(isinstance(k, str) and isinstance(v, str) and (k == flag or k.startswith("AWS_ENDPOINT_URL_"))
                       for k, v in data.items())):
        return {}
    return dict(data)


def takes_ephemeral_variables(binary: str) -> bool:
    """Whether ``binary`` is terraform 1.10 or later (ephemeral input variables, which a root's
    :data:`ENDPOINT_ENV_VARIABLE` is): one ``version -json``, cached (:func:`version`)."""
    if not os.path.basename(binary).startswith("terraform"):
        return False
    from packaging.version import InvalidVersion, Version
    found, _err = version(binary)
    try:
        return found is not None and Version(found) >= Version("1.10")
    except InvalidVersion:
        return False


def terraform_env(base: Optional[Mapping[str, str]] = None, root: Optional[str] = None) -> Dict[str, str]:
    """Environment for a terraform subprocess: ``base`` plus our CLI configuration and, run in
    ``root``, that root's endpoint environment (:func:`root_endpoint_env`)."""
    env = dict(os.environ if base is None else base)
    env["TF_CLI_CONFIG_FILE"] = ensure_cli_config(env)
    env.setdefault("TF_IN_AUTOMATION", "1")
    env.setdefault("CHECKPOINT_DISABLE", "1")
    if not any(k in env for k in GO_DEFAULTS):
        env.update(GO_DEFAULTS)
    env.update(root_endpoint_env(root))
    return env


def env_overrides(base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Only the variables :func:`terraform_env` adds (for an Ansible ``environment:``)."""
    full = terraform_env(base)
    keys = ("TF_CLI_CONFIG_FILE", "TF_IN_AUTOMATION", "CHECKPOINT_DISABLE") + tuple(GO_DEFAULTS)
    return {k: full[k] for k in keys if k in full}


# --------------------------------------------------------------------------- commands
def run(binary: str, args: Sequence[str], cwd: str, extra_env: Optional[Mapping[str, str]] = None,
        timeout: int = 900) -> Dict[str, Any]:
    """``<binary> <args>`` in ``cwd``: ``{cmd, rc, stdout, stderr}`` (the last 4000 characters of each)."""
    env = terraform_env(dict(os.environ, **(extra_env or {})), root=cwd)
    res = subprocess.run([binary] + list(args), cwd=cwd, capture_output=True, text=True, env=env,
                         timeout=timeout, check=False)
    return {"cmd": " ".join([os.path.basename(binary)] + list(args)), "rc": res.returncode,
            "stdout": res.stdout[-4000:], "stderr": res.stderr[-4000:]}


def prepare_steps(dry_run: bool, backend_file: Optional[str]) -> List[List[str]]:
    """The argument lists that prepare a rendered root: ``fmt -check``, ``init``, and in a dry run
    ``validate`` (``init -backend=false``). A real run inits with ``-reconfigure`` and the partial
    backend file and does not validate: its plan, seconds later, validates the same configuration
    (a second provider start saved per changed root)."""
    init = ["init", "-input=false", "-no-color"]
    if dry_run:
        init.append("-backend=false")
        return [["fmt", "-check", "-no-color"], init, ["validate", "-no-color"]]
    init.append("-reconfigure")
    if backend_file:
        init.append("-backend-config=%s" % backend_file)
    return [["fmt", "-check", "-no-color"], init]


def show_json(plan_path: str, project_path: str, binary_path: str = "terraform",
              env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """``<binary_path> show -json <plan_path>`` run in ``project_path``."""
    run_env = terraform_env(env)
    try:
        proc = subprocess.run([binary_path, "show", "-json", "-no-color", plan_path], cwd=project_path,
                              env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    except OSError as exc:
        raise TerraformError("cannot run %s: %s" % (binary_path, exc))
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()[-2000:]
        raise TerraformError("%s show -json %s failed (exit %d): %s" % (binary_path, plan_path, proc.returncode, err))
    try:
        return json.loads(proc.stdout.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise TerraformError("%s show -json %s printed no JSON: %s" % (binary_path, plan_path, exc))


def state_pull(project_path: str, binary: str = "terraform") -> Dict[str, Any]:
    """The root's raw state (``state pull``: no provider schema load)."""
    res = subprocess.run([binary, "state", "pull"], cwd=project_path, capture_output=True, text=True,
                         env=terraform_env(), timeout=600, check=False)
    if res.returncode != 0:
        raise TerraformError("%s: 'state pull' failed (rc %d): %s" % (project_path, res.returncode, res.stderr.strip()[-1500:]))
    if not res.stdout.strip():
        return {"resources": [], "outputs": {}}
    try:
        return json.loads(res.stdout)
    except ValueError as exc:
        raise TerraformError("%s: 'state pull' did not print JSON: %s" % (project_path, exc))


def force_unlock(project_path: str, binary: str, lock_id: str,
                 env: Optional[Mapping[str, str]] = None) -> Tuple[int, str]:
    """``force-unlock -force <lock_id>``: (exit code, the end of what it printed)."""
    proc = subprocess.run([binary, "force-unlock", "-force", "-no-color", str(lock_id)], cwd=project_path,
                          env=terraform_env(env), capture_output=True, text=True, check=False)
    return proc.returncode, (proc.stderr or proc.stdout).strip()[-1000:]


_VERSION_CACHE: Dict[str, Tuple[Optional[str], Optional[str]]] = {}


def version(binary: str) -> Tuple[Optional[str], Optional[str]]:
    """(version, error) of a terraform/tofu binary through ``<binary> version -json``."""
    if binary in _VERSION_CACHE:
        return _VERSION_CACHE[binary]
    path = shutil.which(binary)
    # no CLI configuration (nothing to write), no update check: offline and write-free
    env = {k: v for k, v in os.environ.items() if k != "TF_CLI_CONFIG_FILE"}
    env["CHECKPOINT_DISABLE"] = "1"
    if path is None:
        res: Tuple[Optional[str], Optional[str]] = (None, "binary '%s' was not found (not on PATH and not an executable file)" % binary)
    else:
        try:
            out = subprocess.run([path, "version", "-json"], capture_output=True, text=True, timeout=60,
                                 env=env, check=False, stdin=subprocess.DEVNULL)
            data = json.loads(out.stdout)
            res = (str(data["terraform_version"]), None)
        except (subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
            res = (None, "'%s version -json' did not report terraform_version (%s)" % (binary, type(exc).__name__))
    _VERSION_CACHE[binary] = res
    return res


if __name__ == "__main__":  # pragma: no cover - used by scripts/bootstrap
    if "--write" in sys.argv:
        sys.stdout.write(ensure_cli_config() + "\n")
