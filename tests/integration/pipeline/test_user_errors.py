"""The mistakes a new user makes with a pipeline, run as they would run them: one line on stderr
naming the problem and where, a non-zero exit, no traceback, nothing written (issue 21)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from sluiceway.journal import Journal
from sluiceway.testing import wait_until
from tests.conftest import PG_SERVER, pg_database_dsn

#: Start-up checks run before Spark starts: generous, but far below a Spark run's retries.
FAST = 30


def sluice(*args: str, cwd: Path, timeout: float = FAST) -> subprocess.CompletedProcess[str]:
    """``sluice …`` in a child process, its output piped (not a terminal), as a user's script runs it."""
    return subprocess.run(
        [sys.executable, "-m", "sluiceway.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def write_spec(tmp: Path, body: str) -> Path:
    spec = tmp / "orders.yaml"
    spec.write_text(body)
    return spec


def journal_with(path: Path, records: int) -> None:
    with Journal.open(path, fsync=False) as j, j.append() as tx:
        for i in range(records):
            tx.write(f"k{i}", b"{}", namespace="orders")


# --- item 2: a mistyped journal path ------------------------------------------------------------
def test_a_missing_journal_source_fails_naming_the_path(tmp_path: Path) -> None:
    journal_with(tmp_path / "journal", 3)
    write_spec(
        tmp_path,
        """pipeline:
  name: orders
  source: {type: journal, path: ./data/jurnal}
  sinks: [{name: lake, type: parquet, path: ./lake}]
  checkpoint: ./cp
""",
    )
    result = sluice("pipeline", "run", "orders.yaml", "--once", cwd=tmp_path)
    line = one_line(result)
    assert line == "error: orders.yaml: pipeline.source.path: no journal at ./data/jurnal"
    assert "finished" not in result.stdout + result.stderr
    assert not (tmp_path / "cp").exists() and not (tmp_path / "lake").exists()
    assert not (tmp_path / "data").exists()  # a read does not create the journal


# --- item 3: spec typos -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sinks", "expected"),
    [
        (
            "sinks: [{name: lake, type: parquet, paht: ./lake}]",
            "error: orders.yaml: pipeline.sinks[0].paht: unknown key (did you mean 'path'?); "
            "pipeline.sinks[0].path: required but missing",
        ),
        (
            "sink: [{name: lake, type: parquet, path: ./lake}]",
            "error: orders.yaml: pipeline.sink: unknown key (did you mean 'sinks'?); "
            "pipeline.sinks: required but missing",
        ),
    ],
)
def test_a_misspelt_key_is_named_with_a_suggestion(tmp_path: Path, sinks: str, expected: str) -> None:
    journal_with(tmp_path / "journal", 1)
    write_spec(
        tmp_path,
        f"""pipeline:
  name: orders
  source: {{type: journal, path: ./journal}}
  {sinks}
  checkpoint: ./cp
""",
    )
    assert one_line(sluice("pipeline", "run", "orders.yaml", "--once", cwd=tmp_path)) == expected
    assert not (tmp_path / "cp").exists()


# --- item 4: a destination that cannot be reached ------------------------------------------------
MISSING_DB = f"nosuch_{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(
    ("sink", "words"),
    [
        (
            f'{{name: db, type: postgres, dsn: "{pg_database_dsn(PG_SERVER, MISSING_DB)}", table: orders}}',
            ["sink 'db': destination unreachable", f'database "{MISSING_DB}" does not exist'],
        ),
        (
            '{name: bus, type: kafka, topic: out, config: {bootstrap.servers: "127.0.0.1:9"}}',
            ["sink 'bus': destination unreachable", "kafka 127.0.0.1:9"],
        ),
        (
            '{name: mq, type: rabbitmq, url: "amqp://guest:wrong@127.0.0.1:5672/"}',
            [
                "sink 'mq': destination unreachable",
                "rabbitmq amqp://guest:***@127.0.0.1:5672/",
                "ACCESS_REFUSED",
            ],
        ),
        (
            '{name: cache, type: redis, url: "redis://127.0.0.1:6399/0"}',
            ["sink 'cache': destination unreachable", "127.0.0.1:6399"],
        ),
        (
            "{name: copy, type: journal, path: ./orders.yaml/copy}",
            ["sink 'copy': destination unreachable", "orders.yaml is not a directory"],
        ),
        (
            "{name: c, type: console, dead_letter: {type: redis, url: 'redis://127.0.0.1:6399/0'}}",
            ["sink 'c.dead_letter': destination unreachable", "127.0.0.1:6399"],
        ),
    ],
)
def test_an_unreachable_sink_fails_at_start(tmp_path: Path, sink: str, words: list[str]) -> None:
    journal_with(tmp_path / "journal", 3)
    write_spec(
        tmp_path,
        f"""pipeline:
  name: orders
  source: {{type: journal, path: ./journal}}
  sinks: [{sink}]
  checkpoint: ./cp
""",
    )
    line = one_line(sluice("pipeline", "run", "orders.yaml", "--once", cwd=tmp_path))
    assert line.startswith("error: orders.yaml: ")
    for word in words:
        assert word in line
    assert "offset" not in line  # no record is blamed
    assert not (tmp_path / "cp").exists()


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


# --- item 10: skip past the end -----------------------------------------------------------------
def test_skip_past_the_end_of_the_source_is_refused(tmp_path: Path) -> None:
    journal_with(tmp_path / "journal", 3)
    write_spec(
        tmp_path,
        """pipeline:
  name: orders
  source: {type: journal, path: ./journal}
  sinks: [{name: lake, type: parquet, path: ./lake}]
  checkpoint: ./cp
""",
    )
    skip = ["pipeline", "skip", "orders.yaml", "--sink", "lake", "--offset"]
    line = one_line(sluice(*skip, "500", cwd=tmp_path))
    assert line == (
        "error: offset 500 is past the end of the source: journal ./journal holds offsets 0 to 2 "
        "(nothing skipped)"
    )
    assert not (tmp_path / "cp").exists()
    ok = sluice(*skip, "2", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "cp" / "lake").exists()


# --- item 9: status piped, and a sink with nothing committed ------------------------------------
def test_status_piped_is_not_cut_and_says_nothing_is_committed(tmp_path: Path) -> None:
    write_spec(
        tmp_path,
        """pipeline:
  name: orders
  source: {type: redis, stream: orders-stream-with-a-rather-long-name}
  sinks:
    - {name: a-sink-with-a-long-name-to-widen-the-table, type: console}
  checkpoint: ./cp
""",
    )
    result = sluice("pipeline", "status", "orders.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout
    assert "position" in result.stdout and "last error" in result.stdout
    assert "no batch committed yet" in result.stdout
    assert "None" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) > 80


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


@pytest.mark.parametrize(
    ("place", "words"),
    [
        ("checkpoint: ./orders.yaml/cp", "checkpoint: cannot create ./orders.yaml/cp: "),
        (
            "checkpoint: ./cp\n  sinks:\n    - name: t\n      type: iceberg\n      table: shop.orders\n"
            "      catalog: {type: sql, uri: 'sqlite:///catalog.db', warehouse: 'file://WAREHOUSE'}",
            "sink 't': destination unreachable: cannot create ",
        ),
    ],
    ids=["checkpoint", "iceberg-warehouse"],
)
def test_a_place_that_cannot_be_written_is_one_line_before_spark_starts(
    tmp_path: Path, place: str, words: str
) -> None:
    journal_with(tmp_path / "journal", 3)
    body = "pipeline:\n  name: orders\n  source: {type: journal, path: ./journal}\n"
    if "sinks:" not in place:
        body += "  sinks: [{name: out, type: parquet, path: ./out}]\n"
    spec = write_spec(
        tmp_path, body + "  " + place.replace("WAREHOUSE", str(tmp_path / "orders.yaml" / "wh")) + "\n"
    )
    line = one_line(sluice("pipeline", "run", spec.name, "--once", cwd=tmp_path))
    assert words in line and "is not a directory" in line, line
    assert not (tmp_path / "cp").exists() and not (tmp_path / "out").exists()


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
