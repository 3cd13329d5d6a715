# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The YAML adapter: the dialects csis.infra reads and writes.

* :func:`config_loaders` -- configuration files: a safe loader that refuses duplicate
  mapping keys (libyaml when available, and its pure-Python twin whose error messages
  are clearer), with the :class:`DuplicateKeyError` it raises; an ansible-vault inline
  value (``!vault |``) becomes a :class:`Vaulted` (its ciphertext, never decrypted here:
  ``config/loader.py`` decides where one is allowed);
* :func:`meta_loader` / :func:`meta_dumper` -- meta-state files: timestamps stay strings,
  output is libyaml's when available (both emitters give the same text for plain data).

PyYAML is optional at import time (Ansible's sanity ``import`` test imports every file
without it; ansible-core itself requires it): :data:`HAS_YAML` says whether it is there,
and the loaders are built on first use.
"""
from __future__ import annotations

import functools
import traceback
from typing import Any, Dict, List, Optional, Tuple

try:
    import yaml
    HAS_YAML = True
    YAML_IMPORT_ERROR: Optional[str] = None
except ImportError:
    yaml = None  # type: ignore[assignment]
    HAS_YAML = False
    YAML_IMPORT_ERROR = traceback.format_exc()

_TIMESTAMP = "tag:yaml.org,2002:timestamp"
#: the tag of an ansible-vault inline encrypted value (``ansible-vault encrypt_string``)
VAULT_TAG = "!vault"
#: what PyYAML's safe constructors raise, beside ``yaml.YAMLError``, on an explicitly tagged
#: value they cannot build: ``!!int x`` (ValueError), ``!!bool x`` (KeyError), ``!!int _``
#: (IndexError), ``!!timestamp x`` (AttributeError), ``!!timestamp 2024-99-99`` (ValueError),
#: and on nesting too deep to build (RecursionError). Every reader of user or meta-state
#: YAML turns these into its own clear message; ``UnicodeDecodeError`` is a ValueError too.
VALUE_ERRORS: Tuple[type, ...] = (ValueError, TypeError, OverflowError, RecursionError,
                                  AttributeError, KeyError, IndexError)


class Vaulted:
    """An ansible-vault encrypted value as read from a configuration file: its ciphertext
    (``$ANSIBLE_VAULT;1.1;AES256...``, not secret) and, once the loader placed it, the file
    and key it was read at. Never a ``str``: a field that is not secret refuses it. Its
    ``repr`` names where it is, never the ciphertext."""

    __slots__ = ("ciphertext", "file", "key")

    def __init__(self, ciphertext: str, file: str = "", key: str = "") -> None:
        self.ciphertext = ciphertext
        self.file = file
        self.key = key

    def __repr__(self) -> str:
        return "<!vault %s%s>" % (self.file, (": " + self.key) if self.key else "")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vaulted) and other.ciphertext == self.ciphertext

    def __hash__(self) -> int:
        return hash(self.ciphertext)

    def __deepcopy__(self, memo: Dict[int, Any]) -> "Vaulted":
        return Vaulted(self.ciphertext, self.file, self.key)


#: the most values a document's aliases may expand to (a "billion laughs" document is a few
#: lines whose aliases expand to billions; a 10,000-instance tree is well under a million)
MAX_EXPANDED_VALUES = 10_000_000


def shape_problem(data: Any, text: Optional[str] = None, limit: int = MAX_EXPANDED_VALUES) -> Optional[str]:
    """Why a loaded document cannot be walked, or None. YAML aliases make shared nodes: a
    node aliased inside itself (``a: &x [*x]``) is a cycle that every recursive walk (the
    models, the vault walker, a dump) follows forever, and nested aliases can expand a few
    lines into billions of values. Each distinct node is visited once (no recursion). With
    the document's ``text``, a document without an anchor and an alias (most) is not walked."""
    if not isinstance(data, (dict, list)) or (text is not None and ("&" not in text or "*" not in text)):
        return None
    on_path: set = set()
    size: Dict[int, int] = {}
    # an entry: (node, its parent's entry, its key in the parent, leaving?)
    stack: List[Tuple[Any, Any, Any, bool]] = [(data, None, None, False)]
    while stack:
        entry = stack.pop()
        node, _up, _key, leaving = entry
        if leaving:
            on_path.discard(id(node))
            total = 1 + sum(size.get(id(c), 1) for c in (node.values() if isinstance(node, dict) else node))
            if total > limit:
                return "%s: its aliases expand to more than %d values (nested aliases, a 'billion laughs' " \
                       "document)" % (_entry_path(entry), limit)
            size[id(node)] = total
            continue
        if id(node) in on_path:
            return "%s: a YAML alias refers to a node that contains it (a cycle)" % _entry_path(entry)
        if id(node) in size:
            continue
        on_path.add(id(node))
        here = (node, _up, _key, True)
        stack.append(here)
        for k, v in (node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(v, (dict, list)):
                stack.append((v, here, k if isinstance(node, dict) else [k], False))
    return None


def _entry_path(entry: Any) -> str:
    parts: List[str] = []
    while entry is not None and entry[1] is not None:
        key = entry[2]
        parts.append("[%d]" % key[0] if isinstance(key, list) else ".%s" % key)
        entry = entry[1]
    return "".join(reversed(parts)).lstrip(".") or "the document"


@functools.lru_cache(maxsize=None)
def config_loaders() -> Tuple[Any, Any, Any]:
    """(the fast loader, the pure-Python loader, DuplicateKeyError) for configuration files."""

    class DuplicateKeyError(yaml.constructor.ConstructorError):
        pass

    class UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        """SafeLoader (libyaml when available) that refuses duplicate mapping keys."""

    class PyUniqueKeyLoader(yaml.SafeLoader):
        """The pure-Python loader: only used again on a syntax error, for its clearer message."""

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Dict[Any, Any]:
        # the keys written in this mapping itself; those a merge key (``<<: *defaults``) brings in
        # come first after flatten_mapping, and a key written here overrides them (YAML's merge),
        # so only a key written twice here is a duplicate
        written = [pair for pair in node.value if pair[0].tag != "tag:yaml.org,2002:merge"]
        loader.flatten_mapping(node)
        seen: Dict[Any, Any] = {}
        for key_node, _value in written:
            key = loader.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
            except TypeError:  # an unhashable key: let the constructor report it
                dup = False
            if dup:
                raise DuplicateKeyError(
                    "while constructing a mapping", node.start_mark,
                    "found duplicate key %r" % (key,), key_node.start_mark)
            if not isinstance(key, (list, dict)):
                seen[key] = True
        return loader.construct_mapping(node, deep=deep)

    def construct_vault(loader: Any, node: Any) -> Vaulted:
        if not isinstance(node, yaml.ScalarNode):
            raise yaml.constructor.ConstructorError(
                None, None, "a !vault value must be the text ansible-vault encrypt_string wrote (a scalar)", node.start_mark)
        # the envelope's header line, then the hex body (its line breaks and indentation dropped)
        head, _sep, body = str(loader.construct_scalar(node)).strip().partition("\n")
        if not head.startswith("$ANSIBLE_VAULT;"):
            raise yaml.constructor.ConstructorError(
                None, None, "a !vault value must start with $ANSIBLE_VAULT; (the output of ansible-vault encrypt_string)",
                node.start_mark)
        return Vaulted(head.strip() + "\n" + "".join(body.split()))

    for cls in (UniqueKeyLoader, PyUniqueKeyLoader):
        cls.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
        cls.add_constructor(VAULT_TAG, construct_vault)
    return UniqueKeyLoader, PyUniqueKeyLoader, DuplicateKeyError


@functools.lru_cache(maxsize=None)
def meta_loader() -> Any:
    """A safe loader (libyaml when available) that reads timestamps as strings."""

    class MetaLoader(yaml.CSafeLoader if hasattr(yaml, "CSafeLoader") else yaml.SafeLoader):  # type: ignore[misc]
        """Safe loader that reads timestamps as strings (meta-state is plain JSON-able data)."""

    MetaLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != _TIMESTAMP]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    MetaLoader.add_constructor(_TIMESTAMP, yaml.SafeLoader.construct_yaml_str)

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Dict[Any, Any]:
        # csis.infra never writes a key twice: a second one (a hand edit) would silently win
        loader.flatten_mapping(node)
        seen = set()
        for key_node, _value in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        "found duplicate key %r" % (key_node.value,), key_node.start_mark)
                seen.add(key_node.value)
        return loader.construct_mapping(node, deep=deep)

    MetaLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return MetaLoader


def meta_dumper() -> Any:
    """libyaml's safe emitter when present (about 5x faster than the pure-Python one on large
    trees); both give the same text for meta-state data (tests/unit/test_metastate.py checks it)."""
    return getattr(yaml, "CSafeDumper", yaml.SafeDumper)
