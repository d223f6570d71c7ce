"""The data change data capture passes between its steps: positions, snapshots, chunks, and what
one decoded stretch of a slot holds. Plain values, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from sluiceway.cdc.values import PgType
from sluiceway.cdc.watermark import Watermark

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


TypeResolver = Callable[[Iterable[int]], Mapping[int, PgType]]
ChunkLoader = Callable[[int], Chunk | None]


@dataclass(slots=True)
class Stretch:
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
    # watermarks in range: (seq, position, watermark)
    marks: list[tuple[int, int, Watermark]] = field(default_factory=list)
    seq: int = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq
