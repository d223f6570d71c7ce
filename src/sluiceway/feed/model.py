"""The feed's vocabulary as plain, immutable values: statuses, items, results, partitions.

Nothing here does I/O; the store turns rows into these and the worker hands them around.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from sluiceway.clock import duration_seconds
from sluiceway.feed.errors import FeedError, ProcessorError
from sluiceway.feed.rate import RateLimit

#: What callers may pass as an item's data: raw bytes, text (stored as UTF-8) or a JSON value.
ItemData = bytes | bytearray | memoryview | str | Mapping[str, Any] | Sequence[Any]


class Status(enum.StrEnum):
    """The status of a partition or an item."""

    AVAILABLE = "available"
    FAILED = "failed"
    COMPLETE = "complete"


def encode_data(value: object) -> bytes:
    """An item's payload as bytes: bytes pass through, text is UTF-8, dicts and lists are compact JSON.

    >>> encode_data({"a": 1})
    b'{"a":1}'
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:  # "\ud800": a lone surrogate is no text
            raise FeedError(f"item data is not text: {exc.reason} at character {exc.start}") from None
    if isinstance(value, Mapping | list | tuple):
        try:
            return json.dumps(value, separators=(",", ":"), sort_keys=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise FeedError(f"item data is not JSON-serialisable: {exc}") from exc
    raise FeedError(f"item data must be bytes, str, dict or list, not {type(value).__name__}")


#: What ``not_before`` accepts: an aware datetime, or a delay (timedelta or seconds) from now.
Schedule = datetime | timedelta | int | float


@dataclass(frozen=True, slots=True)
class NotBefore:
    """When scheduled work may first be claimed: at the instant ``at`` (aware), or ``delay``
    seconds after the database's now when it is added (its clock decides, as for leases).

    >>> NotBefore.coerce(timedelta(minutes=1))
    NotBefore(at=None, delay=60.0)
    >>> NotBefore.coerce(None) is None
    True
    """

    at: datetime | None = None
    delay: float | None = None

    @classmethod
    def coerce(cls, value: object) -> NotBefore | None:
        if value is None or isinstance(value, NotBefore):
            return value
        if isinstance(value, datetime):
            if value.tzinfo is None or value.utcoffset() is None:
                raise FeedError(
                    f"not_before {value.isoformat()} has no time zone; give an aware datetime "
                    "(e.g. datetime.now(UTC) + …) or a timedelta"
                )
            return cls(at=value)
        seconds = value.total_seconds() if isinstance(value, timedelta) else value
        try:
            if isinstance(seconds, str):
                raise ValueError("text")  # a duration string is for the CLI (--in), not the API
            return cls(delay=duration_seconds(seconds))
        except ValueError:
            raise FeedError(
                f"not_before must be an aware datetime, a timedelta or seconds >= 0, not {value!r}"
            ) from None


#: Priorities are the databases' INTEGER: 32 bits, signed.
PRIORITY_RANGE = (-(2**31), 2**31 - 1)


def check_priority(value: object, what: str = "priority") -> int:
    """A partition's or an item's priority: an integer in the INTEGER range (higher goes first).

    >>> check_priority(-5)
    -5
    """
    low, high = PRIORITY_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FeedError(f"{what} must be an integer between {low} and {high}, not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Item:
    """One item handed to a processor.

    ``attempt`` counts from 1 for the current step (it resets when the item moves to a new gate).
    """

    id: int
    partition: str
    gate: int
    data: bytes
    attempt: int
    partition_id: int = 0
    attributes: Mapping[str, Any] = field(default_factory=dict)

    def json(self) -> Any:
        """The data decoded as JSON (convenience for processors that store JSON)."""
        return json.loads(self.data)


@dataclass(frozen=True, slots=True)
class ProcessorResult:
    """What a processor says about an item.

    * ``done=True``: the item is complete (``gate`` is ignored);
    * ``done=False``: the item waits at ``gate`` (>= the partition's gate) for its next step;
    * ``data``: the item's new data (``None`` keeps the current data);
    * ``retry_in``: not finished yet, not failed either — process the item again (same gate)
      after this many seconds, without counting an attempt (``{"retry_in": "30s"}``: a number
      of seconds or a duration). It excludes ``gate`` and ``done``; ``data`` may come with it.

    >>> ProcessorResult(gate=1, done=False, data=b"ocr text")
    ProcessorResult(gate=1, done=False, data=b'ocr text', retry_in=None)
    >>> ProcessorResult.coerce({"retry_in": "1m30s"}).retry_in
    90.0
    """

    gate: int | None = None
    done: bool = False
    data: bytes | None = None
    retry_in: float | None = None

    @classmethod
    def coerce(cls, value: object) -> ProcessorResult:
        """Accept a :class:`ProcessorResult` or a ``{gate, done, data}`` mapping; explain anything else."""
        if isinstance(value, ProcessorResult):
            return value
        if value == _DONE:  # the common answer, without the field-by-field checks below
            return _DONE_RESULT
        if not isinstance(value, Mapping):
            raise ProcessorError(
                f"processor returned {type(value).__name__}; expected a ProcessorResult or a "
                "mapping {'gate': int, 'done': bool, 'data': ...}"
            )
        unknown = set(value) - {"gate", "done", "data", "retry_in"}
        if unknown:
            raise ProcessorError(
                f"processor result has unknown field(s) {sorted(unknown)}; "
                "expected gate, done, data, retry_in"
            )
        if value.get("retry_in") is not None:
            return cls._deferred(value)
        done = value.get("done", False)
        if not isinstance(done, bool):
            raise ProcessorError(f"processor result field 'done' must be true or false, not {done!r}")
        gate = value.get("gate")
        if gate is not None and (isinstance(gate, bool) or not isinstance(gate, int)):
            raise ProcessorError(f"processor result field 'gate' must be an integer, not {gate!r}")
        if gate is None and not done:
            raise ProcessorError(
                "processor result must give 'gate' (the item's next gate) unless 'done' is true"
            )
        data = value.get("data")
        return cls(gate=gate, done=done, data=None if data is None else encode_data(data))

    @classmethod
    def _deferred(cls, value: Mapping[str, Any]) -> ProcessorResult:
        if value.get("gate") is not None or value.get("done", False) is not False:
            raise ProcessorError(
                "processor result field 'retry_in' cannot come with 'gate' or 'done': the item stays "
                "where it is and runs again later"
            )
        try:
            retry_in = duration_seconds(value["retry_in"])
        except ValueError as exc:
            raise ProcessorError(f"processor result field 'retry_in': {exc}") from None
        data = value.get("data")
        return cls(data=None if data is None else encode_data(data), retry_in=retry_in)


_DONE: dict[str, Any] = {"done": True}
_DONE_RESULT = ProcessorResult(done=True)


@dataclass(frozen=True, slots=True)
class Partition:
    """A partition as stored."""

    id: int
    name: str
    status: Status
    gate: int
    owner: str | None
    lease_until: datetime | None
    version: int
    attributes: Mapping[str, Any]
    created_at: datetime | None
    updated_at: datetime | None
    #: Added with ``not_before``: the instant it could first be leased (kept after that, until a
    #: worker takes it).
    not_before: datetime | None = None
    #: Workers choosing partitions to lease take higher priorities first (default 0).
    priority: int = 0


@dataclass(frozen=True, slots=True)
class ItemRecord:
    """An item as stored (for listings and operators; processors get :class:`Item`)."""

    id: int
    partition_id: int
    gate: int
    status: Status
    attempts: int
    available_at: datetime | None
    data: bytes
    result: str | None
    last_error: str | None
    version: int
    created_at: datetime | None
    updated_at: datetime | None
    #: Within a gate, higher priorities are claimed first (default 0).
    priority: int = 0


@dataclass(frozen=True, slots=True)
class NewPartition:
    """A partition to create with ``Feed.add_many``: its name, its items (all at ``gate``),
    attributes, ``not_before``, the partition's ``priority`` and its items' ``item_priority``
    (see ``Feed.add``).

    >>> NewPartition("urgent", [b"page-1"], priority=10).priority
    10
    """

    name: str
    items: Sequence[ItemData] = ()
    gate: int = 0
    attributes: Mapping[str, Any] | None = None
    not_before: Schedule | None = None
    priority: int = 0
    item_priority: int = 0


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a keyset-paged listing; pass ``next_after`` as ``after`` for the next page."""

    rows: list[T]
    next_after: int | None


@dataclass(frozen=True, slots=True)
class WorkerLeases:
    """One worker (owner id) as seen from the partitions table."""

    owner: str
    partitions: int
    earliest_expiry: datetime | None
    latest_expiry: datetime | None
    live: bool
    #: Of ``partitions``, those whose lease has run out (by the database's clock).
    expired: int = 0


@dataclass(frozen=True, slots=True)
class ScheduledWork:
    """Work held back to a time on purpose, by the database's clock: free partitions whose
    ``not_before`` is ahead, and open items never attempted whose ``available_at`` is (their
    ``not_before``, or a ``retry_in`` before any failure) — not retries backing off, nor items in
    flight. ``next_due``: the first of them to come due."""

    partitions: int = 0
    items: int = 0
    next_due: datetime | None = None


@dataclass(frozen=True, slots=True)
class FeedStatus:
    """A snapshot for ``sluice feed status``."""

    partitions: list[tuple[str, int, int]]  # (status, gate, count)
    items: dict[str, int]
    ready_items: int
    oldest_available_age: float | None  # seconds since the oldest available item was added
    workers: list[WorkerLeases]
    items_by_gate: list[tuple[str, int, int]] = field(default_factory=list)  # (status, gate, count)
    #: Open work by priority: ("partitions" | "items", priority, count), highest first.
    open_by_priority: list[tuple[str, int, int]] = field(default_factory=list)
    #: Rate limits with their buckets' levels now (``Feed.set_rate``).
    rate_limits: list[RateLimit] = field(default_factory=list)
    #: Scheduled work not due yet (``not_before``), and when the first of it is.
    scheduled: ScheduledWork = field(default_factory=ScheduledWork)


@dataclass(slots=True)
class WorkerStats:
    """Counters of one worker's run (a copy is handed out; the worker's own is private)."""

    owner: str
    processed: int = 0
    completed: int = 0
    moved: int = 0
    retried: int = 0
    failed: int = 0
    requeued: int = 0
    #: Items a processor asked to see again later (``retry_in``), attempts not counted.
    deferred: int = 0
    lost: int = 0
    acquired: int = 0
    stolen: int = 0
    released: int = 0
    gates_advanced: int = 0
    partitions_completed: int = 0
    partitions_failed: int = 0
    #: Notifications that woke this worker from an idle rest (PostgreSQL wake-ups).
    wakeups: int = 0
    #: Rests taken because a rate limit had no token for work that was there, and their seconds.
    rate_waits: int = 0
    rate_wait_seconds: float = 0.0
