# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

# matches AWS_ACCESS_ARGS in plugins/module_utils/csis/module.py
AWS_OPTION = r"""
  aws:
    description:
      - How boto3 reaches the runtime - the C(aws) entry of a root returned by
        M(csis.infra.csis_render) (C(roots[].aws)), which the runtime's configuration fills in.
      - Credentials are never part of it. A runtime with static keys gives them in O(secrets); else they come from the
        environment (or the named profile).
    type: dict
    default: {}
    suboptions:
      region:
        description: The AWS region.
        type: str
      profile:
        description: The AWS profile of the shared configuration files.
        type: str
      endpoints:
        description:
          - Endpoint URL per service (C(ec2), C(s3), C(ssm), C(sts), ...), for a local endpoint,
            LocalStack, VPC or FIPS endpoints. Services not listed use the default endpoint.
        type: dict
      s3_use_path_style:
        description: Address S3 buckets by path instead of by virtual host.
        type: bool
      session_mechanism:
        description: How the runtime reaches its machines (C(ssm), C(ssh) or C(none)).
        type: str
      ssh:
        description:
          - The runtime's C(ssh) settings (C(cfg/runtime-builders.yml)), present with O(aws.session_mechanism=ssh).
          - The key file is named, never read into logs or receipts; relative paths are relative to the configuration root.
        type: dict
        suboptions:
          user:
            description: The login user (C(sudo -n) runs the command unless it is C(root)).
            type: str
            required: true
          private_key_file:
            description: The private key file (C(ssh -i), with C(IdentitiesOnly=yes)).
            type: str
            required: true
          port:
            description: The SSH port.
            type: int
            default: 22
          address:
            description: Which address recorded in C(meta-state/instance-state.yaml) to connect to.
            type: str
            choices: [private_ip, public_ip]
            default: private_ip
          known_hosts_file:
            description: The known_hosts file holding the machines' host keys (default OpenSSH's own).
            type: str
          host_key_checking:
            description:
              - C(strict) (C(StrictHostKeyChecking=yes)) refuses a host whose key is not known.
              - C(accept-new) records the key of a host seen for the first time; a changed key is still refused.
            type: str
            choices: [strict, accept-new]
            default: strict
          connect_timeout:
            description: Seconds to wait for the connection (C(ConnectTimeout)).
            type: int
            default: 10
          config_file:
            description: An OpenSSH client configuration to read (C(ssh -F)); default none is read.
            type: str
  secrets:
    description:
      - The root's secret values (M(csis.infra.csis_render)'s C(roots[].secrets)), ciphertext as rendered.
      - The runtime's static keys among them (C(TF_VAR_csis_aws_access_key), C(TF_VAR_csis_aws_secret_key),
        C(TF_VAR_csis_aws_token)) are decrypted on the controller with the run's vault secrets, for this module's
        boto3 calls only. A runtime with static keys is never reached with the environment's credentials.
    type: dict
    default: {}
"""

BOTO3_REQUIREMENT = r"""
requirements:
  - boto3 >= 1.34 (the AWS calls)
"""


class ModuleDocFragment:
    """The modules that call AWS themselves (boto3).

    ``csis.infra.aws``: the option saying how to reach a runtime (``AWS_ACCESS_ARGS`` in
    ``plugins/module_utils/csis/module.py``) and the boto3 requirement;
    ``csis.infra.aws.boto3``: the boto3 requirement alone, for the modules that reach AWS
    through the tree's runtimes or the rendered root.
    """

    def __init__(self):
        # put together from the texts above (the yamllint sanity test reads literal class
        # attributes only, and Ansible's fragment loader reads an instance)
        self.DOCUMENTATION = "options:" + AWS_OPTION + BOTO3_REQUIREMENT
        self.BOTO3 = "options: {}" + BOTO3_REQUIREMENT
