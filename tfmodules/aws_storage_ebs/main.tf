data "aws_subnet" "this" {
  count = var.availability_zone == "" && var.subnet_id != "" ? 1 : 0
  id    = var.subnet_id
}

data "aws_ebs_snapshot" "archive" {
  count       = var.snapshot_name == "" ? 0 : 1
  most_recent = true
  owners      = ["self"]

  filter {
    name   = "tag:Name"
    values = [var.snapshot_name]
  }

  # a snapshot still being taken (pending) or one that failed (error) seeds no volume
  filter {
    name   = "status"
    values = ["completed"]
  }

  # the archive's owner tags, so another tree's snapshot of the same name never matches
  dynamic "filter" {
    for_each = var.snapshot_tags
    content {
      name   = "tag:${filter.key}"
      values = [filter.value]
    }
  }
}

locals {
  availability_zone = var.availability_zone != "" ? var.availability_zone : (
    var.subnet_id != "" ? data.aws_subnet.this[0].availability_zone : ""
  )
}

resource "aws_ebs_volume" "this" {
  availability_zone = local.availability_zone
  size              = var.size
  type              = var.volume_type
  # false asks for nothing (null): in an account with EBS encryption by default, AWS encrypts the
  # volume anyway, and an explicit false would then plan its replacement on every run
  encrypted   = var.encrypted ? true : null
  snapshot_id = var.snapshot_name == "" ? null : data.aws_ebs_snapshot.archive[0].id

  tags = merge({ Name = var.name }, var.tags)

  lifecycle {
    # The snapshot only seeds a new volume; a newer snapshot must not replace it.
    ignore_changes = [snapshot_id]

    precondition {
      condition     = local.availability_zone != ""
      error_message = "Set availability_zone or subnet_id."
    }
  }
}
