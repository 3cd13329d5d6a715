# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The AWS adapter: the one boto3 client factory, how a runtime (or a state backend) is
reached, and what an error from the endpoint means.

* :func:`client` builds every boto3 client csis.infra uses, from an *access* mapping
  (``region``, ``profile``, ``endpoints`` {service: url}, ``s3_use_path_style``): the
  ``aws`` entry of a rendered root, :func:`runtime_access` of a runtime, or
  :func:`backend_access` of an S3 state backend. Credentials come from the environment (or
  the profile), unless the access mapping carries ``credentials`` (clear static keys,
  :data:`CREDENTIAL_KEYS`: a runtime's ``!vault`` credentials decrypted by the caller, see
  :func:`tree_access` and :func:`root_access`, which refuse to leave them out); an access
  mapping with them is never returned or logged.
* Every client has bounded connect and read timeouts and a bounded number of attempts
  (:func:`client_settings`: ``CSIS_AWS_CONNECT_TIMEOUT``, ``CSIS_AWS_READ_TIMEOUT``,
  ``CSIS_AWS_MAX_ATTEMPTS``; defaults 5 s, 10 s, 3 attempts), so a hung endpoint fails a call
  in about 35 s at most instead of hanging the run.
* :class:`Endpoint` holds the clients of one runtime; a transport error makes every later
  call to that endpoint fail fast (:class:`Unreachable`).
* :func:`error_code`, :func:`is_absent`, :func:`is_transport`, :func:`error_text`:
  "does not exist", "not allowed to look" and "cannot reach" are told apart, so a lookup
  error is never read as absence.

boto3 is optional at import time (Ansible's sanity ``import`` test imports this file
without it): :data:`HAS_BOTO3` says whether it is there, and :func:`client` raises
:class:`~.errors.MissingDependency` when it is not.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Set

from .config.secrets import Reveal, root_credentials
from .errors import CsisError, MissingDependency

# boto3 is imported on first use, not with this file: a reader that never reaches AWS (validation,
# a local meta-state store, the inventory of a local tree) must not pay its import, nor urllib3's
# IPv6 probe (a socket bind), which an offline validation must not make.
HAS_BOTO3 = importlib.util.find_spec("boto3") is not None and importlib.util.find_spec("botocore") is not None
BOTO3_IMPORT_ERROR: Optional[str] = None if HAS_BOTO3 else "No module named 'boto3' (or 'botocore')"
_BOTO: Dict[str, Any] = {}


def boto() -> Dict[str, Any]:
    """boto3, ``botocore.config`` and ``botocore.exceptions``, imported once, on first use."""
    if not _BOTO:
        _BOTO["boto3"] = importlib.import_module("boto3")
        _BOTO["config"] = importlib.import_module("botocore.config")
        _BOTO["exceptions"] = importlib.import_module("botocore.exceptions")
    return _BOTO


#: services the provider reaches through a runtime's single endpoint URL
PROVIDER_SERVICES = ("ec2", "efs", "iam", "s3", "ssm", "sts")

#: error codes that mean "this resource does not exist" (everything else is unavailable)
ABSENT_CODES = {
    "ec2": ("InvalidVolume.NotFound", "InvalidInstanceID.NotFound", "InvalidSnapshot.NotFound"),
    "efs": ("FileSystemNotFound",),
    "s3": ("NoSuchBucket", "404", "NotFound"),
}
#: error codes that mean "we were not allowed to look" (prefixed REFUSED in reports)
REFUSED_CODES = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure",
                 "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException",
                 "Forbidden", "403", "UnrecognizedClientException", "InvalidAccessKeyId")

ClientFactory = Callable[[str, Mapping[str, Any]], Any]

#: a runtime's ``credentials`` field -> the boto3 session argument it is given as
CREDENTIAL_KEYS = (("access_key_id", "aws_access_key_id"), ("secret_access_key", "aws_secret_access_key"),
                   ("session_token", "aws_session_token"))

#: how long one boto3 call may take, and how often it is tried: {setting: (environment variable, default)}.
#: A hung endpoint fails a call after about max_attempts x read_timeout (plus a few seconds of backoff).
CLIENT_SETTINGS = {
    "connect_timeout": ("CSIS_AWS_CONNECT_TIMEOUT", 5.0),
    "read_timeout": ("CSIS_AWS_READ_TIMEOUT", 10.0),
    "max_attempts": ("CSIS_AWS_MAX_ATTEMPTS", 3),
}


class ClientSettingsError(CsisError):
    """A timeout or attempts setting that is not a usable number."""


def client_settings(access: Optional[Mapping[str, Any]] = None,
                    environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """``{connect_timeout, read_timeout (seconds, float), max_attempts (int, the first try included)}``:
    from ``access`` (keys of the same names), else the environment (:data:`CLIENT_SETTINGS`), else
    the defaults. Raises :class:`ClientSettingsError` on a value that is not a positive number."""
    env = os.environ if environ is None else environ
    out: Dict[str, Any] = {}
    for key, (var, default) in CLIENT_SETTINGS.items():
        value: Any = (access or {}).get(key)
        source = "aws.%s" % key
        if value is None and env.get(var, "").strip():
            value, source = env[var].strip(), var
        if value is None:
            out[key] = default
            continue
        try:
            number = int(value) if key == "max_attempts" else float(value)
        except (TypeError, ValueError):
            number = 0
        if number <= 0 or isinstance(value, bool):
            raise ClientSettingsError("%s=%r: must be a positive %s" % (
                source, value, "whole number of attempts" if key == "max_attempts" else "number of seconds"))
        out[key] = number
    return out


# --------------------------------------------------------------------------- clients
#: the process's one botocore data loader: the service models (megabytes of JSON) are read once
#: per process, not once per client
_LOADER: Dict[str, Any] = {}
#: the services :func:`preload` has read in this process
_PRELOADED: Set[str] = set()


def _botocore_session() -> Any:
    """A new botocore session on the process's one data loader."""
    session = importlib.import_module("botocore.session").get_session()
    if "loader" in _LOADER:
        session.register_component("data_loader", _LOADER["loader"])
    else:
        _LOADER["loader"] = session.get_component("data_loader")
    return session


def preload(services: Sequence[str]) -> None:
    """Import boto3 and read the models of ``services`` into this process's data loader.

    For a process that forks workers which will build such clients (Ansible's controller, before
    it forks a task's worker: plugins/plugin_utils/controller.py): each worker then inherits
    the import and the models instead of paying them (about 0.3 s of CPU per task). Builds
    clients with placeholder keys and reaches no endpoint, once per service and process (the
    action plugins of several modules name the same services). Does nothing without boto3."""
    if not HAS_BOTO3:
        return
    for service in services:
        if service in _PRELOADED:
            continue
        _PRELOADED.add(service)
        client(service, {"region": "us-east-1", "credentials": {"aws_access_key_id": "preload", "aws_secret_access_key": "preload"}})


def client(service: str, access: Mapping[str, Any]) -> Any:
    """A boto3 client of ``service`` reached as ``access`` says (see the module docstring),
    with the timeouts and attempts of :func:`client_settings`."""
    if not HAS_BOTO3:
        raise MissingDependency("boto3", BOTO3_IMPORT_ERROR)
    limits = client_settings(access)
    mods = boto()
    static = {arg: value for arg, value in (access.get("credentials") or {}).items()
              if arg in dict(CREDENTIAL_KEYS).values() and value}
    session = mods["boto3"].session.Session(profile_name=None if static else (access.get("profile") or None),
                                            region_name=access.get("region"), botocore_session=_botocore_session(),
                                            **static)
    _LOADER["loader"].search_paths[:] = list(dict.fromkeys(_LOADER["loader"].search_paths))  # boto3 appends its own
    config = mods["config"].Config
    cfg = config(connect_timeout=limits["connect_timeout"], read_timeout=limits["read_timeout"],
                 retries={"total_max_attempts": limits["max_attempts"], "mode": "standard"},
                 s3={"addressing_style": "path"} if access.get("s3_use_path_style") else {})
    return session.client(service, endpoint_url=(access.get("endpoints") or {}).get(service), config=cfg)


def endpoint_urls(endpoints: Any, services: Sequence[str]) -> Dict[str, str]:
    """{service: url} of a declared ``endpoints`` block for ``services`` (and any other
    service it names explicitly, sorted after them)."""
    out: Dict[str, str] = {}
    keys = list(services) + sorted(k for k in endpoints.services if k not in services)
    for s in keys:
        u = endpoints.for_service(s)
        if u:
            out[s] = u
    return out


def runtime_access(runtime: Any, session_mechanism: bool = False) -> Dict[str, Any]:
    """How boto3 reaches a runtime builder (no secrets); with the session mechanism
    (what a rendered root's ``aws`` entry carries) when asked, and with ``session_mechanism:
    ssh`` the runtime's ``ssh`` settings (the key file's path as written, never its content).

    Never the runtime's static keys: this is what a rendered root's ``aws`` entry carries. A
    client of the runtime is built from :func:`tree_access` or :func:`root_access`, which add them."""
    out = {"region": runtime.region, "profile": runtime.credentials.profile_name,
           "endpoints": endpoint_urls(runtime.endpoints, PROVIDER_SERVICES), "s3_use_path_style": runtime.s3_use_path_style}
    if session_mechanism:
        out["session_mechanism"] = runtime.session_mechanism
        if runtime.session_mechanism == "ssh" and getattr(runtime, "ssh", None) is not None:
            out["ssh"] = runtime.ssh.model_dump()
    return out


def _static_keys(runtime: Any) -> Dict[str, Any]:
    """{credentials field: value (a ``!vault`` value, clear text, or None)} of a runtime model."""
    return {fld: getattr(runtime.credentials, fld, None) for fld, _arg in CREDENTIAL_KEYS}


class StaticKeysNotGiven(CsisError):
    """A step would reach a runtime that has static keys without them (the environment's
    credentials, maybe another account's): a caller that did not pass ``reveal``."""


def with_static_keys(access: Mapping[str, Any], sealed: Mapping[str, Any],
                     reveal: Optional[Reveal], what: str = "") -> Dict[str, Any]:
    """``access`` with ``credentials``: the clear text (by ``reveal``) of ``sealed``, a runtime's
    static keys ({credentials field: a ``!vault`` value or clear text}, unset fields None);
    ``access`` as it is when there are none. With keys and no ``reveal``, raises
    :class:`StaticKeysNotGiven` rather than reaching AWS with the environment's credentials."""
    keys = {fld: value for fld, value in sealed.items() if value is not None}
    if not keys.get("access_key_id"):
        return dict(access)
    if reveal is None:
        raise StaticKeysNotGiven("%s has static credentials (access_key_id, secret_access_key), and this step was "
                                 "not given them: it would reach AWS with the environment's credentials instead"
                                 % (what or "the runtime"))
    return dict(access, credentials={arg: reveal(keys[fld]) for fld, arg in CREDENTIAL_KEYS if fld in keys})


def tree_access(tree: Any, runtime: str, reveal: Optional[Reveal] = None) -> Dict[str, Any]:
    """How boto3 reaches the runtime named ``runtime`` in a loaded tree, with its static keys
    revealed by ``reveal`` (:func:`runtime_access`; :class:`StaticKeysNotGiven` when it has some
    and ``reveal`` is None)."""
    rt = tree.runtimes[runtime]
    return with_static_keys(runtime_access(rt), _static_keys(rt), reveal, "runtime '%s'" % runtime)


def root_access(access: Mapping[str, Any], secret_map: Optional[Mapping[str, Any]],
                reveal: Optional[Reveal] = None, what: str = "") -> Dict[str, Any]:
    """How boto3 reaches a rendered root's runtime: the root's ``aws`` entry (``access``), with the
    static keys of its ``secrets`` (``secret_map``: ciphertext, as csis_render returns them)
    revealed by ``reveal`` (:class:`StaticKeysNotGiven` when it has some and ``reveal`` is None)."""
    return with_static_keys(access, root_credentials(secret_map), reveal, what)


def backend_access(config: Mapping[str, Any]) -> Dict[str, Any]:
    """How boto3 reaches an initialised S3 backend (its ``config`` from ``.terraform/terraform.tfstate``):
    its region, profile and S3 endpoint, as terraform's S3 backend does."""
    endpoints = config.get("endpoints") or {}
    url = endpoints.get("s3") or config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") or None
    return {"region": config.get("region"), "profile": config.get("profile") or None, "endpoints": {"s3": url} if url else {},
            "s3_use_path_style": bool(config.get("use_path_style") or config.get("force_path_style"))}


def state_backend_access(backend: Any) -> Dict[str, Any]:
    """How boto3 reaches a declared S3 state backend (a ``StateBackend`` model; no secrets):
    its region, profile and S3 endpoint (else ``AWS_ENDPOINT_URL_S3``)."""
    url = backend.endpoints.for_service("s3") or os.environ.get("AWS_ENDPOINT_URL_S3") or None
    return {"region": backend.region, "profile": backend.profile, "endpoints": {"s3": url} if url else {},
            "s3_use_path_style": bool(backend.use_path_style)}


# --------------------------------------------------------------------------- errors
def efs_transition(days: int) -> str:
    """EFS's name of a lifecycle transition after ``days`` days (``AFTER_1_DAY``, ``AFTER_7_DAYS``, ...)."""
    return "AFTER_1_DAY" if int(days) == 1 else "AFTER_%d_DAYS" % int(days)


def error_code(exc: BaseException) -> Optional[str]:
    """The AWS error code of a botocore error (else its HTTP status), or None."""
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        code = (resp.get("Error") or {}).get("Code")
        if code is not None:
            return str(code)
        status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if status is not None:
            return str(status)
    return None


def is_absent(service: str, exc: BaseException) -> bool:
    """Whether ``exc`` definitely says "does not exist" (never true for transport errors)."""
    return error_code(exc) in ABSENT_CODES.get(service, ())


def is_transport(exc: BaseException) -> bool:
    """A connection/timeout error: the endpoint is not reachable."""
    if not HAS_BOTO3:
        return False
    errors = boto()["exceptions"]
    return isinstance(exc, (errors.ConnectionError, errors.HTTPClientError))


def timeout_text(exc: BaseException) -> Optional[str]:
    """For a connect or read timeout: what waited how long, and the setting to change; else None."""
    if not HAS_BOTO3:
        return None
    errors = boto()["exceptions"]
    if not isinstance(exc, (errors.ConnectTimeoutError, errors.ReadTimeoutError)):
        return None
    limits = client_settings()
    key = "connect_timeout" if isinstance(exc, errors.ConnectTimeoutError) else "read_timeout"
    return ("no answer within %g s (%s, %d attempt(s); set %s / %s to wait longer)"
            % (limits[key], key.replace("_", " "), limits["max_attempts"], CLIENT_SETTINGS[key][0],
               CLIENT_SETTINGS["max_attempts"][0]))


def error_text(exc: BaseException) -> str:
    """One line naming the error; ``REFUSED (<code>): ...`` when we were not allowed to look;
    for a timeout, how long was waited and how to change it."""
    if isinstance(exc, Unreachable):
        return str(exc)
    code = error_code(exc)
    text = " ".join(str(exc).split())
    waited = timeout_text(exc)
    if waited:
        return "%s: %s" % (text, waited)
    if code in REFUSED_CODES:
        return "REFUSED (%s): %s" % (code, text)
    return text or type(exc).__name__


# --------------------------------------------------------------------------- one endpoint
class Unreachable(Exception):
    """The endpoint did not answer (this call, or an earlier one of the same run)."""


class Endpoint:
    """Clients of one runtime; a transport error makes every later call fail fast."""

    def __init__(self, access: Mapping[str, Any], factory: Optional[ClientFactory] = None):
        self.access = access
        self.factory = factory or client
        self.clients: Dict[str, Any] = {}
        self.down: Dict[str, str] = {}

    def where(self, service: str) -> str:
        return ((self.access.get("endpoints") or {}).get(service)
                or "%s.%s.amazonaws.com" % (service, self.access.get("region")))

    def call(self, service: str, op: str, **kw: Any) -> Any:
        where = self.where(service)
        if where in self.down:
            raise Unreachable(self.down[where])
        try:
            if service not in self.clients:
                self.clients[service] = self.factory(service, self.access)
            return getattr(self.clients[service], op)(**kw)
        except Exception as exc:  # noqa: BLE001 - classified by the caller
            if is_transport(exc):
                self.down[where] = "endpoint %s unreachable (%s; not retried)" % (where, type(exc).__name__)
                raise Unreachable("endpoint %s unreachable: %s" % (where, error_text(exc))) from exc
            raise
