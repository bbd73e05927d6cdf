"""A local Spark session set up for reading the mount (tests, jobs, benchmarks)."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def local_session(app: str = "segment-gateway", cores: int = 2, **conf: str) -> SparkSession:
    """``local[cores]`` with the ``segments`` source registered, and ``segments-jvm``
    when its jar is built (`pipeline.jvm`; ``make install`` builds it).

    Python workers run this interpreter (not whatever ``python3`` is first
    on PATH), the UI is off, and shuffles use a few partitions: the data of
    one node is small for Spark, and 200 empty shuffle tasks cost seconds.
    """
    from pipeline.jvm import jar_path
    from pipeline.source import SegmentsDataSource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(max(2, cores * 2)))
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.python.filterPushdown.enabled", "true")
    )
    jar = jar_path()
    if jar is not None and "spark.jars" not in conf:
        builder = builder.config("spark.jars", str(jar))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(SegmentsDataSource)
    return spark
