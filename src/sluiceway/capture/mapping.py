"""Captured changes as messages: topic, key, value, headers and a sequence id per change. Pure.

A change's message::

    key     the primary key as in the CDC records (one column: its text; several: a JSON array)
    value   {"op": "update", "before": {...old row...} or null, "after": {...row...},
             "source": {"table": "public.orders", "lsn": "0/1A2B3C8", "xid": 771,
                        "commit_time": "2026-11-27T01:02:03.456789+00:00", "mode": "sync"}}
    headers pg.lsn, pg.xid, sluice.mode, sluice.op (as the pipeline's CDC records), sluice-id

From MariaDB/MySQL, ``source`` is ``{"table": "shop.orders", "gtid": "0-1-42", "file":
"binlog.000003", "pos": 1234, "commit_time": …, "mode": …}`` (where the transaction ends in the
binlog), the headers ``mysql.gtid``, ``mysql.file``, ``mysql.pos``, and ``before`` is always the
old row (the binlog's full image).

``after`` is null for deletes and truncates (a truncate's key is empty); ``before`` is the old
row of an update or delete where the server sends it whole (``REPLICA IDENTITY FULL``), else null.
``mode`` is ``copy`` for rows of the initial copy. ``sluice-id`` is the change's place in the stream — its
transaction's commit LSN times 2^32 plus its index in the transaction — so it grows per key in
commit order and is the same whenever the change is sent again: the consumer's
:class:`~sluiceway.harvest.sequence.Deduplicator` drops re-sends by it, and NATS JetStream by the
message id made from it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.cdc.mysql.assemble import BEFORE_HEADER as BINLOG_BEFORE
from sluiceway.cdc.mysql.assemble import FILE_HEADER, GTID_HEADER, POS_HEADER
from sluiceway.cdc.records import BEFORE_HEADER
from sluiceway.harvest.sequence import SLUICE_ID
from sluiceway.journal.record import OP_HEADER
from sluiceway.outbox.record import MarkedRecord, RecordColumns
from sluiceway.tracing import TRACEPARENT

#: The headers every record of a transaction (or copied chunk) has; others are a row's own.
_SHARED = frozenset({"pg.lsn", "pg.xid", GTID_HEADER, FILE_HEADER, POS_HEADER, "sluice.mode"})
#: A change's old row, as the PostgreSQL and the MariaDB/MySQL captures carry it.
_BEFORES = frozenset({BEFORE_HEADER, BINLOG_BEFORE})
#: Room for the changes of one transaction in a sequence id (``commit LSN << 32 | index``).
INDEX_BITS = 32


class TopicMap:
    """``namespace`` (``schema.table``) → topic, from a template; cached per namespace."""

    def __init__(self, template: str) -> None:
        self.template = template
        self._topics: dict[str, str] = {}

    def __call__(self, namespace: str) -> str:
        topic = self._topics.get(namespace)
        if topic is None:
            schema, _, table = namespace.rpartition(".")
            topic = self.template.format(schema=schema, table=table, namespace=namespace)
            self._topics[namespace] = topic
        return topic


def to_columns(
    batch: pa.RecordBatch,
    topics: TopicMap,
    *,
    leader: str = "",
    tombstones: bool = False,
    trace_column: str | None = None,
) -> RecordColumns:
    """The batch's changes (the capture's record schema) as records to publish, in stream order.

    One pass over plain lists taken from the batch's columns: a transaction's ``source`` object,
    commit time and shared headers are made once (its rows share them), a row's own header
    (``pg.before``, ``pg.unchanged-toast``) only where the row has one. ``trace_column``: the
    row's value of that column (the old row's, for a delete), when it is text, becomes a
    ``traceparent`` header (the row is read for it only then).
    """
    out = RecordColumns([], [], [], [], [], [], leader)
    n = batch.num_rows
    if not n:
        return out
    offsets = batch.column("offset").to_pylist()
    namespaces = batch.column("namespace").to_pylist()
    ops = batch.column("op").to_pylist()
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    micros = pc.cast(batch.column("timestamp"), pa.int64()).to_pylist()
    header_column = batch.column("headers")
    if header_column.null_count:
        header_column = header_column.fill_null(pa.scalar([], header_column.type))
    bounds = header_column.offsets.to_pylist()
    pairs = header_column.values
    names, texts = pairs.field("key"), pairs.field("value")

    def headers_of(start: int, end: int) -> tuple[list[str], list[str]]:
        # Read where a run starts or a row has headers of its own, not for every row.
        return names.slice(start, end - start).to_pylist(), texts.slice(start, end - start).to_pylist()

    ids, times, out_topics, out_keys, out_values, out_headers = (
        out.ids, out.create_times, out.topics, out.keys, out.values, out.headers
    )  # fmt: skip
    sources: dict[tuple[int, str], _Source] = {}
    # The rows of a transaction are together and mostly of one table: what they share is looked up
    # when the transaction or the table changes, not per row.
    run_offset, run_namespace, index = -1, "", 0
    source, created, topic = b"", None, ""
    base: list[tuple[str, str]] = []
    shared: dict[str, list[tuple[str, str]]] = {}  # op → the run's shared headers with its sluice.op
    for i in range(n):
        offset, namespace = offsets[i], namespaces[i]
        if offset != run_offset or namespace != run_namespace:
            if offset != run_offset:
                index = 0
            run_offset, run_namespace = offset, namespace
            cached = sources.get((offset, namespace))
            if cached is None:
                start, end = bounds[i], bounds[i + 1]
                cached = _source(namespace, micros[i], *headers_of(start, end), topics)
                sources[(offset, namespace)] = cached
            source, created, base, topic = cached
            shared = {}
        op, key = ops[i], keys[i] or ""
        start, end = bounds[i], bounds[i + 1]
        before = b"null"
        row_base = shared.get(op)
        if row_base is None:
            row_base = shared[op] = [*base, _OP_HEADERS.get(op) or (OP_HEADER, op)]
        if end - start != len(base):  # headers of its own (pg.before, pg.unchanged-toast)
            row = list(zip(*headers_of(start, end), strict=True))
            own = [v for k, v in row if k in _BEFORES]
            row_base = [*(p for p in row if p[0] not in _BEFORES), _OP_HEADERS.get(op) or (OP_HEADER, op)]
            if own:
                before = own[0].encode()
        value = values[i]
        sid = (offset << INDEX_BITS) | index
        index += 1
        ids.append(sid)
        times.append(created)
        out_topics.append(topic)
        out_keys.append(key)
        out_values.append(
            _BODY
            % (_OP_BYTES.get(op) or op.encode(), before, value if value is not None else b"null", source)
        )
        if trace_column is not None:
            traced = _trace_of(value, before, trace_column)
            if traced is not None:
                row_base = [*row_base, (TRACEPARENT, traced)]
        out_headers.append([*row_base, (SLUICE_ID, str(sid))])
        if tombstones and op == "delete":
            sid = (offset << INDEX_BITS) | index
            index += 1
            ids.append(sid)
            times.append(created)
            out_topics.append(topic)
            out_keys.append(key)
            out_values.append(None)
            out_headers.append([*row_base[:-1], (SLUICE_ID, str(sid))])
    return out


def _trace_of(after: bytes | None, before: bytes, column: str) -> str | None:
    """The text in ``column`` of the row (its new image, else its old one), if any."""
    for image in (after, before):
        if image is None or image == b"null":
            continue
        try:
            found = json.loads(image).get(column)
        except (ValueError, AttributeError):
            continue
        if isinstance(found, str):
            return found
    return None


def to_records(
    batch: pa.RecordBatch, topics: TopicMap, *, leader: str = "", tombstones: bool = False
) -> list[MarkedRecord]:
    """:func:`to_columns`, a :class:`MarkedRecord` each."""
    return to_columns(batch, topics, leader=leader, tombstones=tombstones).records()


_BODY = b'{"op":"%s","before":%s,"after":%s,"source":%s}'
#: The ``sluice.op`` header of each kind of change, and its name as bytes, made once.
_OP_HEADERS = {op: (OP_HEADER, op) for op in ("insert", "update", "delete", "truncate")}
_OP_BYTES = {op: op.encode() for op in _OP_HEADERS}
#: A transaction's (or copied chunk's) source object, commit time, shared headers and topic.
_Source = tuple[bytes, "datetime | None", list[tuple[str, str]], str]


def _source(
    namespace: str, micros: int | None, names: list[str], texts: list[str], topics: TopicMap
) -> _Source:
    """A transaction's (or copied chunk's) ``source`` object, commit time, the headers all its
    rows share (those of a row's own — its old row, its unchanged TOASTed columns — left out) and
    its topic."""
    found = dict(zip(names, texts, strict=True))
    created = None if micros is None else datetime.fromtimestamp(micros / 1e6, tz=UTC)
    xid = found.get("pg.xid")
    commit_time = None if created is None else created.isoformat()
    source: dict[str, Any]
    if FILE_HEADER in found:  # MariaDB/MySQL: the binlog's GTID and file/offset
        pos = found.get(POS_HEADER)
        source = {
            "table": namespace,
            "gtid": found.get(GTID_HEADER) or None,
            "file": found[FILE_HEADER],
            "pos": None if pos is None else int(pos),
            "commit_time": commit_time,
            "mode": found.get("sluice.mode", "sync"),
        }
    else:
        source = {
            "table": namespace,
            "lsn": found.get("pg.lsn"),
            "xid": None if xid is None else int(xid),
            "commit_time": commit_time,
            "mode": found.get("sluice.mode", "sync"),
        }
    text = json.dumps(source, separators=(",", ":"), ensure_ascii=False).encode()
    shared = [(k, v) for k, v in zip(names, texts, strict=True) if k in _SHARED]
    return text, created, shared, topics(namespace)
