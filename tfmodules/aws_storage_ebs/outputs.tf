output "volume_id" {
  description = "The volume id."
  value       = aws_ebs_volume.this.id
}

output "volume_arn" {
  description = "The volume ARN."
  value       = aws_ebs_volume.this.arn
}

output "availability_zone" {
  description = "The zone the volume lives in (instances attaching it must be in the same zone)."
  value       = aws_ebs_volume.this.availability_zone
}
