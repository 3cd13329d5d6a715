variable "bucket_name" {
  description = "Bucket name (also the Name tag)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be 3-63 characters of a-z, 0-9, '.' and '-', starting and ending with a letter or digit."
  }
}

variable "force_destroy" {
  description = "Allow terraform to delete the bucket while it still holds objects."
  type        = bool
  default     = false
}

variable "group_prefixes" {
  description = "Groups that get a \"<group>/\" prefix (an empty marker object)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for g in var.group_prefixes : can(regex("^[A-Za-z0-9._-]+$", g))])
    error_message = "group_prefixes entries must be plain names (letters, digits, '.', '_', '-')."
  }
}

variable "public_read" {
  description = "Attach a bucket policy letting every principal of this account read (s3:GetObject, s3:ListBucket)."
  type        = bool
  default     = false
}

variable "lifecycle_rules" {
  description = "Lifecycle rules: transition after transition_days (0: none) to storage_class, expire after expire_days (0: never)."
  type = list(object({
    id              = string
    prefix          = string
    transition_days = number
    storage_class   = string
    expire_days     = number
  }))
  default = []

  validation {
    condition = alltrue([
      for r in var.lifecycle_rules :
      r.id != "" && r.transition_days >= 0 && r.expire_days >= 0 &&
      (r.transition_days == 0 || contains(["STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER", "GLACIER_IR", "DEEP_ARCHIVE"], r.storage_class))
    ])
    error_message = "Each lifecycle rule needs an id, non-negative days, and a valid storage_class when transition_days > 0."
  }

  validation {
    condition     = length(distinct([for r in var.lifecycle_rules : r.id])) == length(var.lifecycle_rules)
    error_message = "lifecycle rule ids must be unique."
  }
}

variable "tags" {
  description = "Extra tags (merged after Name)."
  type        = map(string)
  default     = {}
}
