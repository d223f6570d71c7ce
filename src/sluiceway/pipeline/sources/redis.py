"""``sluice-redis``: a Redis stream as a Spark streaming source (Arrow batches).

>>> (spark.readStream.format("sluice-redis").option("url", "redis://127.0.0.1:6379/0")  # doctest: +SKIP
...    .option("stream", "orders").load())

Options: ``url``, ``stream`` (required), ``startingOffset`` (``earliest`` | ``latest``),
``maxRecordsPerBatch`` (default 100,000).

Offsets are entry ids: ``{"after": "<ms>-<seq>"}``, the last entry already read. Admission
control counts entries: the end of a micro-batch is the id of the ``maxRecordsPerBatch``-th entry
after ``after`` (found by a short script on the server, so the driver never downloads them), capped
by the Trigger.AvailableNow target (the last entry when the query started). A micro-batch is read
by one task with ``XRANGE (after end``, so a replay reads the same entries and each key's records
stay in stream order. Records: ``offset`` = the entry id as one number
(``sluiceway.brokers.redis.entry_offset``), ``namespace`` = the stream, ``key``/``value``/
``headers`` from the fields of the harvester's mapping, ``timestamp`` = the id's milliseconds.
Entries trimmed away (``MAXLEN``) are simply not there. No consumer group is used.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from sluiceway.brokers.redis import entry_offset, from_fields, map_error, offset_millis, raw_stream_replies
from sluiceway.pipeline.errors import SourceError, SourceOptionError
from sluiceway.pipeline.sources.common import (
    RecordSource,
    limit_rows,
    max_records,
    message_row,
    option,
    record_batch,
    required,
)

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition  # isort: skip
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow  # isort: skip

NAME = "sluice-redis"
_CHUNK = 10_000
_ORIGIN = "0-0"
#: The id of the COUNT-th entry after ARGV[1] (exclusive), or nil: the driver learns where a
#: bounded batch ends without the entries crossing the network.
_NTH_ID = """
local entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])
if #entries == 0 then return false end
return entries[#entries][1]
"""


@dataclass(frozen=True)
class RedisPartition(InputPartition):
    url: str
    stream: str
    after: str  # exclusive
    upto: str  # inclusive


def _client(url: str) -> Any:
    import redis

    return raw_stream_replies(redis.Redis.from_url(url, socket_timeout=30))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def id_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def last_id(url: str, stream: str) -> str:
    """The stream's last entry id (``0-0`` when empty or missing)."""
    client = _client(url)
    try:
        entries = client.execute_command("XREVRANGE", stream, "+", "-", "COUNT", 1)
    except Exception as exc:
        raise map_error(exc, "read", stream) from exc
    finally:
        client.close()
    return _text(entries[0][0]) if entries else _ORIGIN


def nth_id(url: str, stream: str, after: str, count: int | None) -> str:
    """The id ``count`` entries after ``after`` (or the last one, if fewer); ``after`` if none."""
    if count is None:
        last = last_id(url, stream)
        return last if id_order(last) > id_order(after) else after
    client = _client(url)
    try:
        found = client.eval(_NTH_ID, 1, stream, after, count)
    except Exception as exc:
        raise map_error(exc, "read", stream) from exc
    finally:
        client.close()
    return _text(found) if found else after


def entry_row(stream: str, raw_id: bytes | str, fields: Sequence[bytes]) -> dict[str, Any]:
    """One ``XRANGE`` entry as a record row: ``offset`` the id as one number, ``timestamp`` its
    milliseconds. An id too large for an offset (given to ``XADD`` explicitly; Redis allows up
    to 2^64 - 1) is a :class:`SourceError`: the entry cannot be read in order with the others."""
    try:
        offset = entry_offset(raw_id)
    except ValueError as exc:  # UnicodeDecodeError too
        raise SourceError(f"{NAME}: stream {stream!r}: entry id {raw_id!r}: {exc}") from None
    stamp = datetime.fromtimestamp(offset_millis(offset) / 1000, UTC)
    return message_row(offset, stream, from_fields(fields), stamp)


def read_range(part: RedisPartition) -> Iterator[pa.RecordBatch]:
    """Entries with ``after < id <= upto`` as Arrow batches (executor side)."""
    client = _client(part.url)
    start = "(" + part.after
    try:
        while True:
            try:
                entries = client.execute_command("XRANGE", part.stream, start, part.upto, "COUNT", _CHUNK)
            except Exception as exc:
                raise map_error(exc, "read", part.stream) from exc
            if not entries:
                return
            yield record_batch([entry_row(part.stream, raw_id, fields) for raw_id, fields in entries])
            if len(entries) < _CHUNK:
                return
            start = "(" + _text(entries[-1][0])
    finally:
        client.close()


class RedisStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, Any]) -> None:
        self.url = option(options, "url", "redis://127.0.0.1:6379/0") or ""
        self.stream = required(options, "stream", NAME)
        self.starting = (option(options, "startingOffset", "earliest") or "earliest").lower()
        if self.starting not in ("earliest", "latest"):
            raise SourceOptionError(
                "startingOffset", f"{NAME}: startingOffset must be earliest or latest, got {self.starting!r}"
            )
        self.max_rows = max_records(options)
        self.target: str | None = None

    def initialOffset(self) -> dict[str, str]:
        return {"after": _ORIGIN if self.starting == "earliest" else last_id(self.url, self.stream)}

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = last_id(self.url, self.stream)

    def latestOffset(self, start: dict[str, str], limit: Any) -> dict[str, str]:
        after = str(start["after"])
        end = nth_id(self.url, self.stream, after, limit_rows(limit))
        if self.target is not None and id_order(end) > id_order(self.target):
            end = max(self.target, after, key=id_order)
        return {"after": end}

    def reportLatestOffset(self) -> dict[str, str]:
        return {"after": last_id(self.url, self.stream)}

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> list[RedisPartition]:
        after, upto = str(start["after"]), str(end["after"])
        if id_order(upto) <= id_order(after):
            return []
        return [RedisPartition(self.url, self.stream, after, upto)]

    def read(self, partition: RedisPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_range(partition)


class RedisDataSource(RecordSource):
    """Reads a Redis stream. See the module docstring for options."""

    NAME = NAME
    READER = RedisStreamReader
