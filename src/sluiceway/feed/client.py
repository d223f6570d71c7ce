"""The producer and operator side of the feed: add work, inspect it, retry or resolve failures."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from sluiceway.db import Database, DataSource
from sluiceway.errors import ConflictError, DatabaseError
from sluiceway.feed.core import Decision, decide
from sluiceway.feed.errors import (
    FeedError,
    GateError,
    PartitionClosedError,
    PartitionExistsError,
    PartitionNotFoundError,
)
from sluiceway.feed.model import (
    FeedStatus,
    ItemData,
    ItemRecord,
    NewPartition,
    NotBefore,
    Page,
    Partition,
    Schedule,
    Status,
    check_priority,
    encode_data,
)
from sluiceway.feed.rate import RateLimit, check_limit, rate_key
from sluiceway.feed.store import FeedStore
from sluiceway.tracing import TRACEPARENT, trace_headers

IfExists = Literal["error", "skip", "append"]
#: A partition ready to add: name, gate, encoded items, attributes, schedule, its priority, its
#: items' priority.
_Prepared = tuple[str, int, list[bytes], Mapping[str, Any] | None, NotBefore | None, int, int]

#: Longest partition name (the MySQL column is VARCHAR(255); the same limit everywhere).
MAX_NAME = 255
#: Largest page a listing returns.
MAX_PAGE = 1000


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise FeedError(
            f"a partition name must be a non-empty string of at most {MAX_NAME} characters, not {name!r}"
        )
    return name


def _check_gate(gate: object) -> int:
    if isinstance(gate, bool) or not isinstance(gate, int) or gate < 0:
        raise FeedError(f"a gate must be an integer >= 0, not {gate!r}")
    return gate


def _coerce_partition(spec: NewPartition | tuple[Any, ...]) -> NewPartition:
    if isinstance(spec, NewPartition):
        return spec
    if isinstance(spec, tuple) and 1 <= len(spec) <= 7:
        return NewPartition(*spec)
    raise FeedError(
        "expected NewPartition(name, items, gate, attributes, not_before, priority, item_priority) "
        f"or a tuple of those, not {spec!r}"
    )


class Feed:
    """Producer/operator API of a feed: partitions of items in the database.

    One ``Feed`` uses one connection; give each thread its own. Tables are created on first use
    (``migrate=False`` to skip). ``prefix`` names the tables: ``feed_partitions``, ``feed_items``.

    >>> feed = Feed("sqlite:///:memory:")
    >>> feed.add("resumes-2026", [b"cv-1", b"cv-2", {"cv": 3}], attributes={"team": "hiring"})
    1
    >>> feed.add_items("resumes-2026", [b"rank"], gate=1)
    1
    >>> feed.partition("resumes-2026").gate
    0
    """

    def __init__(
        self, dsn: str | DataSource | Database, *, prefix: str = "feed_", migrate: bool = True
    ) -> None:
        self._owns_db = not isinstance(dsn, Database)
        self.db = dsn if isinstance(dsn, Database) else Database(dsn)
        self.store = FeedStore(self.db, prefix)
        if migrate:
            self.store.migrate()

    def close(self) -> None:
        if self._owns_db:
            self.db.close()

    def __enter__(self) -> Feed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def migrate(self) -> None:
        """Create the feed's tables and indexes if missing (idempotent)."""
        self.store.migrate()

    # -- producing ------------------------------------------------------------------------------
    def add(
        self,
        partition: str,
        items: Sequence[ItemData] = (),
        *,
        gate: int = 0,
        attributes: Mapping[str, Any] | None = None,
        if_exists: IfExists = "error",
        not_before: Schedule | None = None,
        priority: int = 0,
        item_priority: int = 0,
    ) -> int:
        """Create a partition with its items in one transaction (never visible without them).

        ``items`` are bytes, text (stored UTF-8) or JSON values (dicts/lists), all at ``gate``,
        which becomes the partition's gate. ``if_exists``: ``"error"`` (default) raises
        :class:`PartitionExistsError`, ``"skip"`` leaves the existing partition as it is (idempotent
        re-delivery), ``"append"`` adds the items to it (as :meth:`add_items`). Returns the id.

        ``not_before``: scheduled work — an aware datetime, or a delay (``timedelta`` or seconds)
        from the database's now. No worker leases the partition, and no item is claimed, before
        then (by the database's clock). With ``"append"`` to an existing partition it applies to
        the new items.

        Priorities (integers, higher first, default 0): ``priority`` is the partition's — workers
        choosing partitions to lease take the highest first (set when the partition is created; an
        ``"append"`` leaves an existing partition's as it is); ``item_priority`` is its items' —
        within a gate, a worker claims higher-priority items first, then in the order they were
        added.

        >>> Feed("sqlite:///:memory:").add("folder-7", [b"a.pdf", b"b.pdf"])
        1
        >>> Feed("sqlite:///:memory:").add("in-an-hour", [b"report"], not_before=3600)
        1
        >>> Feed("sqlite:///:memory:").add("urgent", [b"page-1"], priority=10, item_priority=5)
        1
        """
        spec = NewPartition(partition, items, gate, attributes, not_before, priority, item_priority)
        return self.add_many([spec], if_exists=if_exists)[0]

    def add_many(
        self, partitions: Iterable[NewPartition | tuple[Any, ...]], *, if_exists: IfExists = "error"
    ) -> list[int]:
        """Create many partitions (``NewPartition`` or ``(name, items[, gate[, attributes[,
        not_before[, priority[, item_priority]]]]]])``) in one transaction, with items inserted in
        bounded batches. All or nothing. Added where an OpenTelemetry span is recording, each
        partition's attributes also get its ``traceparent`` (and ``tracestate``), unless they
        name their own: a worker with tracing continues that trace (:mod:`sluiceway.feed.tracing`).

        The batch API for bulk producers such as a pipeline sink: with ``if_exists="skip"`` a
        replayed batch is a no-op for the partitions it already created.
        """
        specs = [_coerce_partition(p) for p in partitions]
        if if_exists not in ("error", "skip", "append"):
            raise FeedError(f"if_exists must be 'error', 'skip' or 'append', not {if_exists!r}")
        trace = dict(trace_headers())  # added inside a traced request: its workers continue it
        prepared = [
            (
                _check_name(s.name),
                _check_gate(s.gate),
                [encode_data(i) for i in s.items],
                _traced(s.attributes, trace),
                NotBefore.coerce(s.not_before),
                check_priority(s.priority),
                check_priority(s.item_priority, "item_priority"),
            )
            for s in specs
        ]
        seen: set[str] = set()
        for name, *_ in prepared:
            if name in seen:
                raise FeedError(f"partition {name!r} is given twice in one add_many")
            seen.add(name)
        for attempt in range(3):
            try:
                return self._add_many(prepared, if_exists)
            except DatabaseError as exc:
                if isinstance(exc, ConflictError) and attempt < 2:
                    # MariaDB's gap locks on the name index can deadlock two producers creating
                    # neighbouring names; the transaction was rolled back as a whole: go again.
                    continue
                # Another producer created one of these names between our look-up and our
                # insert, and the unique constraint stopped us. Report it, or go again.
                taken = [name for name, *_ in prepared if self.store.partition(name) is not None]
                if not taken or attempt == 2:
                    raise
                if if_exists == "error":
                    raise PartitionExistsError(taken[0]) from exc
        raise FeedError("add_many did not succeed")  # not reached: the loop returns or raises

    def _add_many(self, prepared: list[_Prepared], if_exists: IfExists) -> list[int]:
        ids: list[int] = []
        # Items grouped by schedule and priority, so plain ones (nearly always all of them) stay
        # one bulk insert across partitions.
        rows: dict[tuple[NotBefore | None, int], list[tuple[int, int, bytes]]] = {}
        instants: dict[NotBefore, object] = {}
        with self.db.transaction():
            for name, gate, datas, attributes, not_before, priority, item_priority in prepared:
                at = None
                if not_before is not None:
                    if not_before not in instants:
                        instants[not_before] = self.store.scheduled_at(not_before)
                    at = instants[not_before]
                current = self.store.lock_partition(name)
                if current is None:
                    pid = self.store.insert_partition(name, gate, attributes, at, priority)
                elif if_exists == "error":
                    raise PartitionExistsError(name)
                elif if_exists == "skip":
                    ids.append(current[0])
                    continue
                else:
                    pid = self._open_for_items(name, current, gate)
                ids.append(pid)
                rows.setdefault((not_before, item_priority), []).extend((pid, gate, d) for d in datas)
            for (not_before, item_priority), group in rows.items():
                at = None if not_before is None else instants[not_before]
                self.store.insert_items(group, at, item_priority)
            if rows:  # a partition created or appended to (not only skipped)
                # Delivered at commit (PostgreSQL): no worker wakes before the work is visible.
                self.store.notify("add")
        return ids

    def _open_for_items(self, name: str, current: tuple[int, Status, int, int], gate: int) -> int:
        pid, status, current_gate, version = current
        if status is Status.COMPLETE:
            raise PartitionClosedError(name)
        if gate < current_gate:
            raise GateError(
                f"cannot add items at gate {gate} to partition {name!r}: its gate is already {current_gate}, "
                "so they would never be processed (add them at or above the current gate)",
                partition=name,
                gate=gate,
                current=current_gate,
            )
        # Bump the version (and make a blocked partition workable again): a worker's gate decision
        # taken before these items existed must not apply now.
        if not self.store.reopen_partition(pid, version):
            raise FeedError(f"partition {name!r} changed while it was locked (should not happen)")
        return pid

    def add_items(
        self,
        partition: str,
        items: Sequence[ItemData],
        gate: int | None = None,
        *,
        not_before: Schedule | None = None,
        item_priority: int = 0,
    ) -> int:
        """Add items to an open partition at ``gate`` (default: its current gate); return how many.

        A gate below the partition's current gate raises :class:`GateError` (those items would
        never run); a complete partition raises :class:`PartitionClosedError`. ``not_before``: no
        item is claimed before then (see :meth:`add`); meanwhile they hold their gate open.
        ``item_priority``: within their gate, higher-priority items are claimed first (see
        :meth:`add`).

        >>> feed = Feed("sqlite:///:memory:"); _ = feed.add("p", [b"x"])
        >>> feed.add_items("p", [b"y", b"z"], gate=2)
        2
        >>> feed.add_items("p", [b"before x"], item_priority=1)
        1
        """
        name = _check_name(partition)
        datas = [encode_data(i) for i in items]
        schedule = NotBefore.coerce(not_before)
        priority = check_priority(item_priority, "item_priority")
        with self.db.transaction():
            available_at = None if schedule is None else self.store.scheduled_at(schedule)
            current = self.store.lock_partition(name)
            if current is None:
                raise PartitionNotFoundError(name)
            at = current[2] if gate is None else _check_gate(gate)
            pid = self._open_for_items(name, current, at)
            self.store.insert_items([(pid, at, d) for d in datas], available_at, priority)
            self.store.notify("add")  # delivered at commit, with the items
        return len(datas)

    # -- checkpoints and operators --------------------------------------------------------------
    def checkpoint(self, partition: str) -> Partition:
        """Advance a partition's gate by hand (for workers in manual-checkpoint mode).

        Moves to the next gate that has items, or completes the partition when none is left.
        Raises :class:`GateError` while items at the current gate are open or failed.
        """
        name = _check_name(partition)
        for _ in range(10):
            current = self._require(name)
            if current.status is Status.COMPLETE:
                return current
            if current.status is Status.FAILED:
                raise GateError(
                    f"partition {name!r} is blocked by failed items at gate {current.gate}; "
                    "retry or resolve them",
                    partition=name,
                    current=current.gate,
                )
            summary = self.store.summarize(current.id)
            if summary is None:
                continue  # changed status under us: read again
            decision = decide(summary, manual=False)
            if decision is Decision.WAIT:
                raise GateError(
                    f"gate {summary.gate} of partition {name!r} still has items to process",
                    partition=name,
                    current=summary.gate,
                )
            if decision is Decision.FAIL:
                raise GateError(
                    f"gate {summary.gate} of partition {name!r} has failed items; retry or resolve them",
                    partition=name,
                    current=summary.gate,
                )
            if all(ok for _, _, ok in self.store.apply([(summary, decision)])):
                return self._require(name)
            # A worker renewed its lease or a producer added items meanwhile: decide again.
        raise FeedError(f"partition {name!r} kept changing; checkpoint not applied")

    def retry(self, partition: str | None = None, item: int | None = None) -> int:
        """Make failed items available again (fresh attempts, at once); return how many.

        Without arguments, every failed item of the feed.
        """
        return self._settle("retry", partition, item)

    def resolve(self, partition: str | None = None, item: int | None = None) -> int:
        """Mark failed items complete without processing them (``result = 'resolved'``), so the
        gate they block can advance; return how many."""
        return self._settle("resolve", partition, item)

    def _settle(self, action: str, partition: str | None, item: int | None) -> int:
        pid = None if partition is None else self._require(_check_name(partition)).id
        if item is not None and (isinstance(item, bool) or not isinstance(item, int)):
            raise FeedError(f"an item id must be an integer, not {item!r}")
        return self.store.settle_failed(action, pid, item)

    # -- rate limits ------------------------------------------------------------------------------
    def set_rate(
        self,
        max_rate: float,
        *,
        attribute: str | None = None,
        value: object = None,
        burst: float | None = None,
    ) -> RateLimit:
        """Limit how fast every worker of this feed together claims items: ``max_rate`` items a
        second, for the whole feed, or — with ``attribute`` and ``value`` — for the partitions
        whose ``attributes[attribute] == value`` (say one tenant's). ``burst``: how many tokens
        the bucket holds (default one second's worth, at least 1); over any ``T`` seconds at most
        ``burst + max_rate · T`` items are claimed under the limit.

        A shared setting, kept in the database: every worker obeys it, a new limit from its next
        lease renewal (``lease / 3``), a changed rate at its next claim. Setting it again changes
        it (the bucket keeps its level); :meth:`clear_rate` removes it.

        >>> feed = Feed("sqlite:///:memory:")
        >>> feed.set_rate(50).max_rate
        50.0
        >>> feed.set_rate(5, attribute="tenant", value="acme", burst=10).burst
        10.0
        >>> [str(limit.key) for limit in feed.rates()]
        ['the whole feed', 'tenant=acme']
        """
        key, rate, capacity = check_limit(max_rate, burst, attribute, value)
        self.store.set_rate(key, rate, capacity)
        return next(limit for limit in self.store.rate_limits() if limit.key == key)

    def clear_rate(self, *, attribute: str | None = None, value: object = None) -> bool:
        """Remove a limit (the whole feed's, or ``attribute``/``value``'s); False if there was none."""
        return self.store.clear_rate(rate_key(attribute, value))

    def rates(self) -> list[RateLimit]:
        """The feed's rate limits, with each bucket's level now."""
        return self.store.rate_limits()

    # -- reading ----------------------------------------------------------------------------------
    def _require(self, name: str) -> Partition:
        found = self.store.partition(name)
        if found is None:
            raise PartitionNotFoundError(name)
        return found

    def partition(self, name: str) -> Partition | None:
        """The partition named ``name``, or ``None``."""
        return self.store.partition(_check_name(name))

    def partitions(
        self, status: Status | str | None = None, *, after: int = 0, limit: int = 100
    ) -> Page[Partition]:
        """One page of partitions in id order (``status`` filters); go on with ``after=page.next_after``."""
        return self.store.partitions_page(
            None if status is None else Status(status), after, _check_limit(limit)
        )

    def items(self, partition: str, *, after: int = 0, limit: int = 100) -> Page[ItemRecord]:
        """One page of a partition's items in id order."""
        return self.store.items_page(self._require(_check_name(partition)).id, after, _check_limit(limit))

    def status(self) -> FeedStatus:
        """Counts by status and gate, ready items, lag, and the workers holding leases."""
        return self.store.status()


def _check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise FeedError(f"page limit must be between 1 and {MAX_PAGE}, not {limit!r}")
    return limit


def _traced(attributes: Mapping[str, Any] | None, trace: dict[str, str]) -> Mapping[str, Any] | None:
    """A partition's attributes with the current span's trace (``trace``), unless they name a
    trace of their own (then nothing of the span's: its ``tracestate`` is not theirs)."""
    if not trace or (attributes and TRACEPARENT in attributes):
        return attributes
    return {**attributes, **trace} if attributes else trace
