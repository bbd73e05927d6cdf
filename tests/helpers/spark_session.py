"""The suite's one local Spark session, shared by every module that reads through it.

A SparkContext costs seconds to start, and only one may run in a process:
the modules that need ``local[2]`` (tests/conftest.py's ``spark`` fixture)
share one, started on first use. A standalone cluster's session
(tests/helpers/spark_cluster.py) stops it first, and the next module that
needs it starts it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_local: SparkSession | None = None


def local_spark() -> SparkSession:
    """The shared ``local[2]`` session (pipeline.session.local_session), started if need be."""
    global _local
    if _local is None:
        from pipeline.session import local_session

        _local = local_session("segment-gateway tests")
    return _local


def stop_local_spark() -> None:
    """Stop the shared local session if one runs (a cluster session is next, or the end)."""
    global _local
    if _local is not None:
        session, _local = _local, None
        session.stop()
