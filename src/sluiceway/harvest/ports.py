"""The narrow ports the MP/R engine talks to. Adapters (SQL, Kafka, journal) implement them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from sluiceway.outbox.record import MarkedRecord


class Delivery(NamedTuple):
    """The outcome of one send. ``error`` is None on success.

    ``permanent`` says the destination can never accept this record (too large, invalid topic):
    retrying is pointless and the record is a dead-letter candidate at once.
    """

    record: MarkedRecord
    error: str | None = None
    permanent: bool = False
    #: Where it landed (Kafka partition/offset or journal offset), for events and tests.
    partition: int | None = None
    offset: int | None = None


class OutboxStore(Protocol):
    """The three verbs of MP/R plus burial of poison records. Each call may fail with a
    DatabaseError *after* succeeding on the server: callers must assume it might have."""

    def mark(self, leader_id: str, limit: int) -> list[MarkedRecord]: ...

    def purge(self, ids: Sequence[int]) -> None: ...

    def reset(self, record_id: int, leader_id: str) -> None: ...

    def bury(self, record: MarkedRecord, error: str, attempts: int) -> None: ...

    def close(self) -> None: ...


class Publisher(Protocol):
    """Sends records asynchronously; ``on_done`` is called exactly once per send, from any thread."""

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None: ...

    def flush(self, timeout: float) -> int:
        """Wait for outstanding deliveries; return how many are still outstanding."""
        ...

    def close(self) -> None: ...
