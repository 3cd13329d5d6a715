# No cloud resources: the identity root exists to publish the group -> gid map in its
# state, so other roots read gids only through terraform_remote_state. The
# terraform_data resource records the map in state (and shows changes in plans).
resource "terraform_data" "groups" {
  input = var.groups
}
