"""Change data capture test helpers: a writer that keeps changing tables, and the checks (sink
equals source; per-key order)."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from sluiceway.cdc.capture import CaptureOptions, SlotCapture
from sluiceway.cdc.mysql import BinlogCapture, BinlogOptions
from sluiceway.cdc.target import JournalTarget
from sluiceway.journal import Journal, JournalError
from sluiceway.journal.record import OP_HEADER

SCHEMA = """
CREATE TABLE orders (id bigint PRIMARY KEY, version bigint NOT NULL, note text, payload jsonb,
                     updated timestamptz NOT NULL DEFAULT now());
CREATE TABLE lines (order_id int, line int, version bigint NOT NULL, qty numeric(10, 2),
                    PRIMARY KEY (order_id, line));
CREATE TABLE customers (id uuid PRIMARY KEY, version bigint NOT NULL, name text, tags text[]);
"""
TABLES = ("public.orders", "public.lines", "public.customers")
KEYS = {"public.orders": ["id"], "public.lines": ["order_id", "line"], "public.customers": ["id"]}


def key_of(namespace: str, row: dict[str, Any]) -> str:
    """A row's record key, as the reader makes it (one column: its text; several: a JSON array)."""
    columns = KEYS.get(namespace, ["id"])
    if len(columns) == 1:
        return str(row[columns[0]])
    return json.dumps([row[c] for c in columns], separators=(",", ":"), ensure_ascii=False)


def create_tables(dsn: str, orders: int, lines: int, customers: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(
            "INSERT INTO orders SELECT g, 0, 'order ' || g, jsonb_build_object('n', g) "
            "FROM generate_series(1, %s) g",
            (orders,),
        )
        conn.execute(
            "INSERT INTO lines SELECT g / 10, g %% 10, 0, g * 0.5 FROM generate_series(10, %s + 9) g",
            (lines,),
        )
        conn.execute(
            "INSERT INTO customers SELECT gen_random_uuid(), 0, 'c' || g, ARRAY['a', 'b ' || g] "
            "FROM generate_series(1, %s) g",
            (customers,),
        )


def source_state(dsn: str, tables: Iterable[str] = TABLES) -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        for namespace in tables:
            for (text,) in conn.execute(f"SELECT row_to_json(src.*)::text FROM {namespace} src").fetchall():
                row = json.loads(text)
                out[(namespace, key_of(namespace, row))] = row
    return out


class Writer(threading.Thread):
    """Inserts, updates and deletes rows of the three tables until stopped. Every write sets the
    row's ``version`` to a fresh, ever-growing number, so per key the versions a reader sees must
    never go down."""

    def __init__(self, dsn: str, *, seed: int = 7, pace: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.pace = pace
        self.stop_event = threading.Event()
        self.ops = 0
        self.restarts = 0
        self.error: BaseException | None = None
        self._version = 1_000_000

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                try:
                    self._write()
                except psycopg.OperationalError:
                    # The server restarted under us (a chaos test does that): write on once it is back.
                    self.restarts += 1
                    self.stop_event.wait(0.5)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def _write(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
            customers = [r[0] for r in conn.execute("SELECT id FROM customers").fetchall()]
            while not self.stop_event.is_set():
                self._one(conn, customers)
                self.ops += 1
                if self.pace:
                    self.stop_event.wait(self.pace)

    def _next(self) -> int:
        self._version += 1
        return self._version

    def _one(self, conn: psycopg.Connection[Any], customers: list[Any]) -> None:
        rng, pick = self.rng, self.rng.random()
        if pick < 0.35:
            conn.execute(
                "INSERT INTO orders (id, version, note) VALUES (%s, %s, 'w') "
                "ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version, updated = now()",
                (rng.randint(1, 12_000), self._next()),
            )
        elif pick < 0.5:
            conn.execute("DELETE FROM orders WHERE id = %s", (rng.randint(1, 12_000),))
        elif pick < 0.75:
            with conn.transaction():  # several keys in one transaction
                for _ in range(3):
                    conn.execute(
                        "INSERT INTO lines VALUES (%s, %s, %s, 1) ON CONFLICT (order_id, line) "
                        "DO UPDATE SET version = EXCLUDED.version, qty = lines.qty + 1",
                        (rng.randint(1, 900), rng.randint(0, 9), self._next()),
                    )
        elif pick < 0.85:
            conn.execute(
                "DELETE FROM lines WHERE order_id = %s AND line = %s",
                (rng.randint(1, 900), rng.randint(0, 9)),
            )
        else:
            conn.execute(
                "UPDATE customers SET version = %s, tags = array_append(tags, 'x') WHERE id = %s",
                (self._next(), rng.choice(customers)),
            )

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)
        if self.error is not None:
            raise self.error


@dataclass
class Sink:
    """What a key-upserting sink would hold, and every record seen (for order checks)."""

    state: dict[tuple[str, str], Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)

    def apply(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self.records.append(row)
            key = (row["namespace"], row["key"])
            if row["op"] == "delete":
                self.state.pop(key, None)
            elif row["op"] == "truncate":
                for k in [k for k in self.state if k[0] == row["namespace"]]:
                    del self.state[k]
            else:
                self.state[key] = json.loads(row["value"])

    def modes(self) -> set[str]:
        return {h["value"] for r in self.records for h in r["headers"] if h["key"] == "sluice.mode"}


def version_regressions(records: Iterable[dict[str, Any]]) -> list[str]:
    """Keys whose ``version`` went down in the stream (a change applied out of order)."""
    last: dict[tuple[str, str], int] = {}
    bad = []
    for row in records:
        if row["value"] is None:
            continue
        key = (row["namespace"], row["key"])
        version = int(json.loads(row["value"])["version"])
        if version < last.get(key, -1):
            bad.append(f"{key}: {last[key]} then {version}")
        last[key] = version
    return bad


def wal_now(dsn: str) -> int:
    """The server's WAL position now (what a slot has confirmed once it has caught up)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").fetchone()
        assert row is not None
        return int(row[0])


def slot_confirmed(dsn: str, slot: str) -> int:
    """The slot's confirmed position (0 when there is no such slot)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    return 0 if row is None or row[0] is None else int(row[0])  # (None while it is being created)


def journal_records(path: Path) -> list[dict[str, Any]]:
    """A journal sink's records as dicts (empty while it does not exist or is being created)."""
    if not path.exists():
        return []
    try:
        with Journal.open(path, read_only=True) as journal:
            return [
                {"namespace": r.namespace, "key": r.key, "value": r.value, "headers": r.headers}
                for r in journal.read()
            ]
    except JournalError:
        return []


def journal_count(path: Path) -> int:
    """How many records a journal sink holds (its head, committed records being ``[0, head)``),
    read without opening the journal: cheap enough to poll while a pipeline writes, where
    :func:`journal_records` decodes every record (a third of a second at 40,000)."""
    try:
        return Journal.head_offset(path)
    except JournalError:  # not created yet
        return 0


def capture_records(path: Path) -> list[dict[str, Any]]:
    """A capture journal's records in the pipeline's shape (``op`` restored from its header)."""
    with Journal.open(path, read_only=True) as journal:
        out = []
        for r in journal.read():
            op = next(v for k, v in r.headers if k == OP_HEADER)
            headers = [{"key": k, "value": v} for k, v in r.headers]
            out.append(
                {"namespace": r.namespace, "key": r.key, "value": r.value, "op": op, "headers": headers}
            )
        return out


class Running:
    """A capture (a PostgreSQL slot's or a MariaDB binlog's) into a journal, on a thread of its
    own, as the pipeline runs it."""

    def __init__(self, opts: CaptureOptions | BinlogOptions, log: Path) -> None:
        self.target = JournalTarget(str(log))
        self.capture: SlotCapture | BinlogCapture = (
            BinlogCapture(opts, self.target)
            if isinstance(opts, BinlogOptions)
            else SlotCapture(opts, self.target)
        )
        self.capture.prepare()
        self.capture.start()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.capture.run()
        except BaseException as exc:
            self.error = exc

    def caught_up(self, timeout: float = 60) -> None:
        # A heartbeat written now: once the log holds it, it holds every change committed before.
        point = self.capture.sync_point()
        assert self.capture.wait_for(point, timeout), self.error
        assert self.capture.copy_done.wait(timeout), "the copy did not finish"

    def close(self) -> None:
        self.capture.stop()
        self.thread.join(30)
        self.capture.close()
        self.target.close()
        if self.error is not None:
            raise self.error
