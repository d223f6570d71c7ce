"""Building the SparkSession the pipeline runs on (classic local/cluster or Spark Connect)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def build_session(
    master: str = "local[*]",
    *,
    app_name: str = "sluiceway",
    warehouse: str | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """Create (or get) a SparkSession for ``master``: ``local[*]``, ``spark://…`` or ``sc://…``.

    ``PYSPARK_PYTHON`` is pinned to this interpreter so Python workers find the same packages.
    ``conf``: extra Spark settings (a pipeline spec's ``spark:`` mapping).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # A local session listens on loopback only, and logs warnings rather than Spark's chatter.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        log4j = Path(__file__).with_name("log4j2-quiet.properties")
        os.environ.setdefault(
            "PYSPARK_SUBMIT_ARGS",
            f'--driver-java-options "-Dlog4j.configurationFile=file:{log4j}" pyspark-shell',
        )
    from pyspark.sql import SparkSession

    builder: Any = SparkSession.builder.appName(app_name)
    if master.startswith("sc://"):
        # The Connect client's own builder: it works even where a classic session already runs
        # in this process (the generic builder refuses to mix the two).
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        builder = ConnectSession.builder.appName(app_name).remote(master)
    else:
        builder = (
            builder.master(master)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.sql.session.timeZone", "UTC")
            # Parquet sinks written by Spark: timestamps as microseconds, not the legacy INT96.
            .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
            .config("spark.driver.memory", "2g")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.python.worker.reuse", "true")
        )
        if warehouse:
            builder = builder.config("spark.sql.warehouse.dir", warehouse)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if not master.startswith("sc://"):
        session.sparkContext.setLogLevel("ERROR")
    return session
