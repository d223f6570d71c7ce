"""Turning one decoded stretch of a logical slot into records: pure, deterministic, no I/O.

Input: the rows ``(lsn, xid, data)`` of ``pg_logical_slot_peek_binary_changes`` — everything the
slot holds from its confirmed position on, in commit order — and a range ``(start, upper]`` of
*positions*. A transaction's position is the end of its commit record (``Commit.end_lsn``); a
non-transactional message's is its own LSN. Output: the records of the transactions in range,
each change one record (its ``offset`` is its transaction's position, so offsets grow in stream
order and per-key order is commit order), plus the rows of copied chunks, and the position
reached.

Copied chunks (the watermark method of Netflix's DBLog, sharpened for PostgreSQL): the copier
writes ``L <chunk>`` into the WAL, reads the chunk of rows under a snapshot ``S``, saves them,
then writes ``H <chunk>`` (or ``A <chunk>`` when it gave up). At ``H`` the chunk's rows are
emitted — less every key changed by a transaction that ``S`` did not see yet committed before
``H``: the stream already carried a newer state of that key, which the old row must not
overwrite. Transactions ``S`` did see are older than the rows, so those rows stay (and an
update that left a TOASTed column out never replaces a full copied row). Transactions
committing after ``H`` come after the rows. Where ``PostgreSQL`` makes a commit visible after
writing its WAL record, a transaction can precede ``L`` in the WAL and still be invisible to
``S``: it is found by its xid anywhere in the decoded range, not only between ``L`` and ``H``.

A batch never ends inside a window (between ``L`` and its ``H``/``A``): the chunk's rows need
every change in between. When the close is not in this decode, the batch stops before ``L``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from sluiceway.cdc.columnar import RowResult, decode_group
from sluiceway.cdc.model import Chunk, ChunkLoader, Row, Stretch, TableInfo, TypeResolver
from sluiceway.cdc.pgoutput import Begin, Commit, Message, Relation, Truncate, decode
from sluiceway.cdc.records import build_records
from sluiceway.cdc.relation import RelationDecoder
from sluiceway.cdc.watermark import Mark, Watermark
from sluiceway.errors import InvariantViolation

_RELID = struct.Struct(">I")


@dataclass(slots=True)
class Assembly:
    #: The records, in the pipeline's record shape.
    batch: pa.RecordBatch
    #: Position consumed: the batch's end offset (``start`` when nothing in range was complete).
    end: int
    #: A chunk whose window opened in range but whose close was not decoded (the batch stopped before it).
    pending: int | None = None
    #: Tables whose copy completed in range (the ``T`` marker), with the marker's position.
    completed: dict[str, int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return int(self.batch.num_rows)


@dataclass(slots=True)
class _Groups:
    """Changes gathered per relation version, to be decoded column-wise."""

    tables: list[RelationDecoder] = field(default_factory=list)
    datas: list[list[bytes]] = field(default_factory=list)
    ops: list[list[int]] = field(default_factory=list)

    def add(self, table: RelationDecoder) -> int:
        self.tables.append(table)
        self.datas.append([])
        self.ops.append([])
        return len(self.tables) - 1


def _scan_windows(rows: Sequence[Row], prefix: str) -> tuple[set[int], dict[int, Mark]]:
    """Chunks whose ``L`` is in the decode, and how each chunk's window closes (``H``/``A``)."""
    opened: set[int] = set()
    closes: dict[int, Mark] = {}
    for _lsn, _xid, data in rows:
        if data[0] != 0x4D:  # 'M'
            continue
        msg = decode(data)
        assert isinstance(msg, Message)
        if msg.prefix != prefix or msg.transactional:
            continue
        mark = Watermark.parse(msg.content)
        if mark.kind is Mark.OPEN and mark.chunk is not None:
            opened.add(mark.chunk)
        elif mark.closes and mark.chunk is not None and mark.chunk not in closes:
            closes[mark.chunk] = mark.kind  # the first close wins: the WAL decides, not the copier's state
    return opened, closes


def assemble(
    rows: Sequence[Row],
    *,
    start: int,
    upper: int | None = None,
    limit: int | None = None,
    prefix: str,
    tables: Mapping[str, TableInfo],
    types: TypeResolver,
    chunks: ChunkLoader,
) -> Assembly:
    """Records of the transactions with position in ``(start, upper]``; see the module docstring.

    ``limit``: stop at the first transaction boundary (outside a window) once this many records
    were produced. ``tables``: the captured tables by ``schema.table`` (changes of others are
    passed over, but still move the position).
    """
    opened, closes = _scan_windows(rows, prefix)
    # Chunks whose whole window is in this decode, loaded up front: their snapshots decide which
    # keys, changed anywhere before their H, must be dropped from their rows.
    live: dict[int, Chunk] = {}
    for cid in opened:
        if closes.get(cid) is Mark.CLOSE:
            chunk = chunks(cid)
            if chunk is None:
                raise InvariantViolation(f"chunk {cid} was closed in the WAL but its rows are missing")
            live[cid] = chunk

    # Pass 1: transactions and watermarks in range, their changes gathered per relation version.
    groups = _Groups()
    stretch = Stretch()
    relations: dict[int, int | None] = {}  # relid → group of its current version (None: not captured)
    window: set[int] = set()
    end = start
    pending: int | None = None
    txn: int | None = None  # the transaction being read, when in range
    begin: Begin | None = None
    # The loop below runs once per row of the stretch: its hot branch (row changes) uses local
    # names only.
    unpack_relid = _RELID.unpack_from
    item_group, item_row, item_txn, item_seq = (
        stretch.item_group,
        stretch.item_row,
        stretch.item_txn,
        stretch.item_seq,
    )
    for _lsn, _xid, data in rows:
        kind = data[0]
        if kind == 0x49 or kind == 0x55 or kind == 0x44:  # I, U, D: the bulk of a stretch
            if txn is not None:
                gid = relations.get(unpack_relid(data, 1)[0])
                if gid is not None:
                    held = groups.datas[gid]
                    item_group.append(gid)
                    item_row.append(len(held))
                    item_txn.append(txn)
                    stretch.seq += 1
                    item_seq.append(stretch.seq)
                    held.append(data)
                    groups.ops[gid].append(kind)
        elif kind == 0x42:  # 'B'
            message = decode(data)
            assert isinstance(message, Begin)
            begin = message
            in_range = begin.final_lsn >= start and (upper is None or begin.final_lsn < upper)
            txn = len(stretch.positions) if in_range else None
            if txn is not None:
                stretch.positions.append(0)
                stretch.xids.append(begin.xid)
                stretch.times.append(begin.commit_time)
                stretch.first_item.append(len(stretch.item_seq))
                stretch.commit_seq.append(0)
        elif kind == 0x43:  # 'C'
            commit = decode(data)
            assert isinstance(commit, Commit)
            was, txn, begin = txn, None, None
            if was is None:
                continue
            stretch.positions[was] = end = commit.end_lsn
            stretch.commit_seq[was] = stretch.next_seq()
            if limit is not None and _counted(stretch, live) >= limit and not window:
                break
        elif kind == 0x52:  # 'R': tracked even out of range (later transactions refer to it)
            rel = decode(data)
            assert isinstance(rel, Relation)
            info = tables.get(rel.namespace)
            relations[rel.relid] = (
                None
                if info is None
                else groups.add(RelationDecoder(rel, info, types(c.type_oid for c in rel.columns)))
            )
        elif kind == 0x54:  # 'T'
            truncate = decode(data)
            assert isinstance(truncate, Truncate)
            if txn is not None:
                for relid in truncate.relids:
                    gid = relations.get(relid)
                    if gid is not None:
                        stretch.truncates.append((stretch.next_seq(), txn, gid))
        elif kind == 0x4D:  # 'M'
            msg = decode(data)
            assert isinstance(msg, Message)
            # Our watermarks are non-transactional: they sit between transactions, at their LSN.
            if begin is not None or msg.lsn <= start or (upper is not None and msg.lsn > upper):
                continue
            if msg.prefix == prefix:
                mark = Watermark.parse(msg.content)
                if mark.kind is Mark.OPEN and mark.chunk is not None:
                    if mark.chunk not in closes:
                        pending = mark.chunk  # stop before the window; the position stays before the L
                        break
                    window.add(mark.chunk)
                elif mark.closes and mark.chunk is not None:
                    window.discard(mark.chunk)
                stretch.marks.append((stretch.next_seq(), msg.lsn, mark))
            end = msg.lsn
            if limit is not None and _counted(stretch, live) >= limit and not window:
                break
    if txn is not None:  # a transaction cut off by the end of the decode is not in this batch
        cut = stretch.first_item[txn]
        per_txn = (stretch.positions, stretch.xids, stretch.times, stretch.first_item, stretch.commit_seq)
        for column in per_txn:
            del column[txn:]
        for column in (stretch.item_group, stretch.item_row, stretch.item_txn, stretch.item_seq):
            del column[cut:]
        stretch.truncates = [t for t in stretch.truncates if t[1] < txn]

    # Pass 2: every relation version's changes, decoded column by column.
    changes = [
        decode_group(datas, table.names, table.types, table.key_positions, _one(table, datas))
        for table, datas in zip(groups.tables, groups.datas, strict=True)
    ]
    # Pass 3: the records in stream order (copied rows at their H, less what the stream outdated).
    namespaces = [t.namespace for t in groups.tables]
    batch, completed = build_records(stretch, namespaces, groups.ops, changes, live)
    return Assembly(batch, end, pending=pending, completed=completed)


def _counted(stretch: Stretch, live: Mapping[int, Chunk]) -> int:
    copied = sum(
        len(live[mark.chunk].keys)
        for _s, _p, mark in stretch.marks
        if mark.kind is Mark.CLOSE and mark.chunk is not None and mark.chunk in live
    )
    return len(stretch.item_seq) + len(stretch.truncates) + copied


def _one(table: RelationDecoder, datas: list[bytes]) -> Callable[[int], RowResult]:
    return lambda i: table.decode_one(datas[i])
