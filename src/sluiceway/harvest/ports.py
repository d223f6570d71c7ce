"""The narrow ports the MP/R engine talks to. Adapters (SQL, Kafka, journal) implement them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import NamedTuple, Protocol, runtime_checkable

from sluiceway.outbox.record import MarkedRecord, RecordColumns


class Delivery(NamedTuple):
    """The outcome of one send. ``error`` is None on success.

    ``permanent`` says the destination can never accept this record (too large, invalid topic):
    retrying is pointless and the record is a dead-letter candidate at once. ``fatal`` says the
    publisher can deliver nothing more (librdkafka's fatal errors): the term ends and the next one
    opens a fresh client.
    """

    record: MarkedRecord
    error: str | None = None
    permanent: bool = False
    #: Where it landed (Kafka partition/offset or journal offset), for events and tests.
    partition: int | None = None
    offset: int | None = None
    fatal: bool = False


class Wakeups(Protocol):
    """Notifications that rows were added to the outbox (PostgreSQL's LISTEN, on the outbox's
    notify trigger). Hints only: the marker still marks to find out what is there."""

    def wait(self, timeout: float) -> bool:
        """True when woken (rows may have been added, or a lost connection was reopened: look),
        False when ``timeout`` seconds passed with nothing."""
        ...

    def close(self) -> None: ...


class OutboxStore(Protocol):
    """The three verbs of MP/R plus burial of poison records. Each call may fail with a
    DatabaseError *after* succeeding on the server: callers must assume it might have."""

    def mark(self, leader_id: str, limit: int) -> list[MarkedRecord]: ...

    def purge(self, ids: Sequence[int]) -> None: ...

    def reset(self, record_id: int, leader_id: str) -> None: ...

    def bury(self, record: MarkedRecord, error: str, attempts: int, parked: bool) -> None:
        """Move a poison record to the dead-letter table. ``parked``: its key's later rows are not
        marked (by any leader) until an operator retries or resolves it."""
        ...

    def parked_keys(self) -> int:
        """How many keys are parked behind a dead letter."""
        ...

    def wakeups(self) -> Wakeups | None:
        """Start listening for added rows, if the outbox can tell (its notify trigger); else None
        (the marker polls). Listening starts here: call it before the mark it should follow."""
        ...

    def close(self) -> None: ...


class Publisher(Protocol):
    """Sends records asynchronously; ``on_done`` is called exactly once per send, from any thread.

    Per key, sends are made in id order from one thread. With ``perKeyInFlight`` > 1 a publisher
    must also be *gapless* per key: once a send fails (reported in ``on_done``, possibly inside
    ``send`` itself), no send of the same key made before that report may land after it without
    the failed one. A Kafka idempotent producer with ``enable.gapless.guarantee`` is; so is the
    journal publisher. The engine never sends a record of a key while records of that key marked
    under another leader id are unreported, so a publisher may take a new leader id as the start
    of a re-send (the journal publisher clears a key's failure on it).
    """

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None: ...

    # What a publisher may do besides: the abilities below (Inline, SendsMany, SendsInBatches,
    # SendsColumns).

    def flush(self, timeout: float) -> int:
        """Wait for outstanding deliveries; return how many are still outstanding."""
        ...

    def close(self) -> None: ...


class ColumnsDone(Protocol):
    """How a publisher reports the records of one ``send_columns`` call, from any thread."""

    def acked(self, count: int) -> None:
        """``count`` more of the records were acknowledged (which ones: any, in any order)."""
        ...

    def failed(self, index: int, delivery: Delivery) -> None:
        """Record ``index`` was not delivered (``delivery.error``, ``permanent``, ``fatal``)."""
        ...


@runtime_checkable
class Inline(Protocol):
    """A publisher whose ``send`` only queues the record (it never waits on the destination, only
    on a full local queue) and says so with ``inline = True``: the engine then calls it on the
    thread that dispatched the records, with no send threads (``sendConcurrency``,
    ``sendBuffer``) between."""

    inline: bool


@runtime_checkable
class SendsMany(Protocol):
    """A publisher that takes a send batch whole (the engine then hands it each one)."""

    def send_many(self, records: list[MarkedRecord], on_done: Callable[[Delivery], None]) -> None:
        """The records in order, at once, with no synchronous failure part-way (all or raise)."""
        ...


@runtime_checkable
class SendsInBatches(Protocol):
    """A publisher sent to record by record that wants to know which sends make one dispatched
    batch: the engine makes each batch's ``send`` calls inside ``with publisher.batch(records):``,
    on one thread (its traced wrapper makes one span of them)."""

    def batch(self, records: list[MarkedRecord]) -> AbstractContextManager[object]:
        """What the ``send`` calls of ``records`` (in order, some perhaps withheld) happen in."""
        ...


@runtime_checkable
class SendsColumns(Protocol):
    """A publisher that takes many records made at once (``sluice capture``'s appends)."""

    def send_columns(self, columns: RecordColumns, done: ColumnsDone) -> None:
        """In order, with no object per record on either side. Each record is reported exactly
        once: counted in ``done.acked`` or named in ``done.failed``. A record the destination
        refuses at once and for good (too large for the client) is reported through
        ``done.failed`` too and the rest are sent; any other synchronous error is raised, the rest
        unsent and unreported (the caller ends its use of the publisher)."""
        ...


def is_inline(publisher: Publisher) -> bool:
    """The publisher says its ``send`` only queues (:class:`Inline`)."""
    return isinstance(publisher, Inline) and bool(publisher.inline)


def columns_via_send(publisher: Publisher, columns: RecordColumns, done: ColumnsDone) -> None:
    """``send_columns`` for a publisher that has only ``send``/``send_many``: a record each."""
    records = columns.records()
    index = {id(record): i for i, record in enumerate(records)}

    def on_done(delivery: Delivery) -> None:
        if delivery.error is None:
            done.acked(1)
        else:
            done.failed(index[id(delivery.record)], delivery)

    if isinstance(publisher, SendsMany):
        publisher.send_many(records, on_done)
    else:
        for record in records:
            publisher.send(record, on_done)
