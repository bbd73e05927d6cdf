"""Spark's own text, JSON and CSV readers over ``lines`` segments, truncation included.

``spark.read.json("file:///mnt/scope/stream/*")`` works on mounted segments
as on local files (Spark sees each segment's length at listing time, and
splits large ones at its usual split size). One thing differs: the bytes
below a truncated segment's start offset read as zeros, like a punched hole,
and Spark's readers see them as part of the first line: ``spark.read.text``
gives a first row that starts with NUL characters, ``spark.read.json`` a
``_corrupt_record`` row (PERMISSIVE mode) or drops it (DROPMALFORMED), and
``spark.read.csv`` a first row whose first field starts with NULs.

`read_lines` is the fix: it reads the text, strips the leading NULs of a
line (there are NULs only before the first byte that survived), drops what
is left empty, and hands the lines to the JSON or CSV reader. If the
truncation offset was an event boundary, every surviving event is intact;
if it cut an event, its tail becomes one malformed record (shown or dropped
by the reader's ``mode``), as in any file that starts mid-record.

The mount's ``.trimmed`` view needs none of this (no zeros), and Spark's own
readers take it as it is: a ``lines`` segment's trimmed file starts at a
whole line (the cut line's tail is left out), a ``raw`` segment's at the
start offset itself (a cut line's tail is the same one malformed record as
here; docs/FORMATS.md, "The trimmed view"). `read_lines` over ``.trimmed``
paths reads the same rows as over the plain ones, but for that tail of a
``lines`` segment.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

FORMATS = ("text", "json", "csv")


def read_lines(
    spark: SparkSession,
    paths: str | list[str],
    fmt: str = "json",
    recursive: bool = False,
    **options: Any,
) -> DataFrame:
    """Read ``lines`` segments as ``fmt`` (text, json or csv), ignoring truncated zeros.

    ``recursive`` reads the segments in subdirectories too; ``options`` go
    to the JSON or CSV reader (``mode``, ``header``, a ``schema`` string...).
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, not {fmt!r}")
    text = spark.read.option("recursiveFileLookup", str(recursive).lower()).text(paths)
    lines = text.select(F.regexp_replace("value", "^\\u0000+", "").alias("value")).where(
        F.col("value") != ""
    )
    if fmt == "text":
        return lines
    strings = lines.rdd.map(lambda row: row[0])
    reader = spark.read.options(**options)
    return reader.json(strings) if fmt == "json" else reader.csv(strings)
