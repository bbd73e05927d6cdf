"""The byte types that data moves through the gateway in.

A leaf module: the journal, the cache, Tier 2, the server and the mount all
take and hand on appended bytes without copying them, so they agree here on
what "bytes" means rather than each borrowing the journal's definition.
"""

#: Appended bytes as they travel: received into a bytearray, sliced as
#: memoryviews, stored as bytes. Every consumer accepts all three.
Buffer = bytes | bytearray | memoryview

__all__ = ["Buffer"]
