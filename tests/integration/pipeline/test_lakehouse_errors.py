"""A table sink whose table refuses a batch once Spark runs: one line and a non-zero exit, the
table unchanged. (A table sink set up wrong is refused before Spark starts: test_start_refusals.py.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from sluiceway.journal import Journal
from tests.support.user_errors import sluice


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
