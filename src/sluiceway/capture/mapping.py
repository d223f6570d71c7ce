"""Captured changes as messages: topic, key, value, headers and a sequence id per change. Pure.

A change's message::

    key     the primary key as in the CDC records (one column: its text; several: a JSON array)
    value   {"op": "update", "before": {...old row...} or null, "after": {...row...},
             "source": {"table": "public.orders", "lsn": "0/1A2B3C8", "xid": 771,
                        "commit_time": "2026-11-27T01:02:03.456789+00:00", "mode": "sync"}}
    headers pg.lsn, pg.xid, sluice.mode, sluice.op (as the pipeline's CDC records), sluice-id

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

import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.cdc.records import BEFORE_HEADER
from sluiceway.harvest.sequence import SLUICE_ID
from sluiceway.journal.record import OP_HEADER
from sluiceway.outbox.record import MarkedRecord

#: The headers every record of a transaction (or copied chunk) has; others are a row's own.
_SHARED = frozenset({"pg.lsn", "pg.xid", "sluice.mode"})
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


def to_records(
    batch: pa.RecordBatch, topics: TopicMap, *, leader: str = "", tombstones: bool = False
) -> list[MarkedRecord]:
    """The batch's changes (the capture's record schema) as records to publish, in stream order."""
    n = batch.num_rows
    if not n:
        return []
    offsets = batch.column("offset").to_pylist()
    namespaces = batch.column("namespace").to_pylist()
    ops = batch.column("op").to_pylist()
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    headers = batch.column("headers").to_pylist()
    micros = pc.cast(batch.column("timestamp"), pa.int64()).to_pylist()
    out: list[MarkedRecord] = []
    append = out.append
    sources: dict[tuple[int, str], tuple[bytes, datetime | None, tuple[tuple[str, str], ...]]] = {}
    run_offset, index = -1, 0
    for i in range(n):
        offset = offsets[i]
        if offset != run_offset:
            run_offset, index = offset, 0
        namespace, op, key, value = namespaces[i], ops[i], keys[i], values[i]
        pairs = headers[i] or []
        slot = (offset, namespace)
        cached = sources.get(slot)
        if cached is None:
            cached = _source(namespace, micros[i], pairs)
            sources[slot] = cached
        source, created, base = cached
        before = b"null"
        if len(pairs) != len(base):  # headers of its own (pg.before, pg.unchanged-toast)
            base = tuple((p["key"], p["value"]) for p in pairs if p["key"] != BEFORE_HEADER)
            before = next((p["value"].encode() for p in pairs if p["key"] == BEFORE_HEADER), b"null")
        sid = (offset << INDEX_BITS) | index
        index += 1
        body = b'{"op":"%s","before":%s,"after":%s,"source":%s}' % (
            op.encode(),
            before,
            value if value is not None else b"null",
            source,
        )
        topic = topics(namespace)
        append(
            MarkedRecord(
                sid, created, topic, key or "", body, (*base, (OP_HEADER, op), (SLUICE_ID, str(sid))), leader
            )
        )
        if tombstones and op == "delete":
            sid = (offset << INDEX_BITS) | index
            index += 1
            append(MarkedRecord(sid, created, topic, key or "", None, (*base, (SLUICE_ID, str(sid))), leader))
    return out


def _source(
    namespace: str, micros: int | None, pairs: list[dict[str, str]]
) -> tuple[bytes, datetime | None, tuple[tuple[str, str], ...]]:
    """A transaction's (or copied chunk's) ``source`` object, commit time and the headers all its
    rows share (those of a row's own — its old row, its unchanged TOASTed columns — left out)."""
    found = {p["key"]: p["value"] for p in pairs}
    created = None if micros is None else datetime.fromtimestamp(micros / 1e6, tz=UTC)
    xid = found.get("pg.xid")
    source = {
        "table": namespace,
        "lsn": found.get("pg.lsn"),
        "xid": None if xid is None else int(xid),
        "commit_time": None if created is None else created.isoformat(),
        "mode": found.get("sluice.mode", "sync"),
    }
    text = json.dumps(source, separators=(",", ":"), ensure_ascii=False).encode()
    return text, created, tuple((p["key"], p["value"]) for p in pairs if p["key"] in _SHARED)
