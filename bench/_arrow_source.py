"""A reference Python data source for bench/pipeline.py: it only hands Arrow batches to Spark.

``bench-arrow`` reads a Parquet file with pyarrow inside Spark's Python workers and yields its
record batches unchanged, split over ``partitions`` tasks by row group. It does no decoding of its
own, so its rate is the ceiling of any Python data source on this machine: what Spark's transfer
of Arrow batches from Python workers costs. The journal source is measured against it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from sluiceway.pipeline.sources.common import spark_record_schema


@dataclass(frozen=True)
class RowGroups(InputPartition):  # type: ignore[misc]
    path: str
    groups: tuple[int, ...]


class ArrowFileSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return "bench-arrow"

    def schema(self) -> Any:
        return spark_record_schema()

    def reader(self, schema: Any) -> ArrowFileReader:
        return ArrowFileReader(dict(self.options))


class ArrowFileReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.parts = int(options.get("partitions", "2"))

    def partitions(self) -> list[RowGroups]:
        groups = pq.ParquetFile(self.path).num_row_groups
        return [RowGroups(self.path, tuple(range(i, groups, self.parts))) for i in range(self.parts)]

    def read(self, partition: RowGroups) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        file = pq.ParquetFile(partition.path)
        for group in partition.groups:
            yield from file.read_row_group(group).to_batches()
