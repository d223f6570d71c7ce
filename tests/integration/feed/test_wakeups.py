"""Wake-ups on a real PostgreSQL: producers NOTIFY at commit, idle workers rest on LISTEN.

Every worker here runs with a 30 s fallback poll and a 120 s lease (so its renewal, which also
looks for work, comes only every 40 s): whatever a test sees within its 10 s bound was found by a
wake-up, a catch-up after re-listening, or the due time of a retry — never by a timer that would
also have found it without them. The bounds are "well before the fallback", not performance.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from sluiceway.db import Database
from sluiceway.feed import Feed, FeedWorker, Item, PartitionExistsError, ProcessorError, Status
from sluiceway.feed.store import FeedStore, wake_channel
from sluiceway.testing import wait_until

pytestmark = pytest.mark.timeout(120)

FALLBACK = 30.0
LEASE = 120.0
QUICK = 10.0  # "well before the fallback"


@pytest.fixture
def feed(postgres_dsn: str, prefix: str) -> Iterator[Feed]:
    with Feed(postgres_dsn, prefix=prefix) as f:
        yield f


class Seen:
    """A processor that records the items it was called with (and when)."""

    def __init__(self, fail_first: bool = False) -> None:
        self.calls: list[tuple[bytes, int, float]] = []
        self.fail_first = fail_first
        self.lock = threading.Lock()

    def __call__(self, item: Item) -> dict[str, bool]:
        with self.lock:
            self.calls.append((item.data, item.attempt, time.monotonic()))
        if self.fail_first and item.attempt == 1:
            raise ProcessorError("first attempt fails")
        return {"done": True}

    def count(self, data: bytes | None = None) -> int:
        with self.lock:
            return sum(1 for d, _, _ in self.calls if data is None or d == data)


def listener_pid(dsn: str, owner: str) -> int | None:
    """The backend of ``owner``'s listening connection, once its LISTEN has run."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND query LIKE 'LISTEN%%'",
            (f"sluiceway feed wake-ups {owner}",),
        ).fetchone()
    return None if row is None else int(row[0])


def started_worker(dsn: str, prefix: str, processor: Callable[[Item], object], **options: Any) -> FeedWorker:
    owner = f"wake-{uuid.uuid4().hex[:8]}"
    settings: dict[str, Any] = {"fallback_poll": FALLBACK, "lease": LEASE, "backoff": 0.2, "max_backoff": 0.2}
    worker = FeedWorker(dsn, processor, prefix=prefix, owner=owner, **{**settings, **options})
    assert worker.wake_ups  # on by default on PostgreSQL
    worker.start()
    wait_until(lambda: listener_pid(dsn, owner), timeout=QUICK, message="the worker to listen")
    return worker


def insert_without_notifying(feed: Feed, name: str, data: bytes) -> None:
    """What a producer writing the tables directly does: the work exists, nobody is told."""
    store = feed.store
    with feed.db.transaction():
        pid = store.insert_partition(name, 0, None)
        store.insert_items([(pid, 0, data)])


# -- producers --------------------------------------------------------------------------------------
@pytest.fixture
def listening(postgres_dsn: str, prefix: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection listening on the feed's channel, as a worker's does."""
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'LISTEN "{wake_channel(prefix)}"')
        yield conn


def heard(conn: psycopg.Connection[Any], timeout: float = 5.0) -> list[str]:
    """The payloads of the notifications that arrive: the first within ``timeout``, then any
    that follow it closely."""
    first = [n.payload for n in conn.notifies(timeout=timeout, stop_after=1)]
    return first + [n.payload for n in conn.notifies(timeout=0.2)] if first else []


def test_adding_notifies_once_per_transaction_and_only_when_it_adds(
    feed: Feed, listening: psycopg.Connection[Any]
) -> None:
    feed.add("p1", [b"a"])
    assert heard(listening) == ["add"]
    feed.add_many([("p2", [b"b"]), ("p3", [b"c"])])
    assert heard(listening) == ["add"]  # one per transaction
    feed.add_items("p1", [b"a2"], gate=1)
    assert heard(listening) == ["add"]
    feed.add("p1", [b"a3"], gate=1, if_exists="append")
    assert heard(listening) == ["add"]
    # Nothing new, nothing said: a skipped add, and a refused one (rolled back as a whole).
    feed.add("p1", [b"again"], if_exists="skip")
    with pytest.raises(PartitionExistsError):
        feed.add_many([("p4", [b"d"]), ("p2", [b"e"])])
    assert heard(listening, 0.5) == []


def test_a_released_lease_notifies(
    feed: Feed, postgres_dsn: str, prefix: str, listening: psycopg.Connection[Any]
) -> None:
    feed.add_many([("p1", [b"a"]), ("p2", [b"b"])])
    assert heard(listening) == ["add"]
    with Database(postgres_dsn) as db:
        store = FeedStore(db, prefix)
        got = store.acquire("someone", store.free_partitions(10), 30.0)
        assert len(got) == 2
        assert heard(listening, 0.5) == []  # taking a lease makes nothing available
        assert store.release("someone", [h.id for h in got]) == 2
        assert heard(listening) == ["release"]
        assert store.release("someone", [h.id for h in got]) == 0  # nothing left to give back
        assert heard(listening, 0.5) == []


def test_a_gate_advanced_by_hand_notifies(
    feed: Feed, postgres_dsn: str, prefix: str, listening: psycopg.Connection[Any]
) -> None:
    feed.add("manual", [b"m0"])
    feed.add_items("manual", [b"m1"], gate=1)
    FeedWorker(
        postgres_dsn, lambda item: {"done": True}, prefix=prefix, manual_checkpoint=True, wake_ups=False,
        lease=2.0, poll_interval=0.02,
    ).run_until_idle(30)  # fmt: skip
    assert "release" in heard(listening)  # the adds, then the run's own release
    heard(listening, 0.5)
    assert feed.checkpoint("manual").gate == 1
    assert heard(listening) == ["gate"]


def failed_item(feed: Feed, dsn: str, prefix: str, name: str) -> None:
    def refuse(item: Item) -> object:
        raise ProcessorError("no", retryable=False)

    feed.add(name, [b"x"])
    FeedWorker(dsn, refuse, prefix=prefix, wake_ups=False, lease=2.0, poll_interval=0.02).run_until_idle(30)
    assert feed.partition(name).status is Status.FAILED  # type: ignore[union-attr]


def test_retry_and_resolve_notify(
    feed: Feed, postgres_dsn: str, prefix: str, listening: psycopg.Connection[Any]
) -> None:
    failed_item(feed, postgres_dsn, prefix, "broken-1")
    failed_item(feed, postgres_dsn, prefix, "broken-2")
    heard(listening)
    heard(listening, 0.5)
    assert feed.retry(partition="broken-1") == 1
    assert heard(listening) == ["retry"]
    assert feed.resolve(partition="broken-2") == 1
    assert heard(listening) == ["resolve"]
    assert feed.retry() == 0  # nothing failed any more: nothing said
    assert heard(listening, 0.5) == []


def test_sqlite_sends_nothing_and_workers_there_poll(sqlite_dsn: str) -> None:
    with Feed(sqlite_dsn) as feed:
        feed.add("p", [b"x"])  # no NOTIFY statement exists there: this must not fail
    assert not FeedWorker(sqlite_dsn, lambda item: {"done": True}).wake_ups


# -- workers ----------------------------------------------------------------------------------------
def test_an_idle_worker_picks_up_new_work_long_before_the_fallback(
    feed: Feed, postgres_dsn: str, prefix: str
) -> None:
    seen = Seen()
    worker = started_worker(postgres_dsn, prefix, seen)
    try:
        feed.add("new", [b"hello"])
        wait_until(lambda: seen.count(b"hello") == 1, timeout=QUICK, message="the idle worker to pick it up")
        assert worker.stats.wakeups >= 1  # a notification woke it, not a timer
        # Again, after resting once more (the first partition completed and was let go).
        wait_until(lambda: worker.stats.partitions_completed == 1, timeout=QUICK)
        feed.add("second", [b"again"])
        wait_until(lambda: seen.count(b"again") == 1, timeout=QUICK, message="the second item")
    finally:
        worker.stop(5)


def test_a_wake_up_never_reaches_a_worker_before_the_adding_transaction_commits(
    postgres_dsn: str, prefix: str
) -> None:
    at_commit, go_on = threading.Event(), threading.Event()

    class HeldAtCommit(Database):
        """Stops the producer's transaction just before COMMIT: its inserts and its NOTIFY ran."""

        def execute(self, sql: str, params: Any = None, *, what: str = "") -> int:
            if sql == "COMMIT":
                at_commit.set()
                assert go_on.wait(30)
            return super().execute(sql, params, what=what)

    seen = Seen()
    with Feed(postgres_dsn, prefix=prefix):
        pass  # tables in place before the worker starts
    worker = started_worker(postgres_dsn, prefix, seen)
    producer = Feed(HeldAtCommit(postgres_dsn), prefix=prefix, migrate=False)
    adding = threading.Thread(target=producer.add, args=("held", [b"late"]))
    try:
        adding.start()
        assert at_commit.wait(QUICK)
        # Watching for nothing to happen while the transaction is open: no wake-up, no processing.
        time.sleep(1.5)
        assert (worker.stats.wakeups, seen.count()) == (0, 0)
        committed = time.monotonic()
        go_on.set()
        adding.join(QUICK)
        wait_until(lambda: seen.count(b"late") == 1, timeout=QUICK, message="the item after the commit")
        assert worker.stats.wakeups >= 1
        assert seen.calls[0][2] >= committed
    finally:
        go_on.set()
        adding.join(QUICK)
        producer.db.close()
        worker.stop(5)


def terminate(dsn: str, pid: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)


def test_work_missed_while_the_listener_was_down_is_caught_up_after_it_listens_again(
    feed: Feed, postgres_dsn: str, prefix: str
) -> None:
    seen = Seen()
    worker = started_worker(postgres_dsn, prefix, seen)
    try:
        before = listener_pid(postgres_dsn, worker.owner)
        assert before is not None
        # Work that nobody announces (written directly), then the listening connection dies: only
        # the catch-up look after listening again can find it before the fallback.
        insert_without_notifying(feed, "unannounced", b"quiet")
        terminate(postgres_dsn, before)
        wait_until(lambda: seen.count(b"quiet") == 1, timeout=QUICK, message="the catch-up to find it")
        after = listener_pid(postgres_dsn, worker.owner)
        assert after is not None and after != before  # it listens again, on a new connection
        assert worker.stats.wakeups == 0  # nothing was announced: the catch-up found it
    finally:
        worker.stop(5)


def test_a_notification_lost_with_the_listener_is_made_up_for(
    feed: Feed, postgres_dsn: str, prefix: str
) -> None:
    seen = Seen()
    worker = started_worker(postgres_dsn, prefix, seen)
    try:
        pid = listener_pid(postgres_dsn, worker.owner)
        assert pid is not None
        # Killed between its LISTEN and the insert: the insert's notification goes to nobody, or
        # to the new connection if the worker is that quick; either way the item is found.
        terminate(postgres_dsn, pid)
        feed.add("after-kill", [b"lost"])
        wait_until(lambda: seen.count(b"lost") == 1, timeout=QUICK, message="the item to be found")
        wait_until(lambda: listener_pid(postgres_dsn, worker.owner) not in (None, pid), timeout=QUICK)
    finally:
        worker.stop(5)


def test_the_fallback_poll_finds_work_nobody_announced(feed: Feed, postgres_dsn: str, prefix: str) -> None:
    seen = Seen()
    worker = started_worker(postgres_dsn, prefix, seen, fallback_poll=1.0)
    try:
        insert_without_notifying(feed, "direct", b"direct")
        wait_until(lambda: seen.count(b"direct") == 1, timeout=QUICK, message="the fallback poll to find it")
        assert worker.stats.wakeups == 0
    finally:
        worker.stop(5)


def test_an_idle_worker_wakes_when_a_retry_is_due(feed: Feed, postgres_dsn: str, prefix: str) -> None:
    # The first attempt fails; the retry is due 0.2 s later. Nothing commits at that moment, so
    # no notification comes: the worker must wake by itself, from the due time it asked for.
    seen = Seen(fail_first=True)
    worker = started_worker(postgres_dsn, prefix, seen)
    try:
        feed.add("flaky", [b"flaky"])
        wait_until(lambda: seen.count(b"flaky") == 2, timeout=QUICK, message="the retry")
        assert [attempt for _, attempt, _ in seen.calls] == [1, 2]
        assert worker.stats.retried == 1
    finally:
        worker.stop(5)


def test_stopping_cuts_a_rest_short(postgres_dsn: str, prefix: str) -> None:
    with Feed(postgres_dsn, prefix=prefix):
        pass
    worker = started_worker(postgres_dsn, prefix, Seen())
    time.sleep(0.3)  # let it settle into its (30 s) rest
    t0 = time.monotonic()
    worker.stop(5)  # raises FeedTimeout if the rest ran on
    assert time.monotonic() - t0 < 5
    assert listener_pid(postgres_dsn, worker.owner) is None  # the listening connection is closed


# -- a quiet worker: holding nothing on a feed with nothing open --------------------------------
class Statements:
    """Counts the statements one worker's loop sends (its thread only; the listening connection
    is not a :class:`Database` and sends nothing while it waits), by what they are for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: str) -> None:
        self.thread = f"feed-worker-{owner}"
        self.sent: list[str] = []
        run = Database._run

        def counting(db: Database, sql: str, params: Any, what: str, *args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name == self.thread:
                self.sent.append(what)
            return run(db, sql, params, what, *args, **kwargs)

        monkeypatch.setattr(Database, "_run", counting)

    def over(self, seconds: float) -> list[str]:
        """What was sent during the next ``seconds`` (a measuring window, not a wait)."""
        before = len(self.sent)
        time.sleep(seconds)
        return self.sent[before:]


def quiet_worker(
    monkeypatch: pytest.MonkeyPatch,
    dsn: str,
    prefix: str,
    processor: Callable[[Item], object],
    **options: Any,
) -> tuple[FeedWorker, Statements]:
    """A started worker with a 1.5 s lease — renewals every 0.5 s, were it renewing — whose start
    (first look, LISTEN, catch-up look) is over."""
    owner = f"quiet-{uuid.uuid4().hex[:8]}"
    statements = Statements(monkeypatch, owner)
    worker = FeedWorker(dsn, processor, prefix=prefix, owner=owner, **{"lease": 1.5, **options})
    worker.start()
    wait_until(lambda: listener_pid(dsn, owner), timeout=QUICK, message="the worker to listen")
    # Its catch-up look follows the LISTEN: settled once a while passes in silence (shorter than
    # the fallback, whose looks would otherwise never leave one).
    settle = min(1.0, float(options.get("fallback_poll", FALLBACK)) / 3)
    wait_until(lambda: not statements.over(settle), timeout=QUICK, message="the start-up to settle")
    return worker, statements


def test_a_quiet_worker_sends_at_most_one_statement_in_ten_seconds(
    feed: Feed, postgres_dsn: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Holding nothing on an empty feed: no renewal, no balance every lease/3 (six would fall in
    # the window, five statements each, before the quiet rest) — it rests on LISTEN.
    worker, statements = quiet_worker(monkeypatch, postgres_dsn, prefix, Seen(), fallback_poll=FALLBACK)
    try:
        window = 3.0
        sent = statements.over(window)
        assert len(sent) <= 0.1 * window, sent
        feed.add("woken", [b"w"])  # and it still wakes for work
        wait_until(lambda: worker.stats.completed == 1, timeout=QUICK, message="the woken worker")
    finally:
        worker.stop(5)


def test_a_quiet_worker_looks_at_the_fallback_with_two_statements(
    postgres_dsn: str, prefix: str, feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each fallback look is the census and the next-due question, nothing else: two statements,
    # so the default 30 s fallback costs 2/30 ≈ 0.07 statements a second (≤ 0.1, issue 26).
    fallback = 1.0
    worker, statements = quiet_worker(monkeypatch, postgres_dsn, prefix, Seen(), fallback_poll=fallback)
    try:
        window = 3.0
        sent = statements.over(window)
        looks = window / fallback
        assert set(sent) <= {"feed census", "feed next due"}, sent
        assert looks - 1 <= sent.count("feed census") <= looks + 1, sent
        assert len(sent) <= 2 * (looks + 1), sent
    finally:
        worker.stop(5)


def add_leased_to(feed: Feed, owner: str, names: list[str], lease: float) -> None:
    """Partitions added (and announced) already leased by ``owner``, a worker that never runs:
    in the adding transaction, so no listening worker can take them first."""
    store = feed.store
    with feed.db.transaction():
        for name in names:
            pid = store.insert_partition(name, 0, None)
            store.insert_items([(pid, 0, name.encode())])
        store.notify("add")
        assert len(store.acquire(owner, store.free_partitions(len(names)), lease)) == len(names)


def test_a_quiet_worker_steals_within_the_renewal_cadence(
    feed: Feed, postgres_dsn: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another owner holds all four partitions: twice its share once our worker is live. Our worker
    # is woken by the add, steals one at once, then one per renewal (0.5 s) — within seconds,
    # where the 30 s fallback would be far too late.
    seen = Seen()
    worker, _ = quiet_worker(monkeypatch, postgres_dsn, prefix, seen, fallback_poll=FALLBACK)
    try:
        add_leased_to(feed, "hog", [f"h{i}" for i in range(4)], lease=LEASE)
        wait_until(lambda: worker.stats.stolen == 2, timeout=QUICK / 2, message="two steals")
        wait_until(lambda: seen.count() == 2, timeout=QUICK / 2, message="the stolen items")
        assert worker.stats.stolen == 2 and worker.stats.acquired == 0  # its share, no more
    finally:
        worker.stop(5)


def test_a_worker_holding_nothing_takes_over_a_dead_workers_partition_within_the_cadence(
    feed: Feed, postgres_dsn: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One partition, leased (2 s) by an owner that then dies: within its share, so nothing to steal
    # and nothing free — but the feed is not empty, so our worker keeps renewing-and-balancing
    # every lease/3 and takes the partition soon after the lease runs out, not at the fallback.
    seen = Seen()
    worker, _ = quiet_worker(monkeypatch, postgres_dsn, prefix, seen, fallback_poll=FALLBACK)
    try:
        added = time.monotonic()
        add_leased_to(feed, "ghost", ["orphan"], lease=2.0)
        wait_until(lambda: seen.count(b"orphan") == 1, timeout=QUICK / 2, message="the takeover")
        taken = seen.calls[0][2] - added
        assert 2.0 <= taken <= 2.0 + 1.5, taken  # after the lease, within a few renewals
        assert worker.stats.acquired == 1 and worker.stats.stolen == 0
    finally:
        worker.stop(5)
