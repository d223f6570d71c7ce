"""Wake-ups in the engine (the in-memory store's stand-in for the notify trigger): an idle marker
waits for a notification instead of polling, wakes for a new row, and never waits out its
fallback when the term itself needs a mark (a failed delivery)."""

from __future__ import annotations

import dataclasses
import threading
import time

from sluiceway.harvest.engine import Engine
from sluiceway.outbox.memory import MemoryOutboxStore
from sluiceway.outbox.record import MarkedRecord, OutboxRecord
from sluiceway.testing import wait_until
from tests.support.engine import LIMITS
from tests.unit.harvest.test_engine import FakePublisher

#: Far longer than any wait below: whatever happens within a test happened because of a wake-up.
IDLE_POLL = 120.0


def start(store: MemoryOutboxStore, publisher: FakePublisher) -> threading.Event:
    limits = dataclasses.replace(LIMITS, idle_poll=IDLE_POLL)  # mark_backoff is 1 ms
    engine = Engine(lambda: store, publisher, limits)
    stop = threading.Event()
    threading.Thread(target=lambda: engine.run_term(lambda: not stop.is_set()), daemon=True).start()
    return stop


def idle_marks(store: MemoryOutboxStore, seconds: float) -> int:
    before = store.calls.get("mark", 0)
    time.sleep(seconds)
    return store.calls.get("mark", 0) - before


def test_an_idle_marker_waits_for_a_wake_up_and_a_new_row_wakes_it() -> None:
    store, publisher = MemoryOutboxStore(notify=True), FakePublisher()
    stop = start(store, publisher)
    try:
        wait_until(lambda: store.calls.get("mark", 0) > 0, timeout=10)
        assert idle_marks(store, 1.0) <= 1, "an idle marker with wake-ups does not poll"
        rid = store.stash(OutboxRecord("t", "k", "v"))
        wait_until(lambda: ("k", rid) in publisher.log, timeout=10, message="the wake-up to publish it")
        wait_until(lambda: not store.rows, timeout=10)
    finally:
        stop.set()
        publisher.close()


def test_without_wake_ups_the_marker_polls() -> None:
    """The control for the test above: the same engine on a store that cannot notify polls."""
    store, publisher = MemoryOutboxStore(), FakePublisher()
    stop = start(store, publisher)
    try:
        wait_until(lambda: store.calls.get("mark", 0) > 0, timeout=10)
        assert idle_marks(store, 1.0) > 20
    finally:
        stop.set()
        publisher.close()


def test_a_failed_delivery_is_re_marked_at_once_not_after_the_idle_poll() -> None:
    failed: list[int] = []

    def fail_once(record: MarkedRecord) -> str | None:
        if not failed:
            failed.append(record.id)
            return "injected"
        return None

    store, publisher = MemoryOutboxStore(notify=True), FakePublisher(fail_once)
    stop = start(store, publisher)
    try:
        rid = store.stash(OutboxRecord("t", "k", "v"))
        # The only row failed; the outbox holds nothing new, so no notification comes: the
        # marker must still take a fresh leader id and re-mark it now (forceRemark ends the wait).
        wait_until(lambda: ("k", rid) in publisher.log, timeout=15, message="the re-send")
        assert failed == [rid]
    finally:
        stop.set()
        publisher.close()
