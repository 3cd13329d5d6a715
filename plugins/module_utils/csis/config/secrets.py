# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Secret fields and ansible-vault values (``!vault``) of a configuration tree.

* A field is *secret* when its model declares it with :func:`secret_field`; the policy says
  whether it takes clear text too (``clear``) or only a ``!vault`` value (``vault``).
  :data:`SECRET_FIELDS` lists them as docs/configuration.md does. A ``!vault`` value
  anywhere else is refused by the loader, naming file and key.
* This library never decrypts: the loader keeps a ``!vault`` value as a
  :class:`~..yamlio.Vaulted` (ciphertext, file, key). Whoever holds the vault secrets (the
  controller side of an Ansible run: ``plugins/plugin_utils/vault.py``) decrypts, through a
  :data:`Decrypt` callback that raises :class:`VaultSecretMissing` or :class:`VaultDecryptFailed`;
  :func:`vault_problems` turns the values it cannot decrypt into problems (file, key, why).
* :func:`tf_secrets` is what a rendered root needs of its runtime's secret fields: one
  ``TF_VAR_`` per value, carrying the ciphertext (or the clear text a ``clear`` field was
  given), never a decrypted value.

Plain Python: no Ansible, no pydantic needed to import it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError, Problem
from ..yamlio import Vaulted

#: decrypt(ciphertext) -> clear text; raises VaultSecretMissing / VaultDecryptFailed
Decrypt = Callable[[str], str]
#: reveal(a secret field's value) -> its clear text (:func:`revealer`)
Reveal = Callable[[Any], str]

#: the ``json_schema_extra`` key of a secret field (value: "clear" or "vault")
SECRET_MARK = "csis_secret"

#: every secret field, as docs/configuration.md names them: (where, policy)
SECRET_FIELDS: Tuple[Tuple[str, str], ...] = (
    ("cfg/runtime-builders.yml runtime_builders[].credentials.access_key_id", "clear"),
    ("cfg/runtime-builders.yml runtime_builders[].credentials.secret_access_key", "vault"),
    ("cfg/runtime-builders.yml runtime_builders[].credentials.session_token", "vault"),
)

NO_SECRET = ("no vault secret was given (run ansible-playbook with --vault-password-file, --vault-id "
             "or --ask-vault-pass)")
NOT_DECRYPTED = "the vault secret(s) given do not decrypt it (a wrong password, or its --vault-id not given)"

#: a runtime's credentials field -> (the terraform variable of a rendered root, the provider argument)
CREDENTIAL_VARIABLES: Tuple[Tuple[str, str, str], ...] = (
    ("access_key_id", "csis_aws_access_key", "access_key"),
    ("secret_access_key", "csis_aws_secret_key", "secret_key"),
    ("session_token", "csis_aws_token", "token"),
)


class VaultSecretMissing(Exception):
    """No vault secret was given to the run."""


class VaultDecryptFailed(Exception):
    """The vault secrets given do not decrypt the value."""


def not_secret_message() -> str:
    """Why a ``!vault`` value at a field that is not secret is refused (the problem names the key)."""
    return ("a !vault value is allowed only at a secret field (%s; docs/configuration.md, \"Secret fields\"), "
            "and this key is not one" % ", ".join(w.split(" ", 1)[1] for w, _p in SECRET_FIELDS))


def clear_refused_message(field: str) -> str:
    """Why clear text at a ``vault``-only secret field is refused (the value itself is never shown)."""
    return ("%s is a secret: write it as a !vault value (ansible-vault encrypt_string --name %s), "
            "clear text is refused here" % (field, field))


def check_secret(value: Any, field: str, policy: str) -> Any:
    """A secret field's value: a :class:`Vaulted`, or (policy ``clear``) a non-empty single-line string."""
    if value is None or isinstance(value, Vaulted):
        return value
    if not isinstance(value, str):
        raise ValueError("%s must be a !vault value%s" % (field, " or a string" if policy == "clear" else ""))
    if policy != "clear":
        raise ValueError(clear_refused_message(field))
    if not value or value != value.strip() or any(c in value for c in "\r\n\t"):
        raise ValueError("%s must be a non-empty single-line string without surrounding whitespace" % field)
    return value


def policy_of(model: Any, name: str) -> Optional[str]:
    """The secret policy of field ``name`` of pydantic ``model`` ("clear", "vault"), None if not secret."""
    fields = getattr(model, "model_fields", None) or {}
    info = fields.get(name)
    extra = getattr(info, "json_schema_extra", None) if info is not None else None
    return extra.get(SECRET_MARK) if isinstance(extra, dict) else None


def _decrypted(value: Vaulted, decrypt: Optional[Decrypt]) -> Tuple[Optional[str], Optional[str]]:
    """(clear text, None), or (None, why it cannot be decrypted)."""
    if decrypt is None:
        return None, NO_SECRET
    try:
        return decrypt(value.ciphertext), None
    except VaultSecretMissing:
        return None, NO_SECRET
    except Exception:  # noqa: BLE001 - any failure of the callback: not decrypted
        return None, NOT_DECRYPTED


def vault_problems(vaulted: Iterable[Vaulted], decrypt: Optional[Decrypt]) -> List[Problem]:
    """A problem (file, key, why) for each value ``decrypt`` cannot decrypt; ``decrypt`` None:
    no vault secret was given. The clear text is dropped at once."""
    out: List[Problem] = []
    for v in vaulted:
        _clear, reason = _decrypted(v, decrypt)
        if reason:
            out.append(Problem(v.file, v.key, "cannot decrypt this !vault value: " + reason))
    return out


def problems_rule(problems: Sequence[Mapping[str, str]]) -> Callable[[Any], None]:
    """An ``extra`` rule of ``validate.load_and_validate``: adds problems found elsewhere (the
    controller's decryption of the tree's !vault values), so they are reported with the rest."""
    found = [Problem(str(p.get("file", "")), str(p.get("key", "")), str(p.get("message", ""))) for p in problems]

    def rule(validation: Any) -> None:
        validation.problems.extend(found)
    return rule


def revealer(decrypt: Optional[Decrypt]) -> Reveal:
    """reveal(value): the clear text of a secret field's value: a :class:`Vaulted` decrypted by
    ``decrypt`` (None: no vault secret was given), a clear string as it is. A value that does
    not decrypt raises :class:`~..errors.ConfigError` naming its file and key."""
    def reveal(value: Any) -> str:
        if not isinstance(value, Vaulted):
            return str(value)
        clear, reason = _decrypted(value, decrypt)
        if clear is None:
            raise ConfigError([Problem(value.file, value.key, "cannot decrypt this !vault value: %s" % reason)])
        return clear
    return reveal


def root_credentials(secret_map: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """``{credentials field: Vaulted | clear text}`` of a rendered root's ``secrets`` (what
    :func:`tf_secrets` made of its runtime's static keys, as csis_render returns it): the same
    values as the runtime's ``credentials`` fields, for a step that reaches AWS with them."""
    by_variable = {"TF_VAR_" + variable: fld for fld, variable, _arg in CREDENTIAL_VARIABLES}
    out: Dict[str, Any] = {}
    for name, entry in sorted((secret_map or {}).items()):
        fld = by_variable.get(name)
        if fld is None or not isinstance(entry, Mapping):
            continue
        if "value" in entry:
            out[fld] = str(entry["value"])
        else:
            out[fld] = Vaulted(str(entry.get("vault", "")), str(entry.get("file", "")), str(entry.get("key", "")))
    return out


def tf_secret_env(runtime: Any, reveal: Optional[Reveal]) -> Dict[str, str]:
    """``{TF_VAR_<variable>: clear text}`` of a runtime's set credentials fields: what the action
    plugins give terraform from :func:`tf_secrets` (``plugin_utils/vault.py``), for a terraform run
    the library starts itself (a state import). ``reveal``: :func:`revealer`'s (None: no vault
    secret was given, and a ``!vault`` value raises ConfigError naming its file and key)."""
    show = reveal or revealer(None)
    out: Dict[str, str] = {}
    creds = getattr(runtime, "credentials", None)
    for field, variable, _arg in CREDENTIAL_VARIABLES:
        value = getattr(creds, field, None)
        if isinstance(value, (Vaulted, str)):
            out["TF_VAR_" + variable] = show(value)
    return out


def tf_secrets(runtime: Any) -> Dict[str, Dict[str, str]]:
    """``{TF_VAR_<variable>: {"file", "key", "vault": ciphertext} | {"value": clear text}}`` of a
    runtime's set credentials fields (:data:`CREDENTIAL_VARIABLES`); {} when it has none."""
    out: Dict[str, Dict[str, str]] = {}
    creds = getattr(runtime, "credentials", None)
    for field, variable, _arg in CREDENTIAL_VARIABLES:
        value = getattr(creds, field, None)
        if isinstance(value, Vaulted):
            out["TF_VAR_" + variable] = {"file": value.file, "key": value.key, "vault": value.ciphertext}
        elif isinstance(value, str):
            out["TF_VAR_" + variable] = {"value": value}
    return out
