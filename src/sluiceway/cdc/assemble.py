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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

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
from sluiceway.cdc.values import Kind, PgType, canonical_key, to_json
from sluiceway.errors import InvariantViolation

Row = tuple[int, int, bytes]  # (lsn, xid, data) as the slot returns them


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
        full = (self.xmax & ~0xFFFFFFFF) | xid
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
    keys: Sequence[str]
    values: Sequence[bytes]


@dataclass(frozen=True, slots=True)
class TableInfo:
    """What a record's key is made of: the primary key's columns, or every column (``None``)
    for a table without one (accepted with ``REPLICA IDENTITY FULL``)."""

    key_columns: tuple[str, ...] | None


@dataclass(slots=True)
class Columns:
    """Records as column lists, ready to become one Arrow batch (headers flattened)."""

    offset: list[int] = field(default_factory=list)
    namespace: list[str] = field(default_factory=list)
    op: list[str] = field(default_factory=list)
    key: list[str | None] = field(default_factory=list)
    value: list[bytes | None] = field(default_factory=list)
    timestamp: list[int] = field(default_factory=list)
    header_keys: list[str] = field(default_factory=list)
    header_values: list[str] = field(default_factory=list)
    header_offsets: list[int] = field(default_factory=lambda: [0])

    def __len__(self) -> int:
        return len(self.offset)

    def add(
        self,
        offset: int,
        namespace: str,
        op: str,
        key: str | None,
        value: bytes | None,
        timestamp: int,
        headers: Sequence[tuple[str, str]],
    ) -> None:
        self.offset.append(offset)
        self.namespace.append(namespace)
        self.op.append(op)
        self.key.append(key)
        self.value.append(value)
        self.timestamp.append(timestamp)
        for k, v in headers:
            self.header_keys.append(k)
            self.header_values.append(v)
        self.header_offsets.append(len(self.header_keys))


@dataclass(slots=True)
class Assembly:
    columns: Columns
    #: Position consumed: the batch's end offset (``start`` when nothing in range was complete).
    end: int
    #: A chunk whose window opened in range but whose close was not decoded (the batch stopped before it).
    pending: int | None = None
    #: Tables whose copy completed in range (the ``T`` marker), with the marker's position.
    completed: dict[str, int] = field(default_factory=dict)


TypeResolver = Callable[[Iterable[int]], Mapping[int, PgType]]
ChunkLoader = Callable[[int], Chunk | None]


# --- watermark messages ---------------------------------------------------------------------------
def watermark_prefix(slot: str) -> str:
    return f"sluice-cdc:{slot}"


def parse_watermark(content: bytes) -> tuple[str, str]:
    """``b"H 12"`` → ``("H", "12")``."""
    kind, _, arg = content.decode().partition(" ")
    return kind, arg


# --- decoding one relation's tuples ---------------------------------------------------------------
class _Table:
    """A relation as the stream last described it, with its JSON mapping and key positions."""

    __slots__ = ("full_row", "key_pos", "names", "namespace", "prefixes", "types")

    def __init__(self, rel: Relation, info: TableInfo, types: Mapping[int, PgType]) -> None:
        self.namespace = rel.namespace
        self.names = [c.name for c in rel.columns]
        self.prefixes = [to_json(name, NAME) + ":" for name in self.names]
        self.types = [types[c.type_oid] for c in rel.columns]
        self.full_row = info.key_columns is None
        if info.key_columns is None:
            self.key_pos = list(range(len(rel.columns)))
        else:
            position = {name: i for i, name in enumerate(self.names)}
            missing = [c for c in info.key_columns if c not in position]
            if missing:
                raise InvariantViolation(
                    f"{self.namespace}: key column(s) {missing} not in the change stream"
                )
            self.key_pos = [position[c] for c in info.key_columns]

    def key(self, values: Sequence[object]) -> str | None:
        """The record key; ``None`` when ``values`` (an old ``K`` tuple) does not hold it."""
        if self.full_row:
            return canonical_key([to_json(_text(values[i]), self.types[i]) for i in self.key_pos])
        texts = [values[i] for i in self.key_pos]
        if any(not isinstance(t, str) for t in texts):
            return None
        if len(texts) == 1:
            return texts[0]  # type: ignore[return-value]
        return canonical_key([to_json(t, self.types[i]) for t, i in zip(texts, self.key_pos, strict=True)])  # type: ignore[arg-type]

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


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


NAME = PgType(Kind.STRING)


# --- the assembler ---------------------------------------------------------------------------------
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


Pending = tuple[
    str, str, str | None, bytes | None, list[tuple[str, str]]
]  # namespace, op, key, value, headers


class _Assembler:
    def __init__(
        self,
        rows: Sequence[Row],
        start: int,
        upper: int | None,
        prefix: str,
        tables: Mapping[str, TableInfo],
        types: TypeResolver,
        chunks: ChunkLoader,
    ) -> None:
        self.start, self.upper, self.prefix = start, upper, prefix
        self.tables, self.types = tables, types
        self.out = Columns()
        self.end = start
        opened, self.closes = _scan_windows(rows, prefix)
        # Chunks whose whole window is in this decode, loaded up front: their snapshots decide
        # which keys, changed anywhere before their H, must be dropped from their rows.
        self.live: dict[int, Chunk] = {}
        for cid in opened:
            if self.closes.get(cid) == "H":
                chunk = chunks(cid)
                if chunk is None:
                    raise InvariantViolation(f"chunk {cid} was closed in the WAL but its rows are missing")
                self.live[cid] = chunk
        self.drops: dict[int, set[str]] = {cid: set() for cid in self.live}
        self.window: set[int] = set()
        self.completed: dict[str, int] = {}
        self.relations: dict[int, _Table | None] = {}

    def relation(self, rel: Relation) -> None:
        info = self.tables.get(rel.namespace)
        if info is None:
            self.relations[rel.relid] = None
        else:
            self.relations[rel.relid] = _Table(rel, info, self.types(c.type_oid for c in rel.columns))

    def change(self, data: bytes, pending: list[Pending], touched: list[str]) -> None:
        change = decode(data)
        if isinstance(change, Truncate):
            for relid in change.relids:
                table = self.relations.get(relid)
                if table is not None:
                    pending.append((table.namespace, "truncate", None, None, []))
                    touched.append(f"{table.namespace}\0*")
            return
        if not isinstance(change, Insert | Update | Delete):
            return
        table = self.relations.get(change.relid)
        if table is None:
            return
        if isinstance(change, Insert):
            key = table.key(change.new)
            value, _ = table.value(change.new, None)
            pending.append((table.namespace, "insert", key, value, []))
        elif isinstance(change, Update):
            key = table.key(change.new)
            if change.old is not None:
                old_key = table.key(change.old)
                if old_key is not None and old_key != key:
                    # The key itself changed: the old key is gone.
                    pending.append((table.namespace, "delete", old_key, None, []))
                    touched.append(f"{table.namespace}\0{old_key}")
            value, missing = table.value(change.new, change.old if change.old_kind == "O" else None)
            extra = [("pg.unchanged-toast", ",".join(missing))] if missing else []
            pending.append((table.namespace, "update", key, value, extra))
        else:
            key = table.key(change.old)
            pending.append((table.namespace, "delete", key, None, []))
        if key is not None:
            touched.append(f"{table.namespace}\0{key}")

    def commit(self, begin: Begin, commit: Commit, pending: list[Pending], touched: list[str]) -> None:
        """Emit one transaction in range, and note its keys against the chunks it outdates."""
        position = commit.end_lsn
        if pending:
            headers = [("pg.lsn", format_lsn(position)), ("pg.xid", str(begin.xid)), ("sluice.mode", "sync")]
            for namespace, op, key, value, extra in pending:
                self.out.add(position, namespace, op, key, value, begin.commit_time, headers + extra)
        if touched:
            for cid, drop in self.drops.items():
                if not self.live[cid].snapshot.sees(begin.xid):
                    drop.update(touched)
        self.end = position

    def watermark(self, msg: Message) -> int | None:
        """Act on one of our watermarks (a non-transactional message: its position is its LSN).

        Returns a chunk whose window opens here but whose close was not decoded: the batch must
        stop before it (the position stays before the ``L``)."""
        position = msg.lsn
        if msg.prefix == self.prefix:
            kind, arg = parse_watermark(msg.content)
            if kind == "L":
                cid = int(arg.split()[0])
                if cid not in self.closes:
                    return cid
                self.window.add(cid)
            elif kind == "H" and int(arg) in self.drops:
                cid = int(arg)
                if cid not in self.window:
                    raise InvariantViolation(
                        f"chunk {cid} closes at {format_lsn(position)} but its window began before this batch"
                    )
                _emit_chunk(self.out, self.live[cid], self.drops.pop(cid), position)
                self.window.discard(cid)
            elif kind in ("H", "A"):
                self.window.discard(int(arg))
            elif kind == "T":
                self.completed[arg] = position
        self.end = position
        return None


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
    asm = _Assembler(rows, start, upper, prefix, tables, types, chunks)
    begin: Begin | None = None
    in_range = False
    pending: list[Pending] = []
    touched: list[str] = []
    for _lsn, _xid, data in rows:
        kind = data[0]
        if kind == 0x52:  # 'R': tracked even out of range (later transactions refer to it)
            rel = decode(data)
            assert isinstance(rel, Relation)
            asm.relation(rel)
        elif kind == 0x42:  # 'B'
            decoded = decode(data)
            assert isinstance(decoded, Begin)
            begin = decoded
            in_range = begin.final_lsn >= start and (upper is None or begin.final_lsn < upper)
            pending, touched = [], []
        elif kind == 0x43:  # 'C'
            commit = decode(data)
            assert isinstance(commit, Commit) and begin is not None
            if in_range:
                asm.commit(begin, commit, pending, touched)
            begin = None
            if in_range and limit is not None and len(asm.out) >= limit and not asm.window:
                break
        elif kind == 0x4D:  # 'M'
            msg = decode(data)
            assert isinstance(msg, Message)
            # Our watermarks are non-transactional: they sit between transactions, at their LSN.
            if begin is None and msg.lsn > start and (upper is None or msg.lsn <= upper):
                blocked = asm.watermark(msg)
                if blocked is not None:
                    return Assembly(asm.out, asm.end, pending=blocked, completed=asm.completed)
                if limit is not None and len(asm.out) >= limit and not asm.window:
                    break
        elif in_range:
            asm.change(data, pending, touched)
    return Assembly(asm.out, asm.end, completed=asm.completed)


def _emit_chunk(out: Columns, chunk: Chunk, drop: set[str], position: int) -> None:
    headers = [("pg.lsn", format_lsn(position)), ("sluice.mode", "copy")]
    truncated = f"{chunk.namespace}\0*" in drop
    prefix = f"{chunk.namespace}\0"
    for key, value in zip(chunk.keys, chunk.values, strict=True):
        if truncated or (prefix + key) in drop:
            continue
        out.add(position, chunk.namespace, "insert", key, value, chunk.read_time, headers)
