"""The demo's "orders" service: writes orders and their outbox rows in the same transactions.

Each customer's events carry a per-customer sequence number, so whoever consumes them downstream
can check per-key order: the harvester must publish a customer's events in the order they were
committed.
"""

from __future__ import annotations

import itertools
import json
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluiceway.db import Database, Dialect
from sluiceway.db.connection import map_db_error
from sluiceway.errors import LockTimeoutError
from sluiceway.outbox import OutboxRecord, Stasher, init_outbox

_TEXT = {Dialect.SQLITE: "TEXT", Dialect.POSTGRES: "TEXT", Dialect.MYSQL: "VARCHAR(64)"}
ORDERS_DDL = {
    d: f"CREATE TABLE IF NOT EXISTS demo_orders (id {t} PRIMARY KEY, customer {t} NOT NULL, "
    f"total_cents INTEGER NOT NULL, status {t} NOT NULL)"
    for d, t in _TEXT.items()
}


def prepare_shop(dsn: str) -> None:
    with Database(dsn) as db:
        init_outbox(db)
        db.execute(ORDERS_DDL[db.dialect])
        db.execute("DELETE FROM demo_orders")
        db.execute("DELETE FROM outbox")


@dataclass
class ShopResult:
    events: int = 0
    orders: int = 0
    #: customer -> number of events written for them (their last sequence number)
    last_seq: dict[str, int] = field(default_factory=dict)
    #: (topic, customer) -> the sequence numbers written to that topic, in commit order
    by_topic: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def expected(self, per_topic: bool) -> dict[str, list[int]]:
        """What a reader must see per group: per customer across topics (a journal is one
        totally ordered log), or per topic and customer (Kafka orders within a topic only)."""
        if per_topic:
            return {f"{t}/{c}": seqs for (t, c), seqs in self.by_topic.items()}
        return {c: list(range(1, n + 1)) for c, n in self.last_seq.items()}


def run_shop(
    dsn: str,
    events: int,
    *,
    threads: int = 4,
    customers: int = 200,
    progress: Callable[[int], None] = lambda n: None,
    topic_prefix: str = "",
) -> ShopResult:
    """Write ``events`` outbox events (orders created then paid) from ``threads`` threads.

    A customer belongs to one thread, so that customer's transactions are serial: their events'
    sequence numbers follow commit order — the causal order the harvester must keep.
    """
    result = ShopResult()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            _shop_thread(dsn, index, threads, customers, events, result, lock, progress, topic_prefix)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(i,), name=f"shop-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return result


def _connect(dsn: str) -> Any:
    from sluiceway.db.connection import open_raw
    from sluiceway.db.dsn import parse_dsn

    source = parse_dsn(dsn)
    conn = open_raw(source)
    if source.dialect is Dialect.SQLITE:
        conn.isolation_level = "IMMEDIATE"  # the app's own transactions: BEGIN IMMEDIATE … COMMIT
    elif source.dialect is Dialect.POSTGRES:
        conn.autocommit = False
    else:
        conn.autocommit(False)
    return conn


def _shop_thread(
    dsn: str,
    index: int,
    threads: int,
    customers: int,
    events: int,
    result: ShopResult,
    lock: threading.Lock,
    progress: Callable[[int], None],
    prefix: str,
) -> None:
    rng = random.Random(index)
    mine = [f"customer-{c:04d}" for c in range(customers) if c % threads == index]
    quota = events // threads + (1 if index < events % threads else 0)
    seq = dict.fromkeys(mine, 0)
    by_topic: dict[tuple[str, str], list[int]] = {}
    conn = _connect(dsn)
    stash = Stasher().prepare(conn)
    cur = conn.cursor()
    param = "?" if isinstance(conn, sqlite3.Connection) else "%s"
    insert = f"INSERT INTO demo_orders (id, customer, total_cents, status) VALUES ({', '.join([param] * 4)})"
    update = f"UPDATE demo_orders SET status = {param} WHERE id = {param}"
    written = orders = 0

    def commit_event(
        sql: str, params: tuple[Any, ...], topic: str, customer: str, order_id: str, total: int
    ) -> None:
        """One business transaction: the order row and its event commit together, or neither.
        SQLite has one writer at a time: "database is locked" means another writer kept the lock
        past busy_timeout, and nothing was written; the transaction is simply tried again."""
        nonlocal written
        for attempt in itertools.count():
            try:
                cur.execute(sql, params)
                stash.stash(_event(topic, customer, seq[customer] + 1, order_id, total))
                conn.commit()
                break
            except (sqlite3.OperationalError, LockTimeoutError) as exc:
                conn.rollback()
                if not isinstance(map_db_error(exc, "order"), LockTimeoutError) or attempt >= _BUSY_RETRIES:
                    raise
                time.sleep(0.001)
        seq[customer] += 1
        by_topic.setdefault((topic, customer), []).append(seq[customer])
        written += 1

    try:
        while written < quota:
            customer = rng.choice(mine)
            order_id = f"o-{index}-{orders}"
            total = rng.randrange(500, 50_000)
            commit_event(
                insert,
                (order_id, customer, total, "created"),
                f"{prefix}orders.created",
                customer,
                order_id,
                total,
            )
            orders += 1
            if written < quota:
                commit_event(update, ("paid", order_id), f"{prefix}orders.paid", customer, order_id, total)
            progress(written)
    finally:
        conn.close()
    with lock:
        result.events += written
        result.orders += orders
        result.last_seq.update({c: n for c, n in seq.items() if n})
        result.by_topic.update(by_topic)


#: How often one transaction is tried again after "database is locked" (each try waits up to the
#: connection's busy_timeout first): a lock held that long is not a busy moment, it is a fault.
_BUSY_RETRIES = 100


def _event(topic: str, customer: str, seq: int, order_id: str, total: int) -> OutboxRecord:
    body = {"order": order_id, "customer": customer, "seq": seq, "total_cents": total, "event": topic}
    return OutboxRecord(topic, customer, json.dumps(body), [("source", "demo-shop")])


def check_order(
    events: list[tuple[str, bytes | None]], expected: dict[str, list[int]]
) -> tuple[int, int, list[str]]:
    """Per group, collapse immediate repeats; what is left must be exactly the expected sequence.
    Returns (records, duplicates, problems)."""
    seqs: dict[str, list[int]] = {}
    for group, value in events:
        seqs.setdefault(group, []).append(int(json.loads(value or b"{}")["seq"]))
    problems, dups = [], 0
    for group, want in expected.items():
        got = seqs.get(group, [])
        collapsed = [s for i, s in enumerate(got) if i == 0 or s != got[i - 1]]
        dups += len(got) - len(collapsed)
        if collapsed != want:
            more = "…" if len(collapsed) > 8 else ""
            problems.append(f"{group}: expected {want[:8]}…, got {collapsed[:8]}{more}")
    unexpected = set(seqs) - set(expected)
    if unexpected:
        problems.append(f"events for unknown keys: {sorted(unexpected)[:5]}")
    return len(events), dups, problems
