# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The AWS adapter: the one boto3 client factory, how a runtime (or a state backend) is
reached, and what an error from the endpoint means.

* :func:`client` builds every boto3 client csis.infra uses, from an *access* mapping
  (``region``, ``profile``, ``endpoints`` {service: url}, ``s3_use_path_style``): the
  ``aws`` entry of a rendered root, :func:`runtime_access` of a runtime, or
  :func:`backend_access` of an S3 state backend. Credentials come from the environment.
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

import os
import traceback
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from .errors import MissingDependency

try:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ConnectionError as BotoConnectionError, HTTPClientError
    HAS_BOTO3 = True
    BOTO3_IMPORT_ERROR: Optional[str] = None
except ImportError:
    HAS_BOTO3 = False
    BOTO3_IMPORT_ERROR = traceback.format_exc()

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


# --------------------------------------------------------------------------- clients
def client(service: str, access: Mapping[str, Any]) -> Any:
    """A boto3 client of ``service`` reached as ``access`` says (see the module docstring)."""
    if not HAS_BOTO3:
        raise MissingDependency("boto3", BOTO3_IMPORT_ERROR)
    session = boto3.session.Session(profile_name=access.get("profile") or None, region_name=access.get("region"))
    cfg = Config(retries={"max_attempts": 5, "mode": "standard"},
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
    (what a rendered root's ``aws`` entry carries) when asked."""
    out = {"region": runtime.region, "profile": runtime.credentials.profile_name,
           "endpoints": endpoint_urls(runtime.endpoints, PROVIDER_SERVICES), "s3_use_path_style": runtime.s3_use_path_style}
    if session_mechanism:
        out["session_mechanism"] = runtime.session_mechanism
    return out


def tree_access(tree: Any, runtime: str) -> Dict[str, Any]:
    """:func:`runtime_access` of the runtime named ``runtime`` in a loaded tree."""
    return runtime_access(tree.runtimes[runtime])


def backend_access(config: Mapping[str, Any]) -> Dict[str, Any]:
    """How boto3 reaches an initialised S3 backend (its ``config`` from ``.terraform/terraform.tfstate``)."""
    endpoints = config.get("endpoints") or {}
    url = endpoints.get("s3") or config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") or None
    return {"region": config.get("region"), "endpoints": {"s3": url} if url else {},
            "s3_use_path_style": bool(config.get("use_path_style") or config.get("force_path_style"))}


# --------------------------------------------------------------------------- errors
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
    return isinstance(exc, (BotoConnectionError, HTTPClientError))


def error_text(exc: BaseException) -> str:
    """One line naming the error; ``REFUSED (<code>): ...`` when we were not allowed to look."""
    if isinstance(exc, Unreachable):
        return str(exc)
    code = error_code(exc)
    text = " ".join(str(exc).split())
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
