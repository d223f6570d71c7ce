"""The capture's target when changes go to a broker: appends pipelined, confirmed once acknowledged.

:class:`~sluiceway.cdc.capture.SlotCapture` confirms to PostgreSQL only the *durable* position this
target reports: the end of the last append that the destination acknowledged whole, with every
append before it. So the flush position the server holds is always the end of a transaction
whose every change the broker acknowledged; WAL after it stays on the server. Appends do not
wait for each other's acknowledgements (up to ``max_in_flight`` changes), so the round trips
overlap. A new term resumes from the durable position and sends the unacknowledged tail again,
at least once, in order per key.

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

import logging
import os
import queue
import shlex
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from sluiceway.capture.mapping import TopicMap, to_columns
from sluiceway.capture.metrics import PublishMeter
from sluiceway.capture.refusals import RefusalLog, RefusedChange, refused
from sluiceway.cdc.errors import CdcError
from sluiceway.errors import PublishError
from sluiceway.harvest.ports import ColumnsDone, Delivery, Publisher, SendsColumns, columns_via_send
from sluiceway.outbox.record import RecordColumns

log = logging.getLogger("sluiceway.capture")

#: A dead letter's headers: the destination's refusal, and the topic it was refused on.
REFUSAL_HEADER = "sluice.refusal"
TOPIC_HEADER = "sluice.topic"


_Failure = TypeVar("_Failure", bound=Exception)


class DeliveryFailed(CdcError):
    """The destination refused or did not acknowledge a change in time: transient — the term
    ends and the next one sends again from the position confirmed to PostgreSQL."""


class UndeliverableChange(CdcError):
    """The destination can never accept a change (too large, an invalid topic, unroutable): with no
    ``deadLetter:`` the capture stops on it (recorded for ``sluice capture inspect``); fix the
    destination and start it again, or ``sluice capture skip`` the change."""


class DeadLetter:
    """Where a :class:`PublishTarget` sends a change its destination refused for good: a
    publisher (the term's own, or a journal's) and, for the term's own, the topic to use."""

    def __init__(self, publisher: Publisher, topic: str | None = None) -> None:
        self.publisher, self.topic = publisher, topic


class _Append:
    """One append on its way: where it ends, changes still unacknowledged, when it was sent. It is
    the publisher's :class:`~sluiceway.harvest.ports.ColumnsDone` for its changes."""

    __slots__ = ("columns", "end", "left", "sent", "target")

    def __init__(self, target: PublishTarget, end: int, columns: RecordColumns) -> None:
        self.target, self.end, self.columns = target, end, columns
        self.left, self.sent = len(columns), time.monotonic()

    def acked(self, count: int) -> None:
        target = self.target
        with target._lock:
            target._in_flight -= count
            self.left -= count
            moved = target._advance_locked() if self.left == 0 else None
            if target._waiting:
                target._room.notify_all()
        if moved is not None:
            target._moved(moved)

    def failed(self, index: int, delivery: Delivery) -> None:
        target = self.target
        if delivery.permanent and target.dead_letter is not None:
            target._dead_letters.put((self, delivery))  # acknowledged once the dead letter is
            target._dead_letter_worker()
            return
        failure = target._refusal(delivery) if delivery.permanent else _failure(delivery)
        target._fail(failure)


class PublishTarget:
    """A pipelined :class:`~sluiceway.cdc.target.CaptureTarget` over a harvester
    :class:`~sluiceway.harvest.ports.Publisher`.

    ``append`` hands the changes to the publisher and returns (waiting only while more than
    ``max_in_flight`` changes await acknowledgements), so the next append is sent while this one's
    acknowledgements come back. The *durable* position — the end of the last append which, with
    every append before it, is acknowledged whole — moves as acknowledgements arrive and is
    reported through ``on_durable`` (the capture then confirms it to PostgreSQL). An append with a
    failed change never becomes durable: the failure ends the term at the next ``append`` or
    :meth:`check`, and the next term sends again from the durable position. An append with no
    changes (a quiet position) becomes durable only behind every append before it.
    """

    #: The capture confirms what ``on_durable`` reports, not what ``append`` was given.
    pipelined = True

    def __init__(
        self,
        publisher: Publisher,
        topics: TopicMap,
        *,
        leader: str = "",
        tombstones: bool = False,
        trace_column: str | None = None,
        timeout: float = 60.0,
        max_in_flight: int = 20_000,
        may_continue: Callable[[], bool] = lambda: True,
        meter: PublishMeter | None = None,
        position_file: PositionFile | None = None,
        refusals: RefusalLog | None = None,
        dead_letter: DeadLetter | None = None,
    ) -> None:
        self.publisher = publisher
        self.topics = topics
        self.leader = leader
        self.tombstones = tombstones
        self.trace_column = trace_column
        self.timeout = timeout
        self.max_in_flight = max_in_flight
        self.may_continue = may_continue
        self.meter = meter
        self.position_file = position_file
        #: Where refused changes are recorded (the one stopped on, dead letters, skips).
        self.refusals = refusals
        #: Sequence ids of changes to pass over (``sluice capture skip``), read at the term's start.
        known = refusals.read() if refusals is not None else None
        self.skips = frozenset(s.sid for s in known.skips) if known is not None else frozenset()
        #: Past this position, the skips and the change stopped on are done with (forgotten).
        self._refusals_until = (
            max([s.lsn for s in known.skips] + [known.stuck.lsn if known.stuck else 0]) if known else 0
        )
        self.dead_letter = dead_letter
        self._dead_letters: queue.Queue[tuple[_Append, Delivery] | None] = queue.Queue()
        self._dead_letter_thread: threading.Thread | None = None
        #: Called (from a publisher's thread, or the appender's) with each new durable position.
        self.on_durable: Callable[[int], None] = lambda position: None
        self._send_columns: Callable[[RecordColumns, ColumnsDone], None] = (
            publisher.send_columns
            if isinstance(publisher, SendsColumns)
            else partial(columns_via_send, publisher)
        )
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._waiting = 0  # appenders waiting for room (acknowledgements wake them only then)
        self._pending: deque[_Append] = deque()
        self._in_flight = 0
        self._failure: CdcError | None = None
        self._moving = threading.Lock()
        self._durable = 0

    def position(self) -> int | None:
        """What this target published last (None: nothing recorded — the slot's position rules)."""
        return None if self.position_file is None else self.position_file.read()

    def append(self, batch: pa.RecordBatch, end: int) -> None:
        columns = to_columns(
            batch, self.topics, leader=self.leader, tombstones=self.tombstones, trace_column=self.trace_column
        )
        if self.skips and not self.skips.isdisjoint(columns.ids):
            columns = self._skip(columns)
        entry = _Append(self, end, columns)
        count = len(columns)
        moved = None
        with self._room:
            while self._in_flight and self._in_flight + count > self.max_in_flight:
                self._check_locked()
                self._waiting += 1
                try:
                    self._room.wait(0.05)
                finally:
                    self._waiting -= 1
            self._check_locked()
            self._pending.append(entry)
            self._in_flight += count
            if not count:
                moved = self._advance_locked()
        if count:
            self._send(columns, entry)
            if self.meter is not None:
                self.meter.published(columns, batch)
        elif moved is not None:
            self._moved(moved)

    def check(self) -> None:
        """Raise what ended deliveries: a failed change, leadership gone, or an append not
        acknowledged within ``timeout``."""
        with self._lock:
            self._check_locked()

    def _check_locked(self) -> None:
        if self._failure is not None:
            raise self._failure
        if not self.may_continue():
            raise DeliveryFailed("leadership ended while changes awaited their acknowledgements")
        if (
            self._pending
            and self._pending[0].left
            and time.monotonic() - self._pending[0].sent > self.timeout
        ):
            head = self._pending[0]
            raise DeliveryFailed(f"{head.left} changes were not acknowledged within {self.timeout:g} s")

    def _send(self, columns: RecordColumns, entry: _Append) -> None:
        try:
            self._send_columns(columns, entry)
        except PublishError as exc:  # a synchronous refusal (an invalid topic, a closed client)
            raise (UndeliverableChange if exc.permanent else DeliveryFailed)(
                f"the destination refused a change: {exc}"
            ) from exc

    # -- changes the destination refuses ----------------------------------------------------------
    def _skip(self, columns: RecordColumns) -> RecordColumns:
        """``columns`` without the changes the operator chose to pass over (``sluice capture skip``)."""
        keep = [i for i, sid in enumerate(columns.ids) if sid not in self.skips]
        passed = len(columns) - len(keep)
        for sid in set(columns.ids) & self.skips:
            log.warning("capture: passing over the change %s as told (sluice capture skip)", sid)
        if self.meter is not None:
            self.meter.skipped(passed)
        if self.refusals is not None:
            self.refusals.passed(passed, self._durable)
        return RecordColumns(
            [columns.ids[i] for i in keep],
            [columns.create_times[i] for i in keep],
            [columns.topics[i] for i in keep],
            [columns.keys[i] for i in keep],
            [columns.values[i] for i in keep],
            [columns.headers[i] for i in keep],
            columns.leader_id,
        )

    def _refusal(self, delivery: Delivery, also: str = "") -> UndeliverableChange:
        """The change ``delivery`` names is refused for good: recorded as the one the capture stops on."""
        record = delivery.record
        change = refused(record, record.topic, f"{delivery.error}{also}")
        if self.refusals is not None:
            self.refusals.stopped_on(change)
        return UndeliverableChange(
            f"the destination can never accept the change to {change.describe()}: {delivery.error}{also} "
            f"(sluice capture inspect shows it; sluice capture skip --lsn {shlex.quote(change.where)} "
            "passes over it, or give "
            "the capture a deadLetter: destination)"
        )

    def _fail(self, failure: CdcError) -> None:
        with self._lock:
            self._in_flight -= 1
            self._failure = prevailing(self._failure, failure)
            if self._waiting:
                self._room.notify_all()

    def _dead_letter_worker(self) -> None:
        with self._lock:
            if self._dead_letter_thread is None:
                self._dead_letter_thread = threading.Thread(
                    target=self._send_dead_letters, name="sluice-capture-dead-letters", daemon=True
                )
                self._dead_letter_thread.start()

    def _send_dead_letters(self) -> None:
        """Refused changes to the dead letter destination, one at a time (they are rare): the
        change itself, its refusal and original topic in headers; acknowledged, it counts as
        delivered."""
        assert self.dead_letter is not None
        publisher, topic = self.dead_letter.publisher, self.dead_letter.topic
        while (item := self._dead_letters.get()) is not None:
            entry, delivery = item
            record = delivery.record
            change = refused(record, record.topic, delivery.error or "")
            letter = record._replace(
                topic=topic or record.topic,
                headers=(*record.headers, (REFUSAL_HEADER, change.refusal), (TOPIC_HEADER, record.topic)),
            )
            done = partial(self._dead_lettered, entry, delivery, change)
            try:
                publisher.send(letter, done)
            except PublishError as exc:
                self._fail(self._refusal(delivery, f"; the dead letter destination refused it too: {exc}"))

    def _dead_lettered(
        self, entry: _Append, refused_by: Delivery, change: RefusedChange, outcome: Delivery
    ) -> None:
        if outcome.error is not None:
            also = f"; the dead letter destination refused it too: {outcome.error}"
            self._fail(self._refusal(refused_by, also))
            return
        if self.refusals is not None:
            self.refusals.dead_lettered(change)
        if self.meter is not None:
            self.meter.dead_lettered()
        log.warning(
            "capture: the destination refused the change to %s: sent to the dead letters", change.describe()
        )
        entry.acked(1)

    def _advance_locked(self) -> int | None:
        """Drop the acknowledged appends at the head; the end of the last one dropped, if any."""
        moved = None
        while self._pending and self._pending[0].left == 0:
            moved = self._pending.popleft().end
        return moved

    def _moved(self, position: int) -> None:
        with self._moving:  # reports come from several threads: one at a time, never backwards
            if position <= self._durable:
                return
            self._durable = position
            # Kept before it is confirmed: after a server restart the slot may be older than this.
            if self.position_file is not None:
                self.position_file.write(position)
            if self._refusals_until and position >= self._refusals_until and self.refusals is not None:
                self.refusals.passed(0, position)
                self._refusals_until = 0
            self.on_durable(position)

    def close(self) -> None:
        if self._dead_letter_thread is not None:
            self._dead_letters.put(None)
            self._dead_letter_thread.join(10)
        self.publisher.close()
        if self.dead_letter is not None and self.dead_letter.publisher is not self.publisher:
            self.dead_letter.publisher.close()


def prevailing(current: _Failure | None, new: _Failure) -> _Failure:
    """The failure a term reports: the first, unless a refusal comes later — then the refusal (the
    others may only be its consequences: a key's later changes failed unsent)."""
    if current is None:
        return new
    if isinstance(new, UndeliverableChange) and not isinstance(current, UndeliverableChange):
        return new
    return current


def _failure(delivery: Delivery) -> CdcError:
    where = f"{delivery.record.topic} key {delivery.record.key!r}"
    if delivery.permanent:
        return UndeliverableChange(
            f"the destination can never accept the change to {where}: {delivery.error}"
        )
    return DeliveryFailed(f"a change to {where} was not delivered: {delivery.error}")


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
