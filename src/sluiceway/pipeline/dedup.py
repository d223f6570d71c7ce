"""``dedup: true`` on a Kafka source: drop records the harvester re-sent, by ``sluice-id``.

The harvester delivers at least once; with ``perKeyInFlight`` > 1 a key's unpurged suffix may
come again after a failover (``…, 7, 8, 9, 8, 9, 10, …``). Per ``(namespace, key)`` this keeps
the last ``sluice-id`` passed and drops any record not above it, as
:class:`sluiceway.Deduplicator` does for a plain consumer, so the sinks see each record once and
in order.

State is one ``long`` per key in Spark's state store (``applyInPandasWithState``), kept in the
sink's checkpoint with its offsets, so a replayed micro-batch gives the same answer; it is a
compacted map — it grows with the number of distinct keys, not with the records. Records
without ``sluice-id`` pass. A key's records are in one Kafka partition, so within a micro-batch
they are taken in offset order; the sink sorts the batch by offset again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sluiceway.harvest.sequence import sequence_id


def keep_above(
    offsets: Sequence[int], headers: Sequence[Any], last: int | None
) -> tuple[list[int], int | None]:
    """Row positions to keep, in offset order, and the new last ``sluice-id`` (pure)."""
    kept: list[int] = []
    for i in sorted(range(len(offsets)), key=offsets.__getitem__):
        sid = sequence_id(headers[i])
        if sid is None:
            kept.append(i)
        elif last is None or sid > last:
            kept.append(i)
            last = sid
    return kept, last


class SequenceDedup:
    """The ``applyInPandasWithState`` function: small and picklable (no captured state)."""

    def __call__(self, key: Any, frames: Iterable[Any], state: Any) -> Iterator[Any]:
        import pandas as pd

        frame = pd.concat(list(frames), ignore_index=True)
        last = state.get[0] if state.exists else None
        kept, last = keep_above(list(frame["offset"]), list(frame["headers"]), last)
        if last is not None:
            state.update((last,))
        if kept:
            yield frame.iloc[kept]


def dedup_by_sequence(df: Any) -> Any:
    """The stream without re-sent records (see the module docstring)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    return df.groupBy("namespace", "key").applyInPandasWithState(
        SequenceDedup(),
        outputStructType=df.schema,
        stateStructType="last LONG",
        outputMode="append",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )
