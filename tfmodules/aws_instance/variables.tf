variable "name" {
  description = "Instance name (the Name tag)."
  type        = string

  validation {
    condition     = length(trimspace(var.name)) > 0
    error_message = "name must not be empty."
  }
}

variable "ami_id" {
  description = "AMI id to launch. Empty: look up the most recent self-owned AMI whose name matches ami_name_pattern."
  type        = string
  default     = ""

  validation {
    condition     = var.ami_id == "" || can(regex("^ami-[0-9a-f]+$", var.ami_id))
    error_message = "ami_id must be empty or an AMI id (ami-...)."
  }
}

variable "ami_name_pattern" {
  description = "AMI name filter (wildcards allowed) used when ami_id is empty."
  type        = string
  default     = ""
}

variable "instance_type" {
  description = "EC2 instance type."
  type        = string
  default     = "t3.micro"
}

variable "subnet_id" {
  description = "Subnet to launch into. Empty: provider default (null)."
  type        = string
  default     = ""
}

variable "associate_public_ip_address" {
  description = "Associate a public IPv4 address."
  type        = bool
  default     = false
}

variable "vpc_security_group_ids" {
  description = "Security groups of the instance. Empty: the subnet's VPC default group (null)."
  type        = list(string)
  default     = []
}

variable "iam_instance_profile" {
  description = "IAM instance profile name. Empty: none."
  type        = string
  default     = ""
}

variable "user_data" {
  description = "User data (plain text; the provider base64-encodes it). Empty: none. Changes are ignored after creation (see README)."
  type        = string
  default     = ""
}

variable "ebs_volumes" {
  description = "EBS volumes to attach: key -> {volume_id, device_name}."
  type = map(object({
    volume_id   = string
    device_name = string
  }))
  default = {}

  validation {
    condition     = alltrue([for v in values(var.ebs_volumes) : can(regex("^vol-[0-9a-f]+$", v.volume_id)) && can(regex("^/dev/", v.device_name))])
    error_message = "Each ebs_volumes entry needs volume_id vol-... and a device_name under /dev/."
  }
}

variable "metadata_http_tokens" {
  description = "IMDS token mode: \"required\" (IMDSv2 only) or \"optional\"."
  type        = string
  default     = "required"

  validation {
    condition     = contains(["required", "optional"], var.metadata_http_tokens)
    error_message = "metadata_http_tokens must be \"required\" or \"optional\"."
  }
}

variable "tags" {
  description = "Extra tags for every taggable resource (merged after Name)."
  type        = map(string)
  default     = {}
}
