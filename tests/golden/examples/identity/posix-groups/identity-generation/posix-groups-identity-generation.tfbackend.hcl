# Partial backend configuration of workspace posix_groups (local backend 'local-state').
# Used as: init -reconfigure -backend-config=posix-groups-identity-generation.tfbackend.hcl
path = "../../../../state/posix_groups.tfstate"
