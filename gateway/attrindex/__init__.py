"""The attribute index: an append-only B+tree with progressive compaction (seed 003)."""
