# -*- coding: utf-8 -*-
"""The csis.infra.meta_state inventory plugin, driven through the real ansible CLIs.

Meta-state is written by hand through MetaState transactions (what the lifecycle
recorders write); every check runs the real ``ansible-inventory`` / ``ansible``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
COLLECTIONS = ROOT / ".venv" / "collections"
if str(COLLECTIONS) not in sys.path:  # tests/conftest.py normally does this
    sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState  # noqa: E402

pytestmark = pytest.mark.integration

LAUNCH_PARAMS = {"instances": {
    "test2": {
        "image": "base", "build": "ami-0123456789abcdef0", "machine_type": "t3.micro", "group": "team",
        "runtime": "aws", "builder": "aws-ec2", "region": "us-east-1",
        "mounts": [{"storage": "mnt_data", "type": "ebs", "builder": "aws-ebs", "mount_point": "/mnt/data",
                    "group": "team", "share_mode": "2770", "public_read": False, "device": "/dev/xvdf"}],
        "hostname": "test2-001", "ephemeral": False, "tags": {"Owner": "team-a", "Env": "dev"},
        "launched": True, "launched_run": "2026_11_29t06_13_54"},
    "test3": {
        "image": "ubuntu-22.04", "build": "unbound", "machine_type": "m5.large", "group": "ops",
        "runtime": "aws", "builder": "aws-ec2", "region": "eu-west-1", "mounts": [],
        "hostname": "test3-004", "alias": "db", "ephemeral": True, "tags": {"Owner": "ops"},
        "launched": True, "launched_run": "r2"},
    "planned": {"image": "base", "group": "team", "runtime": "aws", "hostname": "planned-001",
                "launched": False},
}}
INSTANCE_STATE = {"instances": {
    "test2": {"generation": {"durable": 1, "ephemeral": 0}, "history": [],
              "current": {"number": 1, "kind": "durable", "instance_id": "i-0a1b2c3d4e5f60718",
                          "private_ip": "10.0.1.17", "ami_id": "ami-0123456789abcdef0",
                          "availability_zone": "us-east-1a", "opened_run": "r1",
                          "opened_at": "2026-11-29T06:13:54Z"}},
    "test3": {"generation": {"durable": 0, "ephemeral": 4}, "history": [],
              "current": {"number": 4, "kind": "ephemeral", "instance_id": "i-0ffffeeeeddddcccc",
                          "private_ip": "10.0.2.9", "ami_id": "ami-0fedcba9876543210",
                          "availability_zone": "eu-west-1b", "opened_run": "r2",
                          "opened_at": "2026-11-29T07:00:00Z"}},
}}


def _unsafe(obj: Dict[str, Any]) -> Any:
    # ansible-inventory (2.19) marks strings not trusted as templates {"__ansible_unsafe": "..."}
    if set(obj) == {"__ansible_unsafe"}:
        return obj["__ansible_unsafe"]
    return obj


def _env(**extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env.pop("ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED", None)
    env.pop("ANSIBLE_INVENTORY_ENABLED", None)
    env["ANSIBLE_NOCOLOR"] = "1"
    env.update(extra)
    return env


def run_inventory(source: Path, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(source), *args],
                          cwd=str(ROOT), env=_env(**env), capture_output=True, text=True, timeout=120, check=False)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def inventory_list(source: Path, *args: str, **env: str) -> Dict[str, Any]:
    proc = run_inventory(source, "--list", *args, **env)
    return json.loads(proc.stdout, object_hook=_unsafe)


def hosts_of(inv: Dict[str, Any], group: str) -> List[str]:
    return sorted(inv.get(group, {}).get("hosts", []))


def all_hosts(inv: Dict[str, Any]) -> List[str]:
    return sorted(inv["_meta"]["hostvars"])


@pytest.fixture()
def config_root(tmp_path: Path) -> Path:
    root = tmp_path / "config"
    with MetaState(str(root)).transaction("test_inventory_plugin") as txn:
        txn.save("launch-params.yaml", LAUNCH_PARAMS)
        txn.save("instance-state.yaml", INSTANCE_STATE)
    return root


def write_source(tmp_path: Path, name: str = "hosts.csis.yml", **options: Any) -> Path:
    config = {"plugin": "csis.infra.meta_state", "config_root": "config"}  # relative to the file
    config.update(options)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------


def test_lists_launched_instances_with_hostvars_and_default_groups(tmp_path, config_root):
    inv = inventory_list(write_source(tmp_path))
    assert all_hosts(inv) == ["test2", "test3"]  # "planned" is not launched
    hv = inv["_meta"]["hostvars"]["test2"]
    assert hv["csis_instance_id"] == "i-0a1b2c3d4e5f60718"
    assert hv["csis_private_ip"] == "10.0.1.17"
    assert hv["csis_mounts"] == LAUNCH_PARAMS["instances"]["test2"]["mounts"]
    assert hv["csis_mounts"][0]["storage"] == "mnt_data"
    assert {k: hv[k] for k in (
        "csis_name", "csis_region", "csis_runtime", "csis_builder", "csis_image", "csis_build",
        "csis_generation", "csis_generation_kind", "csis_hostname", "csis_alias", "csis_group",
        "csis_ephemeral", "csis_tags", "csis_machine_type", "csis_availability_zone", "csis_ami_id",
        "csis_launched_run", "csis_generations")} == {
        "csis_name": "test2", "csis_region": "us-east-1", "csis_runtime": "aws",
        "csis_builder": "aws-ec2", "csis_image": "base", "csis_build": "ami-0123456789abcdef0",
        "csis_generation": 1, "csis_generation_kind": "durable", "csis_hostname": "test2-001",
        "csis_alias": None, "csis_group": "team", "csis_ephemeral": False,
        "csis_tags": {"Owner": "team-a", "Env": "dev"}, "csis_machine_type": "t3.micro",
        "csis_availability_zone": "us-east-1a", "csis_ami_id": "ami-0123456789abcdef0",
        "csis_launched_run": "2026_11_29t06_13_54", "csis_generations": {"durable": 1, "ephemeral": 0}}
    assert not any(k.startswith("ansible_") for k in hv)  # connection: none
    assert inv["_meta"]["hostvars"]["test3"]["csis_alias"] == "db"
    assert hosts_of(inv, "csis_group_team") == ["test2"]
    assert hosts_of(inv, "csis_group_ops") == ["test3"]
    assert hosts_of(inv, "csis_runtime_aws") == ["test2", "test3"]
    assert hosts_of(inv, "csis_image_base") == ["test2"]
    assert hosts_of(inv, "csis_image_ubuntu_22_04") == ["test3"]  # sanitized
    assert hosts_of(inv, "csis_durable") == ["test2"]
    assert hosts_of(inv, "csis_ephemeral") == ["test3"]


def test_hostnames_preference_and_include_ephemeral(tmp_path, config_root):
    inv = inventory_list(write_source(tmp_path, hostnames=["alias", "hostname"]))
    assert all_hosts(inv) == ["db", "test2-001"]
    assert inv["_meta"]["hostvars"]["db"]["csis_name"] == "test3"
    inv = inventory_list(write_source(tmp_path, hostnames=["hostname"], include_ephemeral=False))
    assert all_hosts(inv) == ["test2-001"]
    assert "csis_ephemeral" not in inv


def test_hostnames_without_value_are_left_out_with_warning(tmp_path, config_root):
    proc = run_inventory(write_source(tmp_path, hostnames=["alias"]), "--list")
    assert sorted(json.loads(proc.stdout)["_meta"]["hostvars"]) == ["db"]
    assert "left out 1 instance(s)" in proc.stderr and "test2" in proc.stderr


def test_duplicate_host_names_fail(tmp_path, config_root):
    with MetaState(str(config_root)).transaction() as txn:
        lp = txn.load("launch-params.yaml")
        lp["instances"]["test2"]["alias"] = "db"  # test3's alias too
        txn.save("launch-params.yaml", lp)
    proc = run_inventory(write_source(tmp_path, hostnames=["alias", "name"]), "--list", check=False,
                         ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    assert proc.returncode != 0
    assert "instances 'test2' and 'test3' both resolve to host name 'db'" in proc.stderr


def test_an_empty_hostnames_list_fails_the_source(tmp_path, config_root):
    proc = run_inventory(write_source(tmp_path, hostnames=[]), "--list", check=False,
                         ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    assert proc.returncode != 0
    assert "'hostnames' is empty, so it names no host: list one or more of name, hostname, alias" in proc.stderr


def _launched_without_a_generation(config_root):
    """A launch record with no open generation: no instance id, no private address to reach it by."""
    with MetaState(str(config_root)).transaction() as txn:
        lp = txn.load("launch-params.yaml")
        lp["instances"]["bare"] = dict(LAUNCH_PARAMS["instances"]["test2"], hostname="bare-001")
        txn.save("launch-params.yaml", lp)


def test_ssm_connection_variables(tmp_path, config_root):
    _launched_without_a_generation(config_root)
    proc = run_inventory(write_source(tmp_path, connection="ssm", ssm_bucket_name="ssm-xfer"), "--list")
    inv = json.loads(proc.stdout, object_hook=_unsafe)
    # never reached by its bare name: left out, with a warning naming it
    assert all_hosts(inv) == ["test2", "test3"]
    assert "left out 1 instance(s) with no recorded instance id, which connection: ssm reaches them by" in proc.stderr
    assert "bare" in proc.stderr
    hv = inv["_meta"]["hostvars"]["test2"]
    assert hv["ansible_connection"] == "amazon.aws.aws_ssm"
    assert hv["ansible_aws_ssm_instance_id"] == "i-0a1b2c3d4e5f60718"
    assert hv["ansible_aws_ssm_region"] == "us-east-1"
    assert hv["ansible_aws_ssm_bucket_name"] == "ssm-xfer"
    assert inv["_meta"]["hostvars"]["test3"]["ansible_aws_ssm_region"] == "eu-west-1"


def test_ssh_connection_variables(tmp_path, config_root):
    _launched_without_a_generation(config_root)
    proc = run_inventory(write_source(tmp_path, connection="ssh", ssh_user="ec2-user"), "--list")
    inv = json.loads(proc.stdout, object_hook=_unsafe)
    hv = inv["_meta"]["hostvars"]["test2"]
    assert (hv["ansible_connection"], hv["ansible_host"], hv["ansible_user"]) == ("ssh", "10.0.1.17", "ec2-user")
    assert not any(k.startswith("ansible_aws_ssm") for k in hv)
    # an ssh connection to the name "bare" would go wherever DNS sends it: left out, with a warning
    assert all_hosts(inv) == ["test2", "test3"]
    assert "left out 1 instance(s) with no recorded private address, which connection: ssh reaches them by" in proc.stderr
    # without connection variables it is listed (the inventory lists what is launched)
    assert all_hosts(inventory_list(write_source(tmp_path))) == ["bare", "test2", "test3"]


def test_keyed_groups_groups_and_compose(tmp_path, config_root):
    source = write_source(
        tmp_path, connection="ssh",
        keyed_groups=[{"key": "csis_tags.Owner", "prefix": "owner"},
                      {"key": "csis_mounts | map(attribute='storage')", "prefix": "storage"},
                      {"key": "csis_availability_zone", "prefix": "az"}],
        groups={"big": "csis_machine_type.startswith('m5.')"},
        compose={"ansible_host": "csis_hostname ~ '.internal'", "owner_upper": "csis_tags.Owner | upper"},
        default_groups=False,
    )
    inv = inventory_list(source)
    assert hosts_of(inv, "owner_team_a") == ["test2"]
    assert hosts_of(inv, "owner_ops") == ["test3"]
    assert hosts_of(inv, "storage_mnt_data") == ["test2"]
    assert hosts_of(inv, "az_us_east_1a") == ["test2"]
    assert hosts_of(inv, "big") == ["test3"]
    assert "csis_group_team" not in inv  # default_groups: false
    hv = inv["_meta"]["hostvars"]["test2"]
    assert hv["ansible_host"] == "test2-001.internal"  # compose overrides the connection default
    assert hv["owner_upper"] == "TEAM-A"


def test_strict_compose_error(tmp_path, config_root):
    source = write_source(tmp_path, strict=True, compose={"x": "no_such_var.attr"})
    proc = run_inventory(source, "--list", check=False, ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    assert proc.returncode != 0 and "Could not set x for host" in proc.stderr
    # not strict: the variable is simply not set
    inv = inventory_list(write_source(tmp_path, compose={"x": "no_such_var.attr"}))
    assert "x" not in inv["_meta"]["hostvars"]["test2"]


def test_cache_is_used_on_the_second_call(tmp_path, config_root):
    cache_dir = tmp_path / "inv-cache"
    source = write_source(tmp_path, cache=True, cache_plugin="ansible.builtin.jsonfile",
                          cache_connection=str(cache_dir), cache_timeout=3600)
    first = inventory_list(source)
    assert all_hosts(first) == ["test2", "test3"]
    cached = list(cache_dir.iterdir())
    assert len(cached) == 1 and "csis.infra.meta_state" in cached[0].name
    # corrupt the records: only a cached answer can still list the host
    lp = config_root / "meta-state" / "launch-params.yaml"
    lp.write_text("instances: [this, is, not, a, mapping]\n", encoding="utf-8")
    second = inventory_list(source)
    assert second["_meta"]["hostvars"] == first["_meta"]["hostvars"]
    # --flush-cache reads meta-state again, and fails naming the file
    proc = run_inventory(source, "--list", "--flush-cache", check=False,
                         ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    assert proc.returncode != 0
    assert "%s: top-level key 'instances' must be a mapping, got list" % lp in proc.stderr


def test_cache_entry_for_another_config_root_is_ignored(tmp_path, config_root):
    cache_opts = dict(cache=True, cache_plugin="ansible.builtin.jsonfile",
                      cache_connection=str(tmp_path / "inv-cache"), cache_timeout=3600)
    assert all_hosts(inventory_list(write_source(tmp_path, **cache_opts))) == ["test2", "test3"]
    other = tmp_path / "other"
    with MetaState(str(other)).transaction() as txn:
        txn.save("launch-params.yaml", {"instances": {"solo": {"launched": True, "group": "x"}}})
    inv = inventory_list(write_source(tmp_path, config_root="other", **cache_opts))
    assert all_hosts(inv) == ["solo"]


@pytest.mark.parametrize("setup", ["no-root", "no-meta-state", "none-launched"])
def test_empty_or_missing_meta_state_is_an_empty_inventory(tmp_path, setup):
    root = tmp_path / "config"
    if setup != "no-root":
        root.mkdir()
    if setup == "none-launched":
        with MetaState(str(root)).transaction() as txn:
            txn.save("launch-params.yaml", {"instances": {"p": {"launched": False}}})
    proc = run_inventory(write_source(tmp_path), "--list", ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    inv = json.loads(proc.stdout)
    assert inv["_meta"]["hostvars"] == {}
    assert inv["all"]["children"] == ["ungrouped"]
    assert "Failed to parse" not in proc.stderr
    if setup == "no-root":
        assert "does not exist; the inventory is empty" in proc.stderr
    if setup == "no-meta-state":  # a directory that is no tree (a mistyped config_root) is not empty in silence
        assert "config root %s is not a configuration tree (no cfg/_config.yml, no meta-state/); the inventory is " \
            "empty" % root in proc.stderr


@pytest.mark.parametrize("name,text,message", [
    ("launch-params.yaml", "instances:\n  test2: {image: [unclosed\n",
     "launch-params.yaml: YAML syntax error at line 3"),
    ("instance-state.yaml", "instances:\n  test2:\n    current: [1, 2]\n",
     "instance-state.yaml: 'instances.test2.current' must be a mapping, got list"),
    # an emptied file is no empty inventory (issue 16, defect 3)
    ("launch-params.yaml", "", "launch-params.yaml: is empty (0 bytes), but csis.infra never writes"),
    ("instance-state.yaml", "# nothing yet\n", "instance-state.yaml: holds no records, only comments"),
])
def test_corrupt_file_fails_naming_it(tmp_path, config_root, name, text, message):
    (config_root / "meta-state" / name).write_text(text, encoding="utf-8")
    source = write_source(tmp_path)
    proc = run_inventory(source, "--list", check=False, ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    assert proc.returncode != 0
    assert "csis.infra.meta_state: %s/meta-state/%s" % (config_root, message) in proc.stderr
    # with ansible's default (unparsed source = warning) the message is still shown
    proc = run_inventory(source, "--list", check=False)
    assert "%s/meta-state/%s" % (config_root, message) in proc.stderr


def test_only_csis_file_names_are_accepted(tmp_path, config_root):
    source = write_source(tmp_path, name="hosts.yml")
    proc = run_inventory(source, "--list", check=False, ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    assert proc.returncode != 0
    assert "could not be verified by inventory plugin 'csis.infra.meta_state'" in proc.stderr
    assert all_hosts(inventory_list(write_source(tmp_path, name="prod.csis.yaml"))) == ["test2", "test3"]


def test_adhoc_ping_reaches_the_hosts(tmp_path, config_root):
    source = write_source(tmp_path, connection="ssm")  # overridden by the -e below
    proc = subprocess.run(
        [str(VENV_BIN / "ansible"), "-i", str(source), "all", "-m", "ansible.builtin.ping",
         "-e", "ansible_connection=local", "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python"),
         "-o"],
        cwd=str(ROOT), env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if "SUCCESS" in line)
    assert len(lines) == 2, proc.stdout
    assert lines[0].startswith("test2 | SUCCESS") and '"ping": "pong"' in lines[0]
    assert lines[1].startswith("test3 | SUCCESS")
    # targeting by a default group
    proc = subprocess.run(
        [str(VENV_BIN / "ansible"), "-i", str(source), "csis_group_team", "-m", "ansible.builtin.debug",
         "-a", "var=csis_private_ip", "-e", "ansible_connection=local", "-o"],
        cwd=str(ROOT), env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test2 | SUCCESS" in proc.stdout and "10.0.1.17" in proc.stdout and "test3" not in proc.stdout


def test_a_template_in_meta_state_never_runs(tmp_path):
    """A string in meta-state shaped as a template (a tag, or anything a writer to the store put
    there) stays a string through keyed groups, groups, compose and a task that prints it: it never
    runs on the controller. (ansible-core 2.17 and 2.18 trust a plain string as a template: the
    plugin marks every value unsafe there: checked by hand on 2.17.14, see the changelog, and its
    branch by the next test.)"""
    marker = tmp_path / "RAN"
    payload = "{{ lookup('pipe', 'touch %s') }}" % marker
    root = tmp_path / "config"
    params = json.loads(json.dumps(LAUNCH_PARAMS))
    params["instances"]["test2"]["tags"] = {"Owner": payload}
    params["instances"]["test2"]["machine_type"] = payload
    with MetaState(str(root)).transaction("test_inventory_plugin") as txn:
        txn.save("launch-params.yaml", params)
        txn.save("instance-state.yaml", INSTANCE_STATE)
    source = write_source(tmp_path, keyed_groups=[{"key": "csis_tags.Owner", "prefix": "owner"}],
                          groups={"owned": "csis_tags.Owner | length > 0"},
                          compose={"owner_copy": "csis_tags.Owner", "type_copy": "csis_machine_type"})
    hv = inventory_list(source)["_meta"]["hostvars"]["test2"]
    assert hv["owner_copy"] == hv["type_copy"] == payload
    playbook = tmp_path / "show.yml"
    playbook.write_text("- hosts: test2\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug:\n"
                        "        msg: \"{{ csis_tags.Owner }} {{ csis_machine_type }} {{ owner_copy }}\"\n", encoding="utf-8")
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(source), str(playbook),
                           "-e", "ansible_connection=local", "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")],
                          cwd=str(ROOT), env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "{{ lookup(" in proc.stdout, proc.stdout  # printed as it is, not run
    assert not marker.exists()


# ansible-inventory as on ansible-core 2.17 and 2.18, which lack ansible.template.trust_as_template:
# the plugin then takes its wrap_var branch; the spy marks each host's variables it wraps
_AS_ON_2_17 = """
import sys
import ansible.template as template
del template.trust_as_template
import ansible.utils.unsafe_proxy as unsafe_proxy
real = unsafe_proxy.wrap_var
def spy(value):
    out = real(value)
    if isinstance(out, dict) and "csis_instance_id" in out:
        out = dict(out, csis_test_wrapped=True)
    return out
unsafe_proxy.wrap_var = spy
from ansible.cli.inventory import main
sys.argv = ["ansible-inventory"] + sys.argv[1:]
main()
"""


def test_on_cores_that_trust_strings_every_host_variable_is_marked_unsafe(tmp_path, config_root):
    """ansible-core 2.17 and 2.18 run a plain string as a template; there the plugin wraps every
    host's variables with wrap_var (the values become AnsibleUnsafe there, never templated) before
    the host gets them and before compose, groups and keyed groups read them. The suite's core is
    2.19, so the older core's import is imitated (its missing trust_as_template) and wrap_var is
    watched: each host's variables are the wrapped ones, and the constructed features still work."""
    source = write_source(tmp_path, keyed_groups=[{"key": "csis_tags.Owner", "prefix": "owner"}],
                          compose={"owner_copy": "csis_tags.Owner"})
    script = tmp_path / "as_on_2_17.py"
    script.write_text(_AS_ON_2_17, encoding="utf-8")
    proc = subprocess.run([str(VENV_BIN / "python"), str(script), "-i", str(source), "--list"],
                          cwd=str(ROOT), env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    inv = json.loads(proc.stdout, object_hook=_unsafe)
    assert all_hosts(inv) == ["test2", "test3"]
    for host in ("test2", "test3"):
        hv = inv["_meta"]["hostvars"][host]
        assert hv["csis_test_wrapped"] is True, hv   # what the host got went through wrap_var
        assert hv["owner_copy"] == hv["csis_tags"]["Owner"]
    assert hosts_of(inv, "owner_team_a") == ["test2"] and hosts_of(inv, "owner_ops") == ["test3"]
    # and on this core (2.19) the plugin never calls it: the same listing has no mark
    plain = inventory_list(source)["_meta"]["hostvars"]["test2"]
    assert "csis_test_wrapped" not in plain and plain["owner_copy"] == "team-a"


def test_plugin_documentation_renders(tmp_path):
    proc = subprocess.run([str(VENV_BIN / "ansible-doc"), "-t", "inventory", "--json", "csis.infra.meta_state"],
                          cwd=str(ROOT), env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["csis.infra.meta_state"]["doc"]
    options = doc["options"]
    for opt in ("plugin", "config_root", "hostnames", "include_ephemeral", "connection", "ssm_bucket_name",
                "ssh_user", "compose", "groups", "keyed_groups", "strict", "cache", "cache_plugin",
                "cache_connection", "cache_timeout"):
        assert opt in options, opt
    assert options["connection"]["choices"] == ["none", "ssm", "ssh"]
    # the last variable set wins in Ansible's configuration: AWS_REGION over AWS_DEFAULT_REGION, as boto3 and
    # amazon.aws take them
    assert [e["name"] for e in options["meta_state_region"]["env"]] == ["AWS_DEFAULT_REGION", "AWS_REGION"]
