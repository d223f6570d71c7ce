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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.cdc.columnar import Group, RowResult, decode_group
from sluiceway.cdc.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Relation,
    Truncate,
    Update,
    decode,
    format_lsn,
)
from sluiceway.cdc.values import Kind, PgType, composite_key, row_key, to_json
from sluiceway.errors import InvariantViolation
from sluiceway.journal.record import ARROW_SCHEMA

Row = tuple[int, int, bytes]  # (lsn, xid, data) as the slot returns them
_RELID = struct.Struct(">I")
_HEADERS = ARROW_SCHEMA.field("headers").type
_TIMESTAMP = ARROW_SCHEMA.field("timestamp").type


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A ``pg_current_snapshot()``: 64-bit ``xmin``, ``xmax`` and the in-progress ``xip``."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def __str__(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(str(x) for x in sorted(self.xip))}"

    def widen(self, xid: int) -> int:
        """The 64-bit id of a 32-bit ``xid`` seen near this snapshot (the one closest to xmax)."""
        full = int((self.xmax & ~0xFFFFFFFF) | xid)
        if full > self.xmax + 2**31:
            full -= 2**32
        elif full < self.xmax - 2**31:
            full += 2**32
        return full

    def sees(self, xid: int) -> bool:
        """Whether a transaction that committed (``xid``, 32-bit) is visible in this snapshot."""
        full = self.widen(xid)
        return full < self.xmin or (full < self.xmax and full not in self.xip)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One copied chunk: its rows (keys, JSON values) and the snapshot they were read in."""

    id: int
    namespace: str
    snapshot: Snapshot
    read_time: int  # µs since the Unix epoch
    keys: pa.Array  # string
    values: pa.Array  # binary


@dataclass(frozen=True, slots=True)
class TableInfo:
    """What a record's key is made of: the primary key's columns, or every column (``None``)
    for a table without one (accepted with ``REPLICA IDENTITY FULL``)."""

    key_columns: tuple[str, ...] | None


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


TypeResolver = Callable[[Iterable[int]], Mapping[int, PgType]]
ChunkLoader = Callable[[int], Chunk | None]


# --- watermark messages ---------------------------------------------------------------------------
def watermark_prefix(slot: str) -> str:
    return f"sluice-cdc:{slot}"


def parse_watermark(content: bytes) -> tuple[str, str]:
    """``b"H 12"`` → ``("H", "12")``."""
    kind, _, arg = content.decode().partition(" ")
    return kind, arg


# --- one relation, as the stream last described it -----------------------------------------------
class _Table:
    """A relation version: its JSON mapping and key positions; decodes one change value by value
    (the reference the column-wise decoder is held to, and its fallback)."""

    __slots__ = ("full_row", "key_pos", "key_positions", "names", "namespace", "prefixes", "types")

    def __init__(self, rel: Relation, info: TableInfo, types: Mapping[int, PgType]) -> None:
        self.namespace = rel.namespace
        self.names = [c.name for c in rel.columns]
        self.prefixes = [to_json(name, NAME) + ":" for name in self.names]
        self.types = [types[c.type_oid] for c in rel.columns]
        self.full_row = info.key_columns is None
        #: Key positions for the column-wise decoder; ``None``: the key is the whole row (value by value).
        self.key_positions: list[int] | None = None
        if info.key_columns is None:
            self.key_pos = list(range(len(rel.columns)))
        else:
            position = {name: i for i, name in enumerate(self.names)}
            missing = [c for c in info.key_columns if c not in position]
            if missing:
                raise InvariantViolation(f"{self.namespace}: key column(s) {missing} missing from the stream")
            self.key_pos = [position[c] for c in info.key_columns]
            self.key_positions = self.key_pos

    def key(self, values: Sequence[object]) -> str | None:
        """The record key; ``None`` when ``values`` (an old ``K`` tuple) does not hold it."""
        if self.full_row:
            import json

            return row_key([json.loads(to_json(_text(values[i]), self.types[i])) for i in self.key_pos])
        texts = [values[i] for i in self.key_pos]
        if any(not isinstance(t, str) for t in texts):
            return None
        if len(texts) == 1:
            return str(texts[0])
        return composite_key(
            [to_json(str(t), self.types[i]) for t, i in zip(texts, self.key_pos, strict=True)]
        )

    def value(self, new: Sequence[object], old: Sequence[object] | None) -> tuple[bytes, list[str]]:
        """The row as a JSON object; and the names of unchanged TOASTed columns left out of it."""
        parts = []
        missing: list[str] = []
        for i, text in enumerate(new):
            if text is UNCHANGED:
                if old is not None and old[i] is not UNCHANGED:
                    text = old[i]  # REPLICA IDENTITY FULL: the old row carries it
                else:
                    missing.append(self.names[i])
                    continue
            parts.append(self.prefixes[i] + to_json(_text(text), self.types[i]))
        return ("{" + ",".join(parts) + "}").encode(), missing

    def decode_one(self, data: bytes) -> RowResult:
        change = decode(data)
        if isinstance(change, Insert):
            value, _ = self.value(change.new, None)
            return RowResult(self.key(change.new), value)
        if isinstance(change, Update):
            key = self.key(change.new)
            old_key = self.key(change.old) if change.old is not None else None
            value, missing = self.value(change.new, change.old if change.old_kind == "O" else None)
            changed = old_key if old_key is not None and old_key != key else None
            return RowResult(key, value, changed, ",".join(missing))
        if isinstance(change, Delete):
            return RowResult(self.key(change.old), None)
        raise InvariantViolation(f"not a row change: {type(change).__name__}")


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


NAME = PgType(Kind.STRING)
_OPS = {0x49: "insert", 0x55: "update", 0x44: "delete"}


# --- pass 1: the structure of the stretch ----------------------------------------------------------
@dataclass(slots=True)
class _Stretch:
    """What pass 1 finds: transactions, their changes (flat, in stream order), watermarks.

    Every change, truncate and watermark gets a sequence number in stream order; pass 3 places
    records by it (a changed key's delete just before its change, a chunk's rows at its H)."""

    # per transaction
    positions: list[int] = field(default_factory=list)
    xids: list[int] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    first_item: list[int] = field(default_factory=list)
    commit_seq: list[int] = field(default_factory=list)
    # per change
    item_group: list[int] = field(default_factory=list)
    item_row: list[int] = field(default_factory=list)
    item_txn: list[int] = field(default_factory=list)
    item_seq: list[int] = field(default_factory=list)
    # per truncated relation: (seq, transaction, group)
    truncates: list[tuple[int, int, int]] = field(default_factory=list)
    # watermarks in range: (seq, position, kind, argument)
    marks: list[tuple[int, int, str, str]] = field(default_factory=list)
    seq: int = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


@dataclass(slots=True)
class _Groups:
    """Changes gathered per relation version, to be decoded column-wise."""

    tables: list[_Table] = field(default_factory=list)
    datas: list[list[bytes]] = field(default_factory=list)
    ops: list[list[int]] = field(default_factory=list)

    def add(self, table: _Table) -> int:
        self.tables.append(table)
        self.datas.append([])
        self.ops.append([])
        return len(self.tables) - 1


def _scan_windows(rows: Sequence[Row], prefix: str) -> tuple[set[int], dict[int, str]]:
    """Chunks whose ``L`` is in the decode, and how each chunk's window closes (``H``/``A``)."""
    opened: set[int] = set()
    closes: dict[int, str] = {}
    for _lsn, _xid, data in rows:
        if data[0] != 0x4D:  # 'M'
            continue
        msg = decode(data)
        assert isinstance(msg, Message)
        if msg.prefix != prefix or msg.transactional:
            continue
        kind, arg = parse_watermark(msg.content)
        if kind == "L":
            opened.add(int(arg.split()[0]))
        elif kind in ("H", "A") and int(arg) not in closes:
            closes[int(arg)] = kind  # the first close wins: the WAL decides, not the copier's state
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
        if closes.get(cid) == "H":
            chunk = chunks(cid)
            if chunk is None:
                raise InvariantViolation(f"chunk {cid} was closed in the WAL but its rows are missing")
            live[cid] = chunk

    # Pass 1: transactions and watermarks in range, their changes gathered per relation version.
    groups = _Groups()
    stretch = _Stretch()
    relations: dict[int, int | None] = {}  # relid → group of its current version (None: not captured)
    window: set[int] = set()
    end = start
    pending: int | None = None
    txn: int | None = None  # the transaction being read, when in range
    begin: Begin | None = None
    for _lsn, _xid, data in rows:
        kind = data[0]
        if kind in (0x49, 0x55, 0x44):  # I, U, D: the bulk of a stretch
            if txn is not None:
                (relid,) = _RELID.unpack_from(data, 1)
                gid = relations.get(relid)
                if gid is not None:
                    stretch.item_group.append(gid)
                    stretch.item_row.append(len(groups.datas[gid]))
                    stretch.item_txn.append(txn)
                    stretch.item_seq.append(stretch.next_seq())
                    groups.datas[gid].append(data)
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
                else groups.add(_Table(rel, info, types(c.type_oid for c in rel.columns)))
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
                wkind, arg = parse_watermark(msg.content)
                if wkind == "L":
                    cid = int(arg.split()[0])
                    if cid not in closes:
                        pending = cid  # stop before the window; the position stays before the L
                        break
                    window.add(cid)
                elif wkind in ("H", "A"):
                    window.discard(int(arg))
                stretch.marks.append((stretch.next_seq(), msg.lsn, wkind, arg))
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
    decoded = [
        decode_group(
            datas, table.names, table.types, None if table.full_row else table.key_pos, _one(table, datas)
        )
        for table, datas in zip(groups.tables, groups.datas, strict=True)
    ]
    # Pass 3: the records in stream order (copied rows at their H, less what the stream outdated).
    return _build(stretch, groups, decoded, live, end, pending)


def _counted(stretch: _Stretch, live: Mapping[int, Chunk]) -> int:
    copied = sum(
        len(live[int(arg)].keys) for _s, _p, kind, arg in stretch.marks if kind == "H" and int(arg) in live
    )
    return len(stretch.item_seq) + len(stretch.truncates) + copied


def _one(table: _Table, datas: list[bytes]) -> Callable[[int], RowResult]:
    return lambda i: table.decode_one(datas[i])


# --- pass 3: the output batch ----------------------------------------------------------------------
class _Parts:
    """Records gathered as columns of parts (the decoded changes, made-up deletes and truncates,
    chunk rows), each record with a sequence number; one stable sort puts them in stream order."""

    def __init__(self) -> None:
        self.seq: list[np.ndarray] = []
        self.offset: list[np.ndarray] = []
        self.namespace: list[pa.Array] = []
        self.op: list[pa.Array] = []
        self.key: list[pa.Array] = []
        self.value: list[pa.Array] = []
        self.block: list[np.ndarray] = []
        self.timestamp: list[np.ndarray] = []
        self.blocks: list[list[tuple[str, str]]] = []

    def add_block(self, pairs: list[tuple[str, str]]) -> int:
        self.blocks.append(pairs)
        return len(self.blocks) - 1

    def add(
        self,
        seq: np.ndarray,
        offset: np.ndarray,
        namespace: pa.Array,
        op: pa.Array,
        key: pa.Array,
        value: pa.Array,
        block: np.ndarray,
        timestamp: np.ndarray,
    ) -> None:
        if len(seq):
            self.seq.append(seq)
            self.offset.append(offset)
            self.namespace.append(namespace)
            self.op.append(op)
            self.key.append(key.cast(pa.string()))
            self.value.append(value.cast(pa.binary()))
            self.block.append(block)
            self.timestamp.append(timestamp)

    def batch(self) -> pa.RecordBatch:
        if not self.seq:
            return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
        order = pa.array(np.argsort(np.concatenate(self.seq), kind="stable"))
        blocks = pa.array([[{"key": k, "value": v} for k, v in pairs] for pairs in self.blocks], _HEADERS)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(np.concatenate(self.offset)).take(order),
                pa.concat_arrays(self.namespace).take(order),
                pa.concat_arrays(self.op).take(order),
                pa.concat_arrays(self.key).take(order),
                pa.concat_arrays(self.value).take(order),
                blocks.take(pa.array(np.concatenate(self.block)).take(order)),
                pa.array(np.concatenate(self.timestamp), pa.int64()).take(order).cast(_TIMESTAMP),
            ],
            schema=ARROW_SCHEMA,
        )


def _repeat(value: str, n: int) -> pa.Array:
    return pa.array([value], pa.string()).take(pa.array(np.zeros(n, dtype=np.int64)))


_OP_NAMES = pa.array(["insert", "update", "delete"], pa.string())
_OP_CODE = np.zeros(256, dtype=np.int64)
_OP_CODE[0x55], _OP_CODE[0x44] = 1, 2


def _build(
    stretch: _Stretch,
    groups: _Groups,
    decoded: list[Group],
    live: Mapping[int, Chunk],
    end: int,
    pending: int | None,
) -> Assembly:
    parts = _Parts()
    positions = np.asarray(stretch.positions, dtype=np.int64)
    times = np.asarray(stretch.times, dtype=np.int64)
    txn_block = np.asarray(
        [
            parts.add_block([("pg.lsn", format_lsn(p)), ("pg.xid", str(x)), ("sluice.mode", "sync")])
            for p, x in zip(stretch.positions, stretch.xids, strict=True)
        ],
        dtype=np.int64,
    )
    gid = np.asarray(stretch.item_group, dtype=np.int64)
    row = np.asarray(stretch.item_row, dtype=np.int64)
    txn = np.asarray(stretch.item_txn, dtype=np.int64)
    seq = np.asarray(stretch.item_seq, dtype=np.int64) * 2
    completed: dict[str, int] = {}
    for g, group in enumerate(decoded):
        mine = np.flatnonzero(gid == g)
        if not len(mine):
            continue
        rows_here = row[mine]
        take = pa.array(rows_here)
        ops = _OP_CODE[np.asarray(groups.ops[g], dtype=np.int64)[rows_here]]
        namespace = _repeat(groups.tables[g].namespace, len(mine))
        blocks = txn_block[txn[mine]]
        if group.missing:
            blocks = blocks.copy()
            for i, r in enumerate(rows_here.tolist()):
                if r in group.missing:
                    t = int(txn[mine][i])
                    blocks[i] = parts.add_block(
                        [*parts.blocks[int(txn_block[t])], ("pg.unchanged-toast", group.missing[r])]
                    )
        parts.add(
            seq[mine],
            positions[txn[mine]],
            namespace,
            _OP_NAMES.take(pa.array(ops)),
            group.keys.take(take),
            group.values.take(take),
            blocks,
            times[txn[mine]],
        )
        # A changed key: the old key is gone, just before the change.
        old = group.old_keys.take(take)
        changed = np.flatnonzero(pc.is_valid(old).to_numpy(zero_copy_only=False))
        if len(changed):
            at = mine[changed]
            parts.add(
                seq[at] - 1,
                positions[txn[at]],
                _repeat(groups.tables[g].namespace, len(at)),
                _repeat("delete", len(at)),
                old.take(pa.array(changed)),
                pa.nulls(len(at), pa.binary()),
                txn_block[txn[at]],
                times[txn[at]],
            )
    for s, t, g in stretch.truncates:
        one = np.asarray([s * 2], dtype=np.int64)
        parts.add(
            one,
            positions[[t]],
            _repeat(groups.tables[g].namespace, 1),
            _repeat("truncate", 1),
            pa.nulls(1, pa.string()),
            pa.nulls(1, pa.binary()),
            txn_block[[t]],
            times[[t]],
        )
    drops = _drops(stretch, groups, decoded, live) if live else {}
    started: set[int] = set()
    for s, position, kind, arg in stretch.marks:
        if kind == "L":
            started.add(int(arg.split()[0]))
        elif kind == "H" and int(arg) in live:
            cid = int(arg)
            if cid not in started:
                raise InvariantViolation(
                    f"chunk {cid} closes at {format_lsn(position)} but its window began before this batch"
                )
            _chunk_rows(parts, live[cid], drops.get(cid, set()), s * 2, position)
        elif kind == "T":
            completed[arg] = position
    return Assembly(parts.batch(), end, pending=pending, completed=completed)


def _drops(
    stretch: _Stretch, groups: _Groups, decoded: list[Group], live: Mapping[int, Chunk]
) -> dict[int, set[str]]:
    """Per chunk: the keys (``namespace\\0key``) that transactions its snapshot did not see changed
    before its H — the stream carries a newer state of those than the chunk's rows."""
    h_seq = {int(arg): s for s, _p, kind, arg in stretch.marks if kind == "H" and int(arg) in live}
    keys = [g.keys.to_pylist() for g in decoded]
    old = [g.old_keys.to_pylist() for g in decoded]
    drops: dict[int, set[str]] = {cid: set() for cid in h_seq}
    truncated: dict[int, list[str]] = {}
    for _s, t, g in stretch.truncates:
        truncated.setdefault(t, []).append(f"{groups.tables[g].namespace}\0*")
    bounds = [*stretch.first_item, len(stretch.item_seq)]
    for t in range(len(stretch.positions)):
        xid = stretch.xids[t]
        touched: list[str] = list(truncated.get(t, []))
        for i in range(bounds[t], bounds[t + 1]):
            g, r = stretch.item_group[i], stretch.item_row[i]
            namespace = groups.tables[g].namespace
            if keys[g][r] is not None:
                touched.append(f"{namespace}\0{keys[g][r]}")
            if old[g][r] is not None:
                touched.append(f"{namespace}\0{old[g][r]}")
        if not touched:
            continue
        for cid, s in h_seq.items():
            if stretch.commit_seq[t] < s and not live[cid].snapshot.sees(xid):
                drops[cid].update(touched)
    return drops


def _chunk_rows(parts: _Parts, chunk: Chunk, drop: set[str], seq: int, position: int) -> None:
    if f"{chunk.namespace}\0*" in drop:
        return
    keys, values = chunk.keys, chunk.values
    prefix = f"{chunk.namespace}\0"
    dropped = [k[len(prefix) :] for k in drop if k.startswith(prefix)]
    if dropped:
        keep = pc.invert(pc.is_in(keys, pa.array(dropped, pa.string())))
        keys, values = keys.filter(keep), values.filter(keep)
    n = len(keys)
    block = parts.add_block([("pg.lsn", format_lsn(position)), ("sluice.mode", "copy")])
    parts.add(
        np.full(n, seq, dtype=np.int64),
        np.full(n, position, dtype=np.int64),
        _repeat(chunk.namespace, n),
        _repeat("insert", n),
        keys,
        values,
        np.full(n, block, dtype=np.int64),
        np.full(n, chunk.read_time, dtype=np.int64),
    )
