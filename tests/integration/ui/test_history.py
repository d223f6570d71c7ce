"""The console's history on a real SQLite file: points kept and read back bucketed, the two tiers
and their retention, a restart that keeps it, rates from counts, and ``GET /api/history`` over a
real workspace (tests/support/overview.py), its answers and its refusals."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluiceway.overview import Workspace, collect
from sluiceway.overview.history import HistoryError, Sampler, SqliteHistory, open_history
from sluiceway.ui import Console, create_app
from tests.support.journal import make_journal
from tests.support.overview import HEAD, Built, build

T0 = 1_800_000_000.0  # a whole minute


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_points_come_back_bucketed_and_a_restart_keeps_them(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "h.db"
    with SqliteHistory(path, every=5, clock=clock) as history:
        for i in range(12):  # a minute of samples, every 5 s
            history.record(T0 + 5 * i, [("outbox/shop", "rows", float(i)), ("outbox/shop", "health", 0.0)])
        clock.now = T0 + 55
        chart = history.read("outbox/shop", 60)
    assert chart.step == 5 and chart.times == [T0 + 5 * i for i in range(12)]
    rows = next(s for s in chart.series if s.name == "rows")
    assert rows.values == [float(i) for i in range(12)] and rows.unit == "records"
    # Every series of the kind is in the answer, in its order; one never sampled has no values.
    assert [s.name for s in chart.series][:2] == ["rows", "oldest_age_seconds"]
    assert chart.series[1].values == [None] * 12

    with SqliteHistory(path, every=5, clock=clock) as reopened:  # the console restarted
        assert reopened.read("outbox/shop", 60).times == chart.times
        # Over a day the minute tier answers: one point, the minute's mean.
        day = reopened.read("outbox/shop", 86400, only=["rows"])
    assert day.step >= 60 and [s.values for s in day.series] == [[5.5]]


def test_retention_is_bounded_in_both_tiers(tmp_path: Path) -> None:
    clock = Clock()
    with SqliteHistory(tmp_path / "h.db", retention=600, detail=120, every=5, clock=clock) as history:
        for i in range(0, 3600, 5):  # an hour of samples
            clock.now = T0 + i
            history.record(clock.now, [("journal/bus", "bytes", float(i))], [("capture/c1", i // 1200, "h")])
        db = sqlite3.connect(tmp_path / "h.db")
        oldest_sample, samples = db.execute("SELECT min(at), count(*) FROM sample").fetchone()
        oldest_minute, minutes = db.execute("SELECT min(at), count(*) FROM minute").fetchone()
        db.close()
        # Pruned once a minute: never more than a minute past each limit.
        assert clock.now - 120 - 60 <= oldest_sample and samples <= (120 + 60) / 5 + 1
        assert clock.now - 600 - 60 <= oldest_minute and minutes <= (600 + 60) / 60 + 1
        # A range past the detail reads the minutes; nothing older than the retention is left.
        chart = history.read("journal/bus", 3600)
        assert chart.times and min(chart.times) >= clock.now - 600 - 120
        # A term is kept while it is seen (epoch 2 began 20 min ago), dropped once it has not been.
        assert [t.epoch for t in history.terms("capture/c1")] == [2]


def test_trouble_since_is_the_start_of_the_streak(tmp_path: Path) -> None:
    clock = Clock(T0 + 100)
    with SqliteHistory(tmp_path / "h.db", clock=clock) as history:
        for i, health in enumerate([1, 0, 0, 1, 2, 1]):
            history.record(T0 + 10 * i, [("feed/work", "health", float(health))])
        assert history.trouble_since("feed/work") == T0 + 30
        history.record(T0 + 60, [("feed/work", "health", 0.0)])
        assert history.trouble_since("feed/work") is None
        assert history.trouble_since("feed/none") is None


def test_a_history_file_that_cannot_be_opened_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match=r"history file .*missing/h\.db: unable to open"):
        SqliteHistory(tmp_path / "missing" / "h.db")
    (tmp_path / "junk.db").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(HistoryError, match=r"junk\.db: file is not a database"):
        SqliteHistory(tmp_path / "junk.db")


@pytest.fixture
def built(tmp_path: Path) -> Built:
    return build(tmp_path / "ws", f"sqlite:///{tmp_path / 'ws' / 'shop.db'}")


def test_the_sampler_keeps_every_part_and_rates_from_counts(built: Built) -> None:
    workspace = Workspace.from_file(built.config)
    assert workspace.history.path == str(built.config.parent / "sluice.history.db")
    clock = Clock()
    history, sampler = open_history(workspace)
    assert isinstance(history, SqliteHistory) and isinstance(sampler, Sampler)
    sampler = Sampler(workspace, history, every=5, clock=clock)
    sampler.sample()
    appended = 30
    make_journal(built.journal, [("orders", f"k{i}", b"v") for i in range(appended)])
    clock.now += 6
    sampler.sample()
    history._clock = clock
    bus = history.read("journal/bus", 60)
    rates = next(s for s in bus.series if s.name == "append_rate").values
    assert rates[-1] == pytest.approx(appended / 6)
    lags = next(s for s in bus.series if s.name == "consumer_lag").values
    assert lags[-1] == HEAD + appended - 60
    orders = history.read("pipeline/orders", 60)
    by_name = {s.name: s.values[-1] for s in orders.series}
    assert (by_name["lag:lake"], by_name["failed_sinks"], by_name["health"]) == (20 + appended, 1.0, 1.0)
    assert by_name["rate:lake"] == 0.0  # no records written between the samples
    shop = {s.name: s.values[-1] for s in history.read("outbox/shop", 60).series}
    assert (shop["rows"], shop["in_flight"], shop["dead_letters"]) == (1234.0, 10.0, 2.0)
    assert [t.holder for t in history.terms("outbox/shop")] == ["harvester-a"]
    history.close()


def _get(console: Console, url: str, **params: Any) -> httpx.Response:
    app = create_app(console)

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as web:
            return await web.get(url, params=params)

    return asyncio.run(get())


def test_the_history_api_answers_and_refuses_in_one_line(built: Built) -> None:
    workspace = Workspace.from_file(built.config)
    history, sampler = open_history(workspace)
    assert history is not None and sampler is not None
    sampler.sample()
    console = Console(workspace, history=history)
    week = _get(console, "/api/history", part="feed/work", range="7d").json()
    assert week["to"] - week["from"] == 7 * 86400 and week["step"] >= 60
    one = _get(console, "/api/history", part="feed/work", range="15m").json()
    assert (one["part"], one["range"], one["source"], one["step"]) == ("feed/work", "15m", "sqlite", 5.0)
    assert one["to"] - one["from"] == 900 and len(one["times"]) == 1
    figures = {s["name"]: s["values"][0] for s in one["series"]}
    (work,) = collect(workspace).feeds  # what sluice status says of it, now
    assert (figures["ready"], figures["failed"], figures["expired_leases"], figures["leased"]) == (
        work.ready_items,
        1.0,
        1.0,
        work.live_leases,
    )
    every = _get(console, "/api/history", range="1h").json()
    assert [(p["part"], [s["name"] for s in p["series"]]) for p in every["parts"]] == [
        ("outbox/shop", ["rows"]),
        ("journal/bus", ["append_rate"]),
        ("pipeline/orders", ["lag"]),
        ("feed/work", ["ready"]),
    ]
    refusals = {
        ("nope/x", "1h"): (400, "part 'nope/x': name one as outbox/<name>"),
        ("outbox/elsewhere", "1h"): (404, "the workspace watches no outbox/elsewhere"),
        ("outbox/shop", "forever"): (400, "range: expected a range like '15m', '1h', '24h' or '7d'"),
        ("outbox/shop", "0s"): (400, "range: between 1s and 366d, got '0s'"),
    }
    for (part, span), (status, words) in refusals.items():
        answer = _get(console, "/api/history", part=part, range=span)
        assert answer.status_code == status and answer.json()["error"].startswith(words), answer.text
    off = _get(Console(workspace), "/api/history", part="outbox/shop")
    assert off.status_code == 404 and "history is off" in off.json()["error"]
    # The pages: a history section per detail page, a sparkline cell per overview row, and the
    # trouble a part is in with what clears it.
    page = _get(console, "/pipeline/orders").text
    assert 'id="history-pipeline/orders"' in page and 'data-field="since"' in page
    assert "sluice pipeline step" in page and "--sink db" in page
    overview = _get(console, "/").text
    assert overview.count('class="spark"') == 4
    assert 'class="spark"' not in _get(Console(workspace), "/").text
    history.close()
