"""`sluice outbox dead list|retry|resolve` on an SQLite outbox."""

from __future__ import annotations

import sqlite3
import uuid

from typer.testing import CliRunner

from sluiceway import OutboxRecord, Stasher
from sluiceway.cli.main import app
from sluiceway.db import Database
from sluiceway.outbox import init_outbox
from sluiceway.outbox.store import SqlOutboxStore


def test_list_retry_resolve(sqlite_dsn: str) -> None:
    with Database(sqlite_dsn) as db:
        init_outbox(db)
    conn = sqlite3.connect(sqlite_dsn.removeprefix("sqlite:///"))
    st = Stasher().prepare(conn)
    for value in ("a1", "a2", "b1"):
        st.stash(OutboxRecord("t", value[0], value))
    conn.commit()
    conn.close()
    store = SqlOutboxStore(sqlite_dsn)
    a1, _, b1 = store.mark(str(uuid.uuid4()), 10)
    store.bury(a1, "MSG_SIZE_TOO_LARGE: too big", 1, True)
    store.bury(b1, "boom", 5, False)
    runner = CliRunner()
    listed = runner.invoke(app, ["outbox", "dead", "list", "--dsn", sqlite_dsn])
    assert listed.exit_code == 0, listed.output
    assert "PARKED" in listed.output and "MSG_SIZE" in listed.output and "boom" in listed.output
    retried = runner.invoke(app, ["outbox", "dead", "retry", str(a1.id), "--dsn", sqlite_dsn])
    assert retried.exit_code == 0 and "at the head of its key" in retried.output
    resolved = runner.invoke(app, ["outbox", "dead", "resolve", str(b1.id), "--dsn", sqlite_dsn])
    assert resolved.exit_code == 0 and "released" in resolved.output
    again = runner.invoke(app, ["outbox", "dead", "resolve", str(b1.id), "--dsn", sqlite_dsn])
    assert again.exit_code == 1 and f"no dead letter {b1.id}" in again.output
    assert [r.value for r in store.mark(str(uuid.uuid4()), 10)] == [b"a1", b"a2"]
    store.close()
