"""The pipeline through Spark Connect (`--master sc://…`): a local Connect server runs the Python
data sources and each sink's foreachBatch; the client only plans."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluiceway.testing import free_port, wait_until
from tests.support.journal import make_journal

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

pytest.importorskip("grpc", reason="Spark Connect needs the [connect] extra (grpcio)")


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import pyspark

    home = Path(pyspark.__file__).parent
    port = free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(home / "bin" / "spark-submit"),
                "--class",
                "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--master",
                "local[2]",
                "--conf",
                f"spark.connect.grpc.binding.port={port}",
                "--conf",
                "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                f"spark.pyspark.python={sys.executable}",
                "spark-internal",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        wait_until(lambda: _listening(port) or proc.poll() is not None, timeout=120, message="Spark Connect")
        if proc.poll() is not None:
            pytest.fail(f"the Spark Connect server exited:\n{log.read_text()[-3000:]}")
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_journal_pipeline_runs_over_spark_connect(connect_server: str, tmp_path: Path) -> None:
    from sluiceway.pipeline import Pipeline, PipelineSpec
    from sluiceway.pipeline.session import build_session

    source = tmp_path / "source"
    make_journal(
        source,
        [
            ("orders.created" if i % 2 else "orders.paid", f"k{i % 5}", json.dumps({"i": i}).encode())
            for i in range(500)
        ],
    )
    spec = (
        PipelineSpec.builder("connect")
        .source("journal", path=str(source), max_records_per_batch=200)
        .namespace("^orders\\.created$")
        .transform(python="sluiceway.pipeline.examples:upper_key")
        .sink("files", "json", path=str(tmp_path / "out"))
        .checkpoint(str(tmp_path / "cp"))
        .build()
    )
    session = build_session(connect_server, app_name="sluice-connect-test")
    try:
        runs = Pipeline(spec, session).run(once=True)
    finally:
        session.stop()
    assert all(getattr(r, "error", None) is None for r in runs.values()), runs
    rows = [
        json.loads(line)
        for f in sorted((tmp_path / "out").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert len(rows) == 250
    assert {r["key"] for r in rows} == {f"K{k}" for k in range(5)}
    offsets = [r["offset"] for r in rows]
    assert offsets == sorted(offsets)
