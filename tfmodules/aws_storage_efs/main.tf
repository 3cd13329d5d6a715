locals {
  adopt          = var.existing_file_system_id != ""
  file_system_id = local.adopt ? data.aws_efs_file_system.existing[0].id : aws_efs_file_system.this[0].id
  mount_targets  = var.vpc_id != "" && length(var.mount_target_subnet_ids) > 0
  tags           = merge({ Name = var.name }, var.tags)
}

data "aws_efs_file_system" "existing" {
  count          = local.adopt ? 1 : 0
  file_system_id = var.existing_file_system_id
}

resource "aws_efs_file_system" "this" {
  count = local.adopt ? 0 : 1

  creation_token   = var.creation_token != "" ? var.creation_token : var.name
  performance_mode = var.performance_mode
  encrypted        = var.encrypted
  # AWS archives only the files of a file system in the Elastic throughput mode (and the
  # General Purpose performance mode): elastic with an archive transition; without one, the
  # provider's default (bursting), so a file system without archive keeps its mode
  throughput_mode = var.transition_to_archive == "" ? null : "elastic"

  dynamic "lifecycle_policy" {
    for_each = var.transition_to_ia == "" ? [] : [var.transition_to_ia]
    content {
      transition_to_ia = lifecycle_policy.value
    }
  }

  dynamic "lifecycle_policy" {
    for_each = var.transition_to_archive == "" ? [] : [var.transition_to_archive]
    content {
      transition_to_archive = lifecycle_policy.value
    }
  }

  tags = local.tags

  lifecycle {
    precondition {
      condition     = var.transition_to_archive == "" || var.performance_mode == "generalPurpose"
      error_message = "transition_to_archive needs performance_mode generalPurpose: EFS archives only file systems in the General Purpose performance mode (and the Elastic throughput mode)."
    }
  }
}

resource "aws_efs_access_point" "group" {
  for_each = var.access_points

  file_system_id = local.file_system_id

  posix_user {
    uid = 0
    gid = each.value.gid
  }

  root_directory {
    path = each.value.path
    creation_info {
      owner_uid   = 0
      owner_gid   = each.value.gid
      permissions = each.value.permissions
    }
  }

  tags = merge({ Name = "${var.name}-${each.key}" }, var.tags, { "csis:group" = each.key })
}

resource "aws_efs_access_point" "public_read" {
  count = var.public_read ? 1 : 0

  file_system_id = local.file_system_id

  root_directory {
    path = "/"
  }

  tags = merge({ Name = "${var.name}-public-read" }, var.tags, { "csis:access" = "public-read" })
}

resource "aws_security_group" "mount_targets" {
  count = local.mount_targets ? 1 : 0

  name_prefix = "csis-efs-${var.name}-"
  description = "NFS to the mount targets of EFS ${var.name}"
  vpc_id      = var.vpc_id

  tags = merge({ Name = "csis-efs-${var.name}" }, var.tags)

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group_rule" "mount_target_nfs" {
  for_each = local.mount_targets ? toset(var.client_security_group_ids) : toset([])

  type                     = "ingress"
  description              = "NFS from ${each.value}"
  security_group_id        = aws_security_group.mount_targets[0].id
  protocol                 = "tcp"
  from_port                = 2049
  to_port                  = 2049
  source_security_group_id = each.value
}

resource "aws_efs_mount_target" "this" {
  for_each = local.mount_targets ? toset(var.mount_target_subnet_ids) : toset([])

  file_system_id  = local.file_system_id
  subnet_id       = each.value
  security_groups = [aws_security_group.mount_targets[0].id]
}
