"""The pipeline on a Spark standalone cluster (`--master spark://…`).

A master and one worker are started on loopback from PySpark's own distribution (``spark-class``);
``sluice pipeline run --master spark://…`` then runs in its own process, as a user would run it:
the driver plans, the worker's executor runs the journal source's partitions in its Python workers,
and each sink's batches land where they should.
"""

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
import yaml

from sluiceway.testing import free_port, wait_until
from tests.support.journal import make_journal, read_journal

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _spark_env(home: Path, work: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work),
        "SPARK_WORKER_DIR": str(work / "worker"),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
    }


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A standalone master with one worker (1 core, 1 GiB) on loopback: its spark:// URL and the
    worker's work directory (one ``app-…`` folder per application that ran executors there)."""
    import pyspark

    home = Path(pyspark.__file__).parent
    work = tmp_path_factory.mktemp("standalone")
    env = _spark_env(home, work)
    port, worker_port = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []

    def launch(name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(work / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(
                [str(home / "bin" / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stopped with its JVM
            )
        procs.append(proc)
        return proc

    try:
        master = launch(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port()),
        )  # fmt: skip
        wait_until(lambda: _listening(port) or master.poll() is not None, timeout=120, message="Spark master")
        if master.poll() is not None:
            pytest.fail(f"the Spark master exited:\n{(work / 'master.log').read_text()[-3000:]}")
        worker = launch(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1", "--port", str(worker_port), "--webui-port", str(free_port()),
            "--cores", "1", "--memory", "1g", "--work-dir", str(work / "worker"),
            url,
        )  # fmt: skip

        def registered() -> bool:
            return worker.poll() is not None or "Successfully registered with master" in (
                work / "worker.log"
            ).read_text(errors="replace")

        wait_until(registered, timeout=120, message="the Spark worker to register")
        if worker.poll() is not None:
            pytest.fail(f"the Spark worker exited:\n{(work / 'worker.log').read_text()[-3000:]}")
        yield url, work / "worker"
    finally:
        for proc in reversed(procs):
            _stop(proc)


def test_journal_pipeline_runs_on_a_standalone_cluster(standalone: tuple[str, Path], tmp_path: Path) -> None:
    url, worker_dir = standalone
    source = tmp_path / "source"
    make_journal(
        source,
        [
            ("orders.created" if i % 2 else "orders.paid", f"k{i % 7}", json.dumps({"i": i}).encode())
            for i in range(3000)
        ],
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "pipeline": {
                    "name": "standalone",
                    "source": {"type": "journal", "path": str(source), "max_records_per_batch": 1000},
                    "namespace": "^orders\\.created$",
                    "transforms": [{"python": "sluiceway.pipeline.examples:upper_key"}],
                    "sinks": [
                        {"name": "copy", "type": "journal", "path": str(tmp_path / "copy")},
                        {"name": "files", "type": "json", "path": str(tmp_path / "files")},
                    ],
                    "checkpoint": str(tmp_path / "cp"),
                }
            }
        )
    )
    import pyspark

    env = _spark_env(Path(pyspark.__file__).parent, tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "sluiceway.cli.main", "pipeline", "run", str(spec), "--once", "--master", url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=240,
        start_new_session=True,
    )
    assert run.returncode == 0, (run.stdout + run.stderr).decode(errors="replace")[-4000:]
    # The work ran on the cluster's executor, not in a local session.
    apps = [d for d in worker_dir.iterdir() if d.name.startswith("app-")]
    assert len(apps) == 1, apps

    copied = read_journal(tmp_path / "copy")
    assert len(copied) == 1500
    assert {key for _, _, key, _ in copied} == {f"K{k}" for k in range(7)}
    assert [json.loads(value or b"")["i"] for *_, value in copied] == list(range(1, 3000, 2))
    rows = [
        json.loads(line)
        for f in sorted((tmp_path / "files").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert sorted(r["offset"] for r in rows) == list(range(1, 3000, 2))
    # Each sink's parts were written by the executor's Python workers, not by the driver.
    for sink in ("copy", "files"):
        state = json.loads((tmp_path / "cp" / sink / "sluice" / "state.json").read_text())
        assert state["writers"], state
        assert {w["jvm"] for w in state["writers"]} == {"CoarseGrainedExecutorBackend"}, state["writers"]
