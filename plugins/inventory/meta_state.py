# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
name: meta_state
short_description: Launched csis.infra instances as an inventory, read from the meta-state records
version_added: 0.1.0
author:
  - csis.infra maintainers (@csis-infra)
description:
  - Lists the instances csis.infra has launched, as recorded in the meta-state of a
    configuration root (C(<config root>/meta-state/)), and makes them usable as
    Ansible hosts.
  - The hosts are the records of C(launch-params.yaml) with C(launched=true), joined
    with the open generation (C(current)) of C(instance-state.yaml), read through the
    meta-state store.
  - "Where the records are read (O(meta_state_backend)): by default from the store the
    configuration root declares: a tree whose C(cfg/_config.yml) sets C(meta_state.backend=s3)
    is read from that S3 store (the bucket, region and endpoint of the state backend it names),
    so a checkout with no meta-state of its own lists what any other run recorded; otherwise
    from the files of C(<config root>/meta-state/), and no AWS call is made."
  - "With O(meta_state_backend=s3) the source file itself names the S3 store
    (O(meta_state_bucket), O(meta_state_prefix), O(meta_state_region),
    O(meta_state_endpoint)) and no configuration tree is read at all: the source works in an
    empty directory, an AWX inventory source or an execution environment without a checkout.
    Credentials come from the environment as boto3 finds them (C(AWS_ACCESS_KEY_ID)/C(AWS_SECRET_ACCESS_KEY)/C(AWS_SESSION_TOKEN),
    O(meta_state_profile), an instance or container role), never from the source file.
    Reading needs C(s3:ListBucket) and C(s3:GetObject) on the prefix; nothing is written."
  - The inventory source is a YAML file whose name ends with C(.csis.yml) or
    C(.csis.yaml), for example C(hosts.csis.yml), with C(plugin=csis.infra.meta_state).
  - An empty or missing meta-state gives an empty inventory. A corrupt meta-state file
    fails the source with an error naming the file (set
    C([inventory] any_unparsed_is_failed = true) in C(ansible.cfg) to make that a
    non-zero exit instead of a warning).
  - "Host variables (all prefixed C(csis_)): C(csis_name) (declared name),
    C(csis_instance_id), C(csis_private_ip), C(csis_availability_zone),
    C(csis_ami_id) (AMI the open generation booted), C(csis_generation) (number of the
    open generation), C(csis_generation_kind) (C(durable) or C(ephemeral)),
    C(csis_generations) (counters C({durable, ephemeral})), C(csis_region),
    C(csis_runtime), C(csis_builder), C(csis_image), C(csis_build) (pinned AMI id or
    C(unbound)), C(csis_machine_type), C(csis_hostname) (canonical C(<name>-NNN)),
    C(csis_alias), C(csis_group) (owning group), C(csis_mounts) (list of
    C({storage, type, builder, mount_point, group, share_mode, public_read, device})),
    C(csis_ephemeral), C(csis_tags), C(csis_launched_run). Values missing from the
    records are null, except C(csis_ephemeral) (false), C(csis_tags) (an empty dict),
    C(csis_mounts) (an empty list) and C(csis_generations) (zero counters). No value is
    trusted as a template (marked unsafe on ansible-core 2.17 and 2.18)."
  - "Default groups (see O(default_groups)): C(csis_group_<group>),
    C(csis_runtime_<runtime>), C(csis_image_<image>), and C(csis_ephemeral) or
    C(csis_durable); names are sanitized like constructed groups (invalid characters
    become C(_))."
  - "Caching follows the standard inventory cache: with O(cache=true) the records are
    read from the cache plugin until O(cache_timeout) expires, even if meta-state
    changed meanwhile. Use C(--flush-cache) (or C(ansible.builtin.meta: refresh_inventory) in a play) after a
    lifecycle run to see new instances at once. A cache entry made for another store is
    ignored (another O(config_root), a tree that now declares another meta-state store, another
    S3 bucket or prefix, or another endpoint)."
extends_documentation_fragment:
  - constructed
  - inventory_cache
options:
  plugin:
    description: Marks this file as an inventory source for this plugin.
    type: str
    required: true
    choices: ['csis.infra.meta_state']
  config_root:
    description:
      - The csis.infra configuration root whose meta-state is read (not read with
        O(meta_state_backend=s3)).
      - A relative path is relative to the directory of the inventory source file.
        C(~) and environment variables are expanded.
    type: str
    default: '.'
    env:
      - name: CSIS_CONFIG_ROOT
  meta_state_backend:
    description:
      - Which meta-state store is read.
      - V(auto) reads the store the configuration root declares in C(cfg/_config.yml)
        (C(meta_state)), and C(<config root>/meta-state/) when it declares none.
      - V(local) reads C(<config root>/meta-state/), whatever C(cfg/_config.yml) says.
      - V(s3) reads the S3 store named by O(meta_state_bucket) and O(meta_state_prefix); no
        configuration root is read (O(config_root) is ignored).
    type: str
    choices: ['auto', 'local', 's3']
    default: 'auto'
    env:
      - name: CSIS_META_STATE_BACKEND
  meta_state_bucket:
    description:
      - The bucket of the S3 store (with O(meta_state_backend=s3)), that is the C(bucket) of the
        state backend the tree's C(meta_state.state_backend) names.
    type: str
    env:
      - name: CSIS_META_STATE_BUCKET
  meta_state_prefix:
    description:
      - The tree's C(meta_state.prefix) (with O(meta_state_backend=s3)); the records are under
        C(s3://<bucket>/<prefix>/meta-state/). Empty when the tree sets none.
      - A bucket and prefix that hold no committed revision give an empty inventory with a warning
        naming the place read (a mistyped prefix is no error to S3).
    type: str
    default: ''
    env:
      - name: CSIS_META_STATE_PREFIX
  meta_state_region:
    description: The bucket's region (with O(meta_state_backend=s3)); the environment's region when unset.
    type: str
    env:
      # the last one set wins: AWS_REGION over AWS_DEFAULT_REGION, as boto3 and amazon.aws take them
      - name: AWS_DEFAULT_REGION
      - name: AWS_REGION
  meta_state_endpoint:
    description:
      - The S3 endpoint URL (with O(meta_state_backend=s3)), for S3-compatible stores, VPC or
        FIPS endpoints and local test endpoints; unset, boto3 chooses (C(AWS_ENDPOINT_URL_S3)
        included).
    type: str
  meta_state_path_style:
    description: Address the bucket in the URL path instead of the host name (with O(meta_state_backend=s3)).
    type: bool
    default: false
  meta_state_profile:
    description: The AWS profile boto3 takes the credentials from (with O(meta_state_backend=s3)).
    type: str
    env:
      - name: AWS_PROFILE
  hostnames:
    description:
      - Which value names the host, in order of preference; the first one a record
        has is used. C(name) is the declared instance name, C(hostname) the canonical
        C(<name>-NNN), C(alias) the optional alias.
      - An instance with none of the listed values is left out with a warning. Two
        instances with the same resulting host name fail the source. An empty list fails the source.
    type: list
    elements: str
    choices: ['name', 'hostname', 'alias']
    default: ['name']
  include_ephemeral:
    description: Whether ephemeral instances are listed.
    type: bool
    default: true
  default_groups:
    description: Whether the default groups (owning group, runtime, image, ephemeral/durable) are created.
    type: bool
    default: true
  connection:
    description:
      - Connection variables set on every host.
      - V(none) sets none (use C(-e ansible_connection=...), O(compose) or group_vars).
      - V(ssm) sets C(ansible_connection=amazon.aws.aws_ssm),
        C(ansible_aws_ssm_instance_id), C(ansible_aws_ssm_region) and, if
        O(ssm_bucket_name) is set, C(ansible_aws_ssm_bucket_name). The controller needs
        the session-manager-plugin.
      - V(ssh) sets C(ansible_connection=ssh), C(ansible_host) (the private address)
        and, if O(ssh_user) is set, C(ansible_user).
      - With V(ssm) or V(ssh), an instance with no recorded instance id or private address (no generation of it is
        recorded) is left out with a warning, never reached by its bare name.
      - These are set before O(compose), which can override them.
    type: str
    choices: ['none', 'ssm', 'ssh']
    default: 'none'
  ssm_bucket_name:
    description: S3 bucket the SSM connection uses for file transfers (with O(connection=ssm)).
    type: str
  ssh_user:
    description: Remote user for O(connection=ssh).
    type: str
notes:
  - Records read (written by the csis.infra lifecycle recorders).
    C(launch-params.yaml) C(instances.<name>) has C(image), C(build), C(machine_type),
    C(group), C(runtime), C(builder), C(region), C(mounts), C(hostname), C(alias),
    C(ephemeral), C(tags), C(launched), C(launched_run).
    C(instance-state.yaml) C(instances.<name>.current) has C(number), C(kind),
    C(instance_id), C(private_ip), C(public_ip) (null without one), C(ami_id), C(availability_zone), C(opened_run),
    C(opened_at).
  - A launched instance without a recorded generation is listed with a null
    C(csis_instance_id) and C(csis_private_ip).
  - Reads take no lock; meta-state files are replaced atomically, so a source read
    while a run writes sees whole files. A source read during a commit reads again once it is
    done, never some of its records new and others old; one that cannot within the lock timeout
    (at most 60 s) fails naming the writer.
  - A damaged record (cut short, not YAML, the wrong shape) fails the source naming its file or
    S3 object; nothing is skipped silently.
seealso:
  - name: csis.infra inventory guide
    description: docs/inventory.md in the collection.
    link: https://example.invalid/csis.infra/docs/inventory.md
"""

EXAMPLES = r"""
# hosts.csis.yml: every launched instance of the configuration root next to this file
plugin: csis.infra.meta_state
config_root: .

---
# hosts.csis.yml: reach hosts over SSM, name them by alias, extra groups, cached
plugin: csis.infra.meta_state
config_root: ../config
hostnames: [alias, hostname, name]
include_ephemeral: false
connection: ssm
ssm_bucket_name: my-ssm-transfer-bucket
keyed_groups:
  - key: csis_tags.Owner | default('none')
    prefix: owner
  - key: csis_mounts | map(attribute='storage')
    prefix: storage
groups:
  big: csis_machine_type.startswith('m5.')
compose:
  ansible_host: csis_private_ip
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: ~/.cache/csis-inventory
cache_timeout: 600

---
# hosts.csis.yml in an empty directory (an AWX inventory source, an execution environment):
# the S3 store of a tree whose cfg/_config.yml says
#   meta_state: {backend: s3, state_backend: shared, prefix: platform}
# and whose state backend "shared" has bucket my-tf-state in eu-west-1.
# Credentials from the environment (AWS_* variables, AWS_PROFILE or a role).
plugin: csis.infra.meta_state
meta_state_backend: s3
meta_state_bucket: my-tf-state
meta_state_prefix: platform
meta_state_region: eu-west-1
"""

import json
import os

from ansible.errors import AnsibleParserError
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable

try:  # ansible-core 2.19 and later: what an inventory plugin returns is never trusted as a template
    from ansible.template import trust_as_template  # noqa: F401  pylint: disable=unused-import
    _unsafe = None
except ImportError:  # 2.17 and 2.18: a string is a template unless marked unsafe
    from ansible.utils.unsafe_proxy import wrap_var as _unsafe

from ansible_collections.csis.infra.plugins.module_utils.csis.errors import CsisError
from ansible_collections.csis.infra.plugins.module_utils.csis.state.backends import CONFIG_REL, LocalObjects, S3Objects, open_objects
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import (
    META_STATE_DIR, MetaState, launched_instances)

#: 3: entries name their store (``source``: the config root, or the S3 store's URL) and hold the
#: records as one JSON text (``records``): the cache plugin then encodes and decodes one string,
#: not every value (ansible-core's jsonfile cache took longer than meta-state itself at 10,000 hosts)
_CACHE_FORMAT = 3


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "csis.infra.meta_state"
    INVENTORY_FILE_SUFFIXES = (".csis.yml", ".csis.yaml")

    def verify_file(self, path):
        """Accept readable files named ``*.csis.yml`` / ``*.csis.yaml``."""
        if not super().verify_file(path):
            return False
        return path.endswith(self.INVENTORY_FILE_SUFFIXES)

    # -- reading -----------------------------------------------------------------

    def _config_root(self, path):
        root = os.path.expandvars(os.path.expanduser(self.get_option("config_root") or "."))
        if not os.path.isabs(root):
            root = os.path.join(os.path.dirname(os.path.abspath(path)), root)
        return os.path.normpath(root)

    @staticmethod
    def _identity(objects):
        """What a cache entry was read from: the store itself (the one the parse cache is kept under),
        so an entry read from another store is not taken for this one's."""
        return "%s:%s" % (objects.kind, objects.identity)

    def _store(self, path):
        """(what the records are read from, for messages; the store's identity, for the cache
        entry; a function opening the :class:`MetaState`)."""
        backend = self.get_option("meta_state_backend") or "auto"
        if backend != "s3":
            root = self._config_root(path)
            if backend == "local":
                objects = LocalObjects(root)
            else:  # the store the tree declares, known before a cache entry is taken
                try:
                    objects = open_objects(root)
                except CsisError as exc:
                    raise AnsibleParserError("csis.infra.meta_state: %s: %s" % (root, to_native(exc)))
            return root, self._identity(objects), lambda: MetaState(root, objects=objects)
        bucket = (self.get_option("meta_state_bucket") or "").strip()
        if not bucket:
            raise AnsibleParserError("csis.infra.meta_state: %s: 'meta_state_backend: s3' needs 'meta_state_bucket' "
                                     "(the bucket of the tree's meta_state.state_backend)" % path)
        endpoint = (self.get_option("meta_state_endpoint") or "").strip()
        access = {"region": self.get_option("meta_state_region") or None,
                  "profile": self.get_option("meta_state_profile") or None,
                  "endpoints": {"s3": endpoint} if endpoint else {},
                  "s3_use_path_style": bool(self.get_option("meta_state_path_style"))}
        objects = S3Objects(access, bucket, self.get_option("meta_state_prefix") or "")
        # no tree: never read (or migrate) the local meta-state of the source's directory
        return objects.where, self._identity(objects), lambda: MetaState(
            os.path.dirname(os.path.abspath(path)), objects=objects, migrate_local=False)

    def _load_records(self, source, open_store):
        if not source.startswith("s3://") and not os.path.isdir(source):
            self.display.warning("csis.infra.meta_state: config root %s does not exist; "
                                 "the inventory is empty" % source)
        elif (not source.startswith("s3://") and not os.path.isfile(os.path.join(source, CONFIG_REL))
              and not os.path.isdir(os.path.join(source, META_STATE_DIR))):
            # a mistyped config_root (or the default '.' in the wrong directory): say so, do not list
            # nothing in silence (an AWX inventory source that overwrites would empty the inventory)
            self.display.warning("csis.infra.meta_state: config root %s is not a configuration tree (no %s, no %s/); "
                                 "the inventory is empty" % (source, CONFIG_REL, META_STATE_DIR))
        ms = None
        try:
            ms = open_store()
            records = launched_instances(ms)
            for notice in ms.notices:
                self.display.warning("csis.infra.meta_state: %s" % notice)
            if not records and source.startswith("s3://") and ms.revision() == 0:
                # a mistyped meta_state_bucket or meta_state_prefix reads an empty place, not an error:
                # say so (an AWX inventory source that overwrites would drop every host in silence)
                self.display.warning("csis.infra.meta_state: %s holds no meta-state (no committed revision): check "
                                     "meta_state_bucket and meta_state_prefix against the tree's "
                                     "meta_state.state_backend; the inventory is empty" % source)
            return records
        except CsisError as exc:  # MetaStateError (named object), MissingDependency (boto3)
            msg = to_native(exc)
            if ms is not None and msg.startswith(META_STATE_DIR + "/"):
                # a message naming meta-state/<file>: where the store keeps it (the S3 store's
                # s3://bucket/prefix/meta-state, which the tree's cfg/_config.yml may name too)
                msg = ms.where + msg[len(META_STATE_DIR):]
            raise AnsibleParserError("csis.infra.meta_state: %s" % msg)

    def _get_cached(self, path, cache, source):
        """Records from the cache (aws_ec2 semantics), or None on a miss."""
        if not cache or not self.get_option("cache"):
            return None
        try:
            entry = self._cache[self.get_cache_key(path)]
        except KeyError:
            return None
        if (not isinstance(entry, dict) or entry.get("format") != _CACHE_FORMAT
                or entry.get("source") != source or not isinstance(entry.get("records"), str)):
            return None
        try:
            records = json.loads(str(entry["records"]))
        except ValueError:
            return None
        return records if isinstance(records, dict) else None

    def _update_cache(self, path, cache, source, records, from_cache):
        if not self.get_option("cache"):
            return
        # an entry we just read is not rewritten: that would reset its timeout
        if from_cache:
            return
        self._cache[self.get_cache_key(path)] = {
            "format": _CACHE_FORMAT, "source": source, "records": json.dumps(records, sort_keys=True)}

    # -- building ----------------------------------------------------------------

    @staticmethod
    def _hostvars(record):
        current = record.get("current") or {}
        generations = record.get("generation") or {}
        return {
            "csis_name": record.get("name"),
            "csis_instance_id": current.get("instance_id"),
            "csis_private_ip": current.get("private_ip"),
            "csis_availability_zone": current.get("availability_zone"),
            "csis_ami_id": current.get("ami_id"),
            "csis_generation": current.get("number"),
            "csis_generation_kind": current.get("kind"),
            "csis_generations": {"durable": generations.get("durable", 0),
                                 "ephemeral": generations.get("ephemeral", 0)},
            "csis_region": record.get("region"),
            "csis_runtime": record.get("runtime"),
            "csis_builder": record.get("builder"),
            "csis_image": record.get("image"),
            "csis_build": record.get("build"),
            "csis_machine_type": record.get("machine_type"),
            "csis_hostname": record.get("hostname"),
            "csis_alias": record.get("alias"),
            "csis_group": record.get("group"),
            "csis_mounts": [dict(m) if isinstance(m, dict) else m for m in record.get("mounts") or ()],
            "csis_ephemeral": bool(record.get("ephemeral")),
            "csis_tags": dict(record.get("tags") or {}),
            "csis_launched_run": record.get("launched_run"),
        }

    def _connection_vars(self, hostvars):
        kind = self.get_option("connection")
        out = {}
        if kind == "ssm":
            out["ansible_connection"] = "amazon.aws.aws_ssm"
            if hostvars["csis_instance_id"]:
                out["ansible_aws_ssm_instance_id"] = hostvars["csis_instance_id"]
            if hostvars["csis_region"]:
                out["ansible_aws_ssm_region"] = hostvars["csis_region"]
            if self.get_option("ssm_bucket_name"):
                out["ansible_aws_ssm_bucket_name"] = self.get_option("ssm_bucket_name")
        elif kind == "ssh":
            out["ansible_connection"] = "ssh"
            if hostvars["csis_private_ip"]:
                out["ansible_host"] = hostvars["csis_private_ip"]
            if self.get_option("ssh_user"):
                out["ansible_user"] = self.get_option("ssh_user")
        return out

    def _host_name(self, hostvars):
        for choice in self.get_option("hostnames"):
            value = hostvars.get("csis_" + choice)
            if value:
                return str(value)
        return None

    def _default_groups(self, hostvars, names):
        """The default groups of one host; ``names`` memoizes raw -> sanitized group names."""
        raw = []
        for prefix, key in (("csis_group_", "csis_group"), ("csis_runtime_", "csis_runtime"),
                            ("csis_image_", "csis_image")):
            if hostvars.get(key):
                raw.append(prefix + str(hostvars[key]))
        raw.append("csis_ephemeral" if hostvars["csis_ephemeral"] else "csis_durable")
        out = []
        for group in raw:
            sanitized = names.get(group)
            if sanitized is None:
                sanitized = names[group] = self._sanitize_group_name(group)
                self.inventory.add_group(sanitized)
            out.append(sanitized)
        return out

    def _set_host_vars(self, host, hostvars):
        """Set the host's csis_*/connection variables.

        They are plain data this plugin built for this host alone (fresh containers of JSON
        values, names from a fixed list), so they go straight into the host's variables: the
        inventory's per-value visitor (ansible-core 2.19: a copy of every value, each tagged with
        its origin) costs about 20 s at 10,000 hosts and changes nothing in what is listed
        (strings stay untrusted, ``ansible-inventory`` shows them as ``__ansible_unsafe``). A
        host that already has one of these variables (another source named the same host) takes
        the regular path, so the inventory's merge rules apply. On ansible-core 2.17 and 2.18, which
        trust a plain string as a template, every value is already marked unsafe (:meth:`_populate`).
        """
        entity = self.inventory.get_host(host)
        variables = getattr(entity, "vars", None)
        if isinstance(variables, dict) and variables.keys().isdisjoint(hostvars):
            variables.update(hostvars)
            return
        for key, value in hostvars.items():
            self.inventory.set_variable(host, key, value)

    def _populate(self, records):
        strict = self.get_option("strict")
        include_ephemeral = self.get_option("include_ephemeral")
        default_groups = self.get_option("default_groups")
        compose, groups, keyed = self.get_option("compose"), self.get_option("groups"), self.get_option("keyed_groups")
        constructed = bool(compose or groups or keyed)
        connection = self._connection_vars
        # what the connection option reaches a host by: a host without it is left out, never reached by
        # its bare name (which DNS could resolve to another machine)
        address = {"ssh": "csis_private_ip", "ssm": "csis_instance_id"}.get(self.get_option("connection"))
        seen = {}
        unnamed = []
        unaddressed = []
        group_names = {}
        for name in sorted(records):
            hostvars = self._hostvars(records[name])
            if hostvars["csis_ephemeral"] and not include_ephemeral:
                continue
            host = self._host_name(hostvars)
            if host is None:
                unnamed.append(name)
                continue
            if address and not hostvars[address]:
                unaddressed.append(name)
                continue
            if host in seen:
                raise AnsibleParserError(
                    "csis.infra.meta_state: instances %r and %r both resolve to host name %r "
                    "(hostnames: %s)" % (seen[host], name, host, ", ".join(self.get_option("hostnames"))))
            seen[host] = name
            hostvars.update(connection(hostvars))
            if _unsafe is not None:
                # meta-state strings (a tag, a machine type, anything a writer to the store put there)
                # must never run as a template: "{{ lookup('pipe', ...) }}" in a tag would run on the
                # controller when a keyed group, a compose expression or a task reads it
                hostvars = _unsafe(hostvars)

            self.inventory.add_host(host)
            self._set_host_vars(host, hostvars)
            if default_groups:
                for group in self._default_groups(hostvars, group_names):
                    self.inventory.add_child(group, host)

            if constructed:
                self._set_composite_vars(compose, hostvars, host, strict=strict)
                self._add_host_to_composed_groups(groups, hostvars, host, strict=strict)
                self._add_host_to_keyed_groups(keyed, hostvars, host, strict=strict)
        if unnamed:
            self.display.warning(
                "csis.infra.meta_state: left out %d instance(s) with none of hostnames %s: %s"
                % (len(unnamed), self.get_option("hostnames"), ", ".join(unnamed)))
        if unaddressed:
            self.display.warning(
                "csis.infra.meta_state: left out %d instance(s) with no recorded %s, which connection: %s reaches "
                "them by (no generation of theirs is recorded; playbooks/state_query.yml): %s"
                % (len(unaddressed), "private address" if address == "csis_private_ip" else "instance id",
                   self.get_option("connection"), ", ".join(unaddressed)))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache=cache)
        self._read_config_data(path)
        if self.get_option("hostnames") == []:
            # an empty list names no host: refused, not read as the default
            raise AnsibleParserError("csis.infra.meta_state: %s: 'hostnames' is empty, so it names no host: list one or "
                                     "more of name, hostname, alias, or leave it out for [name]" % path)
        source, identity, open_store = self._store(path)

        records = self._get_cached(path, cache, identity)
        from_cache = records is not None
        if not from_cache:
            records = self._load_records(source, open_store)

        self._populate(records)
        self._update_cache(path, cache, identity, records, from_cache)
