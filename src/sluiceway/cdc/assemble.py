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
from sluiceway.cdc.pgoutput import (
    BEGIN,
    COMMIT,
    DELETE,
    INSERT,
    MESSAGE,
    RELATION,
    TRUNCATE,
    UPDATE,
    Begin,
    Commit,
    Message,
    Relation,
    Truncate,
    decode,
)
from sluiceway.cdc.records import build_records
from sluiceway.cdc.relation import RelationDecoder
from sluiceway.cdc.watermark import Mark, Watermark
from sluiceway.errors import InvariantViolation

_RELID = struct.Struct(">I")
#: The messages that are row changes (the bulk of a stretch).
_ROW_CHANGES = frozenset((INSERT, UPDATE, DELETE))


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


@dataclass(slots=True)
class _Reader:
    """Pass 1 of :func:`assemble` over the messages that are not row changes: where transactions
    begin and commit, the relations, truncates and watermarks, and where the batch ends."""

    start: int
    upper: int | None
    limit: int | None
    prefix: str
    tables: Mapping[str, TableInfo]
    types: TypeResolver
    live: Mapping[int, Chunk]
    closes: Mapping[int, Mark]
    groups: _Groups = field(default_factory=_Groups)
    stretch: Stretch = field(default_factory=Stretch)
    #: relid → the group of its current version (None: a table not captured)
    relations: dict[int, int | None] = field(default_factory=dict)
    #: Chunks whose window is open (between their L and H/A).
    window: set[int] = field(default_factory=set)
    #: The position reached.
    end: int = 0
    pending: int | None = None
    #: The transaction being read (its index in the stretch), when in range.
    txn: int | None = None
    began: Begin | None = None

    def begin(self, data: bytes) -> int | None:
        """A transaction begins: its index in the stretch if it is in range, else None."""
        message = decode(data)
        assert isinstance(message, Begin)
        self.began = message
        stretch, upper = self.stretch, self.upper
        in_range = message.final_lsn >= self.start and (upper is None or message.final_lsn < upper)
        self.txn = len(stretch.positions) if in_range else None
        if self.txn is not None:
            stretch.positions.append(0)
            stretch.xids.append(message.xid)
            stretch.times.append(message.commit_time)
            stretch.first_item.append(len(stretch.item_seq))
            stretch.commit_seq.append(0)
        return self.txn

    def commit(self, data: bytes) -> bool:
        """A transaction commits; True: the batch ends here (its limit reached outside a window)."""
        commit = decode(data)
        assert isinstance(commit, Commit)
        was, self.txn, self.began = self.txn, None, None
        if was is None:
            return False
        stretch = self.stretch
        stretch.positions[was] = self.end = commit.end_lsn
        stretch.commit_seq[was] = stretch.next_seq()
        return self._full()

    def relation(self, data: bytes) -> None:
        rel = decode(data)
        assert isinstance(rel, Relation)
        info = self.tables.get(rel.namespace)
        self.relations[rel.relid] = (
            None
            if info is None
            else self.groups.add(RelationDecoder(rel, info, self.types(c.type_oid for c in rel.columns)))
        )

    def truncate(self, data: bytes) -> None:
        truncate = decode(data)
        assert isinstance(truncate, Truncate)
        if self.txn is None:
            return
        for relid in truncate.relids:
            gid = self.relations.get(relid)
            if gid is not None:
                self.stretch.truncates.append((self.stretch.next_seq(), self.txn, gid))

    def message(self, data: bytes) -> bool:
        """A logical decoding message; True: the batch ends here (before a window whose close is
        not in this decode, or at its limit outside a window)."""
        msg = decode(data)
        assert isinstance(msg, Message)
        upper = self.upper
        # Our watermarks are non-transactional: they sit between transactions, at their LSN.
        if self.began is not None or msg.lsn <= self.start or (upper is not None and msg.lsn > upper):
            return False
        if msg.prefix == self.prefix:
            mark = Watermark.parse(msg.content)
            if mark.kind is Mark.OPEN and mark.chunk is not None:
                if mark.chunk not in self.closes:
                    self.pending = mark.chunk  # stop before the window; the position stays before the L
                    return True
                self.window.add(mark.chunk)
            elif mark.closes and mark.chunk is not None:
                self.window.discard(mark.chunk)
            self.stretch.marks.append((self.stretch.next_seq(), msg.lsn, mark))
        self.end = msg.lsn
        return self._full()

    def cut_unfinished(self) -> None:
        """A transaction cut off by the end of the decode is not in this batch."""
        txn, stretch = self.txn, self.stretch
        if txn is None:
            return
        cut = stretch.first_item[txn]
        per_txn = (stretch.positions, stretch.xids, stretch.times, stretch.first_item, stretch.commit_seq)
        for column in per_txn:
            del column[txn:]
        for column in (stretch.item_group, stretch.item_row, stretch.item_txn, stretch.item_seq):
            del column[cut:]
        stretch.truncates = [t for t in stretch.truncates if t[1] < txn]

    def _full(self) -> bool:
        return self.limit is not None and _counted(self.stretch, self.live) >= self.limit and not self.window


def _scan_windows(rows: Sequence[Row], prefix: str) -> tuple[set[int], dict[int, Mark]]:
    """Chunks whose ``L`` is in the decode, and how each chunk's window closes (``H``/``A``)."""
    opened: set[int] = set()
    closes: dict[int, Mark] = {}
    for _lsn, _xid, data in rows:
        if data[0] != MESSAGE:
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
    # The loop runs once per row of the stretch: its hot branch (row changes) uses local names
    # only; the other kinds of message go to the reader's methods.
    reader = _Reader(start, upper, limit, prefix, tables, types, live, closes, end=start)
    groups, stretch, relations = reader.groups, reader.stretch, reader.relations
    unpack_relid = _RELID.unpack_from
    item_group, item_row, item_txn, item_seq = (
        stretch.item_group,
        stretch.item_row,
        stretch.item_txn,
        stretch.item_seq,
    )
    row_changes = _ROW_CHANGES
    txn: int | None = None  # the transaction being read, when in range (the reader's, kept local)
    for _lsn, _xid, data in rows:
        kind = data[0]
        if kind in row_changes:  # the bulk of a stretch
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
        elif kind == BEGIN:
            txn = reader.begin(data)
        elif kind == COMMIT:
            txn = None
            if reader.commit(data):
                break
        elif kind == RELATION:  # tracked even out of range (later transactions refer to it)
            reader.relation(data)
        elif kind == TRUNCATE:
            reader.truncate(data)
        elif kind == MESSAGE and reader.message(data):
            break
    reader.cut_unfinished()

    # Pass 2: every relation version's changes, decoded column by column.
    changes = [
        decode_group(datas, table.names, table.types, table.key_positions, _one(table, datas))
        for table, datas in zip(groups.tables, groups.datas, strict=True)
    ]
    # Pass 3: the records in stream order (copied rows at their H, less what the stream outdated).
    namespaces = [t.namespace for t in groups.tables]
    batch, completed = build_records(stretch, namespaces, groups.ops, changes, live)
    return Assembly(batch, reader.end, pending=reader.pending, completed=completed)


def _counted(stretch: Stretch, live: Mapping[int, Chunk]) -> int:
    copied = sum(
        len(live[mark.chunk].keys)
        for _s, _p, mark in stretch.marks
        if mark.kind is Mark.CLOSE and mark.chunk is not None and mark.chunk in live
    )
    return len(stretch.item_seq) + len(stretch.truncates) + copied


def _one(table: RelationDecoder, datas: list[bytes]) -> Callable[[int], RowResult]:
    return lambda i: table.decode_one(datas[i])
