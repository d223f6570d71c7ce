"""Dead letters that park their key, on SQLite, PostgreSQL and MariaDB: the mark query skips a
parked key's rows for every leader; retry puts the record back at the head of its key; resolve
releases the key; a dead-letter table from before parking is migrated by ``outbox init``."""

from __future__ import annotations

import uuid

import pytest

from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.outbox import (
    DeadLetterNotFoundError,
    discover,
    init_outbox,
    list_dead_letters,
    resolve_dead_letter,
    retry_dead_letter,
)
from sluiceway.outbox.store import SqlOutboxStore
from tests.support.outbox import prepare_outbox, user_connection


def fresh(dsn: str, rows: list[tuple[str, str]]) -> None:
    prepare_outbox(dsn)
    conn = user_connection(dsn)
    st = Stasher().prepare(conn)
    for key, value in rows:
        st.stash(OutboxRecord("t", key, value))
    conn.commit()
    conn.close()


def mark_all(store: SqlOutboxStore) -> list[tuple[str, str]]:
    """What a brand-new leader would claim."""
    return [(r.key, (r.value or b"").decode()) for r in store.mark(str(uuid.uuid4()), 100)]


def test_a_parked_key_is_skipped_by_every_leader_until_retried(any_dsn: str) -> None:
    fresh(any_dsn, [("a", "a1"), ("b", "b1"), ("a", "a2"), ("a", "a3"), ("b", "b2")])
    store = SqlOutboxStore(any_dsn)
    try:
        assert store.layout.can_park
        marked = store.mark(str(uuid.uuid4()), 100)
        a1 = next(r for r in marked if r.value == b"a1")
        store.bury(a1, "poison", 3, True)
        assert store.parked_keys() == 1
        assert mark_all(store) == [("b", "b1"), ("b", "b2")]  # a2, a3 wait behind a1
        with Database(any_dsn) as db:
            (letter,) = list_dead_letters(db, store.layout)
            assert (letter.id, letter.key, letter.parked, letter.attempts) == (a1.id, "a", True, 3)
            assert retry_dead_letter(db, store.layout, a1.id) is True
            assert list_dead_letters(db, store.layout) == []
            with pytest.raises(DeadLetterNotFoundError):
                retry_dead_letter(db, store.layout, a1.id)
        again = store.mark(str(uuid.uuid4()), 100)
        # Back under its own id, at the head of its key, unmarked, with its value and headers.
        assert next((r.id, r.key, r.value) for r in again if r.key == "a") == (a1.id, "a", b"a1")
        assert [r.value for r in again if r.key == "a"] == [b"a1", b"a2", b"a3"]
        assert store.parked_keys() == 0
    finally:
        store.close()


def test_resolve_discards_the_record_and_releases_the_key(any_dsn: str) -> None:
    fresh(any_dsn, [("a", "a1"), ("a", "a2")])
    store = SqlOutboxStore(any_dsn)
    try:
        a1 = store.mark(str(uuid.uuid4()), 1)[0]
        store.bury(a1, "poison", 1, True)
        assert mark_all(store) == []
        with Database(any_dsn) as db:
            resolve_dead_letter(db, store.layout, a1.id)
            with pytest.raises(DeadLetterNotFoundError):
                resolve_dead_letter(db, store.layout, a1.id)
        assert mark_all(store) == [("a", "a2")]
    finally:
        store.close()


def test_a_letter_that_did_not_park_goes_back_at_the_tail(any_dsn: str) -> None:
    fresh(any_dsn, [("a", "a1"), ("a", "a2")])
    store = SqlOutboxStore(any_dsn)
    try:
        a1 = store.mark(str(uuid.uuid4()), 1)[0]
        store.bury(a1, "poison", 1, False)
        assert mark_all(store) == [("a", "a2")]  # not parked: the key goes on
        with Database(any_dsn) as db:
            assert retry_dead_letter(db, store.layout, a1.id) is False
        ids = [(r.id, r.value) for r in store.mark(str(uuid.uuid4()), 100)]
        assert [v for _, v in ids] == [b"a2", b"a1"] and ids[1][0] > a1.id  # a new id, after a2
    finally:
        store.close()


def test_init_adds_parking_to_a_dead_letter_table_made_before_it(any_dsn: str) -> None:
    fresh(any_dsn, [("a", "a1"), ("a", "a2")])
    with Database(any_dsn) as db:
        db.execute("DROP TABLE outbox_dead")
        db.execute("CREATE TABLE outbox_dead AS SELECT * FROM outbox WHERE 1 = 0")
        assert not discover(db).can_park
    legacy = SqlOutboxStore(any_dsn)
    try:
        assert [r.value for r in legacy.mark(str(uuid.uuid4()), 100)] == [b"a1", b"a2"]  # marks as before
    finally:
        legacy.close()
    with Database(any_dsn) as db:
        init_outbox(db)
        assert discover(db).can_park
        init_outbox(db)  # idempotent
