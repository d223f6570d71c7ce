"""The console's history in a real browser, after real load: a harvester (``sluice reap``, SQLite
→ journal) and a ``sluice capture`` (PostgreSQL with logical decoding → journal) run while a
writer stashes outbox rows and updates captured rows; ``sluice ui`` samples every second.

Its outbox page charts what ``/api/history`` returns (and the backlog it saw is what the outbox
held: up while the writer ran, 0 once drained); the overview draws a sparkline per row and
keeps it through refreshes; the capture page shows the slot's WAL over time and the leader's
term; and the history is still there after the console restarts. Screenshots go to the test's
directory (and to docs/images with ``SLUICE_DOCS_SHOTS=1``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from sluiceway import OutboxRecord, Stasher
from sluiceway.capture import Capture
from sluiceway.db import Database
from sluiceway.journal import Journal
from sluiceway.outbox import init_outbox
from sluiceway.testing import free_port, wait_until
from tests.integration.overview.test_capture_status import capture_file
from tests.support import ROOT
from tests.support.metrics import scrape, sluice_process
from tests.support.outbox import outbox_count, user_connection

pytestmark = pytest.mark.timeout(240)

DOCS = ROOT / "docs" / "images"
PUBLISHED = 'sluice_harvest_records_total{harvest="sluiceway",outcome="published"}'


@dataclass
class Loaded:
    url: str
    port: int
    root: Path
    config: Path
    stashed: int
    journal: Path
    ui: subprocess.Popen[str]
    #: The harvester's metrics once the outbox drained.
    harvested: dict[str, float]


def start_ui(config: Path, port: int, log: Path) -> subprocess.Popen[str]:
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluiceway.cli.main", "ui", "--config", str(config),
             "--addr", f"127.0.0.1:{port}", "--refresh", "1"],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith(f"sluice ui on http://127.0.0.1:{port}/"), first
    assert proc.stdout.readline().startswith("history: kept in "), "the console says where history is kept"

    def up() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/api/status", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=30, message="the console to answer")
    return proc


def stop_ui(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    assert proc.wait(15) == 0
    if proc.stdout is not None:
        proc.stdout.close()


def history(url: str, **params: str) -> dict[str, Any]:
    response = httpx.get(url + "/api/history", params=params, timeout=10)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture(scope="module")
def loaded(cdc_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    root = tmp_path_factory.mktemp("history")
    dsn = f"sqlite:///{root / 'shop.db'}"
    with Database(dsn) as db:
        init_outbox(db)
    reaper = root / "reaper.yaml"
    reaper.write_text(yaml.safe_dump({
        "harvest": {"dataSource": dsn, "journal": {"path": str(root / "bus")}}, "logging": {"level": "Warn"},
    }))  # fmt: skip
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO t SELECT g, 'seed' FROM generate_series(1, 50) g")
    (root / "c").mkdir()
    capture = capture_file(root / "c", cdc_dsn, slot="charted")
    config = root / "sluice.yaml"
    config.write_text(yaml.safe_dump({
        "outboxes": [{"name": "shop", "dsn": dsn}],
        "journals": [{"name": "bus", "path": str(root / "bus")}],
        "captures": [str(capture)],
        "history": {"every": "1s"},
    }))  # fmt: skip
    port = free_port()
    ui = start_ui(config, port, root / "ui.log")
    stashed = 0
    try:
        with Capture(str(capture)) as running:
            wait_until(lambda: running.position > 0, timeout=30, message="the capture to start")
            time.sleep(2)  # a quiet start on the charts
            reaping = threading.Event()

            def write() -> None:
                nonlocal stashed
                conn = user_connection(dsn)
                stash = Stasher().prepare(conn)
                with psycopg.connect(cdc_dsn, autocommit=True) as pg:
                    for round_ in range(70):  # ~7 s; the harvester starts half-way through
                        for i in range(40):
                            stash.stash(
                                OutboxRecord("orders.created", f"k{i % 9}", f'{{"n": {stashed + i}}}')
                            )
                        conn.commit()
                        stashed += 40
                        pg.execute("UPDATE t SET note = %s WHERE id = %s", (f"r{round_}", round_ % 50 + 1))
                        if round_ == 35:
                            reaping.set()
                        time.sleep(0.1)
                conn.close()

            writer = threading.Thread(target=write)
            writer.start()
            # A backlog builds up with no harvester running; then one starts and drains it.
            assert reaping.wait(30)
            metrics = free_port()
            with sluice_process(
                ["reap", "-f", str(reaper), "--metrics-addr", f":{metrics}"], root / "reap.log"
            ):
                writer.join(60)
                wait_until(lambda: outbox_count(dsn) == 0, timeout=60, message="the outbox to drain")
                time.sleep(3)  # samples of the drained outbox
                # What the harvester's own metrics say of it, to hold the charts against.
                wait_until(
                    lambda: scrape(metrics).get(PUBLISHED, 0) >= stashed, timeout=30, message="the counter"
                )
                harvested = scrape(metrics)
            loaded = Loaded(
                f"http://127.0.0.1:{port}", port, root, config, stashed, root / "bus", ui, harvested
            )
            yield loaded
            ui = loaded.ui  # a test restarts it
    finally:
        if ui.poll() is None:
            stop_ui(ui)
        with psycopg.connect(cdc_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = 'charted' AND NOT active")  # fmt: skip


def shoot(page: Any, loaded: Loaded, name: str) -> None:
    path = loaded.root / name
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("SLUICE_DOCS_SHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOCS / name)


def drawn(page: Any, part: str) -> dict[str, Any]:
    """What the page's charts of ``part`` were drawn from, and the data each uPlot holds."""
    result: dict[str, Any] = page.evaluate(
        "(part) => { const c = window.sluice.charts[part];"
        " return { chart: c.chart, plots: c.plots.map((p) => p.data) }; }",
        part,
    )
    return result


def test_the_outbox_page_charts_its_history(loaded: Loaded, page: Any) -> None:
    page.goto(loaded.url + "/outbox/shop")
    page.click("section.history button[data-range='15m']")
    page.wait_for_function(
        "() => { const c = window.sluice.charts['outbox/shop'];"
        " return c && c.chart.to - c.chart.from === 900; }"
    )
    shown = drawn(page, "outbox/shop")
    api = history(loaded.url, part="outbox/shop", range="15m")
    chart = shown["chart"]
    # The chart is /api/history's answer: every bucket but the last (still filling) unchanged since.
    assert chart["part"] == "outbox/shop" and chart["step"] == api["step"] == 5
    settled = chart["times"][:-1]
    assert settled and set(settled) <= set(api["times"])
    for line in chart["series"]:
        now = next(s for s in api["series"] if s["name"] == line["name"])
        at = dict(zip(api["times"], now["values"], strict=True))
        assert [at[t] for t in settled] == line["values"][:-1], line["name"]
    # Each panel's uPlot holds those series, aligned with the times.
    for data in shown["plots"]:
        assert data[0] == chart["times"] and all(len(values) == len(data[0]) for values in data[1:])
    # The backlog it saw is the outbox's: rows while the writer ran, 0 once drained.
    rows = next(s["values"] for s in api["series"] if s["name"] == "rows")
    seen = [v for v in rows if v is not None]
    assert max(seen) > 0 and seen[-1] == 0
    assert page.locator("section.history .panel[data-series*=rows] canvas").count() >= 1
    # The harvester's metrics agree: every row published, nothing left at the head.
    assert loaded.harvested[PUBLISHED] == loaded.stashed
    assert loaded.harvested['sluice_harvest_backlog_age_seconds{harvest="sluiceway"}'] == 0
    # And the journal it went to: every row in it, its append rate charted.
    with Journal.open(str(loaded.journal), read_only=True) as journal:
        assert journal.head == loaded.stashed
    bus = history(loaded.url, part="journal/bus", range="15m")
    rates = next(s["values"] for s in bus["series"] if s["name"] == "append_rate")
    assert max(v for v in rates if v is not None) > 0
    shoot(page, loaded, "console-outbox.png")


def test_the_overview_draws_a_sparkline_per_row_and_keeps_it(loaded: Loaded, page: Any) -> None:
    page.goto(loaded.url + "/")
    page.wait_for_function("() => document.querySelectorAll('td.spark canvas').length === 3")
    sparks = page.evaluate("() => Object.keys(window.sluice.sparks).sort()")
    assert sparks == ["capture/c1", "journal/bus", "outbox/shop"]
    before = page.evaluate("() => window.sluice.refreshes")
    page.wait_for_function(f"() => window.sluice.refreshes >= {before + 2}")
    # Refreshed twice: the same canvases (carried over, not drawn again), one per row.
    assert page.locator("td.spark canvas").count() == 3
    headline = page.evaluate("() => window.sluice.sparks['outbox/shop'].chart.series[0].name")
    assert headline == "rows"
    shoot(page, loaded, "console-overview.png")


def test_the_capture_page_shows_the_slots_wal_over_time(loaded: Loaded, page: Any) -> None:
    page.goto(loaded.url + "/capture/c1")
    assert page.locator("[data-field=slot_name]").inner_text() == "charted"
    assert page.locator("#tables tr[data-table='public.t'] [data-field=phase]").inner_text() == "sync"
    page.click("section.history button[data-range='15m']")
    page.wait_for_function(
        "() => { const c = window.sluice.charts['capture/c1']; return c && c.chart.to - c.chart.from === 900"
        " && document.querySelector('.panel[data-series*=wal_retained_bytes] canvas'); }"
    )
    chart = drawn(page, "capture/c1")["chart"]
    wal = next(s["values"] for s in chart["series"] if s["name"] == "wal_retained_bytes")
    assert len([v for v in wal if v is not None]) >= 3, "the WAL retained, sampled over time"
    published = next(s["values"] for s in chart["series"] if s["name"] == "publish_rate")
    assert max(v for v in published if v is not None) > 0, "WAL published while the writer ran"
    epochs = page.locator("#terms tr[data-epoch]")
    assert epochs.count() >= 1 and page.locator(
        "[data-field=epoch]"
    ).inner_text() == epochs.first.get_attribute("data-epoch")
    shoot(page, loaded, "console-capture.png")


def test_history_survives_a_console_restart(loaded: Loaded) -> None:
    before = history(loaded.url, part="outbox/shop", range="15m")["times"]
    stop_ui(loaded.ui)
    loaded.ui = start_ui(loaded.config, loaded.port, loaded.root / "ui.log")
    after = history(loaded.url, part="outbox/shop", range="15m")["times"]
    assert before[0] in after and len(after) >= len(before) - 1
