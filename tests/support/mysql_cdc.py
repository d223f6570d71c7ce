"""MariaDB change data capture test helpers: two tables, a writer that keeps changing them, and
the source's state as the capture's records would rebuild it."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import pymysql

from sluiceway.cdc.mysql.server import BinlogSession
from sluiceway.cdc.mysql.values import key_text, row_json
from sluiceway.testing import PrivateMariaDB

SCHEMA = (
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, version BIGINT NOT NULL, note VARCHAR(40), "
    "amount DECIMAL(10, 2), updated DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), payload BLOB)",
    "CREATE TABLE order_lines (order_id INT, line INT, version BIGINT NOT NULL, qty DECIMAL(10, 2), "
    "PRIMARY KEY (order_id, line))",
)
KEYS = {"orders": ["id"], "order_lines": ["order_id", "line"]}


def binlog_end(db: PrivateMariaDB, database: str = "test") -> int:
    """The end of the server's binlog now, as a capture position."""
    session = BinlogSession(db.dsn(database))
    try:
        return session.current()
    finally:
        session.close()


def create_tables(db: PrivateMariaDB, database: str, orders: int, lines: int) -> None:
    db.execute(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    conn = db.connect(database)
    try:
        with conn.cursor() as cur:
            for statement in SCHEMA:
                cur.execute(statement)
            for start in range(0, orders, 1000):
                ids = range(start + 1, min(start + 1000, orders) + 1)
                cur.execute(
                    "INSERT INTO orders (id, version, note, amount, payload) VALUES "
                    + ",".join(f"({i}, 0, 'order {i}', {i}.25, X'00ff{i % 256:02x}')" for i in ids)
                )
            pairs = [(10 + g) for g in range(lines)]
            for start in range(0, len(pairs), 1000):
                cur.execute(
                    "INSERT INTO order_lines VALUES "
                    + ",".join(f"({g // 10}, {g % 10}, 0, {g}.5)" for g in pairs[start : start + 1000])
                )
    finally:
        conn.close()


def source_state(db: PrivateMariaDB, database: str) -> dict[tuple[str, str], Any]:
    """Every row of the two tables as the capture's records would rebuild it."""
    out: dict[tuple[str, str], Any] = {}
    conn = db.connect(database)
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            for table, key in KEYS.items():
                cur.execute(f"SELECT * FROM {table}")
                names = [d[0] for d in cur.description]
                for row in cur.fetchall():
                    values = dict(zip(names, row, strict=True))
                    namespace = f"{database}.{table}"
                    out[(namespace, key_text([values[k] for k in key]))] = json.loads(row_json(names, values))
    finally:
        conn.close()
    return out


class Writer(threading.Thread):
    """Inserts, updates (some changing a primary key) and deletes rows until stopped; every write
    sets the row's ``version`` to a fresh, growing number, so per key versions never go down."""

    def __init__(self, db: PrivateMariaDB, database: str, *, seed: int = 7, pace: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.db, self.database = db, database
        self.rng = random.Random(seed)
        self.pace = pace
        self.stop_event = threading.Event()
        self.ops = 0
        self.restarts = 0
        self.error: BaseException | None = None
        #: Per order id, the versions its upserts committed (what a consumer must see, in order).
        self.committed: dict[str, list[int]] = {}
        self._version = 1_000_000

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                try:
                    conn = self.db.connect(self.database)
                except pymysql.err.OperationalError:
                    self.restarts += 1
                    self.stop_event.wait(0.3)
                    continue
                try:
                    while not self.stop_event.is_set():
                        self._one(conn)
                        self.ops += 1
                        if self.pace:
                            self.stop_event.wait(self.pace)
                except (pymysql.err.OperationalError, pymysql.err.InterfaceError):
                    self.restarts += 1  # the server went away (a chaos test does that)
                finally:
                    conn.close()
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def _next(self) -> int:
        self._version += 1
        return self._version

    def _one(self, conn: Any) -> None:
        rng, pick = self.rng, self.rng.random()
        with conn.cursor() as cur:
            if pick < 0.35:
                order, version = rng.randint(1, 6_000), self._next()
                cur.execute(
                    "INSERT INTO orders (id, version, note) VALUES (%s, %s, 'w') "
                    "ON DUPLICATE KEY UPDATE version = VALUES(version), updated = CURRENT_TIMESTAMP(6)",
                    (order, version),
                )
                self.committed.setdefault(str(order), []).append(version)  # autocommit: it committed
            elif pick < 0.45:
                cur.execute("DELETE FROM orders WHERE id = %s", (rng.randint(1, 6_000),))
            elif pick < 0.5:
                # A changed primary key: the old key's delete must come first.
                cur.execute(
                    "UPDATE IGNORE orders SET id = %s, version = %s WHERE id = %s",
                    (rng.randint(6_001, 9_000), self._next(), rng.randint(1, 6_000)),
                )
            elif pick < 0.8:
                cur.execute("BEGIN")
                for _ in range(3):  # several keys in one transaction
                    cur.execute(
                        "INSERT INTO order_lines VALUES (%s, %s, %s, 1) "
                        "ON DUPLICATE KEY UPDATE version = VALUES(version), qty = qty + 1",
                        (rng.randint(1, 400), rng.randint(0, 9), self._next()),
                    )
                cur.execute("COMMIT")
            else:
                cur.execute(
                    "DELETE FROM order_lines WHERE order_id = %s AND line = %s",
                    (rng.randint(1, 400), rng.randint(0, 9)),
                )

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)
        if self.error is not None:
            raise self.error
