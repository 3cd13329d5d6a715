# Partial backend configuration of workspace aws_ebs (s3 backend 's3-east2').
# Used as: init -reconfigure -backend-config=aws-ebs-storage-generation.tfbackend.hcl
bucket       = "csis-state-local"
key          = "statefiles/csis-example/aws_ebs.tfstate"
region       = "us-east-2"
encrypt      = true
use_lockfile = true
endpoints = {
  s3 = "http://127.0.0.1:5055"
}
use_path_style              = true
skip_credentials_validation = true
skip_requesting_account_id  = true
skip_metadata_api_check     = true
skip_region_validation      = true
