output "group_gids" {
  description = "Group name -> gid (known at plan time, so consumers' plans see new groups at once)."
  value       = var.groups
}
