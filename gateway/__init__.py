"""Segment Gateway: append-only segments, durable in a local journal, tiered to S3."""

__version__ = "0.1.0"
