variable "name" {
  description = "Volume name (the Name tag)."
  type        = string

  validation {
    condition     = length(trimspace(var.name)) > 0
    error_message = "name must not be empty."
  }
}

variable "size" {
  description = "Size in GiB."
  type        = number
  default     = 100

  validation {
    condition     = var.size >= 1 && floor(var.size) == var.size
    error_message = "size must be a whole number of GiB, at least 1."
  }
}

variable "volume_type" {
  description = "EBS volume type."
  type        = string
  default     = "gp3"

  validation {
    condition     = contains(["gp2", "gp3", "io1", "io2", "st1", "sc1", "standard"], var.volume_type)
    error_message = "volume_type must be one of gp2, gp3, io1, io2, st1, sc1, standard."
  }
}

variable "encrypted" {
  description = "Encrypt the volume (default KMS key). false asks for no encryption; an account with EBS encryption by default still encrypts it."
  type        = bool
  default     = true
}

variable "availability_zone" {
  description = "Availability zone. Empty: the zone of subnet_id."
  type        = string
  default     = ""
}

variable "subnet_id" {
  description = "Subnet whose zone the volume is created in (used only when availability_zone is empty)."
  type        = string
  default     = ""
}

variable "snapshot_name" {
  description = "Restore from the most recent self-owned snapshot with this Name tag. Empty: a blank volume."
  type        = string
  default     = ""
}

variable "snapshot_tags" {
  description = "Further tags the restore snapshot must carry (csis.infra passes csis_storage and csis_config)."
  type        = map(string)
  default     = {}
}

variable "tags" {
  description = "Extra tags (merged after Name)."
  type        = map(string)
  default     = {}
}
