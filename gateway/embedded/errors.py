"""The embedded server's errors (both are `Tier2Error`: Tier-2 calls may raise them)."""

from __future__ import annotations

from gateway.errors import Tier2Error

__all__ = ["EmbeddedS3Down", "EmbeddedS3Error"]


class EmbeddedS3Error(Tier2Error):
    """embedded S3 server (SeaweedFS) failed: {}"""


class EmbeddedS3Down(EmbeddedS3Error):
    """embedded S3 server is down ({})"""
