"""Rate limits: token buckets in the database, obeyed by every worker of a feed together.

The bound under test (docs/feed.md, "Rate limits"): over any T seconds, the workers together
claim at most ``burst + max_rate · T`` items under a limit; busy, they claim about ``max_rate · T``
(less only by how late a resting worker notices a token). Counted from the processor's calls,
in a window that starts at the first call. Each test makes tables of its own (``prefix``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from sluiceway.cli.feed import app
from sluiceway.db import Database
from sluiceway.feed import Feed, FeedWorker, Item, NewPartition
from sluiceway.feed.rate import FEED, RateKey
from sluiceway.testing import wait_until

pytestmark = pytest.mark.timeout(120)

FAST = {"lease": 3.0, "poll_interval": 0.05, "fallback_poll": 5.0}


@pytest.fixture
def pg_feed(postgres_dsn: str, prefix: str) -> Iterator[Feed]:
    with Feed(postgres_dsn, prefix=prefix) as f:
        yield f


class Calls:
    """A processor that records when it was called, and for which partition's tenant."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str]] = []
        self.lock = threading.Lock()

    def __call__(self, item: Item) -> dict[str, bool]:
        with self.lock:
            self.calls.append((time.monotonic(), str(item.attributes.get("tenant", ""))))
        return {"done": True}

    def first(self) -> float:
        with self.lock:
            return self.calls[0][0]

    def within(self, start: float, seconds: float, tenant: str | None = None) -> int:
        with self.lock:
            return sum(
                1
                for at, t in self.calls
                if start <= at <= start + seconds and (tenant is None or t == tenant)
            )


def workers(dsn: str, prefix: str, processor: Calls, n: int, **options: Any) -> list[FeedWorker]:
    return [
        FeedWorker(
            dsn, processor, prefix=prefix, owner=f"rate-{i}-{uuid.uuid4().hex[:6]}", **{**FAST, **options}
        )
        for i in range(n)
    ]


def run_for(started: list[FeedWorker], calls: Calls, seconds: float) -> float:
    """Start the workers, wait for the first call and then ``seconds`` more; stop them. Returns
    the first call's time."""
    for worker in started:
        worker.start()
    try:
        wait_until(lambda: calls.calls, timeout=30, message="a first processor call")
        first = calls.first()
        time.sleep(max(0.0, first + seconds + 0.2 - time.monotonic()))  # the window, then a margin
    finally:
        for worker in started:
            worker.stop()
    return first


def test_a_rate_limit_holds_across_three_workers_within_one_batch(postgres_dsn: str, pg_feed: Feed) -> None:
    """R = 20/s over 3 workers for 8 s (the issue asks 20 s; 8 s keeps the suite short and the
    bound is the same): the processor is called within R·T ± one batch (batch 10, burst 5 — the
    exact bound is burst + R·T = 165, and one batch of slack covers the time from a take to its
    item's call). Without the limit the 400 items would all go in well under a second; a limit
    enforced per worker instead of across them would let three times R through."""
    rate, seconds, batch = 20.0, 8.0, 10
    pg_feed.set_rate(rate, burst=5)
    pg_feed.add_many([NewPartition(f"p{i}", [b"x"] * 50) for i in range(8)])
    calls = Calls()
    started = workers(
        postgres_dsn, pg_feed.store.partitions_table.removesuffix("partitions"), calls, 3, batch_size=batch
    )
    first = run_for(started, calls, seconds)
    done = calls.within(first, seconds)
    assert rate * seconds - batch <= done <= rate * seconds + batch, done
    assert sum(1 for w in started if w.stats.processed) >= 2  # shared by the workers, not one alone
    assert sum(w.stats.rate_waits for w in started) > 0


def test_per_tenant_limits_let_each_tenant_progress_at_its_own_rate(postgres_dsn: str, pg_feed: Feed) -> None:
    """Two tenants limited (10/s and 4/s, burst 2), a third unlimited, two workers for 4 s: each
    limited tenant within its own R·T ± one batch (batch 5), the unlimited one all done — a limit
    keyed by an attribute holds back only the partitions with that value."""
    seconds, batch = 4.0, 5
    pg_feed.set_rate(10, attribute="tenant", value="acme", burst=2)
    pg_feed.set_rate(4, attribute="tenant", value="globex", burst=2)
    specs = [
        NewPartition(f"{tenant}-{i}", [b"x"] * 40, attributes={"tenant": tenant})
        for tenant in ("acme", "globex", "initech")
        for i in range(2)
    ]
    pg_feed.add_many(specs)
    calls = Calls()
    prefix = pg_feed.store.partitions_table.removesuffix("partitions")
    first = run_for(workers(postgres_dsn, prefix, calls, 2, batch_size=batch), calls, seconds)
    acme, globex = calls.within(first, seconds, "acme"), calls.within(first, seconds, "globex")
    assert 10 * seconds - batch <= acme <= 10 * seconds + batch, acme
    assert 4 * seconds - batch <= globex <= 4 * seconds + batch, globex
    assert calls.within(first, seconds, "initech") == 80


def test_a_rate_limited_worker_rests_until_the_next_token_instead_of_spinning(
    postgres_dsn: str, pg_feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker, 2 items/s, plenty of work: over 2 s it issues a few statements per token
    (take, claim, outcome, gate check; about 10), not the hundreds of a loop that polls the
    bucket. Statements are counted at the Database layer, for the worker's own thread."""
    pg_feed.set_rate(2, burst=1)
    pg_feed.add("p", [b"x"] * 50)
    counts: dict[str, int] = {}
    run = Database._run

    def counting(self: Database, *args: Any, **kwargs: Any) -> Any:
        name = threading.current_thread().name
        counts[name] = counts.get(name, 0) + 1
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Database, "_run", counting)
    calls = Calls()
    prefix = pg_feed.store.partitions_table.removesuffix("partitions")
    (worker,) = workers(postgres_dsn, prefix, calls, 1, lease=30.0)
    worker.start()
    try:
        wait_until(lambda: calls.calls, timeout=30, message="a first processor call")
        thread = f"feed-worker-{worker.owner}"
        before, start = counts.get(thread, 0), time.monotonic()
        time.sleep(2.0)
        statements, elapsed = counts.get(thread, 0) - before, time.monotonic() - start
        processed = calls.within(start, elapsed)
    finally:
        worker.stop()
    assert 3 <= processed <= 6, processed  # 2/s: 4 in 2 s, give or take a token at each end
    assert statements / elapsed <= 40, statements
    assert worker.stats.rate_waits >= 3


def test_a_limit_applies_on_every_database_and_run_until_idle_waits_for_it(any_dsn: str, feed: Feed) -> None:
    """On SQLite, PostgreSQL and MariaDB: a tenant limited to 10/s with a burst of 5 needs 2 s
    for 25 items (5 at once, then 10 a second), while another tenant's partition, held by the
    same worker, is done at once; ``run_until_idle`` waits for the limited work."""
    feed.set_rate(10, attribute="tenant", value="acme", burst=5)
    feed.add("slow", [b"x"] * 25, attributes={"tenant": "acme"})
    feed.add("fast", [b"x"] * 25, attributes={"tenant": "initech"})
    calls = Calls()
    prefix = feed.store.partitions_table.removesuffix("partitions")
    start = time.monotonic()
    stats = FeedWorker(any_dsn, calls, prefix=prefix, batch_size=5, **FAST).run_until_idle(timeout=30)
    elapsed = time.monotonic() - start
    assert stats.completed == 50
    assert calls.within(start, 0.8, "initech") == 25
    assert calls.within(start, 0.8, "acme") <= 5 + 10 * 0.8
    assert 1.9 <= elapsed <= 6, elapsed
    assert stats.rate_waits > 0


def test_tokens_are_taken_under_the_row_lock_and_unused_ones_given_back(any_dsn: str, feed: Feed) -> None:
    feed.set_rate(1, burst=3)
    store = feed.store
    first = store.take_tokens(FEED, 2)
    assert first is not None and first.taken == 2
    second = store.take_tokens(FEED, 5)
    assert second is not None and second.taken == 1 and second.wait is None
    empty = store.take_tokens(FEED, 5)
    assert empty is not None and empty.taken == 0 and empty.wait is not None and 0 < empty.wait <= 1.0
    store.give_back_tokens(FEED, 2)
    again = store.take_tokens(FEED, 5)
    assert again is not None and again.taken == 2
    store.give_back_tokens(FEED, 10)  # never above the burst
    assert [round(limit.tokens) for limit in feed.rates()] == [3]
    assert store.take_tokens(RateKey("tenant", "none"), 5) is None  # no such limit


def test_set_change_and_clear_limits(any_dsn: str, feed: Feed) -> None:
    limit = feed.set_rate(50)
    assert (limit.key, limit.max_rate, limit.burst, round(limit.tokens)) == (FEED, 50.0, 50.0, 50)
    assert feed.set_rate(5, burst=2).burst == 2.0
    assert round(feed.rates()[0].tokens) == 2  # kept its level, capped by the new burst
    feed.set_rate(3, attribute="tenant", value="acme")
    assert [(str(r.key), r.max_rate) for r in feed.rates()] == [("the whole feed", 5.0), ("tenant=acme", 3.0)]
    assert [(r.attribute, r.value) for r in feed.status().rate_limits] == [(None, None), ("tenant", "acme")]
    assert feed.clear_rate(attribute="tenant", value="acme")
    assert not feed.clear_rate(attribute="tenant", value="acme")
    assert feed.clear_rate()
    assert feed.rates() == []


def test_a_feed_from_before_rate_limits_reads_as_having_none(any_dsn: str, prefix: str) -> None:
    with Feed(any_dsn, prefix=prefix) as feed:
        feed.add("p", [b"x"])
        feed.db.execute(f"DROP TABLE {feed.store.rates_table}")  # as before rate limits
    with Feed(any_dsn, prefix=prefix, migrate=False) as old:
        assert old.status().rate_limits == []
    with Feed(any_dsn, prefix=prefix) as migrated:  # the next start creates the table
        assert migrated.set_rate(5).max_rate == 5.0


def test_cli_rate_set_show_clear_and_status(postgres_dsn: str, pg_feed: Feed) -> None:
    prefix = pg_feed.store.partitions_table.removesuffix("partitions")
    base = ["--dsn", postgres_dsn, "--prefix", prefix]
    runner = CliRunner()
    out = runner.invoke(
        app, ["rate", "set", *base, "--max-rate", "5", "--per", "tenant=acme", "--burst", "3"]
    )
    assert out.exit_code == 0 and "tenant=acme: 5/s, burst 3" in out.output, out.output
    out = runner.invoke(app, ["rate", "show", *base, "--json"])
    assert out.exit_code == 0 and '"value": "acme"' in out.output, out.output
    out = runner.invoke(app, ["status", *base, "--json"])
    assert '"rate_limits"' in out.output and '"max_rate": 5.0' in out.output, out.output
    out = runner.invoke(app, ["status", *base])
    assert "rate limits" in out.output and "tenant=acme" in out.output, out.output
    assert runner.invoke(app, ["rate", "set", *base, "--max-rate", "5", "--per", "tenant"]).exit_code == 1
    assert runner.invoke(app, ["rate", "set", *base, "--max-rate", "0"]).exit_code == 1
    assert runner.invoke(app, ["rate", "clear", *base, "--per", "tenant=acme"]).exit_code == 0
    out = runner.invoke(app, ["rate", "clear", *base, "--per", "tenant=acme"])
    assert out.exit_code == 1 and "no rate limit for tenant=acme" in out.output
