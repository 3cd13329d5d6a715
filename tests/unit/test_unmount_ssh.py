# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""The unmount over SSH, with the real OpenSSH client against a real SSH server on 127.0.0.1.

The server (asyncssh, in a thread, on a free port) has a generated host key and accepts
one generated client key. It executes nothing on this machine (the unmount script edits
/etc/fstab): it records the login, the command and the stdin it received, and answers
with the exit status and output the test scripted (or never answers, for the timeout).
``unmount()`` runs the system ``ssh`` (``BatchMode``, ``StrictHostKeyChecking``, the
known_hosts file, the key) as it would against a machine.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import threading
from typing import Any, Dict, List, Optional

import asyncssh  # requirements.txt
import pytest
from trees import write_meta  # noqa: E402  (tests/support)

from ansible_collections.csis.infra.plugins.module_utils.csis.apply import receipts, unmount
from ansible_collections.csis.infra.plugins.module_utils.csis import aws
from ansible_collections.csis.infra.plugins.module_utils.csis.config import models as m
from ansible_collections.csis.infra.plugins.module_utils.csis.state import record
from ansible_collections.csis.infra.plugins.module_utils.csis.state.store import MetaState

MOUNT = "/mnt/data"


class FakeSshd:
    """An SSH server on 127.0.0.1 that records what it is sent and answers as scripted."""

    def __init__(self, host_key: Any, client_public_key: Any) -> None:
        self.host_key = host_key
        self.authorized = asyncssh.import_authorized_keys(client_public_key.export_public_key().decode())
        self.received: List[Dict[str, Any]] = []
        self.exit_status = 0
        self.output = "unmounted: %s\n" % MOUNT
        self.hang = False
        self.loop = asyncio.new_event_loop()
        self._release: Optional[asyncio.Event] = None
        self._server: Any = None
        self.port = 0
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _session(self, process: Any) -> None:
        stdin = await process.stdin.read()
        self.received.append({"user": process.get_extra_info("username"), "command": process.command, "stdin": stdin})
        if self.hang:
            await self._release.wait()
            return
        process.stdout.write(self.output)
        process.exit(self.exit_status)

    async def _start(self) -> None:
        self._release = asyncio.Event()
        self._server = await asyncssh.create_server(
            asyncssh.SSHServer, "127.0.0.1", 0, server_host_keys=[self.host_key],
            authorized_client_keys=self.authorized, process_factory=self._session)
        self.port = self._server.sockets[0].getsockname()[1]

    def start(self) -> "FakeSshd":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)
        return self

    async def _stop(self) -> None:
        self._release.set()
        self._server.close()
        await self._server.wait_closed()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("sshkeys")
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    other_host_key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = d / "id_ed25519"
    client_key.write_private_key(str(key_file))
    os.chmod(str(key_file), 0o600)
    return {"host": host_key, "client": client_key, "other_host": other_host_key, "client_file": str(key_file)}


@pytest.fixture
def sshd(keys):
    server = FakeSshd(keys["host"], keys["client"]).start()
    yield server
    server.stop()


def known_hosts_line(port: int, key: Any) -> str:
    return "[127.0.0.1]:%d %s\n" % (port, key.export_public_key().decode().strip())


@pytest.fixture
def tree(tmp_path, keys, sshd):
    """A configuration root with test2 recorded at 127.0.0.1, its known_hosts (the server's
    key) and the client key under keys/ (relative paths, as a tree names them)."""
    root = tmp_path / "tree"
    (root / "keys").mkdir(parents=True)
    shutil.copy(keys["client_file"], str(root / "keys" / "csis"))
    os.chmod(str(root / "keys" / "csis"), 0o600)
    (root / "keys" / "known_hosts").write_text(known_hosts_line(sshd.port, keys["host"]))
    write_meta(str(root), "instance-state.yaml", {"instances": {"test2": {"current": {
        "number": 1, "instance_id": "i-0abc", "private_ip": "127.0.0.1", "public_ip": None}}}})
    write_meta(str(root), "launch-params.yaml", {"instances": {"test2": {"launched": True}}})
    return str(root)


def access(server_port: int, **ssh: Any) -> Dict[str, Any]:
    settings = {"user": "ec2-user", "private_key_file": "keys/csis", "port": server_port, "known_hosts_file": "keys/known_hosts",
                "connect_timeout": 30}
    settings.update(ssh)
    return {"session_mechanism": "ssh", "region": "us-east-2", "ssh": settings}


def read_receipt(rd: str) -> Dict[str, Any]:
    with open(os.path.join(rd, "test2__mnt_data.json"), encoding="utf-8") as fh:
        return json.load(fh)


def test_a_successful_unmount_over_ssh_writes_an_ok_receipt(tree, sshd, tmp_path):
    rd = str(tmp_path / "receipts")
    r = unmount.unmount(tree, "test2", "mnt_data", MOUNT, rd, access=access(sshd.port), runtime="rt", run_id="run-1",
                        timeout=60)
    data = read_receipt(rd)
    assert data["ok"] is True and data["method"] == "session" and data["session"] == "ssh"
    assert (data["host"], data["user"], data["port"]) == ("127.0.0.1", "ec2-user", sshd.port)
    assert data["exit_status"] == 0 and data["output"] == "unmounted: %s\n" % MOUNT
    assert data["instance_id"] == "i-0abc" and data["runtime"] == "rt" and data["run"] == "run-1"
    assert r["path"].endswith("test2__mnt_data.json")
    assert receipts.check_receipts(["test2:mnt_data"], rd) == []
    # the key is named nowhere in the receipt, let alone its content
    text = json.dumps(data)
    assert "keys/csis" not in text and "PRIVATE KEY" not in text
    # what the machine received: the login, sudo (the user is not root), exactly the script
    (got,) = sshd.received
    assert got["user"] == "ec2-user" and got["command"] == "sudo -n sh -s"
    assert got["stdin"] == "\n".join(unmount.unmount_script(MOUNT)) + "\n"


def test_root_runs_the_script_without_sudo_and_force_sends_the_forceful_script(tree, sshd, tmp_path):
    unmount.unmount(tree, "test2", "mnt_data", MOUNT, str(tmp_path / "r"), access=access(sshd.port, user="root"),
                    force=True, timeout=60)
    (got,) = sshd.received
    assert got["user"] == "root" and got["command"] == "sh -s"
    assert got["stdin"] == "\n".join(unmount.unmount_script(MOUNT, force=True)) + "\n"
    assert 'fuser -km "$MP"' in got["stdin"]


def test_a_busy_mount_writes_a_refused_receipt_and_raises_with_the_output(tree, sshd, tmp_path):
    rd = str(tmp_path / "receipts")
    sshd.exit_status, sshd.output = 1, "busy: /mnt/data is held by:\n  root  4242 F.c.. postgres\n"
    with pytest.raises(unmount.UnmountError) as err:
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, rd, access=access(sshd.port), timeout=60)
    msg = str(err.value)
    assert msg.startswith("unmount of /mnt/data on test2 over ssh (ec2-user@127.0.0.1:%d) failed (exit 1, Failed): "
                          % sshd.port)
    assert "busy: /mnt/data is held by:" in msg and "4242 F.c.. postgres" in msg
    data = read_receipt(rd)
    assert data["ok"] is False and data["exit_status"] == 1 and data["session"] == "ssh"
    assert data["output"] == sshd.output
    (problem,) = receipts.check_receipts(["test2:mnt_data"], rd)
    assert problem.startswith("DETACH NOT UNMOUNTED: test2:mnt_data")


def test_the_output_kept_is_trimmed(tree, sshd, tmp_path):
    rd = str(tmp_path / "receipts")
    sshd.output = "x" * (unmount.OUTPUT_MAX * 2) + "unmounted: /mnt/data\n"
    unmount.unmount(tree, "test2", "mnt_data", MOUNT, rd, access=access(sshd.port), timeout=60)
    data = read_receipt(rd)
    assert len(data["output"]) == unmount.OUTPUT_MAX and data["output"].endswith("unmounted: /mnt/data\n")


def test_a_changed_host_key_is_refused(tree, sshd, keys, tmp_path):
    rd = str(tmp_path / "receipts")
    with open(os.path.join(tree, "keys", "known_hosts"), "w", encoding="utf-8") as fh:
        fh.write(known_hosts_line(sshd.port, keys["other_host"]))  # a different machine's key
    with pytest.raises(unmount.UnmountError) as err:
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, rd, access=access(sshd.port), timeout=60)
    msg = str(err.value)
    assert "failed (exit 255, Error)" in msg and "Host key verification failed" in msg
    assert ("ssh refused the host key of 127.0.0.1: it differs from the one in %s (StrictHostKeyChecking=yes)"
            % os.path.join(tree, "keys", "known_hosts")) in msg
    assert sshd.received == []  # nothing was sent
    data = read_receipt(rd)
    assert data["ok"] is False and data["exit_status"] == 255


def test_an_unknown_host_key_is_refused_unless_accept_new_is_set(tree, sshd, keys, tmp_path):
    kh = os.path.join(tree, "keys", "known_hosts")
    open(kh, "w").close()
    with pytest.raises(unmount.UnmountError) as err:
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, str(tmp_path / "r1"), access=access(sshd.port), timeout=60)
    assert "Host key verification failed" in str(err.value)
    assert ("ssh refused the host key of 127.0.0.1: it is not in %s (StrictHostKeyChecking=yes); add the machine's key "
            "there" % kh) in str(err.value) and "host_key_checking: accept-new" in str(err.value)
    assert sshd.received == []
    # accept-new: explicit; the first-seen key is recorded and the unmount runs
    r = unmount.unmount(tree, "test2", "mnt_data", MOUNT, str(tmp_path / "r2"),
                        access=access(sshd.port, host_key_checking="accept-new"), timeout=60)
    assert r["ok"] is True and len(sshd.received) == 1
    with open(kh, encoding="utf-8") as fh:
        recorded = fh.read()
    assert keys["host"].export_public_key().decode().split()[1] in recorded
    # accept-new still refuses a changed key
    with open(kh, "w", encoding="utf-8") as fh:
        fh.write(known_hosts_line(sshd.port, keys["other_host"]))
    with pytest.raises(unmount.UnmountError, match="Host key verification failed"):
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, str(tmp_path / "r3"),
                        access=access(sshd.port, host_key_checking="accept-new"), timeout=60)
    assert len(sshd.received) == 1


def test_a_session_that_never_answers_is_bounded_by_the_timeout(tree, sshd, tmp_path):
    rd = str(tmp_path / "receipts")
    sshd.hang = True
    with pytest.raises(unmount.UnmountError) as err:
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, rd, access=access(sshd.port), timeout=2)
    msg = str(err.value)
    assert "failed (exit None, TimedOut)" in msg
    assert "ssh to 127.0.0.1 did not finish within 2 s (the timeout): killed" in msg
    # whether the 2 s ended during the handshake or after the script was delivered, nothing came back
    assert all(got["stdin"] == "\n".join(unmount.unmount_script(MOUNT)) + "\n" for got in sshd.received)
    data = read_receipt(rd)
    assert data["ok"] is False and data["exit_status"] is None


def test_a_server_that_never_greets_is_bounded_by_the_connect_timeout(tree, tmp_path):
    """A port that accepts the connection but never sends the SSH banner."""
    rd = str(tmp_path / "receipts")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with pytest.raises(unmount.UnmountError) as err:
            unmount.unmount(tree, "test2", "mnt_data", MOUNT, rd, access=access(port, connect_timeout=1), timeout=60)
    msg = str(err.value)
    assert "failed (exit 255, Error)" in msg and "timed out" in msg.lower()
    assert read_receipt(rd)["ok"] is False


def test_the_recorded_public_ip_is_used_when_the_settings_say_so(tree, sshd, tmp_path):
    write_meta(tree, "instance-state.yaml", {"instances": {"test2": {"current": {
        "number": 1, "instance_id": "i-0abc", "private_ip": "192.0.2.10", "public_ip": "127.0.0.1"}}}})
    r = unmount.unmount(tree, "test2", "mnt_data", MOUNT, str(tmp_path / "r"), access=access(sshd.port, address="public_ip"),
                        timeout=60)
    assert r["ok"] is True and r["host"] == "127.0.0.1" and len(sshd.received) == 1


def test_no_recorded_address_is_refused_before_any_connection(tree, sshd, tmp_path):
    rd = str(tmp_path / "receipts")
    with pytest.raises(unmount.UnmountError, match=r"records no public_ip for test2 \(instances\.test2\.current\.public_ip"):
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, rd, access=access(sshd.port, address="public_ip"), timeout=60)
    assert sshd.received == [] and not os.path.exists(rd)
    # the explicit host override reaches the machine
    r = unmount.unmount(tree, "test2", "mnt_data", MOUNT, rd, access=access(sshd.port, address="public_ip"),
                        host="127.0.0.1", timeout=60)
    assert r["ok"] is True and r["host"] == "127.0.0.1"


@pytest.mark.parametrize("bad, words", [
    ({"user": "-oProxyCommand=touch /tmp/x"}, "ssh.user '-oProxyCommand=touch /tmp/x' is not a login name"),
    ({"private_key_file": "-oProxyCommand=x"}, "ssh.private_key_file '-oProxyCommand=x' is not a plain file path"),
    ({"known_hosts_file": "a b"}, "ssh.known_hosts_file 'a b' is not a plain file path"),
    ({"port": 0}, "ssh.port 0 must be a whole number 1-65535"),
    ({"host_key_checking": "no"}, "ssh.host_key_checking 'no' must be one of strict, accept-new"),
    ({"identity": "x"}, "ssh settings: unknown key(s) identity"),
])
def test_unsafe_settings_from_a_playbook_are_refused_before_any_connection(tree, sshd, tmp_path, bad, words):
    with pytest.raises(unmount.UnmountError) as err:
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, str(tmp_path / "r"), access=access(sshd.port, **bad), timeout=60)
    assert words in str(err.value) and "confirm: true" in str(err.value)
    assert sshd.received == []


@pytest.mark.parametrize("host", ["-oProxyCommand=x", "a b", "127.0.0.1 -p 1"])
def test_an_unsafe_host_override_is_refused(tree, sshd, tmp_path, host):
    with pytest.raises(unmount.UnmountError, match="is not an IP address or a plain host name"):
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, str(tmp_path / "r"), access=access(sshd.port), host=host, timeout=60)
    assert sshd.received == []


def test_missing_key_or_known_hosts_files_are_named(tree, sshd, tmp_path):
    with pytest.raises(unmount.UnmountError, match="ssh.private_key_file %s is not a file" % os.path.join(tree, "keys", "nope")):
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, str(tmp_path / "r"),
                        access=access(sshd.port, private_key_file="keys/nope"), timeout=60)
    with pytest.raises(unmount.UnmountError, match=r"ssh.known_hosts_file .*keys/absent is not a file \(host_key_checking: strict"):
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, str(tmp_path / "r"),
                        access=access(sshd.port, known_hosts_file="keys/absent"), timeout=60)
    assert sshd.received == []


def test_no_ssh_settings_and_mechanism_none_are_refused_with_the_way_out(tree, tmp_path):
    with pytest.raises(unmount.UnmountError) as err:
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, str(tmp_path / "r"), access={"session_mechanism": "ssh"})
    assert "carries no ssh settings" in str(err.value) and "confirm: true" in str(err.value)
    with pytest.raises(unmount.UnmountError) as err:
        unmount.unmount(tree, "test2", "mnt_data", MOUNT, str(tmp_path / "r"), access={"session_mechanism": "none"})
    assert str(err.value) == ("unmount of /mnt/data on test2: the runtime's session mechanism is 'none' (csis.infra has no "
                              "session to its machines); unmount it by hand and record it with confirm: true "
                              "(-e csis_unmount_mode=confirm)")


# --------------------------------------------------------------------------- the runtime's settings
def runtime(**kw: Any) -> Any:
    return m.RuntimeBuilder(**dict({"name": "rt", "region": "us-east-2"}, **kw))


def test_the_ssh_settings_reach_the_rendered_access_only_with_session_mechanism_ssh():
    rt = runtime(session_mechanism="ssh", ssh={"user": "admin", "private_key_file": "keys/k"})
    got = aws.runtime_access(rt, session_mechanism=True)
    assert got["ssh"] == {"user": "admin", "private_key_file": "keys/k", "port": 22, "address": "private_ip",
                          "known_hosts_file": None, "host_key_checking": "strict", "connect_timeout": 10,
                          "config_file": None}
    assert unmount.ssh_settings(got) == got["ssh"]  # what the module is given passes its own check
    assert "ssh" not in aws.runtime_access(runtime(ssh={"user": "admin", "private_key_file": "k"}), session_mechanism=True)
    assert "ssh" not in aws.runtime_access(rt)


def test_the_ssh_command_line_checks_host_keys_and_ends_options_before_the_host(tmp_path):
    settings = unmount.ssh_settings(access(2222))
    argv = unmount.ssh_argv(settings, "127.0.0.1", str(tmp_path))
    assert argv[-4:] == ["ec2-user", "--", "127.0.0.1", "sudo -n sh -s"]
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert {"BatchMode=yes", "IdentitiesOnly=yes", "StrictHostKeyChecking=yes", "ConnectTimeout=30",
            "UserKnownHostsFile=%s" % os.path.join(str(tmp_path), "keys", "known_hosts")} <= set(opts)
    assert not any(o.startswith("StrictHostKeyChecking=no") for o in opts)
    assert argv[argv.index("-i") + 1] == os.path.join(str(tmp_path), "keys", "csis")
    assert argv[argv.index("-F") + 1] == "none"


# --------------------------------------------------------------------------- the recorded addresses
def instance_state(ip_public: str) -> Dict[str, Any]:
    return {"resources": [{"mode": "managed", "module": "module.instance_test2", "type": "aws_instance", "name": "this",
                           "instances": [{"attributes": {"id": "i-0abc", "private_ip": "10.0.1.7", "public_ip": ip_public,
                                                         "ami": "ami-0123456789abcdef0", "availability_zone": "us-east-2a",
                                                         "instance_type": "t3.micro"}}]}]}


@pytest.mark.parametrize("ip_public, recorded", [("203.0.113.5", "203.0.113.5"), ("", None)])
def test_the_record_keeps_both_addresses_of_an_instance(tmp_path, ip_public, recorded):
    root = {"builder": "tofu", "instances": {"test2": {"address": "module.instance_test2", "launch_params": {"image": "img"}}}}
    record.record_instance_root(MetaState(str(tmp_path)), root, instance_state(ip_public), "run-1")
    cur = MetaState(str(tmp_path)).load("instance-state.yaml")["instances"]["test2"]["current"]  # the store validates it
    assert (cur["private_ip"], cur["public_ip"]) == ("10.0.1.7", recorded)
    assert unmount.recorded_address(str(tmp_path), "test2", "private_ip") == "10.0.1.7"
    assert unmount.recorded_address(str(tmp_path), "test2", "public_ip") == recorded
