"""A stretch of the binlog → records in binlog order, with the copy's chunks in place: pure.

The binlog reader hands over *units*: a committed transaction (its changes already keyed and
encoded as JSON) or one of our watermarks, each with the position it ends at. The copy's rule
is DBLog's: a chunk's rows, read between its ``L`` and ``H`` watermarks, take their place at
``H``, except the keys that a change between ``L`` and ``H`` touched — the stream carries a
state of those at least as new (the binlog is in commit order, and the chunk's read began after
``L`` committed). A truncate of the table inside the window drops the whole chunk.

A window is assembled whole: the units from an ``L`` whose close has not arrived yet wait
(:func:`ready`), so a restart never resumes inside one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from sluiceway.cdc.model import Chunk
from sluiceway.cdc.mysql.gtid import EPOCH_SHIFT
from sluiceway.cdc.watermark import Mark, Watermark
from sluiceway.errors import InvariantViolation
from sluiceway.journal.record import ARROW_SCHEMA

#: Headers of a captured change: where its transaction ends in the binlog, and its GTID.
GTID_HEADER, FILE_HEADER, POS_HEADER = "mysql.gtid", "mysql.file", "mysql.pos"
#: The old row of an update or delete (the binlog's full before image), as JSON.
BEFORE_HEADER = "mysql.before"
MODE_HEADER = "sluice.mode"
_HEADERS = ARROW_SCHEMA.field("headers").type
_TIMESTAMP = ARROW_SCHEMA.field("timestamp").type
_FILE_MASK = (1 << (EPOCH_SHIFT - 32)) - 1


@dataclass(slots=True)
class Change:
    """One row change: ``op`` is insert, update, delete or truncate (``key`` None for a truncate)."""

    namespace: str
    op: str
    key: str | None
    value: bytes | None = None
    before: bytes | None = None
    #: An update that changed the primary key: the key it had (a delete of it precedes the record).
    old_key: str | None = None


@dataclass(slots=True)
class Unit:
    """A committed transaction or a watermark; ``position``: where it ends (see :func:`position`)."""

    position: int
    file: str
    pos: int
    time: int  # µs since the Unix epoch (the binlog's commit time, whole seconds)
    gtid: str = ""
    changes: list[Change] = field(default_factory=list)
    mark: Watermark | None = None


@dataclass(frozen=True, slots=True)
class Assembly:
    batch: pa.RecordBatch
    #: Units consumed (a prefix of those given) and where the last of them ends.
    units: int
    end: int
    #: Tables whose copy completed in this stretch, with the position of their ``T`` marker.
    completed: dict[str, int]


def _header_column(headers: list[list[tuple[str, str]]]) -> pa.Array:
    """Each record's headers as the journal's list of (key, value) structs, built from flat
    columns (the records of a transaction share one list: no object per record)."""
    offsets = [0]
    names: list[str] = []
    texts: list[str] = []
    for pairs in headers:
        for name, text in pairs:
            names.append(name)
            texts.append(text)
        offsets.append(len(names))
    pairs_array = pa.StructArray.from_arrays(
        [pa.array(names, pa.string()), pa.array(texts, pa.string())], fields=list(_HEADERS.value_type)
    )
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pairs_array, type=_HEADERS)


def position(file_number: int, pos: int, epoch: int = 0) -> int:
    """A binlog position as one growing number: the epoch (one more for each server the capture
    moved to, :mod:`~.gtid`), the file's sequence number, then the offset in it (binlog files are
    far below 4 GiB, the offset's 32 bits)."""
    return (epoch << EPOCH_SHIFT) | (file_number << 32) | pos


def split_position(value: int) -> tuple[int, int]:
    """The file number and offset of a position (its epoch aside)."""
    return (value >> 32) & _FILE_MASK, value & 0xFFFFFFFF


def ready(units: Sequence[Unit]) -> int:
    """How many of ``units`` can be assembled: up to (not including) the first ``L`` whose
    window does not close among them."""
    open_at: dict[int, int] = {}
    for i, unit in enumerate(units):
        mark = unit.mark
        if mark is None or mark.chunk is None:
            continue
        if mark.kind is Mark.OPEN:
            open_at.setdefault(mark.chunk, i)
        elif mark.closes:
            open_at.pop(mark.chunk, None)
    return min(open_at.values(), default=len(units))


def assemble(
    units: Sequence[Unit], chunks: Callable[[int], Chunk | None], *, limit: int | None = None
) -> Assembly:
    """The records of ``units[:ready(units)]`` as one batch (stopping after the unit that makes
    ``limit`` records, outside a window)."""
    count = ready(units)
    offsets: list[int] = []
    namespaces: list[str] = []
    ops: list[str] = []
    keys: list[str | None] = []
    values: list[bytes | None] = []
    headers: list[list[tuple[str, str]]] = []
    times: list[int] = []
    windows: dict[int, tuple[str, set[str]]] = {}  # chunk → (its table, keys touched since its L)
    completed: dict[str, int] = {}
    used, end = 0, 0
    for unit in units[:count]:
        if limit is not None and len(offsets) >= limit and not windows:
            break
        used, end = used + 1, unit.position
        mark = unit.mark
        if mark is not None:
            if mark.kind is Mark.OPEN and mark.chunk is not None and mark.namespace is not None:
                windows[mark.chunk] = (mark.namespace, set())
            elif mark.kind is Mark.CLOSE and mark.chunk is not None:
                window = windows.pop(mark.chunk, None)
                if window is None:
                    raise InvariantViolation(
                        f"chunk {mark.chunk} closes at {unit.file}:{unit.pos} but never opened"
                    )
                chunk = chunks(mark.chunk)
                if chunk is None:
                    raise InvariantViolation(
                        f"chunk {mark.chunk} was closed in the binlog but its rows are missing"
                    )
                if "\0*" in window[1]:
                    continue  # the table was truncated in the window: nothing of the chunk is current
                block = [(FILE_HEADER, unit.file), (POS_HEADER, str(unit.pos)), (MODE_HEADER, "copy")]
                for key, value in zip(chunk.keys.to_pylist(), chunk.values.to_pylist(), strict=True):
                    if key in window[1]:
                        continue
                    offsets.append(unit.position)
                    namespaces.append(chunk.namespace)
                    ops.append("insert")
                    keys.append(key)
                    values.append(value)
                    headers.append(block)
                    times.append(chunk.read_time)
            elif mark.kind is Mark.ABANDON and mark.chunk is not None:
                windows.pop(mark.chunk, None)
            elif mark.kind is Mark.COMPLETE and mark.namespace is not None:
                completed[mark.namespace] = unit.position
            continue
        if not unit.changes:
            continue
        shared = [
            (GTID_HEADER, unit.gtid),
            (FILE_HEADER, unit.file),
            (POS_HEADER, str(unit.pos)),
            (MODE_HEADER, "sync"),
        ]
        for change in unit.changes:
            for table, touched in windows.values():
                if table == change.namespace:
                    touched.add("\0*" if change.key is None else change.key)
                    if change.old_key is not None:
                        touched.add(change.old_key)
            own = shared if change.before is None else [*shared, (BEFORE_HEADER, change.before.decode())]
            if change.old_key is not None:
                offsets.append(unit.position)
                namespaces.append(change.namespace)
                ops.append("delete")
                keys.append(change.old_key)
                values.append(None)
                headers.append(own)
                times.append(unit.time)
            offsets.append(unit.position)
            namespaces.append(change.namespace)
            ops.append(change.op)
            keys.append(change.key)
            values.append(change.value)
            headers.append(own)
            times.append(unit.time)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(offsets, pa.int64()),
            pa.array(namespaces, pa.string()),
            pa.array(ops, pa.string()),
            pa.array(keys, pa.string()),
            pa.array(values, pa.binary()),
            _header_column(headers),
            pa.array(times, pa.int64()).cast(_TIMESTAMP),
        ],
        schema=ARROW_SCHEMA,
    )
    return Assembly(batch, used, end, completed)
