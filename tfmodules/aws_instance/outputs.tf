output "instance_id" {
  description = "The instance id."
  value       = aws_instance.this.id
}

output "private_ip" {
  description = "Private IPv4 address."
  value       = aws_instance.this.private_ip
}

output "ami_id" {
  description = "The AMI the instance was launched from (ami is ignored after creation, so this is the launch AMI)."
  value       = aws_instance.this.ami
}

output "availability_zone" {
  description = "Availability zone of the instance."
  value       = aws_instance.this.availability_zone
}

output "desired_ami_id" {
  description = "The AMI the module would launch now (ami_id, or the newest match of ami_name_pattern). Differs from ami_id when a newer image exists; replace explicitly to move to it."
  value       = local.ami_id
}
