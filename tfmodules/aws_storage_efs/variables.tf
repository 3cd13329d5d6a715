variable "name" {
  description = "File system name: the Name tag (and the creation token unless creation_token is set)."
  type        = string

  validation {
    condition     = length(trimspace(var.name)) > 0 && length(var.name) <= 64
    error_message = "name must be 1 to 64 characters."
  }
}

variable "creation_token" {
  description = "The file system's creation token (idempotency key, unique per account and region). Empty: the name."
  type        = string
  default     = ""

  validation {
    condition     = length(var.creation_token) <= 64
    error_message = "creation_token must be at most 64 characters."
  }
}

variable "existing_file_system_id" {
  description = "Adopt this file system (fs-...) instead of creating one. Empty: create."
  type        = string
  default     = ""

  validation {
    condition     = var.existing_file_system_id == "" || can(regex("^fs-[0-9a-f]+$", var.existing_file_system_id))
    error_message = "existing_file_system_id must be empty or fs-...."
  }
}

variable "performance_mode" {
  description = "generalPurpose or maxIO."
  type        = string
  default     = "generalPurpose"

  validation {
    condition     = contains(["generalPurpose", "maxIO"], var.performance_mode)
    error_message = "performance_mode must be generalPurpose or maxIO."
  }
}

variable "encrypted" {
  description = "Encrypt the file system at rest."
  type        = bool
  default     = true
}

variable "transition_to_ia" {
  description = "Lifecycle transition to Infrequent Access, e.g. AFTER_30_DAYS. Empty: none."
  type        = string
  default     = ""

  validation {
    condition     = var.transition_to_ia == "" || can(regex("^AFTER_[0-9]+_DAYS?$", var.transition_to_ia))
    error_message = "transition_to_ia must be empty or AFTER_<N>_DAYS."
  }
}

variable "transition_to_archive" {
  description = "Lifecycle transition to Archive, e.g. AFTER_90_DAYS. Empty: none."
  type        = string
  default     = ""

  validation {
    condition     = var.transition_to_archive == "" || can(regex("^AFTER_[0-9]+_DAYS?$", var.transition_to_archive))
    error_message = "transition_to_archive must be empty or AFTER_<N>_DAYS."
  }
}

variable "access_points" {
  description = "One access point per group: group -> {gid, path, permissions}. The access point acts as uid 0 / the group's gid and creates path owned by 0:gid with the given mode."
  type = map(object({
    gid         = number
    path        = string
    permissions = string
  }))
  default = {}

  validation {
    condition = alltrue([
      for ap in values(var.access_points) :
      ap.gid > 0 && startswith(ap.path, "/") && can(regex("^[0-7]{3,4}$", ap.permissions))
    ])
    error_message = "Each access point needs gid > 0, an absolute path and octal permissions (e.g. \"2770\")."
  }
}

variable "public_read" {
  description = "Also create an access point rooted at \"/\" meant for read-only clients (enforce read-only with IAM / mount options)."
  type        = bool
  default     = false
}

variable "vpc_id" {
  description = "VPC of the mount targets. Mount targets and their security group are created only when vpc_id and mount_target_subnet_ids are both set."
  type        = string
  default     = ""
}

variable "mount_target_subnet_ids" {
  description = "One mount target per subnet (at most one subnet per availability zone)."
  type        = list(string)
  default     = []
}

variable "client_security_group_ids" {
  description = "Security groups of the clients admitted to NFS (tcp/2049) on the mount targets."
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Extra tags (merged after Name)."
  type        = map(string)
  default     = {}
}
