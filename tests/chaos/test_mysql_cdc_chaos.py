"""``sluice capture`` from a MariaDB binlog into a journal under a writer: killed with kill -9
twice while it copies two tables and twice while it follows their changes, and the server
restarted once. Per key a consumer sees the changes in order apart from re-sent tails (ids
already seen), every committed upsert is there, and the last state of every row is the table's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluiceway.capture.target import PositionFile
from sluiceway.harvest.sequence import sequence_id
from sluiceway.testing import PrivateMariaDB, wait_until
from tests.support.cdc import journal_records
from tests.support.mysql_cdc import Writer, binlog_end, create_tables, source_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


class Process:
    def __init__(self, spec: Path, logs: Path) -> None:
        self.spec, self.logs = spec, logs
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.logs / f"capture{self.runs}.log", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sluiceway.cli.main", "capture", "-f", str(self.spec)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip

    def kill(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, f"capture{self.runs} died: see its log"
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def test_kill_9_four_times_mid_copy_and_mid_sync_and_a_server_restart_lose_nothing(tmp_path: Path) -> None:
    with PrivateMariaDB() as db:
        create_tables(db, "shop", orders=12_000, lines=6_000)
        spec = tmp_path / "capture.yaml"
        spec.write_text(
            yaml.safe_dump(
                {
                    "capture": {
                        "name": "mchaos",
                        "dsn": db.dsn("shop"),
                        "tables": ["orders", "order_lines"],
                        "serverId": 5150,
                        "stateDir": str(tmp_path / "state"),
                        "chunkSize": 300,
                        "retryBackoff": "200ms",
                        "election": {"leaseTimeout": "2s"},
                        "journal": {"path": str(tmp_path / "j"), "fsync": False},
                    }
                }
            )
        )
        published = PositionFile(tmp_path / "state" / "published.lsn")
        copy_file = tmp_path / "state" / "state.json"

        def copied_rows() -> int:
            if not copy_file.exists():
                return 0
            return sum(t["rows"] for t in json.loads(copy_file.read_text()).get("tables", {}).values())

        def copy_complete() -> bool:
            return copy_file.exists() and json.loads(copy_file.read_text()).get("done_at") is not None

        process = Process(spec, tmp_path)
        writer = Writer(db, "shop", pace=0.002)
        writer.start()
        try:
            run_chaos(db, process, writer, published, copied_rows, copy_complete)
        finally:
            writer.stop_event.set()
            process.stop()
        expected = source_state(db, "shop")
    check(tmp_path / "j", writer, expected)


def run_chaos(
    db: PrivateMariaDB,
    process: Process,
    writer: Writer,
    published: PositionFile,
    copied_rows: Any,
    copy_complete: Any,
) -> None:
    try:
        process.start()
        # Upserts committed before the capture's first position are the copy's to deliver (as
        # the row's state then), not the stream's: count only those after it.
        wait_until(lambda: published.read() is not None, timeout=60, message="the capture to start")
        writer.committed.clear()
        for at in (2_000, 8_000):  # twice while the copy runs
            wait_until(lambda: copied_rows() >= at, timeout=90, interval=0.05, message="the copy")  # noqa: B023
            process.kill()
            process.start()
        wait_until(copy_complete, timeout=120, message="the copy to complete")
        for _ in range(2):  # twice while it follows the changes
            end = binlog_end(db)
            wait_until(lambda: (published.read() or 0) >= end, timeout=90, message="changes to flow")  # noqa: B023
            time.sleep(0.5)
            process.kill()
            process.start()
        end = binlog_end(db)  # the restart comes while the capture streams
        wait_until(lambda: (published.read() or 0) >= end, timeout=90, message="the capture to stream")
        db.restart()
        end = binlog_end(db)
        wait_until(lambda: (published.read() or 0) >= end, timeout=120, message="resuming after the restart")
    finally:
        writer.stop()
    assert writer.restarts >= 1 and writer.ops > 500
    end = binlog_end(db)
    wait_until(lambda: (published.read() or 0) >= end, timeout=120, message="the capture to catch up")


def check(journal: Path, writer: Writer, expected: dict[tuple[str, str], Any]) -> None:
    """Per key in order (re-sent ids aside), every committed upsert there, the last states the table's."""
    final: dict[tuple[str, str], Any] = {}
    seen: dict[tuple[str, str], set[int]] = {}
    top: dict[tuple[str, str], int] = {}
    versions: dict[str, set[int]] = {}
    resent = 0
    for record in journal_records(journal):
        body = json.loads(record["value"])
        key = (body["source"]["table"], record["key"])
        sid = sequence_id(record["headers"])
        assert sid is not None
        if sid in seen.setdefault(key, set()):
            resent += 1
            continue
        assert sid > top.get(key, -1), f"{key}: change {sid} after a later one ({top[key]})"
        seen[key].add(sid)
        top[key] = sid
        after = body["after"]
        if after is None:
            final.pop(key, None)
        else:
            final[key] = after
            if key[0] == "shop.orders":
                versions.setdefault(key[1], set()).add(int(after["version"]))
    missing = {k: [v for v in vs if v not in versions.get(k, set())] for k, vs in writer.committed.items()}
    assert {k: v for k, v in missing.items() if v} == {}
    assert final == expected
