"""The MP/R engine against the in-memory store and a fake publisher: order and completeness under
delivery failures and database failures that may have taken effect."""

from __future__ import annotations

import dataclasses
import random
import threading
from collections import defaultdict
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluiceway.errors import PublishError
from sluiceway.harvest.engine import Engine
from sluiceway.harvest.events import Event, LeaderRefreshed, RecordDeadLettered
from sluiceway.harvest.ports import Delivery
from sluiceway.outbox.memory import MemoryOutboxStore
from sluiceway.outbox.record import MarkedRecord
from sluiceway.testing import wait_until
from tests.support.engine import LIMITS, load, run


class FakePublisher:
    """Delivers on a background thread; fails records by a rule; remembers what the broker got."""

    def __init__(
        self,
        fail: Callable[[MarkedRecord], str | None] = lambda r: None,
        permanent: bool = False,
        *,
        inline: bool = False,
        refuse: Callable[[MarkedRecord], bool] = lambda r: False,
    ) -> None:
        self.log: list[tuple[str, int]] = []  # (key, record id) as the broker accepted them
        self.fail = fail
        self.permanent = permanent
        #: As librdkafka's producer: send only queues, so the engine calls it with no send threads.
        self.inline = inline
        #: Records refused synchronously (``send`` raises), as a producer refuses a full queue.
        self.refuse = refuse
        self.lock = threading.Lock()
        self.pending: list[tuple[MarkedRecord, Callable[[Delivery], None]]] = []
        self.cv = threading.Condition(self.lock)
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        if self.refuse(record):
            raise PublishError("injected: refused")
        with self.cv:
            self.pending.append((record, on_done))
            self.cv.notify()

    def _run(self) -> None:
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.pending or self.stop)
                if self.stop and not self.pending:
                    return
                batch, self.pending = self.pending, []
            random.shuffle(batch)  # deliveries of different keys complete in any order
            for record, done in batch:
                error = self.fail(record)
                if error is None:
                    with self.lock:
                        self.log.append((record.key, record.id))
                    done(Delivery(record))
                else:
                    done(Delivery(record, error=error, permanent=self.permanent))

    def flush(self, timeout: float) -> int:
        wait_until(lambda: not self.pending, timeout=timeout)
        return 0

    def close(self) -> None:
        with self.cv:
            self.stop = True
            self.cv.notify()


def assert_order(log: list[tuple[str, int]], ids_by_key: dict[str, list[int]]) -> None:
    got: dict[str, list[int]] = defaultdict(list)
    for key, rid in log:
        got[key].append(rid)
    for key, ids in ids_by_key.items():
        seq = got[key]
        collapsed = [x for i, x in enumerate(seq) if i == 0 or x != seq[i - 1]]
        assert collapsed == ids, f"key {key}: {collapsed} != {ids}"


@pytest.mark.parametrize("inline", [False, True], ids=["send-threads", "inline"])
def test_drains_in_per_key_order(inline: bool) -> None:
    store = MemoryOutboxStore()
    ids = load(store, 2000, 37)
    pub = FakePublisher(inline=inline)
    run(store, pub, LIMITS, lambda: not store.rows)
    assert_order(pub.log, ids)
    assert len(pub.log) == 2000  # no failures: no duplicates


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    fail_rate=st.floats(0.0, 0.2),
    keys=st.integers(1, 20),
    inline=st.booleans(),
    refuse_rate=st.sampled_from([0.0, 0.05]),
)
def test_random_delivery_failures_never_reorder_or_lose(
    seed: int, fail_rate: float, keys: int, inline: bool, refuse_rate: float
) -> None:
    """Failures reported later and refusals inside ``send`` (the next record of the key must be
    held back at once), with send threads and inline (as the Kafka and journal publishers)."""
    rng = random.Random(seed)
    rng_lock = threading.Lock()

    def fail(r: MarkedRecord) -> str | None:
        with rng_lock:
            return "injected" if rng.random() < fail_rate else None

    def refuse(r: MarkedRecord) -> bool:
        with rng_lock:
            return rng.random() < refuse_rate

    store = MemoryOutboxStore()
    ids = load(store, 300, keys)
    for verb in ("mark", "purge", "reset"):
        store.fail_next(verb, applied=rng.random() < 0.5, times=rng.randrange(3))
    pub = FakePublisher(fail, inline=inline, refuse=refuse)
    run(store, pub, LIMITS, lambda: not store.rows)
    assert_order(pub.log, ids)


def test_mark_that_failed_after_applying_is_re_marked_under_a_new_id() -> None:
    store = MemoryOutboxStore()
    ids = load(store, 100, 5)
    store.fail_next("mark", applied=True)
    events: list[Event] = []
    pub = FakePublisher()
    run(store, pub, LIMITS, lambda: not store.rows, events)
    assert_order(pub.log, ids)
    assert any(isinstance(e, LeaderRefreshed) for e in events)


def test_purge_failures_hold_the_barrier_until_retried() -> None:
    store = MemoryOutboxStore()
    ids = load(store, 200, 3)
    store.fail_next("purge", applied=False, times=5)
    pub = FakePublisher()
    run(store, pub, LIMITS, lambda: not store.rows)
    assert_order(pub.log, ids)
    assert len(pub.log) == 200  # purge retried: nothing re-sent
    assert store.calls["purge"] >= 6


def test_a_term_ending_with_purges_failing_gives_up_once(caplog: pytest.LogCaptureFixture) -> None:
    """The database goes for good mid-term: the term ends, the purge thread gives up once (one
    line), and the deliveries still reported after that stay marked without more retries."""
    store = MemoryOutboxStore()
    load(store, 200, 20)
    pub = FakePublisher()
    store.fail_next("purge", applied=False, times=1_000_000)
    with caplog.at_level("INFO", logger="sluiceway"):
        run(store, pub, LIMITS, lambda: len(pub.log) >= 10)
    gave_up = [r for r in caplog.records if r.getMessage().startswith("giving up purging")]
    assert len(gave_up) == 1, [r.getMessage() for r in gave_up]
    assert len(store.rows) == 200  # nothing purged, nothing lost: every row stays for the next leader


def test_poison_record_goes_to_dead_letters_and_others_flow() -> None:
    store = MemoryOutboxStore()
    ids = load(store, 60, 3)
    poison = ids["k1"][4]
    limits = dataclasses.replace(LIMITS, max_attempts=3, park_key=False)
    events: list[Event] = []
    pub = FakePublisher(lambda r: "boom" if r.id == poison else None)
    run(store, pub, limits, lambda: not store.rows, events)
    assert list(store.dead) == [poison]
    assert store.dead[poison][1:] == ("boom", 3)
    ids["k1"].remove(poison)
    assert_order(pub.log, ids)
    assert [e.record_id for e in events if isinstance(e, RecordDeadLettered)] == [poison]


def test_permanent_errors_are_buried_at_once() -> None:
    store = MemoryOutboxStore()
    ids = load(store, 10, 2)
    pub = FakePublisher(lambda r: "MSG_SIZE_TOO_LARGE" if r.id == ids["k0"][0] else None, permanent=True)
    run(store, pub, dataclasses.replace(LIMITS, park_key=False), lambda: not store.rows)
    assert store.dead[ids["k0"][0]][2] == 1


def test_unlimited_attempts_by_default_keep_retrying() -> None:
    store = MemoryOutboxStore()
    ids = load(store, 5, 1)
    tries: dict[int, int] = defaultdict(int)

    def flaky(r: MarkedRecord) -> str | None:
        tries[r.id] += 1
        return "transient" if tries[r.id] <= 6 else None

    pub = FakePublisher(flaky)
    run(store, pub, LIMITS, lambda: not store.rows)
    assert not store.dead
    assert_order(pub.log, ids)


@pytest.mark.parametrize("send_buffer", [1, 2])
def test_send_buffer_bounds_each_shard_queue(send_buffer: int) -> None:
    store = MemoryOutboxStore()
    load(store, 200, 50)
    gate = threading.Event()
    seen_sizes: list[int] = []
    engine_ref: list[Engine] = []

    class SlowPublisher(FakePublisher):
        def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
            term = engine_ref[0].current
            if term is not None:
                seen_sizes.extend(q.qsize() for q in term._shards)
            gate.wait(0.002)
            super().send(record, on_done)

    pub = SlowPublisher()
    limits = dataclasses.replace(LIMITS, send_buffer=send_buffer, send_concurrency=2)
    engine = Engine(lambda: store, pub, limits)
    engine_ref.append(engine)
    done = threading.Event()
    t = threading.Thread(target=lambda: engine.run_term(lambda: not done.is_set()), daemon=True)
    t.start()
    wait_until(lambda: not store.rows, timeout=30)
    done.set()
    t.join(10)
    pub.close()
    assert seen_sizes and max(seen_sizes) <= send_buffer
