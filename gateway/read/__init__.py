"""The read side: the read index, reading chunks back from Tier 2, read-ahead."""
