"""``sluice ui`` in a real browser (Playwright driving Debian's Chromium): the overview, a link to
each kind of page with its figures checked against the data (tests/support/overview.py), the
page refreshing itself, /api/status against ``sluice status --format json``, and a dead-letter
retry that works with the token and is refused without it.

One console process and one browser for the module (they take seconds to start); the tests run
in order, and the one that changes data comes last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluiceway.journal import Journal
from sluiceway.testing import free_port, wait_until
from tests.support import ROOT
from tests.support.browser import read_png
from tests.support.overview import Built, build

pytestmark = pytest.mark.timeout(180)


@dataclass
class Served:
    url: str
    token: str
    built: Built
    shots: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("console")
    built = build(root / "ws", f"sqlite:///{root / 'ws' / 'shop.db'}")
    port = free_port()
    log = root / "ui.log"
    args = [
        "ui",
        "--config",
        str(built.config),
        "--addr",
        f"127.0.0.1:{port}",
        "--allow-actions",
        "--refresh",
        "1",
    ]
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluiceway.cli.main", *args],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        token = next(line.split(": ", 1)[1].strip() for line in lines if line.startswith("token: "))
        url = f"http://127.0.0.1:{port}"
        assert lines[0].startswith(f"sluice ui on {url}/ (actions on"), lines

        def up() -> bool:
            try:
                return httpx.get(url + "/api/status", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=30, message="the console to answer")
        yield Served(url, token, built, root)
    finally:
        proc.terminate()
        proc.wait(15)
        if proc.stdout is not None:
            proc.stdout.close()


#: Rows of the overview's screenshot that are decoded (the badges checked are above this).
HEADER = 900
#: base.html's colours: the header bar, and the ``ok`` and ``stuck`` health badges.
HEADER_COLOUR, OK_COLOUR, STUCK_COLOUR = (0x24, 0x29, 0x2F), (0x1A, 0x7F, 0x37), (0xB3, 0x59, 0x00)


def near(pixel: tuple[int, int, int], colour: tuple[int, int, int]) -> bool:
    return all(abs(a - b) <= 6 for a, b in zip(pixel, colour, strict=True))


def cell(page: Any, selector: str) -> str:
    return str(page.locator(selector).first.inner_text()).strip()


def test_the_overview_shows_every_part_with_its_figures(served: Served, page: Any) -> None:
    page.goto(served.url + "/")
    shop = "#outboxes tr[data-name=shop]"
    assert cell(page, f"{shop} [data-field=rows]") == "1,234"
    assert cell(page, f"{shop} [data-field=in_flight]") == "10"
    assert cell(page, f"{shop} [data-field=dead_letters]") == "2"
    assert cell(page, f"{shop} [data-health]") == "ok"
    assert "harvester-a" in cell(page, shop)
    bus = "#journals tr[data-name=bus]"
    assert cell(page, f"{bus} [data-field=head]") == "100"
    assert cell(page, f"{bus} [data-consumer='orders.lake']") == "orders.lake: 40"
    orders = "#pipelines tr[data-name=orders]"
    assert cell(page, f"{orders} [data-health]") == "stuck"
    assert cell(page, f"{orders} [data-sink=lake]") == "lake: ok, lag 20"
    assert cell(page, f"{orders} [data-sink=db]") == "db: failed, lag 60"
    assert "sink db stopped at offset 42" in cell(page, orders)
    work = "#feeds tr[data-name=work]"
    fields = ("partitions", "available", "failed", "complete", "live_leases", "expired_leases")
    assert [cell(page, f"{work} [data-field={f}]") for f in fields] == ["3", "6", "1", "0", "1", "1"]
    assert "held by worker-gone" in cell(page, work)
    # The screenshot (kept for a person to look at) shows that page: the whole of it, styled, with
    # each entry's health badge in its colour where the page has it.
    shot = read_png(page.screenshot(path=str(served.shots / "overview.png"), full_page=True), rows=HEADER)
    size = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    assert [shot.width, shot.height] == size and shot.width == 1400 and shot.height >= 1000
    assert near(shot.pixel(5, 5), HEADER_COLOUR), "the header bar, styled"
    # The page replaces its content every second (--refresh 1), so a locator's element can be
    # detached between finding and measuring it: measure every badge in one script, which runs
    # between two refreshes (the refreshed content has the same layout).
    rows = ((shop, OK_COLOUR), (bus, OK_COLOUR), (orders, STUCK_COLOUR), (work, STUCK_COLOUR))
    boxes = page.evaluate(
        """selectors => selectors.map(s => {
            const found = document.querySelector(s);
            if (!found) return null;
            const r = found.getBoundingClientRect();
            return {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height};
        })""",
        [f"{row} [data-health]" for row, _ in rows],
    )
    for (row, colour), box in zip(rows, boxes, strict=True):
        assert box is not None and box["width"] > 0 and box["y"] + box["height"] < shot.height, (row, box)
        at = (int(box["x"]) + 3, int(box["y"] + box["height"] / 2))  # inside the badge, left of its word
        assert at[1] < HEADER, "the badges are in the decoded top of the page"
        assert near(shot.pixel(*at), colour), (row, shot.pixel(*at))


def test_a_link_leads_to_each_kind_of_page(served: Served, page: Any) -> None:
    page.goto(served.url + "/")
    page.click("#outboxes a:text('shop')")
    page.wait_for_url("**/outbox/shop")
    assert cell(page, "[data-field=rows]") == "1,234" and cell(page, "[data-field=leader]") == "harvester-a"
    oldest = page.locator("#oldest tr[data-id]")
    assert oldest.count() == 20 and oldest.first.get_attribute("data-id") == "3"  # 1 and 2 are dead letters
    assert page.locator("#dead tr[data-id]").evaluate_all("rows => rows.map(r => r.dataset.id)") == ["1", "2"]
    assert "MessageSizeTooLarge" in cell(page, "#dead tr[data-id='1']")

    page.goto(served.url + "/")
    page.click("#journals a:text('bus')")
    page.wait_for_url("**/journal/bus")
    assert cell(page, "#consumers [data-consumer='orders.lake'] [data-field=lag]") == "40"
    offsets = page.locator("#records tr[data-offset]").evaluate_all(
        "rows => rows.map(r => +r.dataset.offset)"
    )
    assert offsets == list(range(50, 100)), "by default, the last 50 records"
    page.fill("#range input[name=from]", "10")
    page.fill("#range input[name=to]", "15")
    page.click("#range button")
    page.wait_for_url("**/journal/bus?from=10&to=15")
    rows = page.locator("#records tr[data-offset]")
    assert rows.evaluate_all("rows => rows.map(r => +r.dataset.offset)") == [10, 11, 12, 13, 14]
    assert "customer-3" in cell(page, "#records tr[data-offset='10']")
    assert "order 10" in cell(page, "#records tr[data-offset='10']")

    page.goto(served.url + "/")
    page.click("#pipelines a:text('orders')")
    page.wait_for_url("**/pipeline/orders")
    assert cell(page, "table.sink[data-sink=lake] [data-field=lag]") == "20"
    assert cell(page, "table.sink[data-sink=lake] [data-field=committed]") == "80"
    assert cell(page, "table.sink[data-sink=db] [data-field=state]") == "failed"
    assert cell(page, "[data-field=error_offset]") == "42"
    assert cell(page, "table.stopped[data-sink=db] [data-field=stopped_offset]") == "42"
    assert cell(page, "table.stopped[data-sink=db] [data-field=stopped_key]") == "customer-0"  # 42 % 7
    assert "order 42" in cell(page, "table.stopped[data-sink=db]")

    page.goto(served.url + "/")
    page.click("#feeds a:text('work')")
    page.wait_for_url("**/feed/work")
    assert (cell(page, "[data-field=live_leases]"), cell(page, "[data-field=expired_leases]")) == ("1", "1")
    assert cell(page, "#workers tr[data-owner=worker-gone] [data-field=expired]") == "1"
    assert cell(page, "#workers tr[data-owner=worker-live] [data-field=live]") == "1"
    gate = "#gates tr[data-kind=items][data-status=available]"
    assert cell(page, f"{gate}[data-gate='0'] [data-field=count]") == "5"
    assert cell(page, f"{gate}[data-gate='1'] [data-field=count]") == "1"
    assert "OCR timed out" in cell(page, "#failed tr[data-partition=folder-3]")
    assert page.locator("#partitions tr[data-partition]").count() == 3


def test_the_page_refreshes_itself(served: Served, page: Any) -> None:
    page.goto(served.url + "/")
    head = "#journals tr[data-name=bus] [data-field=head]"
    assert cell(page, head) == "100"
    with Journal.open(served.built.journal, fsync=False) as journal, journal.append() as tx:
        tx.write("customer-1", b"one more", namespace="orders.created")
    # No reload: the page polls (every second in this console) and shows the new head.
    wait_until(lambda: cell(page, head) == "101", timeout=15, message="the overview to show the new head")


def test_api_status_is_what_sluice_status_prints(served: Served) -> None:
    api = httpx.get(served.url + "/api/status", timeout=10).json()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluiceway.cli.main",
            "status",
            "-c",
            str(served.built.config),
            "--format",
            "json",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    cli = json.loads(result.stdout)

    def steady(report: dict[str, Any]) -> str:
        # Ages and times move between the two reads; everything else must be equal.
        moving = {"generated_at", "oldest_age_seconds", "term_seconds", "expires_in_seconds"}
        moving |= {"oldest_available_age_seconds", "at"}

        def strip(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: strip(v) for k, v in value.items() if k not in moving}
            if isinstance(value, list):
                return [strip(v) for v in value]
            return value

        return json.dumps(strip(report), sort_keys=True)

    assert set(api) == {"generated_at", "outboxes", "journals", "pipelines", "feeds", "captures"}
    assert steady(api) == steady(cli)


def test_a_dead_letter_retry_needs_the_token(served: Served, page: Any) -> None:
    page.goto(served.url + "/outbox/shop")
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.click("#dead tr[data-id='1'] button[value=retry]")
    assert answer.value.status == 403
    assert "needs the token" in cell(page, "[data-refused]")
    page.goto(served.url + "/outbox/shop")
    assert page.locator("#dead tr[data-id]").count() == 2, "refused: nothing changed"

    page.goto(f"{served.url}/outbox/shop?token={served.token}")  # the start-up link sets a cookie
    page.wait_for_url("**/outbox/shop")
    page.click("#dead tr[data-id='1'] button[value=retry]")
    page.wait_for_selector(".flash")
    assert cell(page, ".flash") == "dead letter 1 put back into the outbox"
    assert page.locator("#dead tr[data-id]").evaluate_all("rows => rows.map(r => r.dataset.id)") == ["2"]
    assert cell(page, "[data-field=rows]") == "1,235" and cell(page, "[data-field=dead_letters]") == "1"

    page.goto(served.url + "/feed/work")
    page.click("#failed tr[data-partition=folder-3] button")
    page.wait_for_selector(".flash")
    assert cell(page, ".flash") == "1 failed item(s) of partition folder-3 made available again"
    # A form posted from another site is refused even with the operator's cookie.
    forged = page.request.post(
        served.url + "/outbox/shop/dead/2/resolve", headers={"Origin": "http://evil.test"}
    )
    assert forged.status == 403
