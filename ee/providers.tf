# The providers the execution environment's filesystem mirror holds
# (`terraform providers mirror`, run by execution-environment.yml). csis.infra's roots
# require hashicorp/aws ">= 5.0, < 6.0"; the mirror pins one release of that range.
terraform {
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "5.100.0"
    }
  }
}
