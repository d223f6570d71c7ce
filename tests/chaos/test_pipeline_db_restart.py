"""Continuous pipelines on PostgreSQL while the server restarts twice under them: ``pg_ctl
restart -m fast`` (a fraction of a second), then stopped for 3 s. On the module's own server
(the shared one is never restarted). Two pipelines: the outbox source into the postgres sink
(both on the server), and a journal source into the postgres sink (only the sink meets the
outages, while batches keep coming).

What must hold (issue 27):

* the pipeline lives on: it waits the outages out, reconnects, and drains the outbox (all but
  the last batch, which the next batch's commit purges);
* nothing lost: every record reaches the sink table (keyed on the record's offset, so a batch
  written again after an outage is written over, not doubled);
* the outages are logged as outages: a few lines each, not one per retry.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import psycopg
import pytest

from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.outbox import init_outbox
from sluiceway.testing import PrivatePostgres, wait_until
from tests.support.pipeline import start_pipeline, write_spec

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(420)]

ROWS = 6000


def count(dsn: str, sql: str) -> int:
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute(sql).fetchone()
            return int(row[0]) if row else -1
    except psycopg.Error:
        return -1  # the server is away, or the sink has not made its table yet


def test_outbox_into_postgres_rides_through_two_restarts(server: PrivatePostgres, tmp_path: Path) -> None:
    dsn = server.dsn()
    with Database(dsn) as db:
        init_outbox(db)
    with psycopg.connect(dsn) as conn:
        stash = Stasher().prepare(conn)
        for n in range(ROWS):
            stash.stash(OutboxRecord("orders", f"k{n % 40}", json.dumps({"n": n})))
        conn.commit()
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "name": "restart",
            "source": {"type": "outbox", "dsn": dsn, "max_records_per_batch": 200, "lease_ttl": "2s"},
            "sinks": [
                {
                    "name": "db",
                    "type": "postgres",
                    "dsn": dsn,
                    "table": "copied",
                    "key": "offset",
                    "retry": {"backoff": "0.2s", "max_backoff": "1s", "outage": "60s"},
                }
            ],
            "checkpoint": str(tmp_path / "cp"),
            "trigger": {"interval": "200ms"},
        },
    )
    log = tmp_path / "run.log"
    proc = start_pipeline(spec, log=log)
    copied = "SELECT count(*) FROM copied"
    try:
        wait_until(lambda: count(dsn, copied) >= 600, timeout=180, message="the pipeline to get going")
        server.restart("fast")
        wait_until(lambda: count(dsn, copied) >= 2400, timeout=120, message="progress after a restart")
        server.restart("fast", down=3.0)
        wait_until(lambda: count(dsn, copied) == ROWS, timeout=180, message="every row copied")
        assert proc.poll() is None, log.read_text()[-4000:]
        # The last batch's rows are purged when the next batch commits it: at most one batch left.
        assert 0 <= count(dsn, "SELECT count(*) FROM outbox") <= 200
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    with Database(dsn) as db:
        rows = db.fetchall('SELECT "offset", value FROM copied ORDER BY "offset"')
    values = sorted(json.loads(v)["n"] for _, v in rows)
    assert values == list(range(ROWS)), "every record once in the sink"
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    # What the outages made the run say (its Spark-side processes write bare lines): per outage
    # one line each from the source, its lease and the sink at most, plus the lapsed lease.
    said = re.compile(r"AdminShutdown|terminating connection|refused|retrying|lost by this process|fenced")
    lines = [line for line in text.splitlines() if said.search(line) and not line.startswith("\t")]
    print(f"\n{len(rows)} rows; outage lines:\n" + "\n".join(lines))
    assert 2 <= len(lines) <= 12, lines  # the outages were seen, and said once each, not once per retry


def test_a_postgres_sink_rides_through_two_restarts(server: PrivatePostgres, tmp_path: Path) -> None:
    """The sink alone meets the outages: a journal source keeps handing out batches while the
    server the postgres sink writes to restarts twice. The sink waits each outage out (one warning
    each) and every record lands once (keyed on the offset, a batch written again is written over)."""
    from sluiceway.journal import Journal

    records = 8000
    with Journal.open(tmp_path / "journal", fsync=False) as j, j.append() as tx:
        for n in range(records):
            tx.write(f"k{n % 40}", json.dumps({"n": n}).encode(), namespace="orders")
    dsn = server.dsn()
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "name": "sink-restart",
            "source": {"type": "journal", "path": str(tmp_path / "journal"), "max_records_per_batch": 100},
            "sinks": [
                {
                    "name": "db",
                    "type": "postgres",
                    "dsn": dsn,
                    "table": "landed",
                    "key": "offset",
                    "retry": {"backoff": "0.2s", "max_backoff": "1s", "outage": "60s"},
                }
            ],
            "checkpoint": str(tmp_path / "cp"),
            "trigger": {"interval": "100ms"},
        },
    )
    log = tmp_path / "run.log"
    proc = start_pipeline(spec, log=log)
    landed = "SELECT count(*) FROM landed"
    try:
        wait_until(lambda: count(dsn, landed) >= 500, timeout=180, message="the pipeline to get going")
        server.restart("fast")
        wait_until(lambda: count(dsn, landed) >= 2500, timeout=120, message="progress after a restart")
        server.restart("fast", down=3.0)
        wait_until(lambda: count(dsn, landed) == records, timeout=180, message="every record landed")
        assert proc.poll() is None, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    with Database(dsn) as db:
        values = sorted(json.loads(v)["n"] for (v,) in db.fetchall("SELECT value FROM landed"))
    assert values == list(range(records)), "every record once in the sink"
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    said = re.compile(r"AdminShutdown|terminating connection|refused|unreachable|reachable again")
    lines = [line for line in text.splitlines() if said.search(line) and not line.startswith("\t")]
    print(f"\n{len(values)} rows; outage lines:\n" + "\n".join(lines))
    assert any("unreachable" in line for line in lines), "the sink met an outage"
    assert len(lines) <= 8, lines  # per outage and part: a warning (and a line when it is over)
