"""The embedded Tier-2 server (SeaweedFS as a supervised child process)."""
