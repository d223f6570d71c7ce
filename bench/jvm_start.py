"""JVM start-up benchmark: a pipeline-shaped Spark session with the JVM's defaults, against C1-only
compilation, a class archive of Spark (application class-data sharing), and both.

Each run is a fresh process: ``build_session("local[2]")`` as the pipeline builds it, then a
shuffle and a Python UDF (``tests/support/jvm.py``'s ``warm`` without the streaming query, which
would only add its fixed trigger waits). The options reach the driver JVM through
``SPARK_SUBMIT_OPTS``, as ``tests/conftest.py`` gives them to every JVM the tests start. The
archive is made first, in a temporary directory, by a run of the same work. Rounds alternate the
option sets; whole-process wall time, the median of the rounds.

    .venv/bin/python bench/jvm_start.py [--rounds 3]

Prints a table, then one JSON line: {"bench": "jvm_start", "default_s": …, "both_s": …, …}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORK = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import functions as F
from sluiceway.pipeline.session import build_session
spark = build_session("local[2]")
spark.range(10_000).groupBy((F.col("id") % 7).alias("k")).count().collect()
spark.range(100).select(F.udf(lambda x: x + 1, "long")("id")).collect()
spark.stop()
"""
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def run(options: str) -> float:
    env = {**os.environ, "SPARK_SUBMIT_OPTS": options}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WORK], env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the run with {options!r} failed: {done.stderr.decode()[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-jvm-") as work:
        archive = Path(work) / "spark.jsa"
        made = run(f"{QUIET} -XX:ArchiveClassesAtExit={archive}")
        if not archive.exists():
            raise SystemExit("the JVM made no class archive")
        sets = {
            "default": "",
            "c1": "-XX:TieredStopAtLevel=1",
            "archive": f"{QUIET} -XX:SharedArchiveFile={archive}",
            "both": f"{QUIET} -XX:SharedArchiveFile={archive} -XX:TieredStopAtLevel=1",
        }
        times: dict[str, list[float]] = {name: [] for name in sets}
        for r in range(args.rounds):
            order = list(sets) if r % 2 == 0 else list(reversed(sets))
            for name in order:
                times[name].append(run(sets[name]))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"archive made in {made:.1f} s (a run of the work with -XX:ArchiveClassesAtExit)")
    print(f"{'options':<10} {'median':>8}  runs")
    for name, values in times.items():
        print(f"{name:<10} {medians[name]:>7.1f}s  {', '.join(f'{v:.1f}' for v in values)}")
    out = {"bench": "jvm_start", "rounds": args.rounds, "archive_made_s": round(made, 1)}
    out |= {f"{name}_s": round(value, 2) for name, value in medians.items()}
    out["both_vs_default"] = round(medians["both"] / medians["default"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
