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
      - Credentials are never part of it; they come from the environment (or the named profile).
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
        description: How the runtime reaches its machines (for example C(ssm)).
        type: str
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
