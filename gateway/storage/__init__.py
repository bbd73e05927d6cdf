"""Tier-2 bindings: the chunk storage protocol, S3, filesystem, memory, retries, the chunk layer."""
