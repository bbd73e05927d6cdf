"""The FUSE filesystem: segments as read-only files (DESIGN.md, "FUSE"). Not built yet."""
