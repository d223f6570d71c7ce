"""What every sluiceway data source shares: option parsing, the record schema, read limits.

The ``DataSource`` classes only parse options; partitions and commit messages are small
picklable dataclasses; clients are created inside ``read``/``write`` on the executor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

import pyarrow as pa

from sluiceway.pipeline.errors import SourceError, SourceOptionError
from sluiceway.pipeline.offsets import parse_max_records
from sluiceway.pipeline.record import RECORD_SCHEMA, with_delete_ops

from pyspark.sql.datasource import DataSource  # isort: skip


def spark_record_schema() -> Any:
    """The record shape as a Spark ``StructType``, derived from :data:`RECORD_SCHEMA` (no JVM)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(RECORD_SCHEMA)


#: The largest record offset (the record's ``offset`` is a signed 64-bit integer).
_MAX_OFFSET = 2**63 - 1

#: What a broker adapter reads back from a message: (key, value, headers), the harvester's mapping.
Decoded = tuple[str, bytes | None, Sequence[tuple[str, str]]]


def message_row(offset: int, namespace: str, decoded: Decoded, timestamp: datetime) -> dict[str, Any]:
    """One broker message (NATS, Redis) as a record row; ``decoded`` from the adapter
    (``from_nats``, ``from_fields``). A tombstone's ``op`` is set by :func:`record_batch`.

    An offset a record cannot hold (a JetStream sequence is unsigned, 64 bits) is a
    :class:`SourceError`."""
    if not 0 <= offset <= _MAX_OFFSET:
        raise SourceError(f"{namespace!r}: position {offset} does not fit a record offset (0 to 2^63 - 1)")
    key, value, headers = decoded
    return {
        "offset": offset,
        "namespace": namespace,
        "op": "insert",
        "key": key,
        "value": value,
        "headers": [{"key": k, "value": v} for k, v in headers],
        "timestamp": timestamp,
    }


def record_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Record rows as an Arrow batch of the record schema, tombstones as ``delete``."""
    return with_delete_ops(pa.RecordBatch.from_pylist(rows, schema=RECORD_SCHEMA))


def option(options: Mapping[str, Any], name: str, default: str | None = None) -> str | None:
    """Options arrive case-insensitive from Spark, but a plain dict in unit tests."""
    if name in options:
        return str(options[name])
    lowered = name.lower()
    for k, v in options.items():
        if k.lower() == lowered:
            return str(v)
    return default


def flag_option(options: Mapping[str, Any], name: str) -> bool:
    """An on/off option: on only when it says ``true`` (any case); off when absent."""
    return (option(options, name) or "").lower() == "true"


def required(options: Mapping[str, Any], name: str, source: str) -> str:
    value = option(options, name)
    if value is None or value == "":
        raise SourceOptionError(name, f"{source}: option {name!r} is required")
    return value


def int_option(options: Mapping[str, Any], name: str, default: int, *, minimum: int = 0) -> int:
    raw = option(options, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SourceOptionError(name, f"option {name!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SourceOptionError(name, f"option {name!r} must be >= {minimum}, got {raw!r}")
    return value


def float_option(options: Mapping[str, Any], name: str, default: float) -> float:
    raw = option(options, name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SourceOptionError(name, f"option {name!r} must be a number, got {raw!r}") from None


def max_records(options: Mapping[str, Any]) -> int:
    return parse_max_records(option(options, "maxRecordsPerBatch"))


def limit_rows(limit: Any) -> int | None:
    """Rows allowed by a Spark ``ReadLimit`` (``None``: all available)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    if isinstance(limit, ReadMaxRows):
        return int(limit.max_rows)
    return None


class RecordSource(DataSource):
    """A Spark data source of sluiceway records: its ``NAME`` and the record schema. A source
    adds its readers and writers only."""

    NAME: ClassVar[str] = ""
    #: The stream reader, built from the options (sources with a richer API override streamReader).
    READER: ClassVar[type[Any] | None] = None

    @classmethod
    def name(cls) -> str:
        return cls.NAME

    def schema(self) -> Any:
        return spark_record_schema()

    def streamReader(self, schema: Any) -> Any:
        if self.READER is None:
            raise NotImplementedError(f"{self.NAME} is not a streaming source")
        return self.READER(dict(self.options))
