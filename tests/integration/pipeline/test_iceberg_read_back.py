"""The Iceberg read-back snippet of docs/pipeline.md runs as written, on a table the sink's own
writer made (no Spark): the catalog is named ``sluice``, and under pyiceberg's usual ``default``
the table is not there — the trap the snippet's page warns about."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from sluiceway.pipeline import PipelineSpec
from sluiceway.pipeline.record import Record, records_to_arrow
from sluiceway.pipeline.sinks.lakehouse.sink import LakeWriter
from sluiceway.pipeline.sinks.part import token_of
from sluiceway.pipeline.spec import IcebergSinkSpec
from tests.docs.test_docs import ROOT, blocks

THIS = "tests/integration/pipeline/test_iceberg_read_back.py"


def _snippet() -> str:
    """The python block of docs/pipeline.md whose not-run note names this test."""
    (block,) = [
        b
        for b in blocks(ROOT / "docs" / "pipeline.md")
        if b.lang == "python" and b.directive is not None and THIS in b.directive[1]
    ]
    return block.body


@pytest.fixture
def orders_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """shop.orders with 3 rows, written by the iceberg sink of the page's example, from tmp_path."""
    monkeypatch.chdir(tmp_path)
    spec = (
        PipelineSpec.builder("shop")
        .source("journal", path="./journal")
        .sink(
            "orders",
            "iceberg",
            table="shop.orders",
            catalog={"type": "sql", "uri": "sqlite:///iceberg.db", "warehouse": f"file://{tmp_path}/lake"},
        )
        .checkpoint("./checkpoints")
        .build()
    )
    sink = spec.sinks[0]
    assert isinstance(sink, IcebergSinkSpec)
    records = [Record(offset=i, key=f"o-{i}", value=b"{}", namespace="orders") for i in range(3)]
    LakeWriter(sink, "shop.orders").write(records_to_arrow(records), token_of("run", 0, None, 0, 3))
    return tmp_path


def test_the_docs_snippet_reads_the_table_back(orders_table: Path) -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_snippet(), "docs/pipeline.md", "exec"), {"__name__": "__docs__"})
    assert printed.getvalue().startswith("3 rows: ['offset', 'namespace', 'op', 'key', 'value'")


def test_under_the_name_default_the_table_is_not_there(orders_table: Path) -> None:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    with pytest.raises(NoSuchTableError):
        load_catalog("default", type="sql", uri="sqlite:///iceberg.db").load_table("shop.orders")
