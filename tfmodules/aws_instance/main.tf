data "aws_ami" "this" {
  count       = var.ami_id == "" ? 1 : 0
  most_recent = true
  owners      = ["self"]

  filter {
    name   = "name"
    values = [var.ami_name_pattern]
  }

  # the newest image that can launch: not one still being made (pending) or a failed one
  filter {
    name   = "state"
    values = ["available"]
  }

  lifecycle {
    precondition {
      condition     = var.ami_name_pattern != ""
      error_message = "Either ami_id or ami_name_pattern must be set."
    }
  }
}

locals {
  ami_id = var.ami_id != "" ? var.ami_id : data.aws_ami.this[0].id
  tags   = merge({ Name = var.name }, var.tags)
}

resource "aws_instance" "this" {
  ami                         = local.ami_id
  instance_type               = var.instance_type
  subnet_id                   = var.subnet_id == "" ? null : var.subnet_id
  associate_public_ip_address = var.associate_public_ip_address
  vpc_security_group_ids      = length(var.vpc_security_group_ids) == 0 ? null : var.vpc_security_group_ids
  iam_instance_profile        = var.iam_instance_profile == "" ? null : var.iam_instance_profile
  user_data                   = var.user_data == "" ? null : var.user_data

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = var.metadata_http_tokens
  }

  # The root volume carries the instance's tags (otherwise only the provider's default_tags).
  # Tags only, so an instance launched without this block updates in place (the tags of its
  # root volume): encrypted or kms_key_id here would replace every such instance, volume_size
  # or volume_type would modify its root volume; volume_tags (every volume of the instance,
  # the attached aws_ebs_volume ones too) would fight those volumes' own tags.
  root_block_device {
    tags = local.tags
  }

  tags = local.tags

  lifecycle {
    # A new AMI or new user data never replaces a running machine implicitly:
    # replacement is requested explicitly (terraform -replace) by the caller.
    ignore_changes = [ami, user_data]
  }
}

resource "aws_volume_attachment" "this" {
  for_each = var.ebs_volumes

  device_name = each.value.device_name
  volume_id   = each.value.volume_id
  instance_id = aws_instance.this.id
}
