"""A table sink set up wrong is one line and a non-zero exit before any batch runs: a directory
that is not a Delta table, a catalog that cannot be reached, a key column the rows will not have."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from sluiceway.journal import Journal
from tests.integration.pipeline.test_user_errors import journal_with, one_line, sluice


def run(tmp_path: Path, sink: str) -> str:
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


def test_a_directory_that_is_not_a_delta_table(tmp_path: Path) -> None:
    (tmp_path / "lake").mkdir()
    (tmp_path / "lake" / "notes.txt").write_text("mine")
    line = run(tmp_path, "{name: lake, type: delta, path: ./lake}")
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
    line = run(tmp_path, f"{{name: ice, type: iceberg, table: lake.orders, catalog: {catalog}}}")
    assert "sink 'ice': destination unreachable" in line
    for word in words:
        assert word in line


def test_a_mirror_key_the_rows_will_not_have(tmp_path: Path) -> None:
    line = run(tmp_path, "{name: m, type: delta, path: ./m, mode: mirror, key: [id]}")
    assert "sinks[0].key: no column 'id' in the rows this sink writes" in line


def test_an_existing_table_without_the_mirror_key(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "m"), pa.table({"id": [1], "name": ["a"]}))
    line = run(tmp_path, "{name: m, type: delta, path: ./m, mode: mirror}")
    assert "has no column 'namespace' to mirror on" in line


def test_a_column_whose_type_changed_stops_the_sink_with_one_line(tmp_path: Path) -> None:
    """Schema evolution has one limit: a column the table has, arriving with another type. The
    sink stops with one error line naming the column, its type and the value; the table keeps
    what it had."""
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(str(tmp_path / "t"), pa.table({"id": pa.array([7], pa.int64()), "name": ["a"]}))
    journal = tmp_path / "journal"
    with Journal.open(journal, fsync=False) as j, j.append() as tx:
        tx.write("k1", b'{"id": "seven", "name": "b"}', namespace="orders")
    (tmp_path / "orders.yaml").write_text(
        """pipeline:
  name: orders
  source: {type: journal, path: ./journal}
  sinks: [{name: t, type: delta, path: ./t, columns: json}]
  checkpoint: ./cp
"""
    )
    result = sluice("pipeline", "run", "orders.yaml", "--once", cwd=tmp_path, timeout=180)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    errors = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr
    line = errors[0]  # the run's own log lines come before it; this is the one that says why
    assert "sink 't' stopped: the table refused the batch: column 'id'" in line, line
    assert "int64" in line and "'seven'" in line, line
    assert DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist() == [{"id": 7, "name": "a"}]
