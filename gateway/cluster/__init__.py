"""Several nodes on one Tier 2: the registry, other nodes' segments, and this node's view."""
