"""The mistakes a new user makes with a pipeline that are refused before Spark starts, run as they
would run them: one line on stderr naming the problem and where, a non-zero exit, no traceback,
nothing written (issue 21), a table sink set up wrong among them. No JVM starts, so these run
beside the Spark lane."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import PG_SERVER, pg_database_dsn
from tests.support.user_errors import journal_with, one_line, sluice, write_spec


def refusal(tmp_path: Path, sink: str) -> str:
    """The one line of a ``--once`` run of one sink over a small journal, refused before anything
    was made."""
    journal_with(tmp_path / "journal", 3)
    (tmp_path / "orders.yaml").write_text(
        f"""pipeline:
  name: orders
  source: {{type: journal, path: ./journal}}
  sinks: [{sink}]
  checkpoint: ./cp
"""
    )
    line = one_line(sluice("pipeline", "run", "orders.yaml", "--once", cwd=tmp_path))
    assert line.startswith("error: orders.yaml: ")
    assert not (tmp_path / "cp").exists()
    return line


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
    line = refusal(tmp_path, sink)
    for word in words:
        assert word in line
    assert "offset" not in line  # no record is blamed


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


# --- a table sink set up wrong: a directory that is not a Delta table, a catalog that cannot be
# reached, a key column the rows will not have -----------------------------------------------------
def test_a_directory_that_is_not_a_delta_table(tmp_path: Path) -> None:
    (tmp_path / "lake").mkdir()
    (tmp_path / "lake" / "notes.txt").write_text("mine")
    line = refusal(tmp_path, "{name: lake, type: delta, path: ./lake}")
    assert "sink 'lake'" in line and "lake is not a Delta table (no _delta_log)" in line
    assert (tmp_path / "lake" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("catalog", "words"),
    [
        (
            "{type: sql, uri: 'sqlite:////nonexistent/dir/catalog.db'}",
            ["iceberg catalog sqlite:////nonexistent/dir/catalog.db", "OperationalError"],
        ),
        ("{type: rest, uri: 'http://127.0.0.1:9'}", ["iceberg catalog http://127.0.0.1:9"]),
    ],
)
def test_an_iceberg_catalog_that_cannot_be_reached(tmp_path: Path, catalog: str, words: list[str]) -> None:
    line = refusal(tmp_path, f"{{name: ice, type: iceberg, table: lake.orders, catalog: {catalog}}}")
    assert "sink 'ice': destination unreachable" in line
    for word in words:
        assert word in line


def test_a_mirror_key_the_rows_will_not_have(tmp_path: Path) -> None:
    line = refusal(tmp_path, "{name: m, type: delta, path: ./m, mode: mirror, key: [id]}")
    assert "sinks[0].key: no column 'id' in the rows this sink writes" in line


def test_an_existing_table_without_the_mirror_key(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "m"), pa.table({"id": [1], "name": ["a"]}))
    line = refusal(tmp_path, "{name: m, type: delta, path: ./m, mode: mirror}")
    assert "has no column 'namespace' to mirror on" in line
