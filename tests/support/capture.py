"""``sluice capture`` test helpers: a writer over 200 keys that remembers what it committed, the
configuration, reading Kafka back, and the per-key check of what a consumer saw."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from sluiceway.harvest.sequence import sequence_id

SCHEMA = "CREATE TABLE items (id int PRIMARY KEY, version bigint NOT NULL, note text)"


@dataclass(frozen=True)
class Change:
    """One message as a consumer sees it."""

    key: str
    sid: int
    op: str
    version: int | None


def parse(key: str, value: bytes | None, headers: Any) -> Change:
    sid = sequence_id(headers)
    assert sid is not None, f"no sluice-id on {key}"
    body = json.loads(value) if value is not None else {"op": "tombstone", "after": None}
    after = body["after"]
    return Change(key, sid, body["op"], None if after is None else int(after["version"]))


def seed_items(dsn: str, rows: int) -> str:
    """A fresh ``items`` table (:data:`SCHEMA`) with ``rows`` rows (``id`` = ``version`` = 1…rows)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS items")
        conn.execute(SCHEMA)
        conn.execute("INSERT INTO items SELECT g, g, 'seed' FROM generate_series(1, %s) g", (rows,))
    return dsn


def config(dsn: str, slot: str, state: Path, **destination: Any) -> dict[str, Any]:
    return {
        "capture": {
            "name": slot,
            "dsn": dsn,
            "tables": ["public.items"],
            "slot": slot,
            "publication": slot,
            "stateDir": str(state),
            "chunkSize": 50,
            "retryBackoff": "200ms",
            "election": {"leaseTimeout": "2s"},
            **destination,
        }
    }


class ItemsWriter(threading.Thread):
    """Inserts, updates and deletes ``items`` rows over ``keys`` keys until stopped; each write
    sets a fresh, ever-growing ``version``. ``committed``: per key, what it knows committed (an
    operation cut by a server restart is in doubt and left out)."""

    def __init__(self, dsn: str, *, keys: int = 200, pace: float = 0.0, seed: int = 3) -> None:
        super().__init__(daemon=True)
        self.dsn, self.keys, self.pace = dsn, keys, pace
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.committed: dict[str, list[int | None]] = defaultdict(list)
        self.ops = 0
        self.error: BaseException | None = None
        self._version = 0

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                try:
                    with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                        while not self.stop_event.is_set():
                            self._one(conn)
                            if self.pace:
                                self.stop_event.wait(self.pace)
                except psycopg.OperationalError:
                    self.stop_event.wait(0.3)  # the server restarted: write on once it is back
        except BaseException as exc:
            self.error = exc

    def _one(self, conn: psycopg.Connection[Any]) -> None:
        key = self.rng.randint(1, self.keys)
        self._version += 1
        if self.rng.random() < 0.15:
            cur = conn.execute("DELETE FROM items WHERE id = %s", (key,))
            if cur.rowcount:
                self.committed[str(key)].append(None)
        else:
            conn.execute(
                "INSERT INTO items VALUES (%s, %s, 'w') "
                "ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version",
                (key, self._version),
            )
            self.committed[str(key)].append(self._version)
        self.ops += 1

    def finish(self) -> None:
        self.stop_event.set()
        self.join(30)
        if self.error is not None:
            raise self.error


def source_rows(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {str(k): int(v) for k, v in conn.execute("SELECT id, version FROM items").fetchall()}


def check_changes(changes: list[Change], writer: ItemsWriter | None, source: dict[str, int]) -> int:
    """Per key: a change never arrives after a later one except as a re-send (an id already seen);
    every change the writer knows committed is there; the last state is the table's. Returns how
    many messages were re-sends."""
    by_key: dict[str, list[Change]] = defaultdict(list)
    for change in changes:
        if change.op != "tombstone":
            by_key[change.key].append(change)
    resent = 0
    final: dict[str, int | None] = {}
    for key, seen in by_key.items():
        top, ids = -1, set()
        for change in seen:
            if change.sid in ids:
                resent += 1
                continue
            assert change.sid > top, f"key {key}: a new change (id {change.sid}) after a later one (id {top})"
            ids.add(change.sid)
            top = change.sid
            final[key] = change.version
        if writer is not None:
            versions = {c.version for c in seen if c.version is not None}
            missing = [v for v in writer.committed.get(key, []) if v is not None and v not in versions]
            assert not missing, f"key {key}: committed versions never published: {missing[:5]}"
    live = {k: v for k, v in final.items() if v is not None}
    assert live == source, f"last states differ from the table: {_diff(live, source)}"
    return resent


def _diff(a: dict[str, int], b: dict[str, int]) -> str:
    keys = sorted(set(a) ^ set(b) | {k for k in set(a) & set(b) if a[k] != b[k]})[:5]
    return ", ".join(f"{k}: {a.get(k)} vs {b.get(k)}" for k in keys)


def read_kafka(bootstrap: str, topic: str, *, quiet: float = 1.5, timeout: float = 60) -> list[Change]:
    """Every message of ``topic`` (all partitions, from the start), until quiet for ``quiet`` s."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    parts = list(meta.topics[topic].partitions)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{time.time_ns()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[Change] = []
    deadline, quiet_since = time.monotonic() + timeout, time.monotonic()
    try:
        while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet:
            msgs = consumer.consume(1000, 0.3)
            for m in msgs:
                if not m.error():
                    out.append(parse(m.key().decode(), m.value(), m.headers()))
                    quiet_since = time.monotonic()
    finally:
        consumer.close()
    return out
