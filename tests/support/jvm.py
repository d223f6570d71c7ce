"""Faster JVM start-ups for the test session: a class archive of Spark's driver, made once per
``.venv`` (tests/conftest.py).

Most of the Spark lane's time is JVMs starting: each pipeline the tests run as a process (the
chaos tests start several, kill -9 between them) loads Spark's ten thousand classes and compiles
them again. Java's application class-data sharing keeps the loaded classes in an archive that a
later JVM maps instead (``-XX:SharedArchiveFile``), and the tests' JVMs, short-lived, compile
with C1 only (``-XX:TieredStopAtLevel=1``): together about half of a session's start-up and first
jobs on two cores. Neither changes what a JVM computes. ``SPARK_SUBMIT_OPTS`` carries them to every
driver ``spark-submit`` starts (the session, ``sluice pipeline run``, ``spark-pipelines``, a Spark
Connect server); a JVM whose class path differs from the archive's runs without it, silently.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

#: C1 only, and no unified-logging line about the archive (one not usable is used without, quietly).
_COMMON = "-XX:TieredStopAtLevel=1 -Xlog:cds=off -Xlog:cds+dynamic=off"


def _key() -> str:
    """What the archive depends on: the JVM and Spark's jars."""
    import pyspark

    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True).stderr
    return hashlib.sha256("\n".join([java, pyspark.__version__, *jars]).encode()).hexdigest()[:16]


def spark_submit_opts(cache: Path, *, make: bool = True) -> str:
    """The options for the tests' driver JVMs, making the archive under ``cache`` first if it is
    not there and ``make`` (about half a minute, once). Without Java, or if the archive cannot be
    made: C1 only."""
    try:
        archive = cache / f"spark-{_key()}.jsa"
    except (OSError, subprocess.CalledProcessError):
        return _COMMON
    if not archive.exists() and not make:
        return _COMMON
    if not archive.exists():
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError:
            return _COMMON
        scratch = archive.with_suffix(f".{os.getpid()}.tmp")
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{_COMMON} -XX:ArchiveClassesAtExit={scratch}"}
        done = subprocess.run(
            [sys.executable, "-c", "from tests.support.jvm import warm; warm()"],
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0 or not scratch.exists():
            scratch.unlink(missing_ok=True)
            return _COMMON
        scratch.replace(archive)
    return f"{_COMMON} -XX:SharedArchiveFile={archive}"


def warm() -> None:
    """What loads the classes the tests' drivers use: a session as the pipeline builds it, a
    shuffle, a Python UDF, Arrow batches to Python and a streaming query's micro-batches."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import functions as F

    from sluiceway.pipeline.session import build_session

    spark = build_session("local[2]")
    try:
        spark.range(10_000).groupBy((F.col("id") % 7).alias("k")).count().collect()
        plus = F.udf(lambda x: x + 1, "long")
        spark.range(100).select(plus("id")).collect()
        spark.range(100).mapInArrow(lambda batches: batches, "id long").collect()
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 100)
            .load()
            .writeStream.format("noop")
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        deadline = time.monotonic() + 60
        while (query.lastProgress or {}).get("batchId", -1) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        query.stop()
    finally:
        spark.stop()
