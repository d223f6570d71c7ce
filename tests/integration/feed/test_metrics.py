"""``sluice feed worker --metrics-addr``: the documented series are served and move as it works,
and the feed's scheduled work is counted."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from sluiceway.feed import Feed
from sluiceway.testing import free_port, wait_until
from tests.support.metrics import scrape, sluice_process

pytestmark = pytest.mark.timeout(120)


def test_a_worker_serves_its_counters_and_they_move(sqlite_dsn: str, tmp_path: Path) -> None:
    with Feed(sqlite_dsn) as feed:
        feed.set_rate(20, burst=1)  # 5 items: 4 of them wait for a token (50 ms each)
        feed.add("later", [b"x", b"y"], not_before=3600)  # scheduled work, due in an hour
    port = free_port()
    args = ["feed", "worker", "--dsn", sqlite_dsn, "--processor", "tests.support.processors:done"]
    args += ["--poll-interval", "0.05", "--lease", "3", "--metrics-addr", f"127.0.0.1:{port}"]
    with sluice_process(args, tmp_path / "worker.log") as proc:
        completed = 'sluice_feed_items_total{feed="feed_",outcome="completed"}'
        wait_until(
            lambda: scrape(port).get(completed) == 0, timeout=30, message="the worker's metrics at zero"
        )
        with Feed(sqlite_dsn) as feed:
            feed.add("folder-1", [b"a", b"b", b"c"])
            feed.add_items("folder-1", [b"index"], gate=1)
            feed.add("folder-2", [b"d"])
        wait_until(lambda: scrape(port).get(completed) == 5, timeout=30, message="5 completed items")
        samples = scrape(port)
        assert samples['sluice_feed_partitions_total{event="acquired",feed="feed_"}'] >= 2
        assert samples['sluice_feed_partitions_total{event="completed",feed="feed_"}'] == 2
        assert samples['sluice_feed_gates_advanced_total{feed="feed_"}'] >= 1
        assert samples['sluice_feed_items_total{feed="feed_",outcome="failed"}'] == 0
        assert 'sluice_feed_partitions_held{feed="feed_"}' in samples
        assert samples['sluice_feed_wakeups_total{feed="feed_"}'] == 0  # SQLite: the worker polls
        assert samples['sluice_feed_rate_limited_waits_total{feed="feed_"}'] >= 1
        assert samples['sluice_feed_rate_limited_wait_seconds_total{feed="feed_"}'] > 0
        assert samples['sluice_feed_scheduled_partitions{feed="feed_"}'] == 1
        assert samples['sluice_feed_scheduled_items{feed="feed_"}'] == 2
        assert 3500 < samples['sluice_feed_next_due_seconds{feed="feed_"}'] <= 3600
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert "metrics on http://127.0.0.1:" in (tmp_path / "worker.log").read_text()
