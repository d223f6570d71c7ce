"""The mistakes a new user makes with a pipeline that show once Spark runs, run as they would run
them: one line on stderr naming the problem and where, a non-zero exit, no traceback (issue 21).
Those refused before Spark starts are in test_start_refusals.py, beside the Spark lane."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from sluiceway.testing import wait_until
from tests.conftest import PG_SERVER, pg_database_dsn
from tests.support.user_errors import journal_with, one_line, sluice, write_spec

MISSING_DB = f"nosuch_{uuid.uuid4().hex[:8]}"


def test_a_lost_destination_at_run_time_blames_no_record(sluice_spark: Any, tmp_path: Path) -> None:
    """Past the start-up check (skipped here), a sink whose database is gone stops at once (a
    missing database is permanent: no ``retry.outage`` wait) saying the destination is
    unreachable: no record-by-record replay, no offset."""
    from sluiceway.pipeline import Pipeline, PipelineSpec

    journal_with(tmp_path / "journal", 3)
    dsn = pg_database_dsn(PG_SERVER, MISSING_DB)
    spec = PipelineSpec.from_dict(
        {
            "name": "lost",
            "source": {"type": "journal", "path": str(tmp_path / "journal")},
            "sinks": [
                {
                    "name": "db",
                    "type": "postgres",
                    "dsn": dsn,
                    "table": "orders",
                    "retry": {"backoff": "50ms", "max_backoff": "200ms", "outage": "1s"},
                }
            ],
            "checkpoint": str(tmp_path / "cp"),
        },
        env={},
    )
    pipeline = Pipeline(spec, sluice_spark)
    pipeline.preflight = lambda: None  # type: ignore[method-assign]
    runs = pipeline.run(once=True, handle_signals=False, timeout=120)
    run = runs["db"]
    assert run.state == "failed"
    assert run.offset is None
    assert run.error is not None and run.error.startswith("destination unreachable: cannot connect to ")
    assert MISSING_DB in run.error
    [status] = pipeline.status()
    assert status.error is not None and status.error["offset"] is None and status.records == 0


# --- issue 37: errors that hide their cause -------------------------------------------------------
def last_error(result: subprocess.CompletedProcess[str]) -> str:
    """A run that started Spark and failed: no traceback, no JVM frame, no multi-kilobyte line;
    its last line is the one ``error:`` line."""
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "\tat " not in result.stderr, result.stderr
    assert all(len(line) < 1000 for line in result.stderr.splitlines()), result.stderr
    # The JVM's start-up lines that read like trouble and are none are not passed on.
    for noise in ("WARNING: Using incubator modules", "Setting default log level", "sc.setLogLevel"):
        assert noise not in result.stderr, result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        result.stderr.splitlines()[-1]
    ], result.stderr
    return result.stderr.splitlines()[-1]


def test_a_python_transform_that_raises_names_the_transform_the_record_and_the_error(tmp_path: Path) -> None:
    journal_with(tmp_path / "journal", 3)
    (tmp_path / "mytx.py").write_text(
        "import json\n\ndef total(record):\n"
        "    return record.replace(value=json.loads(record.value)['total'])\n"
    )
    write_spec(
        tmp_path,
        """pipeline:
  name: orders
  source: {type: journal, path: ./journal}
  transforms: [{python: "mytx:total"}]
  sinks: [{name: out, type: parquet, path: ./out}]
  checkpoint: ./cp
""",
    )
    env_run = subprocess.run(
        [sys.executable, "-m", "sluiceway.cli.main", "pipeline", "run", "orders.yaml", "--once"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    line = last_error(env_run)
    assert line == (
        "error: sink 'out' stopped: transforms[0] (python: mytx:total) failed on the record at offset 0 "
        "(key 'k0'): KeyError: 'total' (at mytx.py:4, in total)"
    ), line
    status = sluice("pipeline", "status", "orders.yaml", "--json", cwd=tmp_path)
    error = json.loads(status.stdout)["error"]
    assert error["message"] == line.split("stopped: ", 1)[1]
    assert "Traceback" in error["detail"] and "KeyError: 'total'" in error["detail"]


def test_a_sql_transform_naming_a_missing_column_is_one_line_naming_the_transform(tmp_path: Path) -> None:
    journal_with(tmp_path / "journal", 3)
    write_spec(
        tmp_path,
        """pipeline:
  name: orders
  source: {type: journal, path: ./journal}
  transforms: [{sql: "SELECT key, value, total FROM input"}]
  sinks: [{name: out, type: parquet, path: ./out}]
  checkpoint: ./cp
""",
    )
    line = last_error(sluice("pipeline", "run", "orders.yaml", "--once", cwd=tmp_path, timeout=180))
    assert line.startswith("error: orders.yaml: transforms[0].sql: [UNRESOLVED_COLUMN"), line
    assert "`total` cannot be resolved" in line and "Project" not in line and "SQLSTATE" not in line
    assert not (tmp_path / "cp").exists()  # refused before anything was made


def test_a_second_run_of_one_checkpoint_is_refused_naming_the_first(tmp_path: Path) -> None:
    """Two runs of one spec at once: the second is refused at start, before Spark, naming the
    process that runs; once that one is gone (even by kill -9) the next run may start."""
    journal_with(tmp_path / "journal", 3)
    write_spec(
        tmp_path,
        """pipeline:
  name: orders
  source: {type: journal, path: ./journal}
  sinks: [{name: out, type: parquet, path: ./out}]
  checkpoint: ./cp
""",
    )
    first = subprocess.Popen(
        [sys.executable, "-m", "sluiceway.cli.main", "pipeline", "run", "orders.yaml"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lock = tmp_path / "cp" / ".sluice-run.lock"
        wait_until(lambda: lock.exists() and str(first.pid) in lock.read_text(), timeout=120)
        line = one_line(sluice("pipeline", "run", "orders.yaml", "--once", cwd=tmp_path))
        assert "is in use by another run of this pipeline" in line and f"process {first.pid} on" in line, line
    finally:
        first.kill()
        first.wait(30)
    again = sluice("pipeline", "run", "orders.yaml", "--once", cwd=tmp_path, timeout=180)
    assert again.returncode == 0, again.stderr


def _has_jvm_child(pid: int) -> bool:
    """Whether ``pid`` has started a JVM (Spark's driver) as its child."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if f"\nPPid:\t{pid}\n" in text and b"java" in cmdline:
            return True
    return False


def test_ctrl_c_while_spark_starts_is_one_line_and_exit_130(tmp_path: Path) -> None:
    journal_with(tmp_path / "journal", 3)
    write_spec(
        tmp_path,
        """pipeline:
  name: orders
  source: {type: journal, path: ./journal}
  sinks: [{name: out, type: parquet, path: ./out}]
  checkpoint: ./cp
""",
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "sluiceway.cli.main", "pipeline", "run", "orders.yaml"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _has_jvm_child(run.pid), timeout=60, message="Spark's JVM starts")
        run.send_signal(signal.SIGINT)
        _out, err = run.communicate(timeout=60)
    finally:
        run.kill()
        run.wait()
    assert run.returncode == 130, err
    assert err.strip().splitlines() == ["interrupted"], err
