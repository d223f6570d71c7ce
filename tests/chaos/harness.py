"""Helpers for harvester chaos tests: load generators, reaper processes, and the order check."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.outbox import init_outbox
from sluiceway.testing import wait_until
from tests.contract.test_stasher import user_connection

ROOT = Path(__file__).resolve().parents[2]


def write_config(path: Path, harvest: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"harvest": harvest, "logging": {"level": "Warn"}}))
    return path


class Reaper:
    """One harvester process; its events go to a log file we parse."""

    def __init__(self, config: Path, log: Path, faults: float = 0.0, seed: int = 0) -> None:
        self.log = log
        with open(log, "ab") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.faulty_reaper", str(config), str(faults), str(seed)],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=sink,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )

    def events(self) -> list[str]:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return re.findall(r"^EVENT (\w+)", text, re.MULTILINE)

    def leading(self) -> bool:
        if self.proc.poll() is not None:
            return False
        state = False
        for name in self.events():
            if name == "LeaderAcquired":
                state = True
            elif name in ("LeaderRevoked", "LeaderFenced", "Stopped"):
                state = False
        return state

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return self.proc.returncode


def the_leader(reapers: Iterable[Reaper], timeout: float = 60) -> Reaper:
    def find() -> Reaper | None:
        leaders = [r for r in reapers if r.leading()]
        return leaders[0] if len(leaders) == 1 else None

    return wait_until(find, timeout=timeout, message="exactly one leader")


class Writers:
    """``threads`` application threads stashing ``total`` records over ``keys`` keys, each record
    carrying its key's sequence number (1, 2, …). A key belongs to one thread, so a key's records
    are committed in sequence order: causal order that the harvester must keep."""

    def __init__(
        self,
        dsn: str,
        total: int,
        keys: int,
        threads: int = 4,
        topic: str = "t",
        batch: int = 20,
        pause: float = 0.0,
    ) -> None:
        self.dsn, self.total, self.keys, self.topic = dsn, total, keys, topic
        self.batch, self.pause = batch, pause
        self.expected: dict[str, int] = defaultdict(int)
        self._threads = [
            threading.Thread(target=self._run, args=(i, threads), daemon=True) for i in range(threads)
        ]
        self.errors: list[BaseException] = []

    def start(self) -> Writers:
        for t in self._threads:
            t.start()
        return self

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
            for i in range(count):
                key = my_keys[i % len(my_keys)]
                seq[key] += 1
                stash.stash(
                    OutboxRecord(self.topic, key, json.dumps({"seq": seq[key]}), [("writer", str(index))])
                )
                if (i + 1) % self.batch == 0 or i == count - 1:
                    conn.commit()
                    if self.pause:
                        time.sleep(self.pause)
            conn.close()
            for key, n in seq.items():
                self.expected[key] = n
        except BaseException as exc:  # surfaced by join()
            self.errors.append(exc)


def prepare_outbox(dsn: str) -> None:
    with Database(dsn) as db:
        init_outbox(db)
        db.execute("DELETE FROM outbox")
        db.execute("DELETE FROM outbox_dead")


def outbox_count(dsn: str) -> int:
    with Database(dsn) as db:
        row = db.fetchone("SELECT count(*) FROM outbox")
        return int(row[0]) if row else -1


def read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[tuple[str, int, int]]:
    """(key, seq, partition) of every message of ``topic``, in partition order."""
    return [(key, seq, part) for key, seq, part, _ in read_topic_ids(bootstrap, topic, expected, timeout)]


def read_topic_ids(
    bootstrap: str, topic: str, expected: int, timeout: float = 60
) -> list[tuple[str, int, int, int | None]]:
    """(key, seq, partition, sluice-id) of every message of ``topic``, in partition order."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    from sluiceway.harvest.sequence import sequence_id

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    parts = list(meta.topics[topic].partitions)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{time.time_ns()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[tuple[str, int, int, int | None]] = []
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            msgs = consumer.consume(1000, 0.5)
            if msgs:
                quiet_since = time.monotonic()
            for m in msgs:
                if m.error():
                    continue
                seq = json.loads(m.value())["seq"]
                out.append((m.key().decode(), seq, m.partition(), sequence_id(m.headers())))
            if len(out) >= expected and time.monotonic() - quiet_since > 1.0:
                break
    finally:
        consumer.close()
    return out


def check_per_key_order(messages: Iterable[tuple[str, int]], expected: dict[str, int]) -> dict[str, int]:
    """Per key, collapse immediate repeats; the result must be exactly 1..n. Returns duplicate counts."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, seq in messages:
        by_key[key].append(seq)
    dups: dict[str, int] = {}
    assert set(by_key) == set(expected), f"keys missing: {sorted(set(expected) - set(by_key))[:5]}"
    for key, seqs in by_key.items():
        collapsed = [s for i, s in enumerate(seqs) if i == 0 or s != seqs[i - 1]]
        if collapsed != list(range(1, expected[key] + 1)):
            first_bad = next((i for i, s in enumerate(collapsed) if s != i + 1), len(collapsed))
            raise AssertionError(
                f"key {key}: sequence broken at position {first_bad}: "
                f"...{collapsed[max(0, first_bad - 3) : first_bad + 3]} (expected 1..{expected[key]})"
            )
        dups[key] = len(seqs) - len(collapsed)
    return dups


def check_resent_suffixes(messages: Iterable[tuple[str, int]], expected: dict[str, int]) -> int:
    """Per key, each record first appears after its predecessor and a repeat only restarts an
    earlier suffix (1, 2, 3, 2, 3, 4, …): what ``perKeyInFlight`` > 1 allows. Returns re-sends."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, seq in messages:
        by_key[key].append(seq)
    assert set(by_key) == set(expected), f"keys missing: {sorted(set(expected) - set(by_key))[:5]}"
    resent = 0
    for key, seqs in by_key.items():
        bad = next((i for i in range(1, len(seqs)) if seqs[i] > seqs[i - 1] + 1), None)
        if seqs[0] != 1 or bad is not None or max(seqs) != expected[key]:
            at = bad or 0
            raise AssertionError(
                f"key {key}: not 1..{expected[key]} with re-sent suffixes: ...{seqs[max(0, at - 4) : at + 4]}"
            )
        resent += len(seqs) - expected[key]
    return resent


def run_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    wait_until(cond, timeout=timeout, message=what)
