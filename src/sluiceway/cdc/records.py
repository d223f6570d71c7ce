"""The last step of assembling a stretch: records in stream order, as one Arrow batch.

Every record carries the sequence number pass 1 gave its change, truncate or watermark; the
parts (decoded changes, deletes of changed keys, truncates, copied rows at their ``H``) are
built as whole columns and one stable sort on those numbers puts them in stream order. Which
copied rows are left out is decided here too: the keys that transactions a chunk's snapshot did
not see changed before its ``H``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.cdc.columnar import Group
from sluiceway.cdc.model import Chunk, Stretch
from sluiceway.cdc.pgoutput import DELETE, UPDATE, format_lsn
from sluiceway.cdc.watermark import Mark
from sluiceway.errors import InvariantViolation

# The batches built here are appended to the capture's journal (Journal.write_arrow), so the
# journal's append schema is the one to build them in: the right dependency, not a detour to the
# pipeline's (which is the same schema, defined by the journal).
from sluiceway.journal.record import ARROW_SCHEMA

_HEADERS = ARROW_SCHEMA.field("headers").type
#: The header holding a change's old row as JSON, where the server sent it (``REPLICA IDENTITY FULL``).
BEFORE_HEADER = "pg.before"
_TIMESTAMP = ARROW_SCHEMA.field("timestamp").type


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
_OP_CODE[UPDATE], _OP_CODE[DELETE] = 1, 2  # INSERT: 0


def build_records(
    stretch: Stretch,
    namespaces: Sequence[str],
    ops: Sequence[Sequence[int]],
    decoded: list[Group],
    live: Mapping[int, Chunk],
) -> tuple[pa.RecordBatch, dict[str, int]]:
    """The stretch's records as one batch, and the tables whose copy completed (``T`` markers).

    ``namespaces``/``ops``/``decoded``: per relation version, its table, the message kind of each
    of its changes (``I``/``U``/``D`` bytes) and their decoded keys and values."""
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
        op_codes = _OP_CODE[np.asarray(ops[g], dtype=np.int64)[rows_here]]
        namespace = _repeat(namespaces[g], len(mine))
        blocks = txn_block[txn[mine]]
        if group.missing:
            blocks = blocks.copy()
            for i, r in enumerate(rows_here.tolist()):
                if r in group.missing:
                    t = int(txn[mine][i])
                    blocks[i] = parts.add_block(
                        [*parts.blocks[int(txn_block[t])], ("pg.unchanged-toast", group.missing[r])]
                    )
        if group.befores is not None:
            # The old row, where the server sent it whole (REPLICA IDENTITY FULL): a header of its own.
            befores = group.befores.take(take)
            present = np.flatnonzero(pc.is_valid(befores).to_numpy(zero_copy_only=False))
            if len(present):
                blocks = blocks.copy()
                texts = befores.take(pa.array(present)).to_pylist()
                for i, text in zip(present.tolist(), texts, strict=True):
                    blocks[i] = parts.add_block(
                        [*parts.blocks[int(blocks[i])], (BEFORE_HEADER, text.decode())]
                    )
        parts.add(
            seq[mine],
            positions[txn[mine]],
            namespace,
            _OP_NAMES.take(pa.array(op_codes)),
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
                _repeat(namespaces[g], len(at)),
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
            _repeat(namespaces[g], 1),
            _repeat("truncate", 1),
            pa.nulls(1, pa.string()),
            pa.nulls(1, pa.binary()),
            txn_block[[t]],
            times[[t]],
        )
    drops = _drops(stretch, namespaces, decoded, live) if live else {}
    started: set[int] = set()
    for s, position, mark in stretch.marks:
        if mark.kind is Mark.OPEN and mark.chunk is not None:
            started.add(mark.chunk)
        elif mark.kind is Mark.CLOSE and mark.chunk is not None and mark.chunk in live:
            cid = mark.chunk
            if cid not in started:
                raise InvariantViolation(
                    f"chunk {cid} closes at {format_lsn(position)} but its window began before this batch"
                )
            _chunk_rows(parts, live[cid], drops.get(cid, set()), s * 2, position)
        elif mark.kind is Mark.COMPLETE and mark.namespace is not None:
            completed[mark.namespace] = position
    return parts.batch(), completed


def _drops(
    stretch: Stretch, namespaces: Sequence[str], decoded: list[Group], live: Mapping[int, Chunk]
) -> dict[int, set[str]]:
    """Per chunk: the keys (``namespace\\0key``) that transactions its snapshot did not see changed
    before its H — the stream carries a newer state of those than the chunk's rows."""
    h_seq = {
        mark.chunk: s
        for s, _p, mark in stretch.marks
        if mark.kind is Mark.CLOSE and mark.chunk is not None and mark.chunk in live
    }
    keys = [g.keys.to_pylist() for g in decoded]
    old = [g.old_keys.to_pylist() for g in decoded]
    drops: dict[int, set[str]] = {cid: set() for cid in h_seq}
    truncated: dict[int, list[str]] = {}
    for _s, t, g in stretch.truncates:
        truncated.setdefault(t, []).append(f"{namespaces[g]}\0*")
    bounds = [*stretch.first_item, len(stretch.item_seq)]
    for t in range(len(stretch.positions)):
        xid = stretch.xids[t]
        touched: list[str] = list(truncated.get(t, []))
        for i in range(bounds[t], bounds[t + 1]):
            g, r = stretch.item_group[i], stretch.item_row[i]
            namespace = namespaces[g]
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
