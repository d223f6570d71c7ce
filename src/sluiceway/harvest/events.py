"""Events for embedded users (``Harvest.set_event_handler``), as goharvest's."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Event:
    """Base class of every harvester event."""


@dataclass(frozen=True, slots=True)
class LeaderAcquired(Event):
    """This process became the leader; ``leader_id`` is fresh and never reused. ``destination``
    names where it publishes (``nats nats://127.0.0.1:4222 stream ORDERS``, ``kafka host:9092``…)."""

    leader_id: str
    destination: str = ""


@dataclass(frozen=True, slots=True)
class LeaderRefreshed(Event):
    """A new leader id was generated (after a delivery error or a failed database call)."""

    leader_id: str


@dataclass(frozen=True, slots=True)
class LeaderRevoked(Event):
    """Leadership was given up in an orderly way (rebalance, release, shutdown)."""


@dataclass(frozen=True, slots=True)
class LeaderFenced(Event):
    """Leadership could no longer be confirmed in time: marking stopped at once."""


@dataclass(frozen=True, slots=True)
class RecordDeadLettered(Event):
    """A poison record moved to the dead-letter table (with its removal from the outbox)."""

    record_id: int
    topic: str
    key: str
    error: str
    attempts: int
    #: Its key is parked: the key's later records wait in the outbox (``deadLetter.parkKey``).
    parked: bool = False


@dataclass(frozen=True, slots=True)
class KeyParked(Event):
    """A dead letter parks its key: no later record of ``key`` is published until an operator runs
    ``sluice outbox dead retry`` (the record goes back at the head of its key) or ``resolve``
    (it is discarded and the key released)."""

    record_id: int
    topic: str
    key: str


@dataclass(frozen=True, slots=True)
class Stats:
    """A meter reading over the interval since the previous one."""

    interval_s: float
    throughput: float  # records acknowledged per second
    in_flight: int
    pending: int
    marked: int
    published: int
    purged: int
    reset: int
    dead: int
    latency_ms: dict[str, float] = field(default_factory=dict)  # p50, p90, p99, max: create → ack
    parked_keys: int | None = None  # keys parked behind a dead letter (None: could not be counted)


@dataclass(frozen=True, slots=True)
class MeterRead(Event):
    stats: Stats
