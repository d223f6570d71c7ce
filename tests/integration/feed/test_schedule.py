"""Scheduled work on every database: ``not_before`` for partitions and items, a processor's
``retry_in``, and ``sluice feed add --at/--in``.

"Respected to the second": the processor notes the wall clock when it is called, and the work was
scheduled from a wall-clock reading taken *before* it was added (the databases run on this host,
so their clock is this clock; SQLite keeps milliseconds, hence the 10 ms allowance). "Soon after"
is a liveness bound well below anything that would find the work by accident: PostgreSQL workers
rest on LISTEN with a 30 s fallback and a 120 s lease (so no renewal looks in between) and must
wake by the due time alone; the others poll every 0.1 s.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from sluiceway.cli.feed import app
from sluiceway.db import parse_dsn
from sluiceway.feed import Feed, FeedWorker, Item, ScheduledWork, Status
from sluiceway.testing import wait_until

pytestmark = pytest.mark.timeout(120)

DELAY = 2.0
SLACK = 0.01  # SQLite stores milliseconds
SOON = 10.0  # liveness: far below the 30 s fallback poll and the 40 s renewal


class Calls:
    """A processor that records when it was called; ``answers`` are given in turn, then done."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[bytes, int, float]] = []
        self.lock = threading.Lock()

    def __call__(self, item: Item) -> dict[str, Any]:
        with self.lock:
            self.calls.append((item.data, item.attempt, time.time()))
            return self.answers.pop(0) if self.answers else {"done": True}

    def at(self, data: bytes) -> list[float]:
        with self.lock:
            return [t for d, _, t in self.calls if d == data]


def listening(dsn: str, owner: str) -> bool:
    """``owner``'s listening connection has run its LISTEN (it has asked next_due before)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND query LIKE 'LISTEN%%'",
            (f"sluiceway feed wake-ups {owner}",),
        ).fetchone()
    return row is not None


def worker(dsn: str, prefix: str, processor: Calls, **options: Any) -> FeedWorker:
    """A started worker; on PostgreSQL, one already resting on LISTEN — so scheduled work added
    afterwards is found by a wake-up and next_due, not by the worker's first look."""
    settings: dict[str, Any] = {"lease": 120.0, "fallback_poll": 30.0, "poll_interval": 0.1}
    owner = f"sched-{uuid.uuid4().hex[:8]}"
    w = FeedWorker(dsn, processor, prefix=prefix, owner=owner, **{**settings, **options})
    w.start()
    if parse_dsn(dsn).dialect.value == "postgres":
        assert w.wake_ups  # the point there: woken by the due time, not a poll
        wait_until(lambda: listening(dsn, owner), timeout=SOON, message="the worker to listen")
    return w


def test_a_scheduled_partition_is_not_leased_before_its_time(any_dsn: str, feed: Feed, prefix: str) -> None:
    calls = Calls()
    with worker(any_dsn, prefix, calls):
        before = time.time()
        feed.add("later", [b"x"], not_before=DELAY)
        feed.add("at", [b"y"], not_before=datetime.now(UTC) + timedelta(seconds=DELAY))
        scheduled = feed.partition("later")
        assert scheduled is not None and scheduled.not_before is not None and scheduled.owner is None
        wait_until(lambda: calls.at(b"x") and calls.at(b"y"), timeout=DELAY + SOON, message="scheduled work")
        assert min(calls.at(b"x")) >= before + DELAY - SLACK
        assert min(calls.at(b"y")) >= before + DELAY - SLACK
    for name in ("later", "at"):
        done = feed.partition(name)
        assert done is not None and done.status is Status.COMPLETE


def test_a_partition_that_comes_due_while_the_worker_is_busy_is_not_slept_past(
    postgres_dsn: str, prefix: str
) -> None:
    # A poll_interval of 30 s keeps the worker from balancing again right after its work (the
    # balance is throttled to one per poll_interval while it is busy): the second partition,
    # due while the first one's item is processed, must be found through next_due — which
    # reports partitions that came due since the worker last looked — and not by the 30 s
    # fallback or the 40 s renewal.
    class Slow(Calls):
        def __call__(self, item: Item) -> dict[str, Any]:
            answer = super().__call__(item)
            if item.data == b"first":
                time.sleep(0.5)  # slow work, not a wait: the second partition comes due meanwhile
            return answer

    calls = Slow()
    with Feed(postgres_dsn, prefix=prefix) as feed, worker(postgres_dsn, prefix, calls, poll_interval=30.0):
        before = time.time()
        feed.add("first", [b"first"], not_before=DELAY)
        feed.add("second", [b"second"], not_before=DELAY + 0.2)
        wait_until(lambda: calls.at(b"second"), timeout=DELAY + SOON, message="the second partition")
        assert min(calls.at(b"first")) >= before + DELAY - SLACK
        assert min(calls.at(b"second")) >= before + DELAY + 0.2 - SLACK


def test_a_due_partition_a_balance_left_to_others_is_taken_once_ours_run_out(
    postgres_dsn: str, prefix: str
) -> None:
    # Worker "busy" holds one partition and blocks in its processor. Three partitions come due
    # together; "idle"'s target is then ceil(4 / 2) = 2, so its balance takes two and leaves one
    # (due already, so next_due will not name it again). Both of its own finish at once — within
    # poll_interval of that balance, so the top-up is throttled. The one left over must be taken
    # once the throttle allows it, not after the 30 s fallback (what a worker once did).
    release = threading.Event()

    class Blocking(Calls):
        def __call__(self, item: Item) -> dict[str, Any]:
            answer = super().__call__(item)
            release.wait(60)
            return answer

    held, calls = Blocking(), Calls()
    with Feed(postgres_dsn, prefix=prefix) as feed:
        try:
            with worker(postgres_dsn, prefix, held):
                feed.add("held", [b"held"])
                wait_until(lambda: held.at(b"held"), timeout=SOON, message="the blocking worker's item")
                with worker(postgres_dsn, prefix, calls, poll_interval=3.0):
                    due = datetime.now(UTC) + timedelta(seconds=DELAY)
                    for name in ("s1", "s2", "s3"):
                        feed.add(name, [name.encode()], not_before=due)
                    wait_until(
                        lambda: all(calls.at(n) for n in (b"s1", b"s2", b"s3")),
                        timeout=DELAY + SOON,
                        message="all three scheduled partitions",
                    )
                    release.set()
        finally:
            release.set()
    assert min(min(calls.at(n)) for n in (b"s1", b"s2", b"s3")) >= due.timestamp() - SLACK


def test_scheduled_items_wait_in_a_partition_that_is_being_worked(
    any_dsn: str, feed: Feed, prefix: str
) -> None:
    calls = Calls()
    before = time.time()
    feed.add("mixed", [b"now"])
    feed.add_items("mixed", [b"soon"], not_before=timedelta(seconds=DELAY))
    with worker(any_dsn, prefix, calls) as w:
        # The worker takes the partition and processes the first item; the second keeps the gate
        # open, so the worker holds the partition and rests until the item is due.
        wait_until(lambda: calls.at(b"now"), timeout=SOON, message="the unscheduled item")
        assert w.partitions == ["mixed"]
        wait_until(lambda: calls.at(b"soon"), timeout=DELAY + SOON, message="the scheduled item")
        assert min(calls.at(b"soon")) >= before + DELAY - SLACK
        wait_until(lambda: feed.partition("mixed").status is Status.COMPLETE, timeout=SOON)  # type: ignore[union-attr]


def test_scheduled_partitions_do_not_count_as_work_to_balance(feed: Feed) -> None:
    feed.add("ready", [b"a"])
    feed.add("tomorrow", [b"b"], not_before=timedelta(days=1))
    # A worker's target is ceil(available / live owners): a partition nobody may lease yet must
    # not raise it.
    assert feed.store.census().available == 1
    status = feed.status()
    assert status.ready_items == 1 and status.items == {"available": 2}


def test_status_counts_scheduled_work_and_its_first_due_time(any_dsn: str, feed: Feed, prefix: str) -> None:
    assert feed.status().scheduled == ScheduledWork(0, 0, None)
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    feed.add("tomorrow", [b"t1", b"t2"], not_before=tomorrow)  # its items are held back with it
    feed.add("today", [b"now", b"in-flight"])
    feed.add_items("today", [b"in-an-hour"], not_before=timedelta(hours=1))
    # In flight and backing off are not scheduled: a claim counts an attempt.
    store = feed.store
    assert len(store.acquire("w", store.free_partitions(10), lease=60)) == 1  # "today" only
    assert len(store.claim("w", 1, lease=60)) == 1
    scheduled = feed.status().scheduled
    assert (scheduled.partitions, scheduled.items) == (1, 3), scheduled
    hour = datetime.now(UTC) + timedelta(hours=1)
    assert scheduled.next_due is not None and abs((scheduled.next_due - hour).total_seconds()) < 5
    base = ["--dsn", any_dsn, "--prefix", prefix]
    code, out = sluice("status", *base, "--json")
    assert code == 0 and '"scheduled": { "partitions": 1, "items": 3, "next_due": "' in out, out
    code, out = sluice("status", *base)
    # An hour from the add, less the moments since (3600.0 when they round away).
    due = re.search(r"next due │ in (359\d|3600)\.", out)
    assert code == 0 and "scheduled (not due yet)" in out and due, out


def test_retry_in_runs_the_item_again_later_without_counting_an_attempt(
    any_dsn: str, feed: Feed, prefix: str
) -> None:
    # max_attempts=1: were retry_in counted as a failure, the item would fail at once.
    calls = Calls({"retry_in": "2s"})
    feed.add("polling", [b"job"])
    with worker(any_dsn, prefix, calls, max_attempts=1) as w:
        wait_until(lambda: len(calls.at(b"job")) == 1, timeout=SOON, message="the first call")
        wait_until(lambda: w.stats.deferred == 1, timeout=SOON, message="the deferral written")
        (record,) = feed.items("polling").rows
        assert record.status is Status.AVAILABLE
        assert record.attempts == 0  # as before the claim: not a failure
        assert record.last_error is None
        wait_until(lambda: len(calls.at(b"job")) == 2, timeout=DELAY + SOON, message="the second call")
        first, second = calls.at(b"job")
        assert second >= first + DELAY - SLACK
        wait_until(lambda: feed.partition("polling").status is Status.COMPLETE, timeout=SOON)  # type: ignore[union-attr]
        stats = w.stats
    assert [attempt for _, attempt, _ in calls.calls] == [1, 1]
    assert stats.retried == 0 and stats.failed == 0 and stats.deferred == 1
    (record,) = feed.items("polling").rows
    assert record.status is Status.COMPLETE and record.attempts == 1


runner = CliRunner()


def sluice(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


def test_cli_add_at_and_in_schedule_the_work(sqlite_dsn: str) -> None:
    before = datetime.now(UTC)
    code, out = sluice("add", "--dsn", sqlite_dsn, "-p", "in", "-i", "x", "--in", "1m30s")
    assert code == 0 and "not before 90s from now" in out, out
    code, out = sluice("add", "--dsn", sqlite_dsn, "-p", "at", "-i", "y", "--at", "2030-01-01T09:00:00+01:00")
    assert code == 0 and "not before 2030-01-01T08:00:00+00:00" in out, out
    code, out = sluice("add", "--dsn", sqlite_dsn, "-p", "in", "-i", "z", "--in", "5m")
    assert code == 0 and "1 item(s) added" in out, out
    with Feed(sqlite_dsn) as feed:
        later = feed.partition("in")
        assert later is not None and later.not_before is not None
        assert before + timedelta(seconds=89) <= later.not_before <= datetime.now(UTC) + timedelta(seconds=91)
        at = feed.partition("at")
        assert at is not None and at.not_before == datetime(2030, 1, 1, 8, tzinfo=UTC)
        by_data = {i.data: i.available_at for i in feed.items("in").rows}
        assert by_data[b"z"] is not None and by_data[b"z"] >= before + timedelta(seconds=299)
        assert feed.status().ready_items == 0


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--in", "soon"], "--in: expected a duration like"),
        (["--in", "-5s"], "--in: expected a duration like"),
        (["--at", "tomorrow"], "--at: 'tomorrow' is not an ISO 8601 time"),
        (["--at", "2030-01-01T09:00:00"], "has no time zone"),
        (["--at", "2030-01-01T09:00:00Z", "--in", "5s"], "give --at or --in, not both"),
    ],
)
def test_cli_bad_schedules_are_one_clear_line(sqlite_dsn: str, flags: list[str], fragment: str) -> None:
    result = runner.invoke(app, ["add", "--dsn", sqlite_dsn, "-p", "p", "-i", "x", *flags])
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert out.startswith("error:") and fragment in out and "Traceback" not in out
    assert len(result.output.strip().splitlines()) == 1, result.output
    with Feed(sqlite_dsn) as feed:
        assert feed.partition("p") is None  # nothing was added
