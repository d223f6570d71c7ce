"""A ``sluice capture`` in ``sluice status`` and the console, on a real PostgreSQL with logical
decoding: while it runs (slot, leader, published position, the copy done), after it stops (no
process holds the lease), and a workspace naming a capture file that is not there."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml

from sluiceway.capture import Capture
from sluiceway.overview import Workspace, collect, unhealthy
from sluiceway.testing import wait_until
from sluiceway.ui import Console, create_app
from tests.support.cli import sluice

pytestmark = pytest.mark.timeout(120)

LEASE = "no process holds the lease: is sluice capture running?"


def capture_file(tmp_path: Path, dsn: str, slot: str = "st1") -> Path:
    section = {
        "name": "c1",
        "dsn": dsn,
        "tables": ["public.t"],
        "slot": slot,
        "publication": slot,
        "stateDir": str(tmp_path / "state"),
        "journal": {"path": str(tmp_path / "j")},
        "election": {"leaseTimeout": "2s"},
    }
    path = tmp_path / "capture.yaml"
    path.write_text(yaml.safe_dump({"capture": section}))
    return path


def workspace_file(tmp_path: Path, *captures: Path) -> Path:
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump({"captures": [str(c) for c in captures]}))
    return path


def console_get(config: Path, url: str) -> httpx.Response:
    """A page of the console over the workspace, in this process (ASGI, no server)."""
    app = create_app(Console(Workspace.from_file(config)))

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as web:
            return await web.get(url)

    response = asyncio.run(get())
    assert response.status_code == 200, response.text
    return response


def test_a_running_capture_then_a_stopped_one(cdc_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO t SELECT g, 'seed' FROM generate_series(1, 20) g")
    config = workspace_file(tmp_path, capture_file(tmp_path, cdc_dsn))
    workspace = Workspace.from_file(config)

    with Capture(str(tmp_path / "capture.yaml")) as capture:
        wait_until(lambda: capture.position > 0, timeout=30, message="the capture's first position")
        wait_until(
            lambda: collect(workspace).to_json()["captures"][0]["tables"][0]["phase"] == "sync",
            timeout=30,
            message="the copy of public.t to finish",
        )
        # The copy is done (20 rows: a row added before it ends may be copied too); a change past
        # it published: every figure is then settled.
        with psycopg.connect(cdc_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO t VALUES (21, 'after')")
        mark = capture.position
        wait_until(lambda: capture.position > mark, timeout=30, message="the change to be published")
        (entry,) = collect(workspace).to_json()["captures"]
        assert (entry["name"], entry["health"], entry["problems"], entry["error"]) == ("c1", "ok", [], None)
        assert entry["destination"] == f"journal {tmp_path / 'j'}"
        assert (entry["slot_name"], entry["election"]) == ("st1", {"kind": "database", "name": "capture.st1"})
        slot = entry["slot"]
        assert slot["slot"] == "st1" and slot["wal_retained_bytes"] >= 0 and slot["active_pid"] is not None
        assert "/" in slot["confirmed_lsn"] and "/" in slot["restart_lsn"]
        leader = entry["leader"]
        assert leader["election"] == "capture.st1" and leader["holder"] and leader["epoch"] >= 1
        assert 0 < leader["expires_in_seconds"] <= 2
        assert entry["published_lsn"] is not None and "/" in entry["published_lsn"]
        (table,) = entry["tables"]
        assert (table["table"], table["phase"], table["rows_copied"]) == ("public.t", "sync", 20)
        assert table["chunks"] >= 1 and table["complete_at"] is not None

        # The same through the console's JSON and the CLI, in a child process.
        assert [c["name"] for c in console_get(config, "/api/status").json()["captures"]] == ["c1"]
        page = console_get(config, "/").text
        row = page[page.index('<table id="captures">') :]
        assert 'data-name="c1"' in row and 'data-health="ok"' in row and "journal " in row
        shown = sluice("status", "-c", str(config), "--check", cwd=tmp_path)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "captures" in shown.stdout and "c1" in shown.stdout and "st1" in shown.stdout
        assert "nothing stuck" in shown.stdout

    # Stopped: the lease is given up (or, after a kill, runs out within its 2 s); the slot stays.
    (entry,) = collect(workspace).to_json()["captures"]
    assert entry["leader"] is None and entry["slot"]["active_pid"] is None
    assert (entry["health"], entry["problems"]) == ("stuck", [LEASE])
    assert unhealthy(collect(workspace)) == [f"capture c1: {LEASE}"]
    checked = sluice("status", "-c", str(config), "--check", "--format", "json", cwd=tmp_path)
    assert checked.returncode == 1 and LEASE in " ".join(checked.stderr.split())
    assert json.loads(checked.stdout)["captures"][0]["problems"] == [LEASE]


def test_a_capture_that_never_ran_or_whose_file_is_missing(cdc_dsn: str, tmp_path: Path) -> None:
    # The database is the module's: another slot than the first test's.
    never = capture_file(tmp_path, cdc_dsn, slot="never_ran")
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY, note text)")
    (entry,) = collect(Workspace(captures=[str(never)])).to_json()["captures"]
    assert entry["slot"] is None and entry["leader"] is None and entry["published_lsn"] is None
    assert entry["problems"] == ["slot never_ran does not exist: has the capture run?", LEASE]

    missing = tmp_path / "gone.yaml"
    report = collect(Workspace(captures=[str(missing)])).to_json()
    (entry,) = report["captures"]
    assert (entry["name"], entry["health"], entry["file"]) == ("gone", "unavailable", str(missing))
    assert "gone.yaml" in entry["error"] and entry["problems"] == [f"cannot be read: {entry['error']}"]
    assert entry["slot"] is None and entry["destination"] is None and "tables" in entry
