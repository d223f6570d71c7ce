"""Per-key pipelining (perKeyInFlight > 1), sequence headers and key parking, against the
in-memory store and a publisher that behaves like librdkafka's gapless idempotent producer."""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluiceway.errors import PublishError
from sluiceway.harvest.engine import Engine
from sluiceway.harvest.events import Event, KeyParked, LeaderRefreshed, RecordDeadLettered
from sluiceway.harvest.ports import Delivery
from sluiceway.harvest.sequence import SLUICE_ID, SLUICE_LEADER, Deduplicator
from sluiceway.outbox.memory import MemoryOutboxStore
from sluiceway.outbox.record import MarkedRecord, OutboxRecord
from sluiceway.testing import wait_until
from tests.support.engine import LIMITS, load, run

#: How a send fails: not written (the broker never got it) or written but reported failed.
DROPPED, ACK_LOST = "dropped", "ack lost"


class GaplessPublisher:
    """Delivers on a background thread, per key in send order (keys interleaved at random), like
    one idempotent producer per partition. ``fail(record)`` picks a failure (or None). Gapless as
    librdkafka's producer with ``enable.gapless.guarantee``: once a record is dropped, the records
    of its key sent before that failure is reported (same leader id) are dropped too."""

    def __init__(
        self,
        fail: Callable[[MarkedRecord], str | None] = lambda r: None,
        permanent: bool = False,
        *,
        inline: bool = False,
        refuse: Callable[[MarkedRecord], bool] = lambda r: False,
    ):
        self.fail, self.permanent = fail, permanent
        self.inline = inline  # as librdkafka's producer: the engine sends with no send threads
        #: Refused inside ``send`` (it raises, nothing is queued), as produce() on a full queue: the
        #: key's next send would be taken, so the engine must hold the key's later records back.
        self.refuse = refuse
        self.log: list[MarkedRecord] = []  # what the broker holds, in order
        self.cv = threading.Condition()
        self.queue: list[tuple[MarkedRecord, Callable[[Delivery], None]]] = []
        self.dropped: dict[str, str | None] = {}  # key -> leader id of its dropped record
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        if self.refuse(record):
            raise PublishError("injected: refused")
        with self.cv:
            self.queue.append((record, on_done))
            self.cv.notify()

    def _run(self) -> None:
        rng = random.Random(7)
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.queue or self.stop)
                if self.stop and not self.queue:
                    return
                batch, self.queue = self.queue, []
            by_key: dict[str, list[tuple[MarkedRecord, Callable[[Delivery], None]]]] = defaultdict(list)
            for item in batch:
                by_key[item[0].key].append(item)
            lanes = list(by_key.values())
            while lanes:
                lane = rng.choice(lanes)
                record, done = lane.pop(0)
                if not lane:
                    lanes.remove(lane)
                self._deliver(record, done)

    def _deliver(self, record: MarkedRecord, done: Callable[[Delivery], None]) -> None:
        if record.key in self.dropped:
            if self.dropped[record.key] == record.leader_id:
                done(Delivery(record, error="dropped behind a dropped record"))
                return
            del self.dropped[record.key]
        mode = self.fail(record)
        if mode is None:
            self.log.append(record)
            done(Delivery(record))
            return
        if mode == ACK_LOST:
            self.log.append(record)
        else:
            self.dropped[record.key] = record.leader_id
        done(Delivery(record, error=f"injected: {mode}", permanent=self.permanent))

    def flush(self, timeout: float) -> int:
        return 0

    def close(self) -> None:
        with self.cv:
            self.stop = True
            self.cv.notify()


def per_key(log: Sequence[MarkedRecord]) -> dict[str, list[int]]:
    got: dict[str, list[int]] = defaultdict(list)
    for record in log:
        got[record.key].append(record.id)
    return got


def assert_resent_suffixes(log: Sequence[MarkedRecord], ids_by_key: dict[str, list[int]]) -> int:
    """Per key: every record first appears after its predecessor, and a repeat only restarts an
    earlier suffix (…, 7, 8, 9, 8, 9, 10, …). Returns the number of re-sent records."""
    got, resent = per_key(log), 0
    for key, ids in ids_by_key.items():
        position = {rid: i + 1 for i, rid in enumerate(ids)}
        seq = [position[rid] for rid in got[key]]
        assert seq and seq[0] == 1, f"key {key}: starts at {seq[:1]}"
        for prev, nxt in itertools.pairwise(seq):
            assert nxt <= prev + 1, f"key {key}: {nxt} follows {prev} in {seq}"
        assert max(seq) == len(ids), f"key {key}: ends at {max(seq)} of {len(ids)}"
        resent += len(seq) - len(ids)
    return resent


def assert_exact_after_dedup(log: Sequence[MarkedRecord], ids_by_key: dict[str, list[int]]) -> None:
    dedup = Deduplicator()
    passed = [r for r in log if dedup.admit_id(r.key, r.id)]
    assert per_key(passed) == {k: v for k, v in ids_by_key.items() if v}


class InOrderPurges(MemoryOutboxStore):
    """Fails the test if a key's row is purged while an older row of the key remains: a key's
    unpurged rows must always be a suffix (a new leader re-sends it whole)."""

    def purge(self, ids: Sequence[int]) -> None:
        with self._lock:
            keys = {rid: self.rows[rid].key for rid in ids if rid in self.rows}
        super().purge(ids)
        with self._lock:
            for other in self.rows.values():
                for rid, key in keys.items():
                    assert not (other.key == key and other.id < rid), (
                        f"row {rid} purged before row {other.id} of its key"
                    )


PIPELINED = dataclasses.replace(LIMITS, per_key_in_flight=4, max_in_flight_records=60)


@pytest.mark.parametrize("inline", [False, True], ids=["send-threads", "inline"])
def test_pipelined_keys_drain_once_each_in_order(inline: bool) -> None:
    store = InOrderPurges()
    ids = load(store, 1500, 3)
    pub = GaplessPublisher(inline=inline)
    run(store, pub, PIPELINED, lambda: not store.rows)
    assert per_key(pub.log) == ids  # no failure: every record exactly once


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    fail_rate=st.floats(0.0, 0.15),
    keys=st.integers(1, 12),
    per_key_in_flight=st.sampled_from([2, 8]),
    inline=st.booleans(),
    refuse_rate=st.sampled_from([0.0, 0.05]),
)
def test_random_failures_re_send_only_suffixes(
    seed: int, fail_rate: float, keys: int, per_key_in_flight: int, inline: bool, refuse_rate: float
) -> None:
    """Failures reported later and refusals inside ``send``, with send threads and inline."""
    rng, lock = random.Random(seed), threading.Lock()

    def fail(r: MarkedRecord) -> str | None:
        with lock:
            if rng.random() >= fail_rate:
                return None
            return DROPPED if rng.random() < 0.5 else ACK_LOST

    def refuse(r: MarkedRecord) -> bool:
        with lock:
            return rng.random() < refuse_rate

    store = InOrderPurges()
    ids = load(store, 300, keys)
    for verb in ("mark", "purge", "reset"):
        store.fail_next(verb, applied=rng.random() < 0.5, times=rng.randrange(3))
    pub = GaplessPublisher(fail, inline=inline, refuse=refuse)
    limits = dataclasses.replace(PIPELINED, per_key_in_flight=per_key_in_flight)
    run(store, pub, limits, lambda: not store.rows)
    assert_resent_suffixes(pub.log, ids)
    assert_exact_after_dedup(pub.log, ids)


def test_sequence_headers_carry_the_row_id_and_the_leader_id() -> None:
    store = MemoryOutboxStore()
    load(store, 20, 2)
    pub = GaplessPublisher()
    run(store, pub, dataclasses.replace(PIPELINED, sequence_headers=True), lambda: not store.rows)
    for record in pub.log:
        assert record.headers[-2:] == ((SLUICE_ID, str(record.id)), (SLUICE_LEADER, record.leader_id))
    plain = GaplessPublisher()
    store2 = MemoryOutboxStore()
    load(store2, 5, 1)
    run(store2, plain, PIPELINED, lambda: not store2.rows)
    assert all(r.headers == () for r in plain.log)


@pytest.mark.parametrize("per_key_in_flight", [1, 4])
@pytest.mark.parametrize("action", ["retry", "resolve"])
def test_a_dead_letter_parks_its_key_until_an_operator_acts(per_key_in_flight: int, action: str) -> None:
    store = InOrderPurges()
    ids = load(store, 120, 4)
    poison = ids["k1"][10]
    broken = threading.Event()
    broken.set()
    pub = GaplessPublisher(lambda r: DROPPED if r.id == poison and broken.is_set() else None, permanent=True)
    events: list[Event] = []
    limits = dataclasses.replace(PIPELINED, per_key_in_flight=per_key_in_flight)
    done = threading.Event()
    engine = Engine(lambda: store, pub, limits, events.append)
    thread = threading.Thread(target=lambda: engine.run_term(lambda: not done.is_set()), daemon=True)
    thread.start()
    try:
        # Every other key completes; k1 stops before the poison and waits, parked.
        behind = ids["k1"][11:]
        wait_until(lambda: sorted(store.rows) == behind, timeout=30)
        assert store.parked == {poison: "k1"} and store.parked_keys() == 1
        assert per_key(pub.log)["k1"] == ids["k1"][:10]
        assert [e.record_id for e in events if isinstance(e, KeyParked)] == [poison]
        assert [e.parked for e in events if isinstance(e, RecordDeadLettered)] == [True]
        broken.clear()  # the fault is gone
        getattr(store, action)(poison)
        wait_until(lambda: not store.rows, timeout=30)
    finally:
        done.set()
        thread.join(30)
        pub.close()
    expected = dict(ids)
    if action == "resolve":
        expected["k1"] = [i for i in ids["k1"] if i != poison]
    assert per_key(pub.log) == expected  # exactly once each, in order


class HoldingPublisher:
    """Holds key ``a``'s deliveries until :meth:`release`; fails key ``b``'s first send at once.
    Notes every send made while a record of its key marked under another leader id is unreported:
    a gapless publisher (the fake above, the journal publisher) that dropped that record would
    let the send land, since another leader id marks a re-send."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: list[int] = []
        self.mixed: list[int] = []
        self.unreported: dict[int, MarkedRecord] = {}
        self.held: list[tuple[MarkedRecord, Callable[[Delivery], None]]] = []
        self.holding, self.b_failed = True, False

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        with self.lock:
            self.sent.append(record.id)
            if any(r.key == record.key and r.leader_id != record.leader_id for r in self.unreported.values()):
                self.mixed.append(record.id)
            self.unreported[record.id] = record
            if record.key == "a" and self.holding:
                self.held.append((record, on_done))
                return
            fail = record.key == "b" and not self.b_failed
            self.b_failed |= fail
        self._report(Delivery(record, error="injected: dropped") if fail else Delivery(record), on_done)

    def _report(self, delivery: Delivery, on_done: Callable[[Delivery], None]) -> None:
        with self.lock:
            del self.unreported[delivery.record.id]
        on_done(delivery)

    def release(self) -> None:
        with self.lock:
            self.holding, held, self.held = False, self.held, []
        for record, on_done in held:
            self._report(Delivery(record), on_done)

    def flush(self, timeout: float) -> int:
        return 0

    def close(self) -> None:
        self.release()


def test_a_key_sends_nothing_under_a_new_leader_id_while_records_of_an_older_one_are_in_flight() -> None:
    store = InOrderPurges()
    assert [store.stash(OutboxRecord("t", key, "v")) for key in ("a", "b")] == [1, 2]
    pub = HoldingPublisher()
    refreshed = threading.Event()

    def on_event(event: Event) -> None:
        if isinstance(event, LeaderRefreshed):
            refreshed.set()

    engine = Engine(lambda: store, pub, PIPELINED, on_event)
    done = threading.Event()
    thread = threading.Thread(target=lambda: engine.run_term(lambda: not done.is_set()), daemon=True)
    thread.start()
    try:
        # Record 1 (key a) is in flight, held; record 2 (key b) fails: a fresh leader id.
        assert refreshed.wait(30)
        later = store.stash(OutboxRecord("t", "a", "later"))  # marked under the fresh id
        wait_until(
            lambda: (
                later in pub.sent or (engine.current is not None and engine.current.dispatcher.pending == 1)
            ),
            timeout=30,
        )
        assert pub.mixed == []  # not sent behind record 1, which is still unreported
        pub.release()
        wait_until(lambda: not store.rows, timeout=30)
    finally:
        done.set()
        thread.join(30)
        pub.close()
    assert pub.mixed == []
    assert [rid for rid in pub.sent if rid != 2] == [1, later]
