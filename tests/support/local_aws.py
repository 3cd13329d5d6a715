# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""A local AWS endpoint (a moto server on 127.0.0.1) for the demo and the tests.

One implementation, two users:

* ``scripts/local-aws`` (the demo): state in ``<repo>/.local/aws/``;
* ``tests/conftest.py`` (the ``moto_endpoint`` fixture): state in a temporary
  directory, on its own free port, so tests never touch a demo server.

A :class:`LocalAws` owns one *state directory* holding

``endpoint.json``  ``{"url", "pid", "port"}`` of the running server
``server.log``     the server's output
``seed.json``      the ids :meth:`LocalAws.seed` created or found
``overlay.yml``    configuration overlay pointing the example tree at the endpoint
``env.sh``         shell exports (dummy credentials, region, endpoint URL)

Only the standard library is needed to start/stop the server; ``seed`` needs boto3.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

REGION = "us-east-2"
PREFERRED_PORT = 5055
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
}
STATE_BUCKET = "csis-state-local"
VPC_NAME = "csis-example"
VPC_CIDR = "10.42.0.0/16"
SUBNETS = (
    # name, cidr, zone, public
    ("private-a", "10.42.1.0/24", "us-east-2a", False),
    ("private-b", "10.42.2.0/24", "us-east-2b", False),
    ("public-a", "10.42.101.0/24", "us-east-2a", True),
)
SECURITY_GROUPS = (
    # key, group name, description
    ("addl", "csis-addl", "csis additional security group"),
    ("ssh_relay", "csis-ssh-relay", "csis SSH-ingress relay"),
)
INSTANCE_PROFILE = "csis-ssm"
INSTANCE_ROLE = "csis-ssm-role"
AMI_NAMES = (
    # registered in this order: creation dates increase, so most_recent is well defined
    "imgfile-basic-pckr-ebs-ans-20261101",
    "imgfile-basic-dask-pckr-ebs-ans-20261101",
    "imgfile-basic-dask-pckr-ebs-ans-20261115",
)
SEED_TAG = {"Key": "csis:seeded-by", "Value": "local-aws"}

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_STATE_DIR = os.path.join(REPO_ROOT, ".local", "aws")


class LocalAwsError(RuntimeError):
    pass


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # the server binds with SO_REUSEADDR too: a port in TIME_WAIT after a stop is free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    # a zombie child of ours is not alive
    try:
        with open("/proc/%d/stat" % pid, "r", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def answers(url: str, timeout: float = 1.0) -> bool:
    """True when a moto server answers at ``url``."""
    # /moto-api/config is cheap (data.json serialises every backend: ~1 s once seeded)
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/moto-api/config", timeout=timeout) as resp:
            return 200 <= resp.status < 300 and isinstance(json.loads(resp.read() or b"null"), dict)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class LocalAws:
    """A moto server whose bookkeeping lives in ``state_dir``."""

    def __init__(self, state_dir: Optional[str] = None, region: str = REGION) -> None:
        self.state_dir = os.path.abspath(state_dir or os.environ.get("CSIS_LOCAL_AWS_DIR") or DEFAULT_STATE_DIR)
        self.region = region

    # -- paths -------------------------------------------------------------------------
    @property
    def endpoint_file(self) -> str:
        return os.path.join(self.state_dir, "endpoint.json")

    @property
    def overlay_path(self) -> str:
        return os.path.join(self.state_dir, "overlay.yml")

    @property
    def env_path(self) -> str:
        return os.path.join(self.state_dir, "env.sh")

    @property
    def seed_path(self) -> str:
        return os.path.join(self.state_dir, "seed.json")

    @property
    def log_path(self) -> str:
        return os.path.join(self.state_dir, "server.log")

    # -- server ------------------------------------------------------------------------
    def recorded(self) -> Optional[Dict[str, Any]]:
        try:
            with open(self.endpoint_file, "r", encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not {"url", "pid", "port"} <= set(data):
            return None
        return data

    def status(self) -> Optional[Dict[str, Any]]:
        """The recorded endpoint when its process is alive and answers, else None."""
        rec = self.recorded()
        if rec and pid_alive(int(rec["pid"])) and answers(rec["url"]):
            return rec
        return None

    @property
    def url(self) -> str:
        rec = self.status()
        if not rec:
            raise LocalAwsError("no local AWS endpoint is running (state dir %s)" % self.state_dir)
        return str(rec["url"])

    def start(self, port: Optional[int] = None, prefer_port: Optional[int] = PREFERRED_PORT,
              timeout: float = 30.0, tie_to_caller: bool = False) -> Dict[str, Any]:
        """Start a detached moto server (or reuse the recorded live one).

        ``tie_to_caller``: the server exits by itself when this process dies (tests use
        it, so a killed test session leaves no server behind)."""
        live = self.status()
        if live:
            if port and int(live["port"]) != port:
                raise LocalAwsError("a local endpoint already runs on port %s (asked for %s); stop it first"
                                    % (live["port"], port))
            return live
        os.makedirs(self.state_dir, exist_ok=True)
        if port is None:
            port = prefer_port if prefer_port and port_is_free(prefer_port) else free_port()
        elif not port_is_free(port):
            raise LocalAwsError("port %d on 127.0.0.1 is in use" % port)
        url = "http://127.0.0.1:%d" % port
        env = dict(os.environ)
        env.update(DUMMY_CREDENTIALS)
        env["AWS_DEFAULT_REGION"] = self.region
        env["MOTO_PORT"] = str(port)
        cmd = [sys.executable, os.path.abspath(__file__), "serve", "--port", str(port)]
        if tie_to_caller:
            cmd += ["--parent-pid", str(os.getpid())]
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=self.state_dir, start_new_session=True, close_fds=True,
            )
        deadline = time.monotonic() + timeout
        while not answers(url, timeout=0.5):
            if proc.poll() is not None:
                raise LocalAwsError("moto server exited with %s; see %s" % (proc.returncode, self.log_path))
            if time.monotonic() > deadline:
                self._kill(proc.pid)
                raise LocalAwsError("moto server did not answer on %s within %.0fs" % (url, timeout))
            time.sleep(0.1)
        rec = {"url": url, "pid": proc.pid, "port": port}
        _write_atomic(self.endpoint_file, json.dumps(rec, indent=2) + "\n")
        self._proc = proc  # keep the handle so a same-process stop() can reap it
        return rec

    @staticmethod
    def _kill(pid: int, timeout: float = 10.0) -> None:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            return
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            try:  # reap if it is our child
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.1)
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (OSError, ChildProcessError):
                pass

    def stop(self) -> bool:
        """Stop the recorded server; True when one was running."""
        rec = self.recorded()
        stopped = False
        if rec:
            pid = int(rec["pid"])
            # only kill what we recorded, and only if it still looks like a moto server
            if pid_alive(pid) and self._looks_like_moto(pid):
                self._kill(pid)
                stopped = True
        try:
            os.unlink(self.endpoint_file)
        except FileNotFoundError:
            pass
        return stopped

    @staticmethod
    def _looks_like_moto(pid: int) -> bool:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as fh:
                cmdline = fh.read()
            return b"moto" in cmdline or b"local_aws" in cmdline
        except OSError:
            return True  # no /proc: trust the record

    def reset(self) -> Dict[str, Any]:
        """Forget every resource in the server (moto's reset API), then seed again."""
        req = urllib.request.Request(self.url + "/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
        return self.seed()

    # -- environment -------------------------------------------------------------------
    def env(self, url: Optional[str] = None) -> Dict[str, str]:
        """Environment for boto3 / terraform / ansible reaching the endpoint."""
        env = dict(DUMMY_CREDENTIALS)
        env["AWS_DEFAULT_REGION"] = self.region
        env["AWS_REGION"] = self.region
        env["CSIS_AWS_ENDPOINT_URL"] = url or self.url
        return env

    def env_sh(self, url: Optional[str] = None) -> str:
        env = self.env(url)
        lines = ["# written by scripts/local-aws seed: source it to reach the local endpoint"]
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "CSIS_AWS_ENDPOINT_URL"):
            lines.append("export %s=%s" % (key, _sh_quote(env[key])))
        return "\n".join(lines) + "\n"

    def client(self, service: str, url: Optional[str] = None) -> Any:
        import boto3  # only seed/tests need it

        return boto3.client(
            service, region_name=self.region, endpoint_url=url or self.url,
            aws_access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    # -- seed --------------------------------------------------------------------------
    def seed(self) -> Dict[str, Any]:
        """Create (or find) what the example tree presumes exists; write overlay and env."""
        url = self.url
        ec2 = self.client("ec2", url)
        iam = self.client("iam", url)
        s3 = self.client("s3", url)

        vpc_id = self._ensure_vpc(ec2)
        subnets = [self._ensure_subnet(ec2, vpc_id, *spec) for spec in SUBNETS]
        self._ensure_public_route(ec2, vpc_id, [s for s in subnets if s["public"]])
        groups = {key: self._ensure_sg(ec2, vpc_id, name, desc) for key, name, desc in SECURITY_GROUPS}
        profile = self._ensure_instance_profile(iam)
        amis = self._ensure_amis(ec2, subnets[0]["subnet_id"])
        self._ensure_state_bucket(s3)
        account = self.client("sts", url).get_caller_identity()["Account"]

        seeded = {
            "url": url,
            "region": self.region,
            "account_id": account,
            "vpc_id": vpc_id,
            "subnets": subnets,
            "subnet_ids": {s["name"]: s["subnet_id"] for s in subnets},
            "security_groups": groups,
            "instance_profile": profile,
            "amis": amis,
            "state_bucket": STATE_BUCKET,
        }
        os.makedirs(self.state_dir, exist_ok=True)
        _write_atomic(self.seed_path, json.dumps(seeded, indent=2, sort_keys=True) + "\n")
        _write_atomic(self.overlay_path, render_overlay(seeded))
        _write_atomic(self.env_path, self.env_sh(url))
        return seeded

    def seeded(self) -> Optional[Dict[str, Any]]:
        try:
            with open(self.seed_path, "r", encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None

    @staticmethod
    def _name_tags(name: str) -> List[Dict[str, Any]]:
        return [{"Key": "Name", "Value": name}, dict(SEED_TAG)]

    def _ensure_vpc(self, ec2: Any) -> str:
        found = ec2.describe_vpcs(Filters=[{"Name": "tag:Name", "Values": [VPC_NAME]}])["Vpcs"]
        if found:
            return str(found[0]["VpcId"])
        vpc_id = ec2.create_vpc(
            CidrBlock=VPC_CIDR,
            TagSpecifications=[{"ResourceType": "vpc", "Tags": self._name_tags(VPC_NAME)}],
        )["Vpc"]["VpcId"]
        ec2.modify_vpc_attribute(VpcId=vpc_id, EnableDnsSupport={"Value": True})
        ec2.modify_vpc_attribute(VpcId=vpc_id, EnableDnsHostnames={"Value": True})
        return str(vpc_id)

    def _ensure_subnet(self, ec2: Any, vpc_id: str, name: str, cidr: str, zone: str,
                       public: bool) -> Dict[str, Any]:
        tag_name = "%s-%s" % (VPC_NAME, name)
        found = ec2.describe_subnets(Filters=[
            {"Name": "vpc-id", "Values": [vpc_id]},
            {"Name": "tag:Name", "Values": [tag_name]},
        ])["Subnets"]
        if found:
            subnet_id = found[0]["SubnetId"]
        else:
            subnet_id = ec2.create_subnet(
                VpcId=vpc_id, CidrBlock=cidr, AvailabilityZone=zone,
                TagSpecifications=[{"ResourceType": "subnet", "Tags": self._name_tags(tag_name) + [
                    {"Key": "csis:tier", "Value": "public" if public else "private"}]}],
            )["Subnet"]["SubnetId"]
            if public:
                ec2.modify_subnet_attribute(SubnetId=subnet_id, MapPublicIpOnLaunch={"Value": True})
        return {"name": name, "subnet_id": str(subnet_id), "availability_zone": zone, "public": public}

    def _ensure_public_route(self, ec2: Any, vpc_id: str, public_subnets: List[Dict[str, Any]]) -> None:
        name = "%s-public" % VPC_NAME
        igws = ec2.describe_internet_gateways(Filters=[{"Name": "tag:Name", "Values": [VPC_NAME]}])["InternetGateways"]
        if igws:
            igw_id = igws[0]["InternetGatewayId"]
        else:
            igw_id = ec2.create_internet_gateway(TagSpecifications=[
                {"ResourceType": "internet-gateway", "Tags": self._name_tags(VPC_NAME)}])["InternetGateway"]["InternetGatewayId"]
            ec2.attach_internet_gateway(InternetGatewayId=igw_id, VpcId=vpc_id)
        tables = ec2.describe_route_tables(Filters=[{"Name": "tag:Name", "Values": [name]}])["RouteTables"]
        if tables:
            return
        rtb_id = ec2.create_route_table(VpcId=vpc_id, TagSpecifications=[
            {"ResourceType": "route-table", "Tags": self._name_tags(name)}])["RouteTable"]["RouteTableId"]
        ec2.create_route(RouteTableId=rtb_id, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw_id)
        for subnet in public_subnets:
            ec2.associate_route_table(RouteTableId=rtb_id, SubnetId=subnet["subnet_id"])

    def _ensure_sg(self, ec2: Any, vpc_id: str, name: str, description: str) -> str:
        found = ec2.describe_security_groups(Filters=[
            {"Name": "vpc-id", "Values": [vpc_id]},
            {"Name": "group-name", "Values": [name]},
        ])["SecurityGroups"]
        if found:
            return str(found[0]["GroupId"])
        return str(ec2.create_security_group(
            GroupName=name, Description=description, VpcId=vpc_id,
            TagSpecifications=[{"ResourceType": "security-group", "Tags": self._name_tags(name)}],
        )["GroupId"])

    def _ensure_instance_profile(self, iam: Any) -> Dict[str, str]:
        try:
            role_arn = iam.get_role(RoleName=INSTANCE_ROLE)["Role"]["Arn"]
        except iam.exceptions.NoSuchEntityException:
            role_arn = iam.create_role(
                RoleName=INSTANCE_ROLE,
                AssumeRolePolicyDocument=json.dumps({
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                   "Principal": {"Service": "ec2.amazonaws.com"}}],
                }),
                Description="csis local endpoint: SSM role of instances",
            )["Role"]["Arn"]
        # moto does not load AWS managed policies by default: an inline policy stands in
        # for AmazonSSMManagedInstanceCore (put_role_policy is idempotent)
        iam.put_role_policy(RoleName=INSTANCE_ROLE, PolicyName="csis-ssm-core", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Resource": "*",
                           "Action": ["ssm:UpdateInstanceInformation", "ssmmessages:*", "ec2messages:*"]}],
        }))
        try:
            prof = iam.get_instance_profile(InstanceProfileName=INSTANCE_PROFILE)["InstanceProfile"]
        except iam.exceptions.NoSuchEntityException:
            prof = iam.create_instance_profile(InstanceProfileName=INSTANCE_PROFILE)["InstanceProfile"]
        if not any(r["RoleName"] == INSTANCE_ROLE for r in prof.get("Roles", [])):
            iam.add_role_to_instance_profile(InstanceProfileName=INSTANCE_PROFILE, RoleName=INSTANCE_ROLE)
        return {"name": INSTANCE_PROFILE, "arn": str(prof["Arn"]), "role": INSTANCE_ROLE, "role_arn": str(role_arn)}

    def _ensure_amis(self, ec2: Any, subnet_id: str) -> Dict[str, str]:
        """Self-owned AMIs named like the example images.

        Made with CreateImage from a (then terminated) seed instance launched from one of
        moto's stock x86_64 images, so they carry architecture x86_64 / hvm like a real
        build (RegisterImage in moto leaves both empty). moto reports root_device_type
        ``standard`` for every image and keeps CreationDate to the second: images are
        made one second apart so ``most_recent`` is well defined.
        """
        amis: Dict[str, str] = {}
        missing = []
        for name in AMI_NAMES:
            found = ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [name]}])["Images"]
            if found:
                amis[name] = str(found[0]["ImageId"])
            else:
                missing.append(name)
        if not missing:
            return amis
        stock = ec2.describe_images(Owners=["amazon"], Filters=[
            {"Name": "architecture", "Values": ["x86_64"]}])["Images"]
        if not stock:
            raise LocalAwsError("moto offers no stock x86_64 image to build the seed AMIs from")
        instance_id = ec2.run_instances(
            ImageId=stock[0]["ImageId"], InstanceType="t3.micro", MinCount=1, MaxCount=1,
            SubnetId=subnet_id,
            TagSpecifications=[{"ResourceType": "instance", "Tags": self._name_tags("csis-ami-seed")}],
        )["Instances"][0]["InstanceId"]
        try:
            ec2.stop_instances(InstanceIds=[instance_id])
            for i, name in enumerate(missing):
                if i or amis:
                    time.sleep(1.05)
                amis[name] = str(ec2.create_image(
                    InstanceId=instance_id, Name=name, Description="csis local endpoint image %s" % name,
                    TagSpecifications=[{"ResourceType": "image", "Tags": self._name_tags(name)}],
                )["ImageId"])
        finally:
            ec2.terminate_instances(InstanceIds=[instance_id])
        return amis

    def _ensure_state_bucket(self, s3: Any) -> None:
        try:
            s3.head_bucket(Bucket=STATE_BUCKET)
        except s3.exceptions.ClientError:
            s3.create_bucket(Bucket=STATE_BUCKET,
                             CreateBucketConfiguration={"LocationConstraint": self.region})
        s3.put_bucket_versioning(Bucket=STATE_BUCKET, VersioningConfiguration={"Status": "Enabled"})


def _sh_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _q(value: Any) -> str:
    """A YAML scalar (JSON strings are valid YAML)."""
    return json.dumps(value)


def render_overlay(seeded: Dict[str, Any]) -> str:
    url = seeded["url"]
    subnets = seeded["subnets"]
    default = next(s for s in subnets if not s["public"] and s["availability_zone"] == "us-east-2a")
    sgs = seeded["security_groups"]
    lines = [
        "# written by scripts/local-aws seed: points the example tree at the local endpoint",
        "runtime_builders:",
        "  - name: aws-east2-runtime",
        "    endpoints: {url: %s}" % _q(url),
        "    networking:",
        "      network: %s" % _q(seeded["vpc_id"]),
        "      default_subnet_id: %s" % _q(default["subnet_id"]),
        "      default_availability_zone: %s" % _q(default["availability_zone"]),
        "      ssh_ingress_security_group_ids: [%s]" % _q(sgs["ssh_relay"]),
        "      addl_security_groups: [%s]" % _q(sgs["addl"]),
        "      subnets:",
    ]
    for s in subnets:
        lines.append("        - {name: %s, subnet_id: %s, availability_zone: %s, public: %s}" % (
            _q(s["name"]), _q(s["subnet_id"]), _q(s["availability_zone"]), "true" if s["public"] else "false"))
    lines += [
        "state_backends:",
        "  - name: s3-east2",
        "    endpoints: {url: %s}" % _q(url),
    ]
    return "\n".join(lines) + "\n"


# -- the server process -----------------------------------------------------------------
def apply_moto_patches() -> List[str]:
    """Narrow fixes to moto's responses where it differs from AWS in a way that makes
    terraform plans non-empty. Each is applied only when the patched code is as expected.
    Returns the names of the patches applied (logged by ``serve``)."""
    applied: List[str] = []
    try:
        from moto.ec2.models.elastic_network_interfaces import NetworkInterface
    except ImportError:  # pragma: no cover - other moto layout
        return applied
    original = NetworkInterface.__dict__.get("association")
    if isinstance(original, property) and original.fget is not None:
        fget = original.fget

        def association(self: Any) -> Optional[Dict[str, Any]]:
            # moto 5.2 returns {} for an interface without a public IP, which reaches
            # the client as an empty <association/> element. AWS omits the element, and
            # terraform-provider-aws reads "Association present" as
            # associate_public_ip_address = true: every aws_instance created with
            # associate_public_ip_address = false would then plan a replacement.
            value = fget(self)
            return value or None

        NetworkInterface.association = property(association)  # type: ignore[assignment]
        applied.append("ec2-eni-empty-association")

    try:
        from moto.ec2.models.instances import Instance
    except ImportError:  # pragma: no cover
        return applied
    init = Instance.__init__

    def instance_init(self: Any, *args: Any, **kwargs: Any) -> None:
        # An instance launched with a NetworkInterfaces spec (what terraform sends when
        # associate_public_ip_address is set) gets its groups only on the ENI in moto
        # 5.2, so DescribeInstances reports SecurityGroups = [] and terraform plans
        # vpc_security_group_ids again on every run. AWS reports the primary ENI's
        # groups on the instance: move them there (the ENI's groups then follow the
        # instance's, so ModifyInstanceAttribute keeps both views in step).
        init(self, *args, **kwargs)
        primary = getattr(self, "nics", {}).get(0)
        if not self.security_groups and primary is not None and primary._group_set:
            self.security_groups = list(primary._group_set)
            primary._group_set = []

    if not getattr(Instance.__init__, "_csis_patched", False):
        instance_init._csis_patched = True  # type: ignore[attr-defined]
        Instance.__init__ = instance_init  # type: ignore[method-assign]
        applied.append("ec2-instance-groups-from-eni")

    try:
        import inspect

        from moto.ec2.responses.instances import InstanceResponse
    except ImportError:  # pragma: no cover
        return applied
    parse = InstanceResponse.__dict__.get("_parse_block_device_mapping")
    validate = InstanceResponse.__dict__.get("_validate_block_device_mapping")
    try:
        refuses = isinstance(validate, staticmethod) and \
            'MissingParameterError("size or snapshotId")' in inspect.getsource(validate.__func__)
    except (OSError, TypeError):  # pragma: no cover - no source to check
        refuses = False
    if callable(parse) and refuses and not getattr(parse, "_csis_patched", False):

        def parse_block_device_mapping(self: Any) -> List[Dict[str, Any]]:
            # RunInstances with a block device mapping for a device the AMI maps (its root
            # device: what terraform-provider-aws sends for a root_block_device block that sets
            # no volume_size, e.g. one with tags only) and neither Ebs.VolumeSize nor
            # Ebs.SnapshotId: AWS launches that volume from the AMI's snapshot, at the AMI's
            # size. moto 5.2 refuses it ("MissingParameter: The request must contain the
            # parameter size or snapshotId"). Take the snapshot and the size from the AMI's
            # mapping of that device (8 GiB, moto's default root, when it states none), in the
            # request's own parameters, before moto reads them.
            mappings = self._get_param("BlockDeviceMappings", []) or []
            image_id = self._get_param("ImageId")
            images = self.ec2_backend.describe_images(filters={"image-id": image_id}) if image_id else []
            from_ami = {m.get("DeviceName"): m.get("Ebs") or {}
                        for image in images[:1] for m in image.block_device_mappings}
            for mapping in mappings:
                ebs = mapping.get("Ebs") if isinstance(mapping, dict) else None
                if not isinstance(ebs, dict) or "NoDevice" in mapping or \
                        ebs.get("VolumeSize") or ebs.get("SnapshotId") or mapping.get("DeviceName") not in from_ami:
                    continue
                ami_ebs = from_ami[mapping["DeviceName"]]
                if ami_ebs.get("SnapshotId"):
                    ebs["SnapshotId"] = ami_ebs["SnapshotId"]
                ebs["VolumeSize"] = ami_ebs.get("VolumeSize") or 8
            return parse(self)

        parse_block_device_mapping._csis_patched = True  # type: ignore[attr-defined]
        InstanceResponse._parse_block_device_mapping = parse_block_device_mapping  # type: ignore[method-assign]
        applied.append("ec2-root-device-size-from-ami")

    try:
        from moto.ec2.models.elastic_block_store import VolumeAttachment
    except ImportError:  # pragma: no cover
        return applied
    if "delete_on_termination" not in VolumeAttachment.__dict__:

        def delete_on_termination(self: Any) -> bool:
            # DescribeVolumes: AWS states each attachment's DeleteOnTermination (true for an
            # instance's root volume, false for a volume attached later, unless changed); moto
            # 5.2 leaves it out, though it keeps it in the instance's block device mapping. The
            # drift report's foreign scan tells an instance's own volume (its root volume, which
            # carries its tags) from a storage's by it.
            mapping = getattr(self.instance, "block_device_mapping", {}).get(self.device)
            return bool(getattr(mapping, "delete_on_termination", False))

        VolumeAttachment.delete_on_termination = property(delete_on_termination)  # type: ignore[attr-defined]
        applied.append("ec2-volume-attachment-delete-on-termination")
    return applied


def serve(port: int, parent_pid: Optional[int] = None) -> None:
    """Run a moto server in this process (what ``start`` launches, detached).

    With ``parent_pid`` the server exits as soon as that process is gone."""
    if parent_pid:
        import threading

        def watch() -> None:
            while pid_alive(parent_pid):
                time.sleep(1.0)
            os._exit(0)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    applied = apply_moto_patches()
    print("local-aws: moto patches applied: %s" % (", ".join(applied) or "none"), flush=True)
    try:
        from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import run_simple
    except ImportError:  # pragma: no cover - another moto layout: its own server, unlogged
        from moto.server import main as moto_main

        moto_main(["-H", "127.0.0.1", "-p", str(port)])
        return
    os.environ.setdefault("MOTO_PORT", str(port))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple("127.0.0.1", port, AttemptLog(app), threaded=True, request_handler=MotoRequestHandler)


class AttemptLog:
    """WSGI middleware for the AWS SDKs' retries.

    An AWS SDK sends every attempt of one API call with the same ``amz-sdk-invocation-id`` and
    counts them in ``amz-sdk-request: attempt=N``. When an answer is lost on its way back (the
    connection reset after the server carried the request out), the SDK retries the call, and
    moto would carry it out again: a second ``DetachVolume`` says "not attached", a second
    ``RevokeSecurityGroupEgress`` "rule not found", and the apply fails on a change that was
    made. AWS makes no such second change where it matters (idempotency tokens, and answers
    that do not get lost on a loopback). So a retry of an invocation this server already
    answered successfully gets that same answer again, without carrying the call out twice.

    Logged (``local-aws:`` lines in the server log, beside werkzeug's request lines, which say
    only "POST / 400"): every retry, and whether it was replayed; every error answer with the
    API action it answered."""

    #: the successful answers kept for a retry, newest last
    KEEP = 4096
    #: a larger answer (a long listing, not a change) is not kept
    LARGEST = 256 * 1024

    def __init__(self, app: Any) -> None:
        import collections
        import threading

        self.app = app
        self.answers: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
        self.lock = threading.Lock()
        self.say_lock = threading.Lock()

    def say(self, line: str) -> None:
        """One whole line in the server log: print() writes the text and its newline apart, so
        the request threads' lines ran into each other (and into werkzeug's request lines)."""
        with self.say_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    @staticmethod
    def _action(environ: Dict[str, Any]) -> str:
        import io
        from urllib.parse import parse_qs

        query = parse_qs(environ.get("QUERY_STRING") or "")
        if "Action" in query:
            return query["Action"][0]
        target = environ.get("HTTP_X_AMZ_TARGET")
        if target:
            return str(target)
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if environ.get("REQUEST_METHOD") == "POST" and 0 < length <= 1_000_000 and \
                "form-urlencoded" in (environ.get("CONTENT_TYPE") or ""):
            body = environ["wsgi.input"].read(length)
            environ["wsgi.input"] = io.BytesIO(body)
            form = parse_qs(body.decode("utf-8", "replace"))
            if "Action" in form:
                return form["Action"][0]
        return "%s %s" % (environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"))

    def __call__(self, environ: Dict[str, Any], start_response: Any) -> Any:
        attempt = (environ.get("HTTP_AMZ_SDK_REQUEST") or "").replace(" ", "")
        invocation = environ.get("HTTP_AMZ_SDK_INVOCATION_ID") or ""
        action = self._action(environ)
        peer = "%s:%s" % (environ.get("REMOTE_ADDR"), environ.get("REMOTE_PORT"))
        retry = bool(attempt) and not attempt.startswith("attempt=1;")
        if retry:
            with self.lock:
                kept = self.answers.get(invocation) if invocation else None
            self.say("local-aws: RETRY %s (%s, invocation %s, from %s): %s"
                     % (action, attempt, invocation or "-", peer,
                        "the first answer was %s; sent again, the call NOT carried out twice" % kept[0]
                        if kept else "no earlier successful answer: carried out"))
            if kept:
                start_response(kept[0], list(kept[1]))
                return [kept[2]]
        answered: Dict[str, Any] = {}

        def answer(status: str, headers: Any, exc_info: Any = None) -> Any:
            answered["status"], answered["headers"] = status, list(headers)
            if not status.startswith(("1", "2", "3")) and not (
                    status.startswith("404") and environ.get("REQUEST_METHOD") in ("GET", "HEAD")):
                self.say("local-aws: %s answered %s (%s, invocation %s, from %s)"
                         % (action, status, attempt or "no attempt header", invocation or "-", peer))
            return start_response(status, headers, exc_info) if exc_info is not None else start_response(status, headers)

        body = self.app(environ, answer)
        if not invocation or environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
            return body
        # every successful answer to a call with an invocation id (the query and JSON protocols
        # send reads as POST too, and a replayed read is as right as the first), for a retry of it
        try:
            data = b"".join(body)
        finally:
            if hasattr(body, "close"):
                body.close()
        if str(answered.get("status", "")).startswith("2") and len(data) <= self.LARGEST:
            with self.lock:
                self.answers[invocation] = (answered["status"], answered["headers"], data)
                while len(self.answers) > self.KEEP:
                    self.answers.popitem(last=False)
        return [data]


# -- command line ----------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="local-aws",
        description="Run a local AWS endpoint (moto) for the csis.infra demo and tests.")
    parser.add_argument("--state-dir", default=None,
                        help="bookkeeping directory (default: $CSIS_LOCAL_AWS_DIR or <repo>/.local/aws)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="start (or reuse) the server")
    p_start.add_argument("--port", type=int, default=None,
                         help="port on 127.0.0.1 (default: %d if free, else any free port)" % PREFERRED_PORT)
    p_up = sub.add_parser("up", help="start + seed")
    p_up.add_argument("--port", type=int, default=None)
    sub.add_parser("seed", help="create/find the seeded resources; write overlay.yml and env.sh")
    sub.add_parser("stop", help="stop the recorded server")
    sub.add_parser("status", help="print the running endpoint (exit 1 when none)")
    sub.add_parser("env", help="print env.sh (shell exports)")
    sub.add_parser("reset", help="wipe the server's resources and seed again")
    p_serve = sub.add_parser("serve", help=argparse.SUPPRESS)  # the server process itself
    p_serve.add_argument("--port", type=int, required=True)
    p_serve.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.port, args.parent_pid)
        return 0

    la = LocalAws(args.state_dir)
    try:
        if args.command in ("start", "up"):
            rec = la.start(port=args.port)
            print("local AWS endpoint: %s (pid %s)" % (rec["url"], rec["pid"]))
            if args.command == "up":
                seeded = la.seed()
                print("seeded vpc %s; overlay %s" % (seeded["vpc_id"], la.overlay_path))
        elif args.command == "seed":
            seeded = la.seed()
            print(json.dumps(seeded, indent=2, sort_keys=True))
            print("overlay: %s\nenv:     %s" % (la.overlay_path, la.env_path), file=sys.stderr)
        elif args.command == "reset":
            seeded = la.reset()
            print("reset and re-seeded %s (vpc %s)" % (seeded["url"], seeded["vpc_id"]))
        elif args.command == "stop":
            print("stopped" if la.stop() else "not running")
        elif args.command == "status":
            rec = la.status()
            if not rec:
                print("not running (state dir %s)" % la.state_dir)
                return 1
            print(json.dumps(rec))
        elif args.command == "env":
            if os.path.exists(la.env_path):
                with open(la.env_path, "r", encoding="utf-8") as fh:
                    sys.stdout.write(fh.read())
            else:
                sys.stdout.write(la.env_sh())
    except LocalAwsError as exc:
        print("local-aws: %s" % exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
