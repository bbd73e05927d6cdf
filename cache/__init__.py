"""The RocksDB cache store (DESIGN.md, "Cache and read index"). Not built yet."""
