"""The OutboxStore port on every adapter: the in-memory fake (``outbox/memory.py``) and the SQL store
(``outbox/store.py``) on SQLite, PostgreSQL and MariaDB answer mark, purge, reset and bury the same way.

The engine's unit tests run on the fake, so the fake must be held to what the databases do.
What the port promises, case by case:

* ``mark(leader_id, limit)`` claims up to ``limit`` of the oldest rows not held by ``leader_id``
  (unheld, or held by any other id: a fresh id re-marks everything, which is how a new leader or a
  leader that refreshed its id takes over), stamps them with ``leader_id`` and returns them in id
  order, exactly as stashed;
* ``purge(ids)`` deletes those rows whoever holds them (an acknowledged record is delivered; a
  holder would only re-send it), ignoring ids that are gone;
* ``reset(id, leader_id)`` releases a row only while ``leader_id`` still holds it, so a deposed
  leader's late reset cannot touch a row its successor holds;
* ``bury(record, error, attempts)`` moves the row, as it stands in the outbox, to the dead-letter
  table with the error (at most ``MAX_ERROR_LENGTH`` characters) and the attempt count, in one
  transaction; burying a row that is already gone does nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import pytest

from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.errors import DatabaseError
from sluiceway.harvest.ports import OutboxStore
from sluiceway.outbox import init_outbox
from sluiceway.outbox.memory import MemoryOutboxStore
from sluiceway.outbox.record import MAX_ERROR_LENGTH, MarkedRecord
from sluiceway.outbox.store import SqlOutboxStore
from sluiceway.outbox.table import decode_row
from tests.support.outbox import user_connection

Dead = tuple[MarkedRecord, str, int]


class Outbox(Protocol):
    """One adapter under test, with the application's and the operator's view of its tables."""

    store: OutboxStore

    def stash(self, record: OutboxRecord) -> int: ...

    def leaders(self) -> dict[int, str | None]:
        """Every outbox row: id → the leader id holding it."""
        ...

    def dead(self) -> dict[int, Dead]:
        """Every dead letter: id → (the row as it was, error, attempts)."""
        ...

    def fail_bury_midway(self) -> None:
        """Make the next bury fail after it has written the dead letter, before the outbox delete."""
        ...


class MemoryOutbox:
    def __init__(self) -> None:
        self.store = MemoryOutboxStore()

    def stash(self, record: OutboxRecord) -> int:
        return self.store.stash(record)

    def leaders(self) -> dict[int, str | None]:
        return {rid: row.leader_id for rid, row in sorted(self.store.rows.items())}

    def dead(self) -> dict[int, Dead]:
        return dict(sorted(self.store.dead.items()))

    def fail_bury_midway(self) -> None:
        # The fake buries under one lock: a failure leaves no half-done state to inject.
        self.store.fail_next("bury")


class SqlOutbox:
    def __init__(self, dsn: str, table: str) -> None:
        self.dsn, self.table = dsn, table
        with Database(dsn) as db:
            self.layout = init_outbox(db, table, partition_column=True)
        self.store = SqlOutboxStore(dsn, table)
        self.db = Database(dsn)

    def stash(self, record: OutboxRecord) -> int:
        conn = user_connection(self.dsn)
        try:
            Stasher(self.table).stash(conn, record)
            conn.commit()
        finally:
            conn.close()
        row = self.db.fetchone(f"SELECT max(id) FROM {self.table}")
        assert row is not None
        return int(row[0])

    def leaders(self) -> dict[int, str | None]:
        rows = self.db.fetchall(f"SELECT id, leader_id FROM {self.table} ORDER BY id")
        return {int(rid): None if leader is None else str(leader) for rid, leader in rows}

    def dead(self) -> dict[int, Dead]:
        columns = ", ".join(self.layout.columns)
        rows = self.db.fetchall(
            f"SELECT {columns}, error, attempts FROM {self.layout.dead_table} ORDER BY id"
        )
        width = len(self.layout.columns)
        return {
            int(r[0]): (decode_row(r[:width], self.layout), str(r[width]), int(r[width + 1])) for r in rows
        }

    def fail_bury_midway(self) -> None:
        store, execute = self.store, self.store.db.execute
        purge_one = store.q["purge_one"]

        def failing(sql: str, params: Any = None, *, what: str = "") -> int:
            if sql == purge_one:
                store.db.execute = execute  # type: ignore[method-assign]
                raise DatabaseError("injected: the connection dropped before the outbox delete")
            return execute(sql, params, what=what)

        store.db.execute = failing  # type: ignore[method-assign]

    def close(self) -> None:
        self.store.close()
        self.db.close()


@pytest.fixture(params=["memory", "sqlite", "postgres", "mysql"])
def outbox(request: pytest.FixtureRequest) -> Iterator[Outbox]:
    """Runs the test once per adapter: in-memory, SQLite, PostgreSQL, MariaDB."""
    if request.param == "memory":
        yield MemoryOutbox()
        return
    dsn = str(request.getfixturevalue(f"{request.param}_dsn"))
    # A table of its own per test: the PostgreSQL and MariaDB databases are shared by the module.
    adapter = SqlOutbox(dsn, f"outbox_{uuid.uuid4().hex[:8]}")
    try:
        yield adapter
    finally:
        adapter.close()


def leader() -> str:
    """Leader ids are UUIDs (PostgreSQL's leader_id column is of type uuid)."""
    return str(uuid.uuid4())


def stash_many(outbox: Outbox, n: int) -> list[int]:
    return [outbox.stash(OutboxRecord("orders", f"k{i % 3}", f"v{i}")) for i in range(n)]


def ids(records: Sequence[MarkedRecord]) -> list[int]:
    return [r.id for r in records]


# --- mark -----------------------------------------------------------------------------------
def test_mark_claims_the_oldest_rows_in_id_order_and_stamps_them(outbox: Outbox) -> None:
    stashed = stash_many(outbox, 5)
    me = leader()
    marked = outbox.store.mark(me, 3)
    assert ids(marked) == stashed[:3]
    assert {r.leader_id for r in marked} == {me}
    assert outbox.leaders() == {**dict.fromkeys(stashed[:3], me), **dict.fromkeys(stashed[3:])}


@pytest.mark.parametrize("limit", [0, 1, 2])
def test_mark_claims_at_most_limit_rows(outbox: Outbox, limit: int) -> None:
    stashed = stash_many(outbox, 3)
    assert ids(outbox.store.mark(leader(), limit)) == stashed[:limit]


def test_mark_skips_rows_the_leader_already_holds_and_takes_new_ones(outbox: Outbox) -> None:
    stashed = stash_many(outbox, 4)
    me = leader()
    assert ids(outbox.store.mark(me, 3)) == stashed[:3]
    assert ids(outbox.store.mark(me, 3)) == stashed[3:]
    assert outbox.store.mark(me, 3) == []
    later = outbox.stash(OutboxRecord("orders", "k0", "later"))
    assert ids(outbox.store.mark(me, 3)) == [later]


def test_a_new_leader_id_re_marks_rows_held_by_any_other_id(outbox: Outbox) -> None:
    stashed = stash_many(outbox, 4)
    old, new = leader(), leader()
    outbox.store.mark(old, 10)
    assert ids(outbox.store.mark(new, 2)) == stashed[:2]
    assert outbox.leaders() == {**dict.fromkeys(stashed[:2], new), **dict.fromkeys(stashed[2:], old)}


def test_mark_returns_each_record_as_it_was_stashed(outbox: Outbox) -> None:
    records = [
        OutboxRecord("orders.created", "order-1", '{"total": 12}', [("app", "shop"), ("v", "1")]),
        OutboxRecord("orders.deleted", "order-2"),  # a tombstone
        OutboxRecord("orders.paid", "order-3", "paid", [["list", "pair"]]),  # type: ignore[list-item]
        OutboxRecord("orders.paid", "order-4", "pinned", partition=2),
        OutboxRecord("orders.paid", "order-5", "by key", partition=-1),  # -1: no pinned partition
    ]
    stashed = [outbox.stash(r) for r in records]
    me = leader()
    marked = outbox.store.mark(me, 10)
    assert [(r.id, r.topic, r.key, r.value, r.headers, r.leader_id, r.partition) for r in marked] == [
        (stashed[0], "orders.created", "order-1", b'{"total": 12}', (("app", "shop"), ("v", "1")), me, None),
        (stashed[1], "orders.deleted", "order-2", None, (), me, None),
        (stashed[2], "orders.paid", "order-3", b"paid", (("list", "pair"),), me, None),
        (stashed[3], "orders.paid", "order-4", b"pinned", (), me, 2),
        (stashed[4], "orders.paid", "order-5", b"by key", (), me, None),
    ]
    assert all(r.create_time is not None and r.create_time.tzinfo is not None for r in marked)


def test_rows_released_out_of_order_come_back_in_id_order(outbox: Outbox) -> None:
    stashed = stash_many(outbox, 5)
    me = leader()
    outbox.store.mark(me, 10)
    for rid in (stashed[3], stashed[1]):
        outbox.store.reset(rid, me)
    assert ids(outbox.store.mark(me, 10)) == [stashed[1], stashed[3]]


# --- purge ----------------------------------------------------------------------------------
def test_purge_deletes_the_given_rows_whoever_holds_them(outbox: Outbox) -> None:
    stashed = stash_many(outbox, 5)
    old, new = leader(), leader()
    outbox.store.mark(old, 3)
    outbox.store.mark(new, 1)  # stashed[0] now held by the new id; stashed[3:] by no one
    outbox.store.purge([stashed[0], stashed[1], stashed[4]])
    assert outbox.leaders() == {stashed[2]: old, stashed[3]: None}


def test_purge_ignores_ids_that_are_gone_and_empty_batches(outbox: Outbox) -> None:
    stashed = stash_many(outbox, 2)
    outbox.store.purge([stashed[0]])
    outbox.store.purge([stashed[0], stashed[0], 10**9])
    outbox.store.purge([])
    assert list(outbox.leaders()) == [stashed[1]]


# --- reset ----------------------------------------------------------------------------------
def test_reset_releases_a_row_only_for_the_leader_id_that_holds_it(outbox: Outbox) -> None:
    stashed = stash_many(outbox, 2)
    holder, other = leader(), leader()
    outbox.store.mark(holder, 10)
    outbox.store.reset(stashed[0], other)  # a deposed leader's late reset: no effect
    assert outbox.leaders()[stashed[0]] == holder
    outbox.store.reset(stashed[0], holder)
    outbox.store.reset(10**9, holder)  # gone: no effect, no error
    assert outbox.leaders() == {stashed[0]: None, stashed[1]: holder}
    # Released, it is in scope for the marker again, even for the id that released it.
    assert ids(outbox.store.mark(holder, 10)) == [stashed[0]]


# --- bury -----------------------------------------------------------------------------------
def test_bury_moves_the_row_to_the_dead_letters_with_error_and_attempts(outbox: Outbox) -> None:
    stashed = stash_many(outbox, 3)
    me = leader()
    marked = outbox.store.mark(me, 10)
    outbox.store.bury(marked[1], "MSG_SIZE_TOO_LARGE: too big", 3)
    assert list(outbox.leaders()) == [stashed[0], stashed[2]]
    assert outbox.dead() == {stashed[1]: (marked[1], "MSG_SIZE_TOO_LARGE: too big", 3)}


def test_burying_a_row_that_is_gone_does_nothing(outbox: Outbox) -> None:
    stash_many(outbox, 1)
    (record,) = outbox.store.mark(leader(), 10)
    outbox.store.bury(record, "first", 1)
    outbox.store.bury(record, "a retry of the same burial", 2)  # e.g. after an ambiguous failure
    assert outbox.dead() == {record.id: (record, "first", 1)}
    outbox.store.purge([record.id])
    assert outbox.dead() == {record.id: (record, "first", 1)}


def test_bury_takes_the_row_as_it_stands_whoever_holds_it(outbox: Outbox) -> None:
    stash_many(outbox, 1)
    old, new = leader(), leader()
    (stale,) = outbox.store.mark(old, 10)
    (current,) = outbox.store.mark(new, 10)
    outbox.store.bury(stale, "boom", 1)
    assert outbox.leaders() == {}
    assert outbox.dead() == {stale.id: (current, "boom", 1)}


def test_bury_keeps_at_most_max_error_length_characters_of_the_error(outbox: Outbox) -> None:
    stash_many(outbox, 1)
    (record,) = outbox.store.mark(leader(), 10)
    outbox.store.bury(record, "x" * (MAX_ERROR_LENGTH + 500), 1)
    assert outbox.dead()[record.id][1] == "x" * MAX_ERROR_LENGTH


def test_bury_is_one_transaction(outbox: Outbox) -> None:
    stashed = stash_many(outbox, 1)
    me = leader()
    (record,) = outbox.store.mark(me, 10)
    outbox.fail_bury_midway()
    with pytest.raises(DatabaseError):
        outbox.store.bury(record, "boom", 1)
    # Neither half happened: the row is still in the outbox, held as before, and no dead letter.
    assert outbox.leaders() == {stashed[0]: me}
    assert outbox.dead() == {}
    outbox.store.bury(record, "boom", 2)
    assert outbox.leaders() == {}
    assert outbox.dead() == {record.id: (record, "boom", 2)}


# --- parked keys ----------------------------------------------------------------------------
def test_a_parked_dead_letter_hides_its_keys_later_rows_from_every_leader(outbox: Outbox) -> None:
    stashed = stash_many(outbox, 7)  # keys k0, k1, k2, k0, k1, k2, k0
    marked = outbox.store.mark(leader(), 10)
    outbox.store.bury(marked[0], "poison", 1, True)  # k0's first row: k0 is parked
    assert outbox.store.parked_keys() == 1
    assert ids(outbox.store.mark(leader(), 10)) == [stashed[i] for i in (1, 2, 4, 5)]
    outbox.store.bury(marked[1], "not parking", 1, False)  # k1 goes on without its row
    assert outbox.store.parked_keys() == 1
    assert ids(outbox.store.mark(leader(), 10)) == [stashed[i] for i in (2, 4, 5)]
