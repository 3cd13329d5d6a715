# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Strict, typed models of every file of a csis.infra configuration tree.

Unknown keys are refused everywhere (``extra="forbid"``). Field names, defaults and
allowed values follow the reference manual (docs/configuration.md lists them).
Cross-file rules (references, state machine, zones, ...) live in ``validate.py``.
"""
from __future__ import annotations

import re
import traceback
import unicodedata
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from . import secrets
# the one duration parser is clock's (validate and instance_roots call it as m.parse_duration)
from ..clock import parse_duration

try:
    # ValidationError: for loader.py, which shares this guard
    from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError,  # pylint: disable=unused-import
                          field_validator, model_validator)
    from pydantic_core import InitErrorDetails
    HAS_PYDANTIC = True
    PYDANTIC_IMPORT_ERROR: Optional[str] = None
except ImportError:  # the classes below still define (inertly); module.require_libraries reports it
    HAS_PYDANTIC = False
    PYDANTIC_IMPORT_ERROR = traceback.format_exc()

    class BaseModel:  # type: ignore[no-redef]
        """Stand-in so this file imports without pydantic; nothing can be validated."""

    class ValidationError(Exception):  # type: ignore[no-redef]
        pass

    ConfigDict = dict  # type: ignore[assignment,misc]
    InitErrorDetails = dict  # type: ignore[assignment,misc]

    def Field(*args: Any, **kwargs: Any) -> Any:  # type: ignore[no-redef]  # noqa: N802 - pydantic's name
        return None

    def field_validator(*args: Any, **kwargs: Any) -> Any:  # type: ignore[no-redef]
        return lambda fn: fn

    model_validator = field_validator  # type: ignore[assignment]

    def AfterValidator(fn: Any) -> Any:  # type: ignore[no-redef]  # noqa: N802 - pydantic's name
        return None

from .flags import parse_apply_flag

# names and the names derived from them (plain Python, shared with the store: names.py)
from .names import (MOUNT_POINT_RE, NAME_RE, SSH_PATH_RE, SSH_USER_RE, archive_snapshot_name,  # noqa: F401 pylint: disable=unused-import
                    label, legacy_archive_snapshot_name, mount_point_ok)

BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
AZ_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]\Z")
TAG_KEY_MAX = 128
TAG_VALUE_MAX = 256

BUCKET_RULE = ("3-63 characters of lowercase letters, digits, '.' and '-', starting and ending with a "
               "letter or digit, no '..', not shaped like an IP address")

STORAGE_STATES = ("active", "archived", "destroyed")
SHARE_MODES = ("2770", "2775")


#: the userinfo of a URL (``https://user:token@``), which may hold a password or a token
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s]*@")


def mask_url(text: str) -> str:
    """``text`` with the userinfo of every URL in it (``https://user:token@host``) replaced by ``***``."""
    return _URL_USERINFO.sub(r"\1***@", text)


def show(value: Any) -> str:
    """A value quoted for a message: ``'name'``, or its repr when it holds quotes or
    control characters (so a message stays on one line and shows what was written)."""
    if isinstance(value, str) and value.isprintable() and "'" not in value:
        return "'%s'" % value
    return repr(value)


#: Prefix a model-level ValueError with ``KEY_MARK % "key"`` to report it at that key
#: (the loader strips the marker and appends the key to the problem's key path).
KEY_MARK = "[[%s]] "


def keyed_error(key: str, message: str) -> ValueError:
    return ValueError(KEY_MARK % key + message)


def check_name(value: str, what: str = "name") -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("%s must be a non-empty string, got %s" % (what, show(value)))
    if "/" in value or "\\" in value:
        raise ValueError("%s %s must not contain '/' or '\\'" % (what, show(value)))
    if not NAME_RE.match(value):
        raise ValueError(
            "%s %s is not allowed: use letters, digits, '_', '.', '-' "
            "(starting with a letter or digit, at most 63 characters)" % (what, show(value)))
    return value


def normalize_builder_name(value: Any) -> Any:
    """The manual's normalisation of builder names: lowercase, spaces to '_'."""
    if isinstance(value, str):
        value = value.strip().lower().replace(" ", "_")
    return value


def check_zone(v: str) -> str:
    if not AZ_RE.match(v):
        raise ValueError("availability_zone %r is not an AWS zone name (like 'us-east-2a')" % v)
    return v


def optional(check: Any, *args: Any) -> Any:
    """A field validator of an optional value: None stays None, anything else must pass
    ``check(value, *args)``."""
    def validate(cls: Any, v: Any) -> Any:
        return None if v is None else check(v, *args)
    return classmethod(validate)


def relative_path(v: str, what: str = "path") -> str:
    """A relative key or path of plain names (no ``..``, no leading ``/``), without its outer slashes."""
    parts = v.split("/")
    if v.startswith("/") or ".." in parts or not all(re.match(r"^[A-Za-z0-9_.-]+\Z", p) for p in parts if p):
        raise ValueError("%s %r must be a relative path of plain names (no '..', no leading '/')" % (what, v))
    return v.strip("/")


def check_builder_reference(cls: Any, v: Any, info: Any) -> Any:
    """A ``type`` (builder) or ``runtime`` reference: not empty, a plain name."""
    what = "a runtime" if info.field_name == "runtime" else "a builder"
    if v == "" or v is None:
        raise ValueError("%s must not be empty: name %s, or leave the key out for the is_default one"
                         % (info.field_name, what))
    return check_name(normalize_builder_name(v), info.field_name)


def is_module_url(source: str) -> bool:
    """Whether a ``module_source_base`` is a module address terraform fetches (not a local path)."""
    return "://" in source or "::" in source or source.startswith("git@")


def bucket_for(storage: Any, builder: Any) -> str:
    """The bucket of an S3 storage (the manual's one rule): its own ``bucket_name``, else its
    builder's ``bucket_name`` (the default bucket of the builder's storages), else its name."""
    return storage.bucket_name or getattr(builder, "bucket_name", None) or storage.name


def check_duration(v: Optional[str]) -> Optional[str]:
    """An optional duration setting ('30m', '2h', '1d', '1w'): kept as written, refused when it is none."""
    if v is not None:
        parse_duration(v)
    return v


def check_bucket(v: str, what: str) -> str:
    if (not isinstance(v, str) or not BUCKET_RE.match(v) or ".." in v or ".-" in v or "-." in v
            or re.match(r"^\d+\.\d+\.\d+\.\d+\Z", v)):
        raise ValueError("%s %s is not a valid S3 bucket name (%s)" % (what, show(v), BUCKET_RULE))
    return v


def tag_text_problem(text: str) -> Optional[str]:
    r"""Why AWS would refuse or alter ``text`` as a tag key or value, or None.

    AWS's tag pattern (S3, EFS: ``[\p{L}\p{Z}\p{N}_.:/=+\-@]``) has no control or format
    character: S3 and EFS refuse a newline or a tab, and S3-compatible endpoints silently drop
    it (moto returns a value without its trailing newline, so the plan never converges).
    Leading or trailing whitespace is trimmed the same way. Other characters outside the
    pattern (quotes, ``$``, ``{``) are kept by EC2 and refused by S3/EFS at apply, never altered."""
    bad = sorted({c for c in text if unicodedata.category(c).startswith("C")})
    if bad:
        return ("contains the control character(s) %s, which AWS refuses in S3 and EFS tags and S3 endpoints "
                "drop (the tag would never converge)" % ", ".join(repr(c) for c in bad))
    if text != text.strip():
        return "has leading or trailing whitespace, which S3 endpoints trim (the tag would never converge)"
    return None


#: the tag keys csis.infra sets itself, over a declared tag of the same key: ``csis_config`` (the
#: tree's id, on every resource: drift and the second-checkout rules read it), and the EFS access
#: points' and S3 group markers' own
RESERVED_TAG_KEYS = {"csis_config": "set by csis.infra on every resource (the tree's id, cfg/_config.yml id)",
                     "csis:group": "set by csis.infra on EFS access points and S3 group markers (their group)",
                     "csis:access": "set by csis.infra on the public-read EFS access point"}


def _check_tags(tags: Dict[str, str], declared: bool = True) -> Dict[str, str]:
    """AWS's rules for a tag map; ``declared`` (a map of values, not ``required_tags``' names): no key
    csis.infra sets itself (:data:`RESERVED_TAG_KEYS`)."""
    for k, v in tags.items():
        if not k or len(k) > TAG_KEY_MAX:
            raise ValueError("tag key %r must be 1..%d characters" % (k, TAG_KEY_MAX))
        if k.lower().startswith("aws:"):
            raise ValueError("tag key %r: the 'aws:' prefix is reserved by AWS" % k)
        if declared and k in RESERVED_TAG_KEYS:
            raise ValueError("tag key %r is %s: a declared value would be replaced; choose another key"
                             % (k, RESERVED_TAG_KEYS[k]))
        if len(v) > TAG_VALUE_MAX:
            raise ValueError("tag %r: value longer than %d characters" % (k, TAG_VALUE_MAX))
        why = tag_text_problem(k)
        if why:
            raise ValueError("tag key %r %s" % (k, why))
        why = tag_text_problem(v)
        if why:
            raise ValueError("tag %r: value %r %s" % (k, v, why))
    return tags


class Strict(BaseModel):
    # strict: a quoted "false" or "yes" is a string, not a boolean (no silent coercion)
    model_config = ConfigDict(extra="forbid", validate_default=True, str_strip_whitespace=False, strict=True)


Tags = Dict[str, str]
#: tags checked against AWS's rules (key length, the reserved ``aws:`` prefix, value length)
CheckedTags = Annotated[Tags, AfterValidator(_check_tags)]


def _no_inherited_name(tags: Dict[str, str]) -> Dict[str, str]:
    if "Name" in tags:
        raise ValueError("tag 'Name' may not be set here: these tags reach every resource below (each module "
                         "names its resource after its storage or instance, and an inherited Name would rename them "
                         "all); give a Name in a storage's or an instance's own tags")
    return tags


#: tags that layers above a storage or an instance pass down to every resource below (a hierarchy
#: node's dependency_tags, a runtime's tags, a builder's): checked tags without a ``Name``
InheritedTags = Annotated[Tags, AfterValidator(_check_tags), AfterValidator(_no_inherited_name)]


# --------------------------------------------------------------------------- cfg/_config.yml
def check_region(v: Optional[str]) -> Optional[str]:
    """An AWS region name (a runtime's ``region``, a hierarchy node's ``dependency_configs.region``)."""
    if v is not None and not re.match(r"^[a-z]{2}(-[a-z]+)+-\d\Z", v):
        raise ValueError("region %r is not an AWS region name (like 'us-east-2')" % v)
    return v


def check_aliases(v: Any, normalize: bool = True) -> Any:
    """Aliases are names, as what they stand for is named (a builder's and a runtime's normalized as
    their names are): each entry of a list checked; anything else is left to the field's type."""
    if isinstance(v, list):
        return [check_name(normalize_builder_name(x) if normalize else x, "alias") for x in v]
    return v


def check_account_id(v: Optional[str]) -> Optional[str]:
    if v is not None and not re.match(r"^\d{12}\Z", str(v)):
        raise ValueError("account_id must be 12 digits (quote it)")
    return v


#: an EC2 instance type: family and size, either with dashed parts (``t3.micro``, ``c7i.metal-24xl``,
#: ``u-6tb1.metal``, ``mac2-m2pro.metal``)
_INSTANCE_TYPE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*\.[a-z0-9]+(-[a-z0-9]+)*\Z")


def check_instance_type(v: Optional[str], key: str = "machine_type") -> Optional[str]:
    """An EC2 instance type (``machine_type``, a runtime's ``default_machine_type``); empty or None: unset."""
    if v and not _INSTANCE_TYPE.match(v):
        raise ValueError("%s %r is not an EC2 instance type (like 't3.medium' or 'c7i.metal-24xl')" % (key, v))
    return v


def check_plain_aws_name(v: Optional[str]) -> Optional[str]:
    """A plain AWS name (a machine type, an instance profile)."""
    if v is not None and not re.match(r"^[A-Za-z0-9+=,.@_-]{1,128}\Z", v):
        raise ValueError("%r must be a plain AWS name" % v)
    return v


class ConfigFlags(Strict):
    use_state_backends: bool = False
    apply_identity: Optional[Any] = None
    apply_instances: Any = False
    apply_storage: Any = False
    #: None: the collection's own terraform modules, vendored into generated/.modules/<version>/
    module_source_base: Optional[str] = None
    require_released_builds: bool = False
    #: the version constraint of ``hashicorp/aws`` in roots whose builder declares no
    #: ``required_plugins`` (null: no constraint, as in the reference manual)
    aws_provider_version: Optional[str] = ">= 5.0, < 6.0"
    #: the roots' ``terraform { required_version }`` (null: none, as in the reference manual)
    terraform_required_version: Optional[str] = ">= 1.5.0"
    #: tag keys every storage and instance must carry (validate) and every taggable resource a
    #: plan creates or updates (the gate); only cfg/_config.yml sets it (config/hierarchy.py)
    required_tags: List[str] = Field(default_factory=list)

    @field_validator("required_tags")
    @classmethod
    def _required_tags(cls, v: List[str]) -> List[str]:
        _check_tags({k: "" for k in v}, declared=False)  # requiring csis_config is meaningful
        dupes = sorted({k for k in v if v.count(k) > 1})
        if dupes:
            raise ValueError("required_tags lists %s more than once" % ", ".join(show(k) for k in dupes))
        return v

    @field_validator("aws_provider_version", "terraform_required_version")
    @classmethod
    def _constraint(cls, v: Optional[str], info: Any) -> Optional[str]:
        if v is not None and (not v.strip() or not re.match(r"^[0-9A-Za-z.,<>=!~ -]+\Z", v)):
            raise ValueError("%s %s is not a terraform version constraint (like '>= 5.0, < 6.0'; null for none)"
                             % (info.field_name, show(v)))
        return v

    @field_validator("apply_instances", "apply_storage", "apply_identity", mode="before")
    @classmethod
    def _flag(cls, v: Any, info: Any) -> Any:
        if v is None and info.field_name == "apply_identity":
            return None
        try:
            return parse_apply_flag(v, "@")
        except ValueError as exc:
            raise ValueError(str(exc)[3:] if str(exc).startswith("@: ") else str(exc))

    @field_validator("module_source_base")
    @classmethod
    def _msb(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        if not v or any(c in v for c in '"\n\r$%'):
            raise ValueError("module_source_base %s: must be a path or module URL without quotes, '$', '%%' or newlines"
                             % show(mask_url(v)))
        return v


class MetaStateSetting(Strict):
    """``meta_state:`` of cfg/_config.yml: where meta-state lives (docs/meta-state.md)."""
    backend: Literal["local", "s3"] = "local"
    #: s3: the name of an S3 state backend declared in cfg/state-backends*.yml (its bucket,
    #: region, profile and endpoint are used)
    state_backend: Optional[str] = None
    #: s3: the key prefix the objects go under (``<prefix>/meta-state/...``)
    prefix: Optional[str] = None

    _n = field_validator("state_backend", mode="before")(
        classmethod(lambda cls, v: v if v is None else check_name(normalize_builder_name(v), "state backend name")))

    _prefix = field_validator("prefix")(optional(relative_path, "prefix"))

    @model_validator(mode="after")
    def _required(self) -> "MetaStateSetting":
        if self.backend == "s3" and not self.state_backend:
            raise keyed_error("state_backend", "an s3 meta-state needs 'state_backend' (an s3 state backend's name)")
        if self.backend == "local" and (self.state_backend or self.prefix):
            raise keyed_error("state_backend" if self.state_backend else "prefix",
                              "a local meta-state takes neither 'state_backend' nor 'prefix'")
        return self


class ApprovalsSetting(Strict):
    """``approvals:`` of cfg/_config.yml: who may approve an apply (docs/awx.md, "Approvals")."""
    #: the apply job's launcher must differ from the plan job's requester (both as AWX passes
    #: them, ``awx_user_name``); a terminal run, where one person is both, is refused
    distinct_approver: bool = False
    #: an apply job refuses a receipt older than this ('8h', '1d'): the plan job that gated the
    #: plan (the last one to gate the same digest) ran longer ago; None: receipts do not expire
    receipt_max_age: Optional[str] = None

    _max_age = field_validator("receipt_max_age")(classmethod(lambda cls, v: check_duration(v)))


class WorkspaceSetting(Strict):
    """``workspace:`` of cfg/_config.yml: the git workspace every rendered root is committed to
    (docs/operations.md, "Git workspace: merge is approval"). Only cfg/_config.yml sets it."""
    #: the workspace repository: a URL git understands, or a path (relative to the configuration root)
    repo: str
    #: the apply refuses a root whose rendered files differ from what main_branch holds
    require_merge: bool = False
    #: the branch a merge goes to (merge = approval)
    main_branch: str = "main"

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not v.strip() or v.startswith("-") or any(c in v for c in "\0\n\r") or v.startswith("ext::"):
            raise ValueError("repo %s: must be a git URL or a path (not empty, no leading '-', no newline, "
                             "no ext:: transport)" % show(mask_url(v)))
        return v

    @field_validator("main_branch")
    @classmethod
    def _main(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*\Z", v) or ".." in v or "//" in v or v.endswith((".lock", "/", ".")):
            raise ValueError("main_branch %s is not a plain branch name (letters, digits, '.', '_', '-', '/')" % show(v))
        return v


class ConfigFile(Strict):
    id: Optional[str] = None
    description: Optional[str] = None
    config: ConfigFlags = Field(default_factory=ConfigFlags)
    meta_state: Optional[MetaStateSetting] = None
    approvals: ApprovalsSetting = Field(default_factory=ApprovalsSetting)
    workspace: Optional[WorkspaceSetting] = None

    _id = field_validator("id")(optional(check_name, "id"))


# --------------------------------------------------------------------------- executables
class Executable(Strict):
    name: str
    type: Literal["tofu", "terraform"] = "tofu"
    binary: str
    version: Optional[str] = None
    description: Optional[str] = None

    _n = field_validator("name")(classmethod(lambda cls, v: check_name(v, "executable name")))

    @field_validator("binary")
    @classmethod
    def _binary(cls, v: str) -> str:
        if not v or any(c in v for c in "\n\r\"'`$;|&<>"):
            raise ValueError("binary %r must be a plain path or command name" % v)
        return v

    @field_validator("version")
    @classmethod
    def _version(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        try:
            SpecifierSet(v)
        except InvalidSpecifier:
            raise ValueError("version %r is not a version requirement (PEP 440, e.g. '>=1.5,<2')" % v)
        return v


class ExecutablesFile(Strict):
    executables: List[Executable] = Field(default_factory=list)


# --------------------------------------------------------------------------- runtime
class Endpoints(Strict):
    """A custom AWS endpoint: one URL for every service, and/or per-service URLs."""
    url: Optional[str] = None
    services: Dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _url(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            _check_url(v)
        return v

    @field_validator("services")
    @classmethod
    def _svc(cls, v: Dict[str, str]) -> Dict[str, str]:
        for k, u in v.items():
            if not re.match(r"^[a-z0-9]+\Z", k):
                raise ValueError("service name %r must be a lowercase AWS service key (ec2, s3, efs, sts, ...)" % k)
            _check_url(u)
        return v

    def for_service(self, service: str) -> Optional[str]:
        return self.services.get(service) or self.url


def _check_url(v: str) -> None:
    if not re.match(r"^https?://[A-Za-z0-9.\-\[\]:]+(:\d+)?(/[A-Za-z0-9._~/-]*)?\Z", v):
        raise ValueError("endpoint %s must be an http(s) URL" % show(mask_url(v)))


def secret_field(policy: str) -> Any:
    """A secret field (config/secrets.py): takes a ``!vault`` value (policy ``vault``: only that;
    ``clear``: clear text too). Left out of ``model_dump``; docs/configuration.md marks it."""
    return Field(default=None, exclude=True, repr=False, json_schema_extra={secrets.SECRET_MARK: policy})


class Credentials(Strict):
    """How the runtime's provider (and nothing else yet) authenticates: a named profile, or
    static keys (secret fields: the secret key and the session token only as ``!vault``)."""
    profile_name: Optional[str] = None
    access_key_id: Optional[Any] = secret_field("clear")
    secret_access_key: Optional[Any] = secret_field("vault")
    session_token: Optional[Any] = secret_field("vault")

    _p = field_validator("profile_name")(optional(check_name, "profile_name"))

    @field_validator("access_key_id", "secret_access_key", "session_token", mode="before")
    @classmethod
    def _secret(cls, v: Any, info: Any) -> Any:
        return secrets.check_secret(v, info.field_name, secrets.policy_of(cls, info.field_name) or "vault")

    @model_validator(mode="after")
    def _static(self) -> "Credentials":
        has_id, has_key = self.access_key_id is not None, self.secret_access_key is not None
        if has_id != has_key:
            raise keyed_error("secret_access_key" if has_id else "access_key_id",
                              "static credentials need both access_key_id and secret_access_key")
        if self.session_token is not None and not has_id:
            raise keyed_error("session_token", "a session_token goes with access_key_id and secret_access_key")
        if has_id and self.profile_name:
            raise keyed_error("profile_name", "profile_name and static keys (access_key_id, secret_access_key) "
                                              "exclude each other: give one or the other")
        return self

    def static(self) -> bool:
        """Whether the runtime authenticates with static keys (the provider's access_key/secret_key)."""
        return self.access_key_id is not None


_AWS_ID = re.compile(r"^[a-z]+-[0-9a-f]{8,17}\Z")


def _aws_id(v: str, prefix: str) -> str:
    if not (isinstance(v, str) and v.startswith(prefix + "-") and _AWS_ID.match(v)):
        raise ValueError("%r is not a %s id (%s-0123abcd...)" % (v, prefix, prefix))
    return v


class Subnet(Strict):
    name: Optional[str] = None
    subnet_id: str
    availability_zone: Optional[str] = None
    public: bool = False
    is_default: bool = False

    _az = field_validator("availability_zone")(optional(check_zone))
    # it reaches the EFS root's mount targets: a subnet id, as default_subnet_id is
    _id = field_validator("subnet_id")(classmethod(lambda cls, v: _aws_id(v, "subnet")))
    _name = field_validator("name")(optional(check_name, "subnet name"))


class Networking(Strict):
    network: Optional[str] = None
    default_subnet_id: Optional[str] = None
    default_availability_zone: Optional[str] = None
    ssh_ingress_security_group_ids: List[str] = Field(default_factory=list)
    addl_security_groups: List[str] = Field(default_factory=list)
    subnets: List[Subnet] = Field(default_factory=list)

    _vpc = field_validator("network")(optional(_aws_id, "vpc"))

    _sub = field_validator("default_subnet_id")(optional(_aws_id, "subnet"))

    @field_validator("ssh_ingress_security_group_ids", "addl_security_groups")
    @classmethod
    def _sgs(cls, v: List[str]) -> List[str]:
        return [_aws_id(x, "sg") for x in v]

    @model_validator(mode="after")
    def _default_subnet(self) -> "Networking":
        """A subnet marked ``is_default`` is the default subnet (the reference's way of naming it),
        unless ``default_subnet_id`` names it already; two marked, or a mark and another
        ``default_subnet_id``, are refused rather than one of them silently ignored."""
        marked = [sub.subnet_id for sub in self.subnets if sub.is_default]
        if len(marked) > 1:
            raise keyed_error("subnets", "more than one subnet is marked is_default: %s" % marked)
        if marked and self.default_subnet_id not in (None, marked[0]):
            raise keyed_error("default_subnet_id", "default_subnet_id %s differs from the subnet marked is_default (%s): "
                              "name one default subnet" % (self.default_subnet_id, marked[0]))
        if marked:
            self.default_subnet_id = _aws_id(marked[0], "subnet")  # checked as default_subnet_id is
        return self

    @field_validator("default_availability_zone")
    @classmethod
    def _az(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not AZ_RE.match(v):
            raise ValueError("default_availability_zone %r is not an AWS zone name" % v)
        return v

    def subnet_zone(self, subnet_id: Optional[str]) -> Optional[str]:
        for s in self.subnets:
            if s.subnet_id == subnet_id:
                return s.availability_zone
        return None

    def effective_zone(self) -> Optional[str]:
        """The zone an instance of this runtime lands in (its default subnet's)."""
        return self.subnet_zone(self.default_subnet_id) or self.default_availability_zone

    def private_subnets_per_zone(self) -> List[str]:
        seen: Dict[str, str] = {}
        for s in self.subnets:
            if not s.public and s.availability_zone and s.availability_zone not in seen:
                seen[s.availability_zone] = s.subnet_id
        return list(seen.values())


def check_ssh_path(v: str, what: str) -> str:
    if not isinstance(v, str) or not SSH_PATH_RE.match(v) or ".." in v.split("/"):
        raise ValueError("%s %s is not a plain file path (letters, digits, '_', '.', '+', '@', ',', '=', '-', '/', an "
                         "optional leading '~/'; no '..', no leading '-', no spaces, quotes or '%%')" % (what, show(v)))
    return v


class SshSession(Strict):
    """How csis.infra reaches a runtime's machines over SSH (``session_mechanism: ssh``)."""
    user: str
    private_key_file: str
    port: int = 22
    address: Literal["private_ip", "public_ip"] = "private_ip"
    known_hosts_file: Optional[str] = None
    host_key_checking: Literal["strict", "accept-new"] = "strict"
    connect_timeout: int = 10
    config_file: Optional[str] = None

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not SSH_USER_RE.match(v):
            raise ValueError("user %s is not a login name (a letter or '_', then letters, digits, '_', '.', '-'; "
                             "at most 32 characters)" % show(v))
        return v

    @field_validator("private_key_file", "known_hosts_file", "config_file")
    @classmethod
    def _path(cls, v: Optional[str], info: Any) -> Optional[str]:
        return None if v is None else check_ssh_path(v, info.field_name)

    @field_validator("port", "connect_timeout")
    @classmethod
    def _range(cls, v: int, info: Any) -> int:
        low, high, what = {"port": (1, 65535, "is not a TCP port (1-65535)"),
                           "connect_timeout": (1, 300, "must be 1-300 seconds")}[info.field_name]
        if not low <= v <= high:
            raise ValueError("%s %d %s" % (info.field_name, v, what))
        return v


class RuntimeBuilder(Strict):
    name: str
    type: Literal["aws"] = "aws"
    description: Optional[str] = None
    aliases: List[str] = Field(default_factory=list)
    is_default: bool = False
    region: str
    account_id: Optional[str] = None
    credentials: Credentials = Field(default_factory=Credentials)
    endpoints: Endpoints = Field(default_factory=Endpoints)
    skip_credentials_validation: bool = False
    skip_requesting_account_id: bool = False
    skip_metadata_api_check: bool = False
    s3_use_path_style: bool = False
    session_mechanism: Literal["ssm", "ssh", "none"] = "ssm"
    session_instance_profile: Optional[str] = None
    ssh: Optional[SshSession] = None
    default_machine_type: str = "t3.micro"
    networking: Networking = Field(default_factory=Networking)
    state_configuration: Optional[str] = None
    on_failure: Literal["keep", "teardown"] = "keep"
    teardown_after: Optional[str] = None
    tags: InheritedTags = Field(default_factory=dict)
    config: Dict[str, Any] = Field(default_factory=dict)
    #: the environment node of cfg/hierarchy.yml this runtime belongs to (its tags and configs flow down)
    environment: Optional[str] = None

    _n = field_validator("name", mode="before")(classmethod(lambda cls, v: check_name(normalize_builder_name(v), "runtime name")))
    # an apply flag names a runtime by them: names, as a builder's aliases are
    _al = field_validator("aliases", mode="before")(classmethod(lambda cls, v: check_aliases(v)))

    _env = field_validator("environment", mode="before")(
        classmethod(lambda cls, v: v if v is None else check_name(normalize_builder_name(v), "environment")))

    _region = field_validator("region")(classmethod(lambda cls, v: check_region(v)))
    _acct = field_validator("account_id")(classmethod(lambda cls, v: check_account_id(v)))
    _plain = field_validator("session_instance_profile")(classmethod(lambda cls, v: check_plain_aws_name(v)))
    _mt = field_validator("default_machine_type")(
        classmethod(lambda cls, v: check_instance_type(v, "default_machine_type")))

    _ta = field_validator("teardown_after")(classmethod(lambda cls, v: check_duration(v)))

    @model_validator(mode="after")
    def _ssh(self) -> "RuntimeBuilder":
        if self.session_mechanism == "ssh" and self.ssh is None:
            raise keyed_error("ssh", "session_mechanism 'ssh' needs an 'ssh:' block (at least user and private_key_file): "
                                     "csis_unmount logs in with it")
        return self


class RuntimeBuildersFile(Strict):
    runtime_builders: List[RuntimeBuilder] = Field(default_factory=list)


# --------------------------------------------------------------------------- state backends
class StateBackend(Strict):
    name: str
    type: Literal["s3", "local"]
    description: Optional[str] = None
    is_default: bool = False
    # s3
    bucket: Optional[str] = None
    key: Optional[str] = None
    region: Optional[str] = None
    profile: Optional[str] = None
    encrypt: bool = True
    use_lockfile: bool = True
    endpoints: Endpoints = Field(default_factory=Endpoints)
    use_path_style: bool = False
    skip_credentials_validation: bool = False
    # local
    directory: Optional[str] = None

    _n = field_validator("name", mode="before")(classmethod(lambda cls, v: check_name(normalize_builder_name(v), "state backend name")))

    _path = field_validator("key", "directory")(optional(relative_path, "path"))

    _bucket = field_validator("bucket")(optional(check_bucket, "bucket"))
    # it reaches every root's backend file and terraform_remote_state settings: an AWS region, or an
    # S3-compatible store's own region word (Cloudflare R2's "auto"), one plain token either way
    _region = field_validator("region")(optional(check_name, "region"))

    _p = field_validator("profile")(optional(check_name, "profile"))

    @model_validator(mode="after")
    def _required(self) -> "StateBackend":
        if self.type == "s3":
            missing = [k for k in ("bucket", "key", "region") if not getattr(self, k)]
            if missing:
                raise keyed_error(missing[0], "an s3 state backend needs %s" % ", ".join(missing))
        else:
            if self.bucket or self.key:
                raise keyed_error("bucket" if self.bucket else "key",
                                  "a local state backend takes 'directory', not bucket/key")
        return self


class StateBackendsFile(Strict):
    state_backends: List[StateBackend] = Field(default_factory=list)


# --------------------------------------------------------------------------- builders
class RequiredPlugin(Strict):
    name: str
    version: str
    source: Optional[str] = None
    config: Dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _n(cls, v: str) -> str:
        if not re.match(r"^[a-z][a-z0-9_-]*\Z", v):
            raise ValueError("provider name %r must be a terraform provider local name" % v)
        return v

    @field_validator("version", "source")
    @classmethod
    def _s(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and any(c in v for c in '"\\\n$%'):
            raise ValueError("%r must not contain quotes, backslashes, '$', '%%' or newlines" % v)
        return v


class _BuilderBase(Strict):
    name: str
    type: str
    description: Optional[str] = None
    aliases: List[str] = Field(default_factory=list)
    executable: Optional[str] = "tofu"
    is_default: bool = False
    config: Dict[str, Any] = Field(default_factory=dict)
    gitignore: List[str] = Field(default_factory=list)
    tags: InheritedTags = Field(default_factory=dict)
    runtime: str = "default"

    @model_validator(mode="before")
    @classmethod
    def _parameters(cls, data: Any) -> Any:
        if isinstance(data, dict) and "parameters" in data:
            raise keyed_error("parameters", "'parameters:' is not supported on builders; declare module inputs under 'variables:' instead")
        return data

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, v: Any) -> Any:
        return check_name(normalize_builder_name(v), "builder name")

    _aliases = field_validator("aliases", mode="before")(classmethod(lambda cls, v: check_aliases(v)))

    @field_validator("runtime", mode="before")
    @classmethod
    def _rt(cls, v: Any) -> Any:
        return check_name(normalize_builder_name(v), "runtime")


class InstanceBuilder(_BuilderBase):
    type: Literal["tofu"]
    required_plugins: List[RequiredPlugin] = Field(default_factory=list)
    state_configuration: str = "default"

    @model_validator(mode="before")
    @classmethod
    def _novars(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "variables" in data:
                raise keyed_error("variables", "'variables:' is not supported on an instance builder: the module inputs come from the instance and its runtime")
            if "modifications" in data:
                raise keyed_error("modifications", "'modifications:' belong on images, not on an instance builder")
        return data


class EbsVariables(Strict):
    volume_type: Optional[Literal["gp2", "gp3", "io1", "io2", "st1", "sc1", "standard"]] = None
    encrypted: Optional[bool] = None
    tags: InheritedTags = Field(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _size(cls, data: Any, handler: Any) -> Any:
        """``size`` under ``variables:`` is refused, together with every other problem of the
        mapping (a misspelt ``volume-type`` beside it is named too: every error at once)."""
        if not (isinstance(data, dict) and "size" in data):
            return handler(data)
        misplaced = InitErrorDetails(type="value_error", loc=(), input=data, ctx={"error": keyed_error(
            "size", "'size' is a builder field of tf-aws-ebs, not a variable: move it out of 'variables:'")})
        others: List[Any] = []
        try:
            handler({k: v for k, v in data.items() if k != "size"})
        except ValidationError as exc:
            others = [InitErrorDetails(type=e["type"], loc=e["loc"], input=e["input"], **({"ctx": e["ctx"]} if "ctx" in e else {}))
                      for e in exc.errors()]
        raise ValidationError.from_exception_data(cls.__name__, [misplaced] + others)


class EfsVariables(Strict):
    performance_mode: Optional[Literal["generalPurpose", "maxIO"]] = None
    encrypted: Optional[bool] = None
    tags: InheritedTags = Field(default_factory=dict)


class S3Variables(Strict):
    force_destroy: Optional[bool] = None
    tags: InheritedTags = Field(default_factory=dict)


class _StorageBuilderBase(_BuilderBase):
    required_plugins: List[RequiredPlugin] = Field(default_factory=list)
    state_configuration: str = "default"


class TfAwsStorageBuilder(_StorageBuilderBase):
    """``tf-aws``: the abstract base; accepted at load, refused at validate (it emits nothing)."""
    type: Literal["tf-aws"]
    variables: Dict[str, Any] = Field(default_factory=dict)


class EbsStorageBuilder(_StorageBuilderBase):
    type: Literal["tf-aws-ebs"]
    size: int = Field(default=100, gt=0, le=65536)
    variables: EbsVariables = Field(default_factory=EbsVariables)


class EfsStorageBuilder(_StorageBuilderBase):
    type: Literal["tf-aws-efs"]
    variables: EfsVariables = Field(default_factory=EfsVariables)


class S3StorageBuilder(_StorageBuilderBase):
    type: Literal["tf-aws-s3"]
    bucket_name: str
    variables: S3Variables = Field(default_factory=S3Variables)

    @field_validator("bucket_name")
    @classmethod
    def _b(cls, v: str) -> str:
        return check_bucket(v, "bucket_name")


StorageBuilder = Annotated[Union[EbsStorageBuilder, EfsStorageBuilder, S3StorageBuilder, TfAwsStorageBuilder],
                           Field(discriminator="type")]

#: capability type, cardinality, zonal, POSIX, archive support per storage builder type
STORAGE_KINDS: Dict[str, Dict[str, Any]] = {
    "tf-aws-ebs": {"capability": "ebs", "single_attach": True, "zonal": True, "posix": True, "archive": True,
                   "module": "aws_storage_ebs"},
    "tf-aws-efs": {"capability": "efs", "single_attach": False, "zonal": False, "posix": True, "archive": False,
                   "module": "aws_storage_efs"},
    "tf-aws-s3": {"capability": "s3", "single_attach": False, "zonal": False, "posix": False, "archive": False,
                  "module": "aws_storage_s3"},
    "tf-aws": {"capability": None, "single_attach": False, "zonal": False, "posix": False, "archive": False,
               "module": None},
}


class InstanceBuildersFile(Strict):
    instance_builders: List[InstanceBuilder] = Field(default_factory=list)


class StorageBuildersFile(Strict):
    # the entry's ``type`` selects its model (an unknown type is reported at its key)
    storage_builders: List[StorageBuilder] = Field(default_factory=list)


class EnrollmentToken(Strict):
    """Where a group builder's enrollment token lives: an SSM parameter (a SecureString) the
    identity root reads and publishes as the sensitive output ``sft_enrollment_token``.
    Only the parameter's name is configuration; the token never is."""
    ssm_parameter: str

    @field_validator("ssm_parameter")
    @classmethod
    def _param(cls, v: str) -> str:
        if not re.match(r"^/?[A-Za-z0-9_.\-/]{1,1011}\Z", v) or "//" in v:
            # the value is not echoed: a token pasted here by mistake must not reach a log
            raise ValueError("ssm_parameter is not an SSM parameter name (letters, digits, '_.-/'): name the parameter "
                             "that holds the token, never the token itself")
        return v


class GroupBuilder(_BuilderBase):
    """An identity builder: owns groups and publishes their gids from its own root."""
    type: Literal["tf-identity"]
    executable: Optional[str] = "tofu"
    state_configuration: str = "default"
    required_plugins: List[RequiredPlugin] = Field(default_factory=list)
    #: the group builder's token reference (the manual's enrollment token source)
    enrollment_token: Optional[EnrollmentToken] = None


class GroupBuildersFile(Strict):
    group_builders: List[GroupBuilder] = Field(default_factory=list)


# --------------------------------------------------------------------------- groups, images
class Group(Strict):
    name: str
    gid: int = Field(gt=0, lt=2 ** 31)
    type: str = "default"
    description: Optional[str] = None

    _n = field_validator("name")(classmethod(lambda cls, v: check_name(v, "group name")))

    @field_validator("name")
    @classmethod
    def _all(cls, v: str) -> str:
        if v == "ALL":
            raise ValueError("the group name 'ALL' is retired; list the groups explicitly")
        return v


class GroupsFile(Strict):
    groups: List[Group] = Field(default_factory=list)


class ImageTests(Strict):
    post_bake: List[str] = Field(default_factory=list)


class Image(Strict):
    name: str
    group: Optional[str] = None
    description: Optional[str] = None
    name_pattern: Optional[str] = None
    ami_id: Optional[str] = None
    storage_types: List[Literal["ebs", "efs", "s3"]] = Field(default_factory=list)
    runtimes: List[str] = Field(default_factory=list)
    tests: ImageTests = Field(default_factory=ImageTests)
    tags: CheckedTags = Field(default_factory=dict)
    #: the released builds of this image (AMI ids): what ``config.require_released_builds`` admits
    released_builds: List[str] = Field(default_factory=list)

    _n = field_validator("name")(classmethod(lambda cls, v: check_name(v, "image name")))

    @field_validator("name_pattern")
    @classmethod
    def _np(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.match(r"^[A-Za-z0-9_.()\[\]/ -]{1,120}\Z", v):
            raise ValueError("name_pattern %r: use the AMI name prefix (letters, digits, '_.-()[]/ ')" % v)
        return v

    _ami = field_validator("ami_id")(optional(_aws_id, "ami"))

    @field_validator("released_builds")
    @classmethod
    def _released(cls, v: List[str]) -> List[str]:
        return [_aws_id(x, "ami") for x in v]


class ImagesFile(Strict):
    images: List[Image] = Field(default_factory=list)


# --------------------------------------------------------------------------- storages
class Storage(Strict):
    name: str
    type: str = "default"
    runtime: str = "default"
    description: Optional[str] = None
    groups: List[str] = Field(default_factory=list)
    public_read: bool = False
    share_mode: Literal["2770", "2775"] = "2770"
    state: Literal["active", "archived", "destroyed"] = "active"
    availability_zone: Optional[str] = None
    bucket_name: Optional[str] = None
    config: Dict[str, Any] = Field(default_factory=dict)
    lifecycle: Optional[Dict[str, Any]] = None
    tags: CheckedTags = Field(default_factory=dict)
    mount_point: Optional[str] = None
    source: Optional[str] = None
    ephemeral: bool = False
    generative: bool = False
    singleton: bool = False
    is_default: bool = False

    _n = field_validator("name")(classmethod(lambda cls, v: check_name(v, "storage name")))

    @field_validator("share_mode", mode="before")
    @classmethod
    def _sm(cls, v: Any) -> Any:
        number = isinstance(v, int) and not isinstance(v, bool)
        if number and str(v) in SHARE_MODES:
            return str(v)  # an unquoted 2775
        if v not in SHARE_MODES:
            octal = (" (YAML read an unquoted number with a leading 0 as octal: %s is 0%o; write it quoted)" % (v, v)
                     if number and "%o" % v in SHARE_MODES else "")
            raise ValueError("share_mode %r: expected one of ('2770', '2775') (N15)%s" % (v, octal))
        return v

    @field_validator("state", mode="before")
    @classmethod
    def _state(cls, v: Any) -> Any:
        if v not in STORAGE_STATES:
            raise ValueError("unknown state %r: expected one of active, archived, destroyed" % (v,))
        return v

    _ref = field_validator("type", "runtime", mode="before")(classmethod(check_builder_reference))

    @field_validator("groups")
    @classmethod
    def _groups(cls, v: List[str]) -> List[str]:
        for g in v:
            if g == "ALL":
                raise ValueError("the group value 'ALL' is retired; list the groups explicitly (or set public_read)")
            check_name(g, "group")
        return v

    _az = field_validator("availability_zone")(optional(check_zone))

    _b = field_validator("bucket_name")(optional(check_bucket, "bucket_name"))

    @field_validator("config")
    @classmethod
    def _cfg(cls, v: Dict[str, Any]) -> Dict[str, Any]:
        fsid = v.get("file_system_id")
        if fsid is not None and not re.match(r"^fs-[0-9a-f]{8,17}\Z", str(fsid)):
            raise ValueError("config.file_system_id %r is not an EFS filesystem id (fs-...)" % (fsid,))
        return v


class StoragesFile(Strict):
    storages: List[Storage] = Field(default_factory=list)


# --------------------------------------------------------------------------- instances
class StorageMapping(Strict):
    name: str
    mount_point: str = "/mnt/storage"
    min_size: int = 100

    _n = field_validator("name")(classmethod(lambda cls, v: check_name(v, "storage name")))

    @field_validator("min_size")
    @classmethod
    def _min(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("min_size must be a positive number of GB, got %d" % v)
        return v

    @field_validator("mount_point")
    @classmethod
    def _mp(cls, v: str) -> str:
        if not v:
            raise ValueError("mount_point must not be empty")
        if not mount_point_ok(v):
            raise ValueError("mount_point %s must be an absolute path of plain names (letters, digits, '_.@+-'), "
                             "without '..', spaces or quotes" % show(v))
        return v


class Instance(Strict):
    name: str
    type: str = "default"
    image: Optional[str] = None
    runtime: str = "default"
    description: Optional[str] = None
    storages: List[StorageMapping] = Field(default_factory=list)
    userdata: str = ""
    image_policy: str = "pinned"
    ephemeral: bool = False
    on_failure: Optional[str] = None
    teardown_after: Optional[str] = None
    machine_type: str = ""
    availability_zone: Optional[str] = None
    tags: CheckedTags = Field(default_factory=dict)
    config: Dict[str, Any] = Field(default_factory=dict)
    aliases: List[str] = Field(default_factory=list)
    undeclare: bool = False

    _n = field_validator("name")(classmethod(lambda cls, v: check_name(v, "instance name")))
    # names, as a builder's aliases are
    _al = field_validator("aliases", mode="before")(classmethod(lambda cls, v: check_aliases(v, normalize=False)))

    @model_validator(mode="before")
    @classmethod
    def _nogroups(cls, data: Any) -> Any:
        if isinstance(data, dict) and "groups" in data:
            raise keyed_error("groups", "'groups:' is not allowed on an instance: ownership lives on the image's 'group'")
        return data

    _ref = field_validator("type", "runtime", mode="before")(classmethod(check_builder_reference))

    @field_validator("storages")
    @classmethod
    def _dedupe(cls, v: List[StorageMapping]) -> List[StorageMapping]:
        # The same storage listed twice keeps the later mapping (manual), in first-seen order.
        out: Dict[str, StorageMapping] = {}
        for m in v:
            out[m.name] = m
        return list(out.values())

    _mt = field_validator("machine_type")(classmethod(lambda cls, v: check_instance_type(v)))

    _az = field_validator("availability_zone")(optional(check_zone))


class InstancesFile(Strict):
    instances: List[Instance] = Field(default_factory=list)


# --------------------------------------------------------------------------- hierarchy
#: the runtime keys a hierarchy node's ``dependency_configs`` may seed (config/hierarchy.py)
DEPENDENCY_CONFIG_KEYS = ("region", "account_id", "default_machine_type")


class DependencyConfigs(Strict):
    """What a node of cfg/hierarchy.yml seeds into the runtimes beneath it: each key is the
    default of the runtime key of the same name (the runtime's own value wins; the nearest node
    wins over a farther one). Checked as the runtime checks them."""
    region: Optional[str] = None
    account_id: Optional[str] = None
    default_machine_type: Optional[str] = None

    # checked exactly as the runtime checks the keys they seed
    _region = field_validator("region")(classmethod(lambda cls, v: check_region(v)))
    _acct = field_validator("account_id")(classmethod(lambda cls, v: check_account_id(v)))
    _mt = field_validator("default_machine_type")(
        classmethod(lambda cls, v: check_instance_type(v, "default_machine_type")))


class HierarchyNode(Strict):
    """An abstract node of cfg/hierarchy.yml: an account, or an environment (a region) under an
    account or under another environment."""
    name: str
    kind: Literal["account", "environment"]
    parent: Optional[str] = None
    description: Optional[str] = None
    dependency_tags: InheritedTags = Field(default_factory=dict)
    dependency_configs: DependencyConfigs = Field(default_factory=DependencyConfigs)

    _n = field_validator("name", mode="before")(
        classmethod(lambda cls, v: check_name(normalize_builder_name(v), "node name")))

    _p = field_validator("parent", mode="before")(
        classmethod(lambda cls, v: v if v is None else check_name(normalize_builder_name(v), "parent")))

    @model_validator(mode="after")
    def _parent(self) -> "HierarchyNode":
        if self.kind == "account" and self.parent is not None:
            raise keyed_error("parent", "account '%s' is a top node and takes no parent (an environment names its "
                                        "account as its parent)" % self.name)
        if self.kind == "environment" and self.parent is None:
            raise keyed_error("parent", "environment '%s' needs a parent: its account (or another environment)"
                              % self.name)
        return self


class HierarchyFile(Strict):
    hierarchy: List[HierarchyNode] = Field(default_factory=list)


# --------------------------------------------------------------------------- overlays
class OverlayFile(Strict):
    """An overlay: ``config:`` keys replace the file's; runtime and backend entries are
    deep-merged by name onto the declared ones (e.g. a local endpoint and networking)."""
    config: Dict[str, Any] = Field(default_factory=dict)
    runtime_builders: List[Dict[str, Any]] = Field(default_factory=list)
    state_backends: List[Dict[str, Any]] = Field(default_factory=list)
    description: Optional[str] = None
