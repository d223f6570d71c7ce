"""The application's side of the outbox in tests: its own connections, a load generator, counts."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import defaultdict
from typing import Any

from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database, Dialect, parse_dsn
from sluiceway.outbox import init_outbox


def user_connection(dsn: str) -> Any:
    """A connection as an application would hold it: not autocommit, its own transaction."""
    src = parse_dsn(dsn)
    if src.dialect is Dialect.POSTGRES:
        import psycopg

        return psycopg.connect(src.target)
    if src.dialect is Dialect.SQLITE:
        return sqlite3.connect(src.target)
    import pymysql

    return pymysql.connect(**dict(src.mysql_kwargs))  # type: ignore[arg-type]


def prepare_outbox(dsn: str) -> None:
    """An outbox and dead-letter table that exist and are empty."""
    with Database(dsn) as db:
        init_outbox(db)
        db.execute("DELETE FROM outbox")
        db.execute("DELETE FROM outbox_dead")


def outbox_count(dsn: str) -> int:
    with Database(dsn) as db:
        row = db.fetchone("SELECT count(*) FROM outbox")
        return int(row[0]) if row else -1


class Writers:
    """``threads`` application threads stashing ``total`` records over ``keys`` keys, each record
    carrying its key's sequence number (1, 2, …). A key belongs to one thread, so a key's records
    are committed in sequence order: causal order that the harvester must keep.

    ``until_stopped``: each thread goes on writing after its share of ``total`` until ``stop()``,
    so a test's faults land while records flow however slow the machine (``written`` says how
    many were committed in all)."""

    def __init__(
        self,
        dsn: str,
        total: int,
        keys: int,
        threads: int = 4,
        topic: str = "t",
        batch: int = 20,
        pause: float = 0.0,
        until_stopped: bool = False,
    ) -> None:
        self.dsn, self.total, self.keys, self.topic = dsn, total, keys, topic
        self.batch, self.pause, self.until_stopped = batch, pause, until_stopped
        self._stopped = threading.Event()
        self.expected: dict[str, int] = defaultdict(int)
        self._threads = [
            threading.Thread(target=self._run, args=(i, threads), daemon=True) for i in range(threads)
        ]
        self.errors: list[BaseException] = []

    def start(self) -> Writers:
        for t in self._threads:
            t.start()
        return self

    def writing(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        """An ``until_stopped`` writer's threads end after their share and the record in hand,
        committing what their open transaction holds."""
        self._stopped.set()

    @property
    def written(self) -> int:
        return sum(self.expected.values())

    def join(self, timeout: float = 120) -> None:
        for t in self._threads:
            t.join(timeout)
        if self.errors:
            raise self.errors[0]

    def _run(self, index: int, threads: int) -> None:
        try:
            my_keys = [f"key-{k}" for k in range(self.keys) if k % threads == index]
            count = self.total // threads + (1 if index < self.total % threads else 0)
            seq: dict[str, int] = defaultdict(int)
            conn = user_connection(self.dsn)
            stash = Stasher().prepare(conn)
            i = 0
            while i < count or (self.until_stopped and not self._stopped.is_set()):
                key = my_keys[i % len(my_keys)]
                seq[key] += 1
                stash.stash(
                    OutboxRecord(self.topic, key, json.dumps({"seq": seq[key]}), [("writer", str(index))])
                )
                i += 1
                if i % self.batch == 0:
                    conn.commit()
                    if self.pause:
                        time.sleep(self.pause)
            conn.commit()  # the last, partial batch
            conn.close()
            for key, n in seq.items():
                self.expected[key] = n
        except BaseException as exc:  # surfaced by join()
            self.errors.append(exc)
