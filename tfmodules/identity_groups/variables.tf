variable "groups" {
  description = "POSIX groups published by the identity root: group name -> gid."
  type        = map(number)
  default     = {}

  validation {
    condition     = alltrue([for gid in values(var.groups) : gid > 0 && floor(gid) == gid])
    error_message = "Every gid must be a positive whole number."
  }

  validation {
    condition     = length(distinct(values(var.groups))) == length(var.groups)
    error_message = "Two groups share a gid."
  }

  validation {
    condition     = alltrue([for name in keys(var.groups) : can(regex("^[A-Za-z_][A-Za-z0-9_.-]*$", name))])
    error_message = "Group names must start with a letter or _ and hold only letters, digits, _, . or -."
  }
}
