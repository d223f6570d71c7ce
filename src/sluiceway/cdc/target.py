"""Where the capture appends: one narrow port, and the journal behind it.

The capture hands a target whole stretches of the stream — the records of complete
transactions (and copied chunks) in commit order — together with the stream position they end
at. The target keeps records and position **together and durably** (one append): the position
it reports is what the capture confirms to PostgreSQL, so the server releases WAL only once the
target holds it, and after a crash the capture resumes from it without loss or a second copy.
A broker is a target too (``sluiceway.capture.target.PublishTarget``): a *pipelined* one, which
returns before its destination acknowledges and reports the durable position later, through
``SlotCapture.durable_at``.
"""

from __future__ import annotations

import time
from typing import Protocol

import numpy as np
import pyarrow as pa

from sluiceway.cdc.errors import CdcError
from sluiceway.journal import ExpectationFailed, Journal, JournalError
from sluiceway.journal.record import OP_HEADER

#: The journal register holding the stream position (an LSN, decimal) of the last append.
POSITION_REGISTER = "cdc.lsn"


class CaptureTarget(Protocol):
    def position(self) -> int | None:
        """The stream position the target holds everything up to; ``None`` for a new target."""
        ...

    def append(self, batch: pa.RecordBatch, end: int) -> None:
        """Append ``batch`` and make ``end`` the position, atomically; return once durable."""
        ...

    def close(self) -> None: ...


class JournalTarget:
    """Appends to a journal; the position is a register committed with the records.

    The register is also the fence: each append expects the position the previous one left, so
    two captures can never interleave their appends (the journal's writer lock is the first guard).
    """

    def __init__(
        self,
        path: str,
        *,
        fsync: bool = True,
        consumers: tuple[str, ...] = (),
        release_every: float = 30.0,
    ) -> None:
        self.path = path
        #: The journal's readers (named consumers): segments all of them have committed are released.
        self.consumers = consumers
        self.release_every = release_every
        self._released_at = time.monotonic()
        try:
            self.journal = Journal.open(path, fsync=fsync)
        except JournalError as exc:
            raise CdcError(f"cannot open the capture's journal: {exc}") from exc
        value = self.journal.registers().get(POSITION_REGISTER)
        self._position: int | None = None if value is None else int(value)

    def position(self) -> int | None:
        return self._position

    def append(self, batch: pa.RecordBatch, end: int) -> None:
        previous = None if self._position is None else str(self._position)
        try:
            with self.journal.append(
                expect_registers={POSITION_REGISTER: previous}, set_registers={POSITION_REGISTER: str(end)}
            ) as tx:
                if batch.num_rows:
                    tx.write_arrow(journal_batch(batch))
        except ExpectationFailed as exc:
            raise CdcError(
                f"journal {self.path} was appended to by another capture (its position is not "
                f"{previous}): {exc}"
            ) from exc
        self._position = end
        if self.consumers and time.monotonic() - self._released_at >= self.release_every:
            self.release()

    def release(self) -> int:
        """Remove the segments every reader has committed (a reader that has not committed yet
        holds everything): a stopped sink keeps what it has not read, on this disk, never in WAL."""
        self._released_at = time.monotonic()
        committed = self.journal.consumers()
        below = min(committed.get(name, 0) for name in self.consumers)
        return self.journal.release(below) if below > 0 else 0

    @property
    def head(self) -> int:
        return self.journal.head

    def close(self) -> None:
        self.journal.close()


def journal_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Records as the journal keeps them: ``op`` in the first header, a truncate's (null) key as ``""``."""
    batch = with_op_headers(batch)
    key = batch.column("key")
    if key.null_count:
        index = batch.schema.get_field_index("key")
        batch = batch.set_column(index, batch.schema.field(index), key.fill_null(""))
    return batch


def with_op_headers(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each record's ``op`` added as the first header (:data:`OP_HEADER`).

    Column-wise: the new header list of row ``i`` is ``[(OP_HEADER, op_i)] + headers_i``, built
    with one ``take`` over the old header structs followed by the new ones.
    """
    n = batch.num_rows
    headers = batch.column("headers")
    if headers.null_count:
        headers = headers.fill_null(pa.scalar([], headers.type))
    old_offsets = np.asarray(headers.offsets, dtype=np.int64)
    base = old_offsets[0]
    old_values = headers.values.slice(base, old_offsets[-1] - base)
    struct_type = headers.type.value_type
    ops = pa.StructArray.from_arrays(
        [pa.array([OP_HEADER] * n, pa.string()), batch.column("op").cast(pa.string())],
        fields=list(struct_type),
    )
    new_offsets = (old_offsets - base) + np.arange(n + 1, dtype=np.int64)
    total = int(new_offsets[-1])
    is_op = np.zeros(total, dtype=bool)
    is_op[new_offsets[:-1]] = True
    order = np.empty(total, dtype=np.int64)
    order[is_op] = len(old_values) + np.arange(n, dtype=np.int64)
    order[~is_op] = np.arange(len(old_values), dtype=np.int64)
    values = pa.concat_arrays([old_values, ops]).take(pa.array(order))
    column = pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), values, type=headers.type)
    index = batch.schema.get_field_index("headers")
    return batch.set_column(index, batch.schema.field(index), column)
