# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Controller side of the tree's ``!vault`` values (config/secrets.py): decryption with the
run's vault secrets, for the action plugins only.

Ansible modules run in processes of their own without the vault secrets; the action plugins
run in the controller's worker, whose loader holds them (``--vault-password-file``,
``--vault-id``, ``--ask-vault-pass``). They decrypt here and hand the module's run in that
worker the clear values as a ``no_log`` argument (``csis_plan``: plugins/plugin_utils/controller.py),
or put them in the worker's own environment for the one task that starts terraform's apply
(``csis_apply_start``): never in an ``environment:`` keyword, which Ansible prints with the
command line at ``-vvv``. Every csis.infra module run in the worker also gets :func:`decrypter`
as ``module.decrypt`` (plugins/plugin_utils/controller.py), so its boto3 calls sign with a
runtime's ``!vault`` static keys (``module.reveal_of``, ``aws.tree_access``, ``aws.root_access``).
"""
from __future__ import annotations

import re

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.parsing.vault import AnsibleVaultError, VaultLib

try:  # plain Python of the collection's library (no pydantic needed for these two)
    from ansible_collections.csis.infra.plugins.module_utils.csis.config import secrets
    from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError
    from ansible_collections.csis.infra.plugins.module_utils.csis.yamlio import Vaulted
except ImportError:  # pragma: no cover - the collection is installed as a whole
    secrets = None
    ConfigError = Exception
    Vaulted = None

_NAME = re.compile(r"^TF_VAR_[A-Za-z_][A-Za-z0-9_]*\Z")


def vault_secrets(loader):
    """The run's vault secrets ([(vault id, secret)]), [] when none was given."""
    found = getattr(getattr(loader, "_vault", None), "secrets", None)
    if not found:
        try:
            from ansible.parsing.vault import VaultSecretsContext
            context = VaultSecretsContext.current(optional=True)
            found = context.secrets if context is not None else None
        except ImportError:  # older ansible-core: the loader is the only place
            found = None
    return list(found or [])


def decrypter(loader):
    """A ``secrets.Decrypt`` callback over the run's vault secrets."""
    found = vault_secrets(loader)
    vault = VaultLib(found) if found else None

    def decrypt(ciphertext):
        if vault is None:
            raise secrets.VaultSecretMissing()
        try:
            return to_text(vault.decrypt(ciphertext), errors="surrogate_or_strict")
        except (AnsibleVaultError, ValueError, TypeError):
            raise secrets.VaultDecryptFailed() from None
    return decrypt


def problems(loader, vaulted):
    """[{file, key, message}] for each of ``vaulted`` that the run's vault secrets do not decrypt."""
    return [dict(file=p.file, key=p.key, message=p.message) for p in secrets.vault_problems(vaulted, decrypter(loader))]


def resolve(loader, secret_map):
    """``{TF_VAR_name: clear text}`` of a rendered root's ``secrets`` (csis_render's
    ``roots[].secrets``). Raises AnsibleActionFail naming the file and key of a value that does
    not decrypt (the clear text of the others is dropped with the exception)."""
    if not secret_map:
        return {}
    if not isinstance(secret_map, dict):
        raise AnsibleActionFail("secrets must be a mapping (csis_render's roots[].secrets)")
    reveal = secrets.revealer(decrypter(loader))
    out = {}
    for name, entry in sorted(secret_map.items()):
        if not isinstance(name, str) or not _NAME.match(name) or not isinstance(entry, dict):
            raise AnsibleActionFail("secrets: %r is not a TF_VAR_<name>: {vault|value} entry" % (name,))
        if "value" in entry:
            out[name] = to_text(entry["value"])
            continue
        value = Vaulted(to_text(entry.get("vault", "")), to_text(entry.get("file", "")), to_text(entry.get("key", "")))
        try:
            out[name] = reveal(value)
        except ConfigError as exc:  # names the file and key; the clear text of the others is dropped with it
            raise AnsibleActionFail(str(exc)) from None
    return out


def tree_problems(loader, config_root, overlays):
    """[{file, key, message}] of the tree's ``!vault`` values (at secret fields) that the run's
    vault secrets do not decrypt: what a tree-loading module (csis_validate, csis_render) gets as
    ``vault_problems``, so they are reported with its own and nothing is written."""
    try:
        from ansible_collections.csis.infra.plugins.module_utils.csis.config.loader import secret_values
    except ImportError:  # pydantic or PyYAML missing: the module itself reports the missing library
        return []
    if not isinstance(config_root, str) or not config_root:
        return []
    vaulted, _read_problems = secret_values(config_root, [o for o in (overlays or []) if isinstance(o, str)])
    return problems(loader, vaulted) if vaulted else []
