"""The RocksDB cache store (DESIGN.md, "Cache and read index").

`CacheStore` keeps two kinds of entries in one RocksDB (rocksdict), WAL off:
unflushed append data by (segment id, offset), pinned until the storage
writer has put it in Tier 2, and Tier-2 blocks by (chunk name, block index),
evicted least recently used first to stay within a byte budget. The read index
(`gateway/read/index.py`) is its only user. Key layout: `cache.keys`.
"""

from cache.store import CacheStatistics, CacheStore

__all__ = ["CacheStatistics", "CacheStore"]
