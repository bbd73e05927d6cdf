"""The request handlers, one module per area; importing them fills `HANDLERS`.

Each module registers its kinds where it defines them (`handles`, `streams`
in gateway/server/registry.py). A new area's module is added here.
"""

from . import admin, attributes, replicas, segments, streams, transactions

__all__ = ["admin", "attributes", "replicas", "segments", "streams", "transactions"]
