"""Tier 1 replicated to other nodes (BookKeeper-style): the replicas this node holds, the
replicator of its own journal, the ensemble record, and recovery from replicas."""
