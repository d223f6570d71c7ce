"""Our sources and writers named from a user's own Spark Declarative Pipelines project.

The Declarative Pipelines example in docs/pipeline.md is run as written — only its journal
path, broker address and topic are pointed at this test's — by ``spark-pipelines run``, twice:
the second run, after more records were appended, delivers just the new ones (the flow's
offsets live in the pipeline's storage) and every key's records reach the topic in order.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sluiceway.journal import Journal
from sluiceway.testing import Broker
from tests.support.order import check_per_key_order, read_topic

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[3]
KEYS = 6


def docs_example() -> str:
    """The Python block under "In a Spark Declarative Pipelines file" in docs/pipeline.md."""
    page = (ROOT / "docs" / "pipeline.md").read_text(encoding="utf-8")
    section = page.split("### In a Spark Declarative Pipelines file", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the Declarative Pipelines example is missing from docs/pipeline.md"
    return match.group(1)


def append(journal: Path, start: int, count: int, seq: dict[str, int]) -> None:
    """Records ``start..start+count``: odd ones are orders (with a per-key sequence), even ones not."""
    with Journal.open(journal, fsync=False) as j, j.append() as tx:
        for i in range(start, start + count):
            key = f"k{i % KEYS}"
            if i % 2:
                seq[key] = seq.get(key, 0) + 1
                tx.write(key, json.dumps({"seq": seq[key]}).encode(), namespace="orders.created")
            else:
                tx.write(key, b"{}", namespace="payments.settled")


def run_pipeline(project: Path) -> None:
    import pyspark

    home = Path(pyspark.__file__).parent
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "SPARK_CONF_DIR": str(project / "conf"),
    }
    run = subprocess.run(
        [str(home / "bin" / "spark-pipelines"), "run"],
        cwd=project,
        env=env,
        capture_output=True,
        timeout=300,
        start_new_session=True,
    )
    output = (run.stdout + run.stderr).decode(errors="replace")
    assert run.returncode == 0, output[-4000:]
    assert "Run is COMPLETED" in output, output[-4000:]


def test_docs_example_runs_under_spark_pipelines(kafka: Broker, topic: str, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    seq: dict[str, int] = {}
    append(journal, 0, 600, seq)

    project = tmp_path / "project"
    (project / "transformations").mkdir(parents=True)
    # A persistent catalog (Hive, with its Derby metastore in the project): with Spark's default
    # in-memory catalog a second run finds the table's files but not the table, and stops.
    (project / "conf").mkdir()
    (project / "conf" / "spark-defaults.conf").write_text(
        "spark.sql.catalogImplementation hive\n"
        f"spark.sql.warehouse.dir {project / 'warehouse'}\n"
        "spark.hadoop.javax.jdo.option.ConnectionURL "
        f"jdbc:derby:;databaseName={project / 'metastore'};create=true\n"
    )
    (project / "spark-pipeline.yml").write_text(
        f"name: orders\nstorage: file://{project}/storage\n"
        "libraries:\n  - glob:\n      include: transformations/**\n"
    )
    code = docs_example()
    for placeholder in ("/data/journal", "localhost:9092", "orders-out"):
        assert placeholder in code, placeholder
    code = (
        code.replace("/data/journal", str(journal))
        .replace("localhost:9092", kafka.bootstrap)
        .replace("orders-out", topic)
    )
    (project / "transformations" / "orders.py").write_text(code)

    run_pipeline(project)
    first = read_topic(kafka.bootstrap, topic, expected=300, timeout=30)
    assert len(first) == 300

    append(journal, 600, 200, seq)
    run_pipeline(project)
    messages = read_topic(kafka.bootstrap, topic, expected=400, timeout=30)
    # Incremental: the second run sent only what was new; every key complete and in order.
    assert len(messages) == 400
    check_per_key_order([(key, s) for key, s, _ in messages], seq)
