output "file_system_id" {
  description = "The file system id (created or adopted)."
  value       = local.file_system_id
}

output "access_point_ids" {
  description = "Access point id per group."
  value       = { for group, ap in aws_efs_access_point.group : group => ap.id }
}

output "public_read_access_point_id" {
  description = "Id of the \"/\" access point, or null when public_read is false."
  value       = var.public_read ? aws_efs_access_point.public_read[0].id : null
}

output "security_group_id" {
  description = "Security group of the mount targets, or null when none are created."
  value       = local.mount_targets ? aws_security_group.mount_targets[0].id : null
}

output "mount_target_ids" {
  description = "Mount target id per subnet id."
  value       = { for subnet, mt in aws_efs_mount_target.this : subnet => mt.id }
}
