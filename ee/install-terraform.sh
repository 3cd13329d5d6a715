#!/bin/sh
# Install terraform $1 for linux_$2 into /usr/local/bin, checked against HashiCorp's
# SHA256SUMS, then fill the provider mirror /usr/share/terraform/plugins (csis.infra's
# terraform.py uses it: init never reaches a registry on an execution node).
set -eu
version="$1"
arch="$2"
work="$(mktemp -d)"
cd "$work"
base="https://releases.hashicorp.com/terraform/${version}"
curl -fsSLo "terraform_${version}_linux_${arch}.zip" "${base}/terraform_${version}_linux_${arch}.zip"
curl -fsSLo SHA256SUMS "${base}/terraform_${version}_SHA256SUMS"
grep " terraform_${version}_linux_${arch}.zip\$" SHA256SUMS | sha256sum -c -
unzip -o "terraform_${version}_linux_${arch}.zip" terraform -d /usr/local/bin
chmod 0755 /usr/local/bin/terraform
mkdir -p /usr/share/terraform/plugins /tmp/csis-mirror
cp /build/ee/providers.tf /tmp/csis-mirror/providers.tf
cd /tmp/csis-mirror
terraform providers mirror -platform="linux_${arch}" /usr/share/terraform/plugins
cd /
rm -rf "$work" /tmp/csis-mirror
terraform version
