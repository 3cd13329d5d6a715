output "bucket" {
  description = "Bucket name."
  value       = aws_s3_bucket.this.id
}

output "bucket_arn" {
  description = "Bucket ARN."
  value       = aws_s3_bucket.this.arn
}

output "group_prefixes" {
  description = "Group -> prefix (\"<group>/\")."
  value       = { for g, o in aws_s3_object.group_prefix : g => o.key }
}
