"""A table sink set up wrong is one line and a non-zero exit before any batch runs: a directory
that is not a Delta table, a catalog that cannot be reached, a key column the rows will not have."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

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
