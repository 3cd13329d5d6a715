# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Vault-encrypted values (issue 15, item 5), library and controller side, without a run.

The loader keeps a ``!vault`` value opaque (file, key, ciphertext) at a secret field and
refuses it anywhere else; the rendered root takes a runtime's static credentials as sensitive,
ephemeral variables and holds neither the ciphertext nor the clear text; boto3 gets them only
when the caller reveals them; the controller's helper (plugins/plugin_utils/vault.py) decrypts
with the run's vault secrets and names file and key of a value it cannot decrypt. The runs
themselves (-vvv, generated/, meta-state) are tests/integration/test_secrets_sentinel.py."""
from __future__ import annotations

import glob
import os
import sys

import pytest
from ansible.errors import AnsibleActionFail
from ansible.parsing.vault import VaultLib, VaultSecret

from ansible_collections.csis.infra.plugins.module_utils.csis import aws
from ansible_collections.csis.infra.plugins.module_utils.csis.config import loader, secrets
from ansible_collections.csis.infra.plugins.module_utils.csis.errors import ConfigError
from ansible_collections.csis.infra.plugins.module_utils.csis.render.pipeline import render
from ansible_collections.csis.infra.plugins.module_utils.csis.yamlio import Vaulted, config_loaders, yaml
from ansible_collections.csis.infra.plugins.plugin_utils import vault

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from trees import copy_as_shipped  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
PASSWORD = b"unit-vault-password"
SECRET = "unitSentinel0SecretKey1Do2Not3Leak"
KEY_ID = "AKIAUNITSENTINEL0001"
RUNTIME = "runtime_builders[0] (aws-east2-runtime).credentials"


def encrypt(value: str, password: bytes = PASSWORD) -> str:
    return VaultLib([("default", VaultSecret(password))]).encrypt(value).decode()


def block(name: str, ciphertext: str, indent: int = 6) -> str:
    pad = " " * indent
    return "%s%s: !vault |\n%s" % (pad, name, "".join("%s  %s\n" % (pad, line) for line in ciphertext.splitlines()))


class Loader:
    """What an action plugin's ``self._loader`` offers: the run's vault secrets."""

    def __init__(self, password=None):
        self._vault = VaultLib([("default", VaultSecret(password))] if password else None)


@pytest.fixture(name="tree")
def fixture_tree(tmp_path):
    root = copy_as_shipped(EXAMPLES, str(tmp_path / "tree"))
    path = os.path.join(root, "cfg", "runtime-builders.yml")
    text = open(path, encoding="utf-8").read()
    assert text.count("      profile_name: null\n") == 1
    creds = "      access_key_id: %s\n" % KEY_ID + block("secret_access_key", encrypt(SECRET))
    open(path, "w", encoding="utf-8").write(text.replace("      profile_name: null\n", creds))
    return root


def test_the_yaml_loaders_read_a_vault_value_as_an_opaque_value():
    ct = encrypt("x")
    for cls in config_loaders()[:2]:
        data = yaml.load("a: !vault |\n  %s\n" % "\n  ".join(ct.splitlines()), Loader=cls)  # noqa: S506
        assert isinstance(data["a"], Vaulted)
        assert VaultLib([("default", VaultSecret(PASSWORD))]).decrypt(data["a"].ciphertext) == b"x"
        assert "ANSIBLE_VAULT" not in repr(data["a"])
        with pytest.raises(yaml.YAMLError):
            yaml.load("a: !vault [1, 2]\n", Loader=cls)  # noqa: S506
        with pytest.raises(yaml.YAMLError):
            yaml.load("a: !vault not-a-vault-text\n", Loader=cls)  # noqa: S506


def test_a_secret_field_keeps_the_value_opaque_and_out_of_dumps(tree):
    t = loader.load_tree(tree)
    creds = t.runtimes["aws-east2-runtime"].credentials
    assert creds.access_key_id == KEY_ID and isinstance(creds.secret_access_key, Vaulted)
    assert (creds.secret_access_key.file, creds.secret_access_key.key) == (
        "cfg/runtime-builders.yml", RUNTIME + ".secret_access_key")
    assert t.vaulted == [creds.secret_access_key]
    dumped = t.runtimes["aws-east2-runtime"].model_dump()
    assert dumped["credentials"] == {"profile_name": None}
    assert KEY_ID not in repr(t.runtimes["aws-east2-runtime"]) and "ANSIBLE_VAULT" not in repr(creds)
    # what the controller decrypts before a module loads the tree: the same values, read alone
    found, read_problems = loader.secret_values(tree)
    assert found == t.vaulted and not read_problems


def test_vault_values_of_an_overlay_are_its_own_and_refused_in_its_config(tree):
    ov = os.path.join(tree, "overlays", "creds.yml")
    with open(ov, "w", encoding="utf-8") as fh:
        fh.write("runtime_builders:\n  - name: aws-east2-runtime\n    credentials:\n"
                 + block("session_token", encrypt("tok"), indent=6)
                 + "config:\n" + block("apply_storage", encrypt("true"), indent=2))
    _t, problems = loader.load_tree_partial(tree, overlays=["overlays/creds.yml"])
    assert [(p.file, p.key) for p in problems] == [("overlays/creds.yml", "config.apply_storage")]
    assert "allowed only at a secret field" in problems[0].message
    del _t
    with open(ov, "w", encoding="utf-8") as fh:
        fh.write("runtime_builders:\n  - name: aws-east2-runtime\n    credentials:\n"
                 + block("session_token", encrypt("tok"), indent=6))
    t = loader.load_tree(tree, overlays=["overlays/creds.yml"])
    token = t.runtimes["aws-east2-runtime"].credentials.session_token
    assert (token.file, token.key) == ("overlays/creds.yml", "runtime_builders[0] (aws-east2-runtime).credentials.session_token")
    assert sorted(v.file for v in t.vaulted) == ["cfg/runtime-builders.yml", "overlays/creds.yml"]

    def where(values):
        return sorted((v.file, v.key) for v in values)
    assert where(loader.secret_values(tree, ["overlays/creds.yml"])[0]) == where(t.vaulted)


def test_vault_problems_name_file_and_key_and_why():
    value = Vaulted(encrypt(SECRET), "cfg/runtime-builders.yml", RUNTIME + ".secret_access_key")
    ok = VaultLib([("default", VaultSecret(PASSWORD))])
    assert secrets.vault_problems([value], lambda ct: ok.decrypt(ct).decode()) == []
    none = secrets.vault_problems([value], None)
    wrong = secrets.vault_problems([value], lambda ct: VaultLib([("default", VaultSecret(b"no"))]).decrypt(ct))
    for got, reason in ((none, secrets.NO_SECRET), (wrong, secrets.NOT_DECRYPTED)):
        assert [(p.file, p.key, p.message) for p in got] == [
            (value.file, value.key, "cannot decrypt this !vault value: " + reason)]
        assert SECRET not in str(got)


def test_the_controller_decrypts_a_roots_secrets_or_names_file_and_key():
    entry = {"file": "cfg/runtime-builders.yml", "key": RUNTIME + ".secret_access_key", "vault": encrypt(SECRET)}
    secret_map = {"TF_VAR_csis_aws_secret_key": entry, "TF_VAR_csis_aws_access_key": {"value": KEY_ID}}
    assert vault.resolve(Loader(PASSWORD), secret_map) == {
        "TF_VAR_csis_aws_secret_key": SECRET, "TF_VAR_csis_aws_access_key": KEY_ID}
    for given, reason in ((None, secrets.NO_SECRET), (b"wrong", secrets.NOT_DECRYPTED)):
        with pytest.raises(AnsibleActionFail) as err:
            vault.resolve(Loader(given), secret_map)
        assert str(err.value.message) == "cfg/runtime-builders.yml: %s.secret_access_key: cannot decrypt this !vault value: %s" % (
            RUNTIME, reason)
    with pytest.raises(AnsibleActionFail):
        vault.resolve(Loader(PASSWORD), {"PATH": {"value": "/x"}})  # only TF_VAR_ names


def test_tree_problems_of_the_controller(tree):
    assert vault.tree_problems(Loader(PASSWORD), tree, []) == []
    got = vault.tree_problems(Loader(b"wrong"), tree, [])
    assert [(p["file"], p["key"]) for p in got] == [("cfg/runtime-builders.yml", RUNTIME + ".secret_access_key")]


def test_the_rendered_root_takes_static_credentials_as_sensitive_ephemeral_variables(tree):
    out = render(tree, ["storage", "instance-image"], dry_run=True, prepare=False)
    assert out["roots"]
    ct = loader.load_tree(tree).vaulted[0].ciphertext
    for root in out["roots"]:
        assert root["secrets"] == {
            "TF_VAR_csis_aws_access_key": {"value": KEY_ID},
            "TF_VAR_csis_aws_secret_key": {"file": "cfg/runtime-builders.yml", "key": RUNTIME + ".secret_access_key",
                                           "vault": ct}}
    files = [p for p in glob.glob(os.path.join(tree, "generated", "**", "*"), recursive=True) if os.path.isfile(p)]
    mains = [p for p in files if p.endswith("-generation.tf")]
    assert mains
    for path in files:
        text = open(path, encoding="utf-8", errors="replace").read()
        assert SECRET not in text and KEY_ID not in text and "ANSIBLE_VAULT" not in text, path
    for path in mains:
        text = open(path, encoding="utf-8").read()
        assert "  access_key                  = var.csis_aws_access_key\n" in text, path
        assert "  secret_key                  = var.csis_aws_secret_key\n" in text
        assert "csis_aws_token" not in text  # no session token given: no variable
        for name in ("csis_aws_access_key", "csis_aws_secret_key"):
            body = text.split('variable "%s" {' % name, 1)[1].split("\n}\n", 1)[0]
            assert "sensitive   = true" in body and "ephemeral   = true" in body and "default" not in body


def test_a_tree_without_static_credentials_renders_no_credential_variables(tmp_path):
    root = copy_as_shipped(EXAMPLES, str(tmp_path / "plain"))
    out = render(root, ["storage"], dry_run=True, prepare=False)
    assert all(r["secrets"] == {} for r in out["roots"])
    for path in glob.glob(os.path.join(root, "generated", "storage", "**", "*.tf"), recursive=True):
        assert "csis_aws_" not in open(path, encoding="utf-8").read()


def test_boto3_gets_static_credentials_only_when_the_caller_reveals_them(tree):
    t = loader.load_tree(tree)
    assert "credentials" not in aws.runtime_access(t.runtimes["aws-east2-runtime"])  # what a rendered root carries
    clear = VaultLib([("default", VaultSecret(PASSWORD))])

    def reveal(v):
        return clear.decrypt(v.ciphertext).decode() if isinstance(v, Vaulted) else v
    access = aws.tree_access(t, "aws-east2-runtime", reveal)
    assert access["credentials"] == {"aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET}
    creds = aws.client("sts", access)._request_signer._credentials  # pylint: disable=protected-access
    assert (creds.access_key, creds.secret_key) == (KEY_ID, SECRET)


def _signer(client):
    creds = client._request_signer._credentials  # pylint: disable=protected-access
    return creds.access_key, creds.secret_key


def test_a_runtime_with_static_keys_is_never_reached_with_the_environments_credentials(tree, monkeypatch):
    """The boto3 steps that load the tree (drift, the storage check, forget and import, series
    heads, the summary) reach a runtime through aws.tree_access: with its static keys revealed
    by the run's vault secrets, and never silently with the environment's (another account's)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT00001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "environment-secret")
    t = loader.load_tree(tree)
    with pytest.raises(aws.StaticKeysNotGiven, match="runtime 'aws-east2-runtime' has static credentials"):
        aws.tree_access(t, "aws-east2-runtime")
    reveal = secrets.revealer(vault.decrypter(Loader(PASSWORD)))
    access = aws.tree_access(t, "aws-east2-runtime", reveal)
    assert _signer(aws.client("ec2", access)) == (KEY_ID, SECRET)
    # a wrong password, or none: the value named by file and key, nothing reached
    for wrong, why in ((Loader(b"not-the-password"), secrets.NOT_DECRYPTED), (Loader(), secrets.NO_SECRET)):
        with pytest.raises(ConfigError) as caught:
            aws.tree_access(t, "aws-east2-runtime", secrets.revealer(vault.decrypter(wrong)))
        assert str(caught.value) == "cfg/runtime-builders.yml: %s.secret_access_key: cannot decrypt this !vault value: %s" % (
            RUNTIME, why)
        assert SECRET not in str(caught.value)


def test_a_runtime_without_static_keys_is_reached_as_before(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT00001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "environment-secret")
    t = loader.load_tree(copy_as_shipped(EXAMPLES, str(tmp_path / "plain")))
    for reveal in (None, secrets.revealer(None)):
        access = aws.tree_access(t, "aws-east2-runtime", reveal)
        assert "credentials" not in access
        assert _signer(aws.client("ec2", access)) == ("AKIAENVIRONMENT00001", "environment-secret")


def test_the_steps_of_a_rendered_root_reveal_its_secrets_for_boto3(tree, monkeypatch):
    """The storage transitions, the unmount and the booted-image check get the root's ``aws``
    entry and its ``secrets`` (ciphertext, as csis_render returns them): aws.root_access."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT00001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "environment-secret")
    root = render(tree, ["storage"], dry_run=True, prepare=False)["roots"][0]
    assert "credentials" not in root["aws"] and set(root["secrets"]) == {"TF_VAR_csis_aws_access_key",
                                                                         "TF_VAR_csis_aws_secret_key"}
    with pytest.raises(aws.StaticKeysNotGiven, match="root '%s' has static credentials" % root["key"]):
        aws.root_access(root["aws"], root["secrets"], None, "root '%s'" % root["key"])
    reveal = secrets.revealer(vault.decrypter(Loader(PASSWORD)))
    access = aws.root_access(root["aws"], root["secrets"], reveal)
    assert access == dict(root["aws"], credentials={"aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET})
    assert _signer(aws.client("s3", access)) == (KEY_ID, SECRET)
    assert aws.root_access(root["aws"], {}, None) == root["aws"]  # no static keys: as rendered
    # the transitions build their clients from it before any call (a snapshot of a root with no state)
    from ansible_collections.csis.infra.plugins.module_utils.csis.apply import transitions
    with pytest.raises(aws.StaticKeysNotGiven):
        transitions.run_transition(root, {"action": "delete_archive_snapshot", "storage": "x", "snapshot_name": "x"})


def test_a_vault_tag_spelled_through_a_tag_handle_is_still_placed(tree):
    """The loader walks a file for !vault values only when its text can hold one: the tag
    itself, or a %TAG directive (``%TAG !v! !va`` makes ``!v!ult`` the same tag)."""
    ov = os.path.join(tree, "overlays", "handle.yml")
    body = block("apply_storage", encrypt("true"), indent=2).replace("!vault |", "!v!ult |")
    with open(ov, "w", encoding="utf-8") as fh:
        fh.write("%TAG !v! !va\n---\nconfig:\n" + body)
    _t, problems = loader.load_tree_partial(tree, overlays=["overlays/handle.yml"])
    assert [(p.file, p.key) for p in problems] == [("overlays/handle.yml", "config.apply_storage")]
    assert "allowed only at a secret field" in problems[0].message
