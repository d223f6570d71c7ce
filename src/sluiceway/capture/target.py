"""The capture's target when changes go to a broker: publish each append, return once acknowledged.

:class:`~sluiceway.cdc.capture.Capture` confirms to PostgreSQL the position of an append only
after :meth:`PublishTarget.append` returns, and it returns only when the destination has
acknowledged every change of the append. So the flush position the server holds is always the
end of a transaction whose every change the broker acknowledged; WAL after it stays on the
server. A new term resumes from there and sends the unacknowledged tail again, at least once, in
order per key.

"There" is the later of the slot's ``confirmed_flush_lsn`` and the target's own record of what
it published (:class:`PositionFile`, in the state directory beside the copy's progress).
PostgreSQL 15 and 16 do not always write a slot's confirmed position at a restart, so after one
the server may resend from an older position: the target's record says what to pass over — and
the copy's chunk files already removed behind it are never needed again.

A delivery that fails is not retried inside the append: the append raises
:class:`DeliveryFailed`, the term ends (closing the client), and the next one sends again from
the confirmed position over a fresh connection. Re-sending the whole tail (never one record
alone) is what keeps every key's changes in order on the broker: Kafka's producer is made
gapless (a failed change is never followed by a later one of its partition), and the brokers'
sender fails a key's later messages unsent once one fails.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from sluiceway.capture.mapping import TopicMap, to_records
from sluiceway.capture.metrics import CaptureMeter
from sluiceway.cdc.errors import CdcError
from sluiceway.errors import PublishError
from sluiceway.harvest.ports import Delivery, Publisher
from sluiceway.outbox.record import MarkedRecord


class DeliveryFailed(CdcError):
    """The destination refused or did not acknowledge a change in time: transient — the term
    ends and the next one sends again from the position confirmed to PostgreSQL."""


class UndeliverableChange(CdcError):
    """The destination can never accept a change (too large, an invalid topic): the capture stops
    rather than skip it; fix the destination (or the topic template) and start it again."""


class PublishTarget:
    """A :class:`~sluiceway.cdc.target.CaptureTarget` over a harvester
    :class:`~sluiceway.harvest.ports.Publisher`."""

    def __init__(
        self,
        publisher: Publisher,
        topics: TopicMap,
        *,
        leader: str = "",
        tombstones: bool = False,
        timeout: float = 60.0,
        may_continue: Callable[[], bool] = lambda: True,
        meter: CaptureMeter | None = None,
        position_file: PositionFile | None = None,
    ) -> None:
        self.publisher = publisher
        self.topics = topics
        self.leader = leader
        self.tombstones = tombstones
        self.timeout = timeout
        self.may_continue = may_continue
        self.meter = meter
        self.position_file = position_file
        self._send_many = getattr(publisher, "send_many", None)

    def position(self) -> int | None:
        """What this target published last (None: nothing recorded — the slot's position rules)."""
        return None if self.position_file is None else self.position_file.read()

    def append(self, batch: pa.RecordBatch, end: int) -> None:
        if batch.num_rows:
            records = to_records(batch, self.topics, leader=self.leader, tombstones=self.tombstones)
            self._publish(records)
            if self.meter is not None:
                self.meter.published(records, batch)
        if self.position_file is not None:
            self.position_file.write(end)

    def _publish(self, records: list[MarkedRecord]) -> None:
        done = threading.Event()
        lock = threading.Lock()
        left = [len(records)]
        failures: list[Delivery] = []

        def on_done(delivery: Delivery) -> None:
            with lock:
                if delivery.error is not None:
                    failures.append(delivery)
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        try:
            if self._send_many is not None:
                self._send_many(records, on_done)
            else:
                for record in records:
                    self.publisher.send(record, on_done)
        except PublishError as exc:  # a synchronous refusal (an invalid topic, a closed client)
            raise (UndeliverableChange if exc.permanent else DeliveryFailed)(
                f"the destination refused a change: {exc}"
            ) from exc
        deadline = time.monotonic() + self.timeout
        while not done.wait(0.05):
            if not self.may_continue():
                raise DeliveryFailed("leadership ended while changes awaited their acknowledgements")
            if time.monotonic() > deadline:
                raise DeliveryFailed(
                    f"{left[0]} of {len(records)} changes were not acknowledged within {self.timeout:g} s"
                )
        if failures:
            first = failures[0]
            where = f"{first.record.topic} key {first.record.key!r}"
            if any(f.permanent for f in failures):
                bad = next(f for f in failures if f.permanent)
                raise UndeliverableChange(
                    f"the destination can never accept the change to {bad.record.topic} key "
                    f"{bad.record.key!r}: {bad.error}"
                )
            raise DeliveryFailed(f"{len(failures)} changes not delivered (first: {where}: {first.error})")

    def close(self) -> None:
        self.publisher.close()


class PositionFile:
    """The stream position everything before which was acknowledged, as a small file replaced
    atomically after each append (so a ``kill -9`` leaves the old value or the new one). It is
    fsynced at most once per ``sync_every`` seconds: a machine crash may lose the last moments,
    which only means the slot's own position (a little older) is used — re-sent, never lost."""

    def __init__(self, path: str | Path, *, sync_every: float = 1.0) -> None:
        self.path = Path(path)
        self.sync_every = sync_every
        self._synced_at = 0.0

    def read(self) -> int | None:
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return None
        try:
            return int(text)
        except ValueError:
            raise CdcError(
                f"{self.path} does not hold a stream position ({text[:40]!r}): remove it"
            ) from None

    def write(self, position: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        scratch = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        sync = time.monotonic() - self._synced_at >= self.sync_every
        with open(scratch, "w") as out:
            out.write(str(position))
            if sync:
                out.flush()
                os.fsync(out.fileno())
        os.replace(scratch, self.path)
        if sync:
            self._synced_at = time.monotonic()
