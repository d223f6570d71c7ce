"""Running the MP/R engine in unit tests: against the in-memory store, with a fake publisher."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

from sluiceway.harvest.engine import Engine, EngineLimits
from sluiceway.harvest.events import Event
from sluiceway.harvest.ports import Publisher
from sluiceway.outbox.memory import MemoryOutboxStore
from sluiceway.outbox.record import OutboxRecord
from sluiceway.testing import wait_until

LIMITS = EngineLimits(
    max_in_flight_records=50,
    send_concurrency=4,
    send_buffer=3,
    mark_query_records=20,
    mark_backoff=0.001,
    io_error_backoff=0.001,
    drain_timeout=2,
    min_metrics_interval=60,
)


def load(store: MemoryOutboxStore, n: int, keys: int) -> dict[str, list[int]]:
    ids: dict[str, list[int]] = defaultdict(list)
    for i in range(n):
        key = f"k{i % keys}"
        ids[key].append(store.stash(OutboxRecord("t", key, str(i))))
    return ids


def run(
    store: MemoryOutboxStore,
    publisher: Publisher,
    limits: EngineLimits,
    until: Callable[[], bool],
    events: list[Event] | None = None,
) -> None:
    engine = Engine(
        lambda: store, publisher, limits, (events.append if events is not None else lambda e: None)
    )
    done = threading.Event()
    thread = threading.Thread(target=lambda: engine.run_term(lambda: not done.is_set()), daemon=True)
    thread.start()
    try:
        wait_until(until, timeout=30, message="the engine to finish")
    finally:
        done.set()
        thread.join(30)
        publisher.close()
