"""The MP/R engine: mark → (throttle, per-key window) → send → purge / reset.

One *term* runs while this process leads: a marker thread claims batches one ahead of the calling
thread, which admits them (throttle, per-key window) and sends them. A publisher whose ``send``
only queues (``inline``: every built-in one) is called right there, on the dispatching thread;
for any other, ``sendConcurrency`` shard threads hand records to it (sharded by key hash, each
queue bounded by ``sendBuffer``). One purge/reset thread settles deliveries in batches. The
engine talks only to ports (:mod:`sluiceway.harvest.ports`); adapters are injected.

Failure rules (from goharvest, made explicit):
* a failed mark may have marked rows on the server: take a fresh leader id so they are re-marked;
  never re-send from memory;
* a failed purge keeps the records in their windows and is retried (DELETE is idempotent); a
  key's rows are purged in id order only (an acknowledged prefix), so its unpurged rows are always
  a suffix that a new leader re-sends whole;
* a failed delivery fences its key at once (the send threads send nothing more of it); once
  nothing of the key is in flight, the failed row is reset (or buried) and forceRemark raised: the
  marker abandons its batch and takes a fresh leader id, so the failed record and every record
  sent behind it are re-marked, in order, ahead of its successors.

With ``perKeyInFlight`` 1 this is goharvest's per-key barrier: a key's next record goes only once
its predecessor's delete has committed. With N > 1, up to N records of a key are in flight, in id
order, all marked under one leader id, to one partition through one producer (a record marked
after a refresh waits until its key's older records are settled: a gapless publisher may take a
new leader id as a re-send); the destination must then be gapless per key (a
failed record is never followed by a later record of its key): librdkafka's idempotent producer
with ``enable.gapless.guarantee`` and no local message timeout, or the journal publisher.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sluiceway.errors import (
    DatabaseError,
    DatabaseRefusedError,
    InvariantViolation,
    LockTimeoutError,
    PublisherFailedError,
)
from sluiceway.harvest.dispatch import Dispatcher, Failure
from sluiceway.harvest.events import (
    Event,
    KeyParked,
    LeaderRefreshed,
    MeterRead,
    RecordDeadLettered,
    Stats,
)
from sluiceway.harvest.ports import (
    Delivery,
    OutboxStore,
    Publisher,
    SendsInBatches,
    SendsMany,
    Wakeups,
    is_inline,
)
from sluiceway.harvest.sequence import with_sequence_headers
from sluiceway.harvest.shards import ShardQueue
from sluiceway.outage import BUSY_GRACE, OUTAGE_REMINDER, WarningThrottle
from sluiceway.outbox.record import MarkedRecord

log = logging.getLogger("sluiceway.harvest")


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_in_flight_records: int = 1000
    send_concurrency: int = 8
    send_buffer: int = 10
    mark_query_records: int = 100
    mark_backoff: float = 0.01
    io_error_backoff: float = 0.5
    drain_timeout: float = 5.0
    min_metrics_interval: float = 5.0
    #: Delivery attempts before a record is dead-lettered; 0 = unlimited (goharvest).
    max_attempts: int = 0
    dead_letter: bool = True
    bury_permanent: bool = True
    #: Keep a dead-lettered record's later records (same key) in the outbox until an operator acts.
    park_key: bool = True
    #: Records of one key in flight at once; 1 = goharvest's per-key barrier.
    per_key_in_flight: int = 1
    #: Publish ``sluice-id`` and ``sluice-leader`` headers with every record.
    sequence_headers: bool = False
    #: With wake-ups (the outbox's notify trigger), the longest an idle marker waits for one
    #: before marking anyway; 0 = never listen, poll every ``mark_backoff``.
    idle_poll: float = 30.0


#: Seconds between two counts of parked keys while the harvester is idle (see Term._parked_keys).
PARKED_IDLE_RECOUNT = 60.0

#: The error of a record not sent because an earlier record of its key failed (it is re-sent).
WITHHELD = "withheld: an earlier record of its key failed"


@dataclass
class Counters:
    marked: int = 0
    published: int = 0
    purged: int = 0
    reset: int = 0
    dead: int = 0
    failed: int = 0
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=20_000))

    def snapshot(self) -> tuple[int, int, int, int, int]:
        return self.marked, self.published, self.purged, self.reset, self.dead


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": ordered[-1]}


class Term:
    """One leadership term: owns the threads and the dispatcher, from acquisition to revocation."""

    def __init__(
        self,
        engine: Engine,
        should_run: Callable[[], bool],
    ) -> None:
        self.engine = engine
        self.limits = engine.limits
        self.should_run = should_run
        self.dispatcher = Dispatcher(self.limits.max_in_flight_records, self.limits.per_key_in_flight)
        self.leader_id = str(uuid.uuid4())
        self._room = threading.Condition()
        # A publisher whose send only queues (librdkafka's producer, the journal's appender, the
        # broker senders' event loop) is called straight from the dispatching thread: a send
        # thread would only add a hand-off (two lock round trips and a wake-up per few records).
        # ``sendConcurrency`` and ``sendBuffer`` shape the send threads of the others.
        self._inline = is_inline(engine.publisher)
        # Publishers that take a batch at once (the NATS, RabbitMQ and Redis ones) get it whole.
        self._send_many: Callable[[list[MarkedRecord], Callable[[Delivery], None]], None] | None = (
            engine.publisher.send_many if isinstance(engine.publisher, SendsMany) else None
        )
        # The others are sent to record by record, a batch's sends inside its ``batch()`` when the
        # publisher has one (the traced wrapper: a span per batch).
        self._batch: Callable[[list[MarkedRecord]], contextlib.AbstractContextManager[object]] = (
            engine.publisher.batch if isinstance(engine.publisher, SendsInBatches) else _no_batch
        )
        self._shards = (
            []
            if self._inline
            else [
                ShardQueue(self.limits.send_buffer, self._room) for _ in range(self.limits.send_concurrency)
            ]
        )
        # Delivery reports arrive on the publisher's threads: appending to a deque is atomic and
        # cheap; the event wakes the purge/reset thread, which takes everything queued at once.
        self._deliveries: deque[Delivery] = deque()
        self._delivery_signal = threading.Event()
        self._purger_stop = False
        self._purge_outage = WarningThrottle(log, OUTAGE_REMINDER)  # the purge/reset thread's only
        self._purge_busy = WarningThrottle(log, OUTAGE_REMINDER, grace=BUSY_GRACE)  # likewise
        self._purge_abandoned = 0  # rows left marked as the term ended with the database away
        # Failed deliveries that fail alike (a full disk, a broker refusing every write): one line per
        # such trouble (a reminder a minute), not one per record and retry. The purge thread's only.
        self._delivery_outage = WarningThrottle(log, OUTAGE_REMINDER)
        self._delivery_error = ""
        self._failed_at = 0.0
        self._handoff: queue.Queue[tuple[int, int, list[MarkedRecord]]] = queue.Queue(maxsize=1)
        self._outstanding = 0  # handed to the publisher, delivery report not yet settled
        self._outstanding_lock = threading.Lock()
        self._stopping = threading.Event()
        # Two threads dispatch (the admit loop, and the purge thread as windows free up). With
        # several records of a key in flight, a key's records must reach its shard queue in the
        # order they were dispatched: each dispatch and its enqueue happen under this lock. With
        # one per key there is nothing to order, and no lock to contend for.
        self._send_order: contextlib.AbstractContextManager[object] = (
            threading.Lock() if self.limits.per_key_in_flight > 1 else contextlib.nullcontext()
        )
        self._error: BaseException | None = None
        self._attempts: dict[int, int] = {}
        self._failures: dict[int, Delivery] = {}  # id -> its failed delivery, until its window drains
        self._publisher_failed: str | None = None
        # The meter's count of parked keys, and when (and after what) it was taken.
        self._parked: int | None = None
        self._parked_seen: tuple[int, int] | None = None
        self._parked_at = 0.0

    # -- marker (calling thread) ------------------------------------------------------------
    def run(self) -> None:
        """Run the term until ``should_run()`` turns false.

        Two stages overlap: a marker thread claims the next batch (a database round trip) while
        this thread admits the previous one and hands it to the send queues (which may block on
        ``sendBuffer``), or sends them itself to an inline publisher. At most one marked batch
        waits between them.
        """
        threads = [
            threading.Thread(target=self._shard_loop, args=(i,), name=f"sluice-send-{i}", daemon=True)
            for i in range(len(self._shards))
        ]
        purger = threading.Thread(target=self._purge_loop, name="sluice-purge", daemon=True)
        marker = threading.Thread(target=self._mark_loop, name="sluice-mark", daemon=True)
        for t in [*threads, purger, marker]:
            t.start()
        try:
            self._admit_loop()
        finally:
            self._stopping.set()
            marker.join()
            self._shutdown(threads, purger)
        if self._error is not None:
            raise self._error
        if self._publisher_failed is not None:
            raise PublisherFailedError(self._publisher_failed)

    def _admit_loop(self) -> None:
        handoff = self._handoff
        while self.should_run() and self._error is None and self._publisher_failed is None:
            try:
                generation, tick, marked = handoff.get(timeout=0.1)
            except queue.Empty:
                continue
            # admit() drops the batch if the leader id changed since it was marked: those rows
            # are re-marked under the new id, behind any record that failed.
            with self._send_order:
                sends, _abandoned = self.dispatcher.admit(marked, generation, tick)
                self._enqueue(sends)

    def _mark_loop(self) -> None:
        engine, lim, disp = self.engine, self.limits, self.dispatcher
        store: OutboxStore | None = None
        wake: Wakeups | None = None
        last_meter = time.monotonic()
        outage = WarningThrottle(log, OUTAGE_REMINDER)
        busy = WarningThrottle(log, OUTAGE_REMINDER, grace=BUSY_GRACE)
        try:
            store = engine.store_factory()
            # Listening starts before the first mark: a row added after a mark that found nothing
            # is always notified to us.
            wake = store.wakeups() if lim.idle_poll > 0 else None
            while not self._stopping.is_set() and self._error is None:
                if disp.force_remark:
                    self._refresh("a delivery failed", quiet=self._delivery_outage.troubled)
                now = time.monotonic()
                if now - last_meter >= lim.min_metrics_interval:
                    engine.emit_meter(now - last_meter, disp, self._parked_keys(store, now))
                    last_meter = now
                if not disp.wait_for_room(timeout=0.1) or disp.force_remark:
                    continue
                if not self.should_run():
                    # Fenced or revoked: not one more mark (the admit loop ends the term shortly).
                    self._sleep(0.01)
                    continue
                generation, tick, leader_id = disp.generation, disp.tick, self.leader_id
                try:
                    marked = store.mark(leader_id, lim.mark_query_records)
                except DatabaseRefusedError:
                    raise  # a refused login, a dropped database: permanent, the harvester stops
                except LockTimeoutError as exc:
                    # "database is locked": another writer holds SQLite's write lock (or a row
                    # lock timed out). The statement did nothing, so no new leader id: mark again
                    # soon. A wait, not an outage: said only if it lasts.
                    busy.warn(
                        "the outbox has been locked by other writers for a while (%s); still trying", exc
                    )
                    self._sleep(0.01)
                    continue
                except DatabaseError as exc:
                    repeated = outage.troubled
                    # One line per outage (a reminder a minute while it lasts), not one per attempt.
                    outage.warn(
                        "mark failed (%s); backing off %.3fs and re-marking under a new leader id",
                        exc,
                        lim.io_error_backoff,
                    )
                    # The UPDATE may have committed on the server: a new id makes those rows eligible
                    # again. Every attempt takes one; only the first of an outage says so.
                    self._refresh("mark failed", quiet=repeated)
                    self._sleep(lim.io_error_backoff)
                    continue
                outage.resolved("marking again after %.1fs", outage.duration())
                busy.resolved("marking again: the outbox is no longer locked")
                if not marked:
                    # Still tell the admit loop (if it has room): the dispatcher forgets which
                    # purged ids a stale batch could hold only as later batches come through.
                    with contextlib.suppress(queue.Full):
                        self._handoff.put_nowait((generation, tick, marked))
                    if wake is None:
                        self._sleep(lim.mark_backoff)
                    else:
                        self._idle(wake)
                    continue
                engine.counters.marked += len(marked)
                while not self._stopping.is_set():
                    try:
                        self._handoff.put((generation, tick, marked), timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:
            log.exception("marker failed")
            self._error = exc
        finally:
            if wake is not None:
                wake.close()
            if store is not None:
                store.close()

    def _idle(self, wake: Wakeups) -> None:
        """Nothing to mark, and the outbox notifies: wait for a notification instead of polling
        every markBackoff — at most ``idle_poll`` (a lost notification), and never past what this
        term itself needs the marker for (forceRemark, the end of the term)."""
        deadline = time.monotonic() + self.limits.idle_poll
        while not self._stopping.is_set() and self._error is None and not self.dispatcher.force_remark:
            left = deadline - time.monotonic()
            if left <= 0 or wake.wait(min(left, 0.1)):
                return

    def _parked_keys(self, store: OutboxStore, now: float) -> int | None:
        """Keys parked behind a dead letter (any leader's), for the meter; None if unknown.

        Counted again when records were marked or buried since the last count, else at most every
        ``PARKED_IDLE_RECOUNT`` s: an idle harvester's queries are the few it cannot do without
        (an operator's retry inserts a row, which is marked; only a resolve waits for the recount).
        """
        c = self.engine.counters
        seen = (c.marked, c.dead)
        if seen == self._parked_seen and now - self._parked_at < PARKED_IDLE_RECOUNT:
            return self._parked
        try:
            self._parked = store.parked_keys()
        except DatabaseError as exc:
            log.debug("counting parked keys failed: %s", exc)
            self._parked = None
        self._parked_seen, self._parked_at = seen, now
        return self._parked

    def _refresh(self, why: str, *, quiet: bool = False) -> None:
        """Take a fresh leader id (marker thread only); ``quiet``: at DEBUG (an outage's later attempts)."""
        leader_id = str(uuid.uuid4())
        dropped = self.dispatcher.refresh()
        self.leader_id = leader_id
        log.log(
            logging.DEBUG if quiet else logging.INFO,
            "leader id refreshed (%s): %s; %d pending records will be re-marked",
            why,
            leader_id,
            dropped,
        )
        self.engine.emit(LeaderRefreshed(leader_id))

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds) if seconds > 0 else None

    def _enqueue(self, records: list[MarkedRecord]) -> None:
        """Hand records to their shards (key hash), in order within each shard. Fills every shard
        that has room before waiting, so one full shard never stalls the others. A publisher
        whose ``send`` only queues (``inline``) gets them here, on the dispatching thread."""
        if not records:
            return
        if self._inline:
            self._send(records, self._send_many)
            return
        n = len(self._shards)
        todo: dict[int, list[MarkedRecord]] = {}
        for record in records:
            index = zlib.crc32(record.key.encode("utf-8")) % n if n > 1 else 0
            todo.setdefault(index, []).append(record)
        done_upto = dict.fromkeys(todo, 0)
        while todo:
            progressed = False
            for index in list(todo):
                batch = todo[index]
                taken = self._shards[index].offer(batch, done_upto[index])
                if taken < 0:  # closed: shutting down
                    self.dispatcher.abandon(batch[done_upto[index] :])
                    del todo[index]
                    continue
                if taken:
                    progressed = True
                    done_upto[index] += taken
                    if done_upto[index] == len(batch):
                        del todo[index]
            if todo and not progressed:
                if self._stopping.is_set() or self._error is not None:
                    for index, batch in todo.items():
                        self.dispatcher.abandon(batch[done_upto[index] :])
                    return
                with self._room:
                    # Bounded wait: a take() between our offer and this wait cannot strand us.
                    self._room.wait(0.005)

    # -- shard senders -------------------------------------------------------------------------
    def _shard_loop(self, index: int) -> None:
        shard = self._shards[index]
        while True:
            batch = shard.take()
            if batch is None:
                return
            self._send(batch, self._send_many)

    def _send(
        self,
        batch: list[MarkedRecord],
        send_many: Callable[[list[MarkedRecord], Callable[[Delivery], None]], None] | None,
    ) -> None:
        """Hand ``batch`` (in dispatch order: each key's records in id order) to the publisher,
        or abandon it."""
        if self._stopping.is_set() or not self.should_run():
            # Shutting down, fenced or revoked: start no new sends (a deposed leader's late send
            # could land after its successor's); the rows stay marked for the next leader.
            self.dispatcher.abandon(batch)
            return
        with self._outstanding_lock:
            self._outstanding += len(batch)
        delivered = self._delivered
        if send_many is not None:
            # The whole batch at once (no synchronous failures to fence on between records).
            ready = list(self._outgoing(batch))
            try:
                send_many(ready, delivered)
            except Exception as exc:  # refused before any was taken: each one failed
                for item in ready:
                    delivered(_refused(item, exc))
            return
        # _outgoing's checks, unrolled: this loop runs once per record published.
        send, fenced, sequence = (
            self.engine.publisher.send,
            self.dispatcher.fenced_keys,
            self.limits.sequence_headers,
        )
        with self._batch(batch):
            for item in batch:
                if item.key in fenced:
                    delivered(Delivery(item, error=WITHHELD))
                    continue
                if sequence:
                    item = with_sequence_headers(item)
                try:
                    send(item, delivered)
                except Exception as exc:  # a synchronous refusal is a failed delivery
                    delivered(_refused(item, exc))

    def _outgoing(self, batch: list[MarkedRecord]) -> Iterator[MarkedRecord]:
        """The batch's records as published (with sequence headers when on), those whose key has
        not failed; the others are reported withheld.

        An earlier record of a fenced key failed (reported on this thread a moment ago, or on the
        publisher's): sending a later one could put it on the broker ahead of the failed record's
        re-send. It goes back with the failed one's window. Checked record by record, as they go.
        """
        fenced, sequence = self.dispatcher.fenced_keys, self.limits.sequence_headers
        for item in batch:
            if item.key in fenced:
                self._delivered(Delivery(item, error=WITHHELD))
            else:
                yield with_sequence_headers(item) if sequence else item

    def _delivered(self, delivery: Delivery) -> None:
        if delivery.error is not None:
            # Fence the key before anything else can happen on this thread: when the publisher
            # reports the failure synchronously (inside send), the next record of the key in this
            # shard's batch is already held back.
            self.dispatcher.fenced_keys.add(delivery.record.key)
            if delivery.fatal and self._publisher_failed is None:
                self._publisher_failed = delivery.error
        self._deliveries.append(delivery)
        # Event.set() takes a lock: skip it while the purger has not yet consumed the last wake-up
        # (it drains everything queued after clearing the flag, so nothing is missed).
        if not self._delivery_signal.is_set():
            self._delivery_signal.set()

    # -- purge / reset -------------------------------------------------------------------------
    def _purge_loop(self) -> None:
        store = self.engine.store_factory()
        signal, deliveries = self._delivery_signal, self._deliveries
        try:
            while True:
                signal.wait(0.1)
                signal.clear()  # before draining: a report appended after this sets it again
                batch: list[Delivery] = []
                while deliveries and len(batch) < 5000:
                    batch.append(deliveries.popleft())
                if batch:
                    self._settle(store, batch)
                    if deliveries:
                        signal.set()
                elif self._purger_stop:
                    if self._purge_abandoned:
                        log.info("%d rows in all stay marked for the next leader", self._purge_abandoned)
                    return
        except BaseException as exc:  # an invariant violation or a bug: stop the term loudly
            log.exception("purge/reset loop failed")
            self._error = exc
        finally:
            store.close()

    def _settle(self, store: OutboxStore, deliveries: list[Delivery]) -> None:
        ok = [d.record for d in deliveries if d.error is None]
        failed = [d for d in deliveries if d.error is not None]
        counters = self.engine.counters
        if ok:
            counters.published += len(ok)
            now = datetime.now(UTC)
            # Latency percentiles need a sample, not every record: every 8th keeps the hot path light.
            for r in ok[::8]:
                if r.create_time is not None:
                    counters.latencies.append((now - r.create_time).total_seconds() * 1000.0)
        for d in failed:
            self._failures[d.record.id] = d
            if d.error is not WITHHELD:
                counters.failed += 1
                self._delivery_failed(d)
        if ok and not failed and self._delivery_outage.troubled and time.monotonic() - self._failed_at > 5.0:
            # Five seconds of deliveries without a failure: the trouble is over.
            self._delivery_outage.resolved(
                "deliveries succeed again after %.1fs", self._delivery_outage.duration()
            )
            self._delivery_error = ""
        plan = self.dispatcher.acknowledge(ok, [d.record for d in failed])
        if plan.purge:
            # One statement for every window's acknowledged prefix: a key's rows go in id order.
            if not self._purge(store, [r.id for r in plan.purge]):
                with self._outstanding_lock:
                    self._outstanding -= len(deliveries)
                return  # term ending with the database away: rows stay marked, windows stay full
            counters.purged += len(plan.purge)
            if self._attempts:  # records that failed before; usually none
                for r in plan.purge:
                    self._attempts.pop(r.id, None)
            with self._send_order:
                self._enqueue(self.dispatcher.settle(plan.purge))
        for failure in plan.failures:
            self._resolve(store, failure)
        with self._outstanding_lock:
            self._outstanding -= len(deliveries)

    def _purge(self, store: OutboxStore, ids: list[int]) -> bool:
        backoff = self.limits.io_error_backoff
        tries_after_stop = 0
        outage = self._purge_outage
        if self._purge_abandoned:
            # This term already gave up on the database as it ended: the later batches' rows stay
            # marked too, without another round of retries or another line.
            self._purge_abandoned += len(ids)
            return False
        while True:
            try:
                store.purge(ids)
                outage.resolved("purging again after %.1fs", outage.duration())
                self._purge_busy.resolved("purging again: the outbox is no longer locked")
                return True
            except DatabaseRefusedError:
                raise  # permanent: the term stops (the rows stay for the next leader)
            except DatabaseError as exc:
                # The records stay in their windows: the successors of these records must not be
                # purged (or sent, with one in flight per key) while the rows might still exist.
                if isinstance(exc, LockTimeoutError):
                    # Another writer holds the lock: the DELETE did nothing. A wait, not an
                    # outage: said only if it lasts; asked again soon.
                    pause = 0.01
                    self._purge_busy.warn(
                        "purge of %d rows: the outbox has been locked by other writers for a while "
                        "(%s); still trying",
                        len(ids),
                        exc,
                    )
                else:
                    # One line per outage (a reminder a minute while it lasts), not one per attempt.
                    pause = backoff
                    outage.warn("purge of %d rows failed (%s); retrying every %.3fs", len(ids), exc, backoff)
                if self._stopping.is_set():
                    tries_after_stop += 1
                    if tries_after_stop > 3:
                        log.warning(
                            "giving up purging %d rows at shutdown: they stay for the next leader", len(ids)
                        )
                        self._purge_abandoned = len(ids)
                        return False
                time.sleep(pause)

    def _delivery_failed(self, d: Delivery) -> None:
        """Warn of a failed delivery: at once when it fails in a new way, then at most once a
        minute while deliveries keep failing the same way (the count held back is said)."""
        error = str(d.error)
        self._failed_at = time.monotonic()
        if error != self._delivery_error:
            self._delivery_error = error
            self._delivery_outage.changed()
        self._delivery_outage.warn(
            "delivery of record %d (key %r) failed: %s", d.record.id, d.record.key, d.error
        )

    def _resolve(self, store: OutboxStore, failure: Failure) -> None:
        """A key's window drained after a failure: bury or reset its first failed record; the
        records behind it are not purged (they are re-marked with it, or parked)."""
        lim, counters, record = self.limits, self.engine.counters, failure.record
        d = self._failures.pop(record.id)
        for behind in failure.behind:
            self._failures.pop(behind.id, None)
        attempts = self._attempts.get(record.id, 0) + 1
        self._attempts[record.id] = attempts
        bury = lim.dead_letter and (
            (d.permanent and lim.bury_permanent) or (lim.max_attempts > 0 and attempts >= lim.max_attempts)
        )
        if bury:
            park = lim.park_key
            try:
                store.bury(record, d.error or "unknown error", attempts, park)
            except DatabaseError as exc:
                log.warning(
                    "moving record %d to the dead-letter table failed (%s); it will be retried",
                    record.id,
                    exc,
                )
            else:
                counters.dead += 1
                counters.reset += len(failure.behind)
                self._attempts.pop(record.id, None)
                self.engine.emit(
                    RecordDeadLettered(record.id, record.topic, record.key, d.error or "", attempts, park)
                )
                if park:
                    log.warning(
                        "key %r parked behind dead letter %d: its later records wait for "
                        "`sluice outbox dead retry|resolve`",
                        record.key,
                        record.id,
                    )
                    self.engine.emit(KeyParked(record.id, record.topic, record.key))
                with self._send_order:
                    self._enqueue(self.dispatcher.close_failure(failure, settled=True, park=park))
                return
        try:
            if record.leader_id is not None:
                store.reset(record.id, record.leader_id)
        except DatabaseError as exc:
            # Possibly not reset: harmless, the marker's fresh leader id re-marks it either way.
            log.warning("reset of record %d failed (%s); the leader refresh re-marks it", record.id, exc)
        # The records behind it keep their leader id: the fresh one re-marks them all the same.
        counters.reset += 1 + len(failure.behind)
        with self._send_order:
            self._enqueue(self.dispatcher.close_failure(failure, settled=False))

    # -- shutdown ------------------------------------------------------------------------------
    def _shutdown(self, shards: list[threading.Thread], purger: threading.Thread) -> None:
        for shard in self._shards:
            # Unsent records stay marked for whoever leads next.
            self.dispatcher.abandon(shard.close())
        for t in shards:
            t.join()
        # Let deliveries already handed to the publisher finish, so their rows are purged or reset.
        remaining = self.engine.publisher.flush(self.limits.drain_timeout)
        deadline = time.monotonic() + self.limits.drain_timeout
        while time.monotonic() < deadline and self._error is None:
            with self._outstanding_lock:
                if self._outstanding <= 0:
                    break
            time.sleep(0.01)
        if remaining:
            log.warning(
                "%d deliveries still outstanding at the end of the term; their rows stay marked", remaining
            )
        self._purger_stop = True
        self._delivery_signal.set()
        purger.join(timeout=self.limits.drain_timeout + 5)


_NO_BATCH = contextlib.nullcontext()


def _no_batch(records: list[MarkedRecord]) -> contextlib.AbstractContextManager[object]:
    """A batch's sends to a publisher that has no ``batch()``: nothing around them."""
    return _NO_BATCH


def _refused(item: MarkedRecord, exc: Exception) -> Delivery:
    """A publisher's synchronous refusal, as the failed delivery it is."""
    return Delivery(
        item,
        error=f"{type(exc).__name__}: {exc}",
        permanent=bool(getattr(exc, "permanent", False)),
        fatal=bool(getattr(exc, "fatal", False)),
    )


class Engine:
    """Runs MP/R terms. ``store_factory`` opens a store (one per thread: marker and purger)."""

    def __init__(
        self,
        store_factory: Callable[[], OutboxStore],
        publisher: Publisher,
        limits: EngineLimits,
        emit: Callable[[Event], None] = lambda e: None,
    ) -> None:
        self.store_factory = store_factory
        self.publisher = publisher
        self.limits = limits
        self._emit = emit
        self.counters = Counters()
        self._last_snapshot = self.counters.snapshot()
        self.current: Term | None = None

    def emit(self, event: Event) -> None:
        try:
            self._emit(event)
        except Exception:
            log.exception("event handler raised on %s", type(event).__name__)

    def run_term(self, should_run: Callable[[], bool], on_start: Callable[[str], None] | None = None) -> str:
        """Harvest until ``should_run()`` turns false. Returns the term's first leader id."""
        term = Term(self, should_run)
        self.current = term
        first_id = term.leader_id
        if on_start is not None:
            on_start(first_id)
        try:
            term.run()
        except InvariantViolation:
            log.critical("invariant violated: stopping the harvester", exc_info=True)
            raise
        finally:
            self.current = None
        return first_id

    def emit_meter(
        self, interval: float, disp: Dispatcher | None = None, parked_keys: int | None = None
    ) -> Stats:
        c = self.counters
        now = c.snapshot()
        prev, self._last_snapshot = self._last_snapshot, now
        delta = [a - b for a, b in zip(now, prev, strict=True)]
        samples = list(c.latencies)
        c.latencies.clear()
        stats = Stats(
            interval_s=interval,
            throughput=delta[1] / interval if interval > 0 else 0.0,
            in_flight=disp.in_flight if disp else 0,
            pending=disp.pending if disp else 0,
            marked=delta[0],
            published=delta[1],
            purged=delta[2],
            reset=delta[3],
            dead=delta[4],
            latency_ms=percentiles(samples),
            parked_keys=parked_keys,
        )
        self.emit(MeterRead(stats))
        return stats
