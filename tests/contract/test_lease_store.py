"""One LeaseStore suite for every adapter: in-memory, SQLite, PostgreSQL, MariaDB.

The election's unit tests run on the in-memory store; this keeps it honest against the SQL one.
Expiry is the store's business: the SQL stores are given a short ttl and the test polls until
the database says it has passed; the in-memory store's clock is moved instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from sluiceway.db import Database
from sluiceway.election import LeaseStore, SqlLeaseStore
from sluiceway.election.lease import inspect_lease
from sluiceway.election.memory import MemoryLeaseStore
from sluiceway.testing import ManualClock, wait_until

TTL = 0.5


@dataclass
class Leases:
    store: LeaseStore
    #: Returns once the lease ``name`` has expired by the store's clock.
    lapse: Callable[[str], None]


@pytest.fixture(params=["memory", "sqlite", "postgres", "mysql"])
def leases(request: pytest.FixtureRequest) -> Iterator[Leases]:
    if request.param == "memory":
        clock = ManualClock()
        yield Leases(MemoryLeaseStore(clock), lambda name: clock.advance(TTL + 0.01))
        return
    dsn = str(request.getfixturevalue(f"{request.param}_dsn"))
    store = SqlLeaseStore(dsn, f"leases_{uuid.uuid4().hex[:8]}")

    def lapse(name: str) -> None:
        def expired() -> bool:
            view = store.read(name)
            return view is not None and view.remaining < 0

        wait_until(expired, timeout=5, message=f"lease {name} to expire")

    try:
        yield Leases(store, lapse)
    finally:
        store.close()


def test_a_free_lease_is_taken_with_a_new_epoch(leases: Leases) -> None:
    assert leases.store.read("orders") is None
    taken = leases.store.acquire("orders", "a", TTL)
    assert taken is not None and (taken.holder, taken.epoch, taken.version) == ("a", 1, 1)
    assert 0 < taken.remaining <= TTL
    assert taken.term is not None and 0 <= taken.term < 5, "the term starts at the acquisition"
    assert leases.store.acquire("orders", "b", TTL) is None, "held: a rival cannot take it"
    assert leases.store.acquire("orders", "a", TTL) is None, "nor can the holder take it twice"


def test_renewal_needs_the_holder_epoch_and_version(leases: Leases) -> None:
    taken = leases.store.acquire("orders", "a", TTL)
    assert taken is not None
    assert not leases.store.renew("orders", "b", taken.epoch, taken.version, TTL)
    assert not leases.store.renew("orders", "a", taken.epoch + 1, taken.version, TTL)
    assert not leases.store.renew("orders", "a", taken.epoch, taken.version + 1, TTL)
    assert leases.store.renew("orders", "a", taken.epoch, taken.version, TTL)
    assert not leases.store.renew("orders", "a", taken.epoch, taken.version, TTL), "the version moved on"
    assert leases.store.renew("orders", "a", taken.epoch, taken.version + 1, TTL)


def test_an_expired_lease_goes_to_a_rival_and_the_old_holder_cannot_renew(leases: Leases) -> None:
    taken = leases.store.acquire("orders", "a", TTL)
    assert taken is not None
    leases.lapse("orders")
    rival = leases.store.acquire("orders", "b", TTL)
    assert rival is not None and (rival.holder, rival.epoch) == ("b", 2)
    assert not leases.store.renew("orders", "a", taken.epoch, taken.version, TTL)


def test_only_the_holder_releases_and_a_released_lease_is_free_at_once(leases: Leases) -> None:
    taken = leases.store.acquire("orders", "a", TTL)
    assert taken is not None
    leases.store.release("orders", "b", taken.epoch)
    leases.store.release("orders", "a", taken.epoch - 1)
    assert leases.store.acquire("orders", "b", TTL) is None
    leases.store.release("orders", "a", taken.epoch)
    view = leases.store.read("orders")
    assert view is not None and view.holder is None and view.term is None
    rival = leases.store.acquire("orders", "b", TTL)
    assert rival is not None and rival.epoch == 2


def test_names_are_independent(leases: Leases) -> None:
    assert leases.store.acquire("orders", "a", TTL) is not None
    assert leases.store.acquire("payments", "b", TTL) is not None


def test_a_table_from_before_terms_were_recorded_is_read_as_it_is_then_upgraded(any_dsn: str) -> None:
    table = f"leases_{uuid.uuid4().hex[:8]}"
    with Database(any_dsn) as db:
        assert inspect_lease(db, "orders", table) is None, "no table: nothing to show, nothing created"
        db.execute(
            f"CREATE TABLE {table} (name VARCHAR(200) PRIMARY KEY, holder VARCHAR(100), "
            "epoch BIGINT NOT NULL DEFAULT 0, version BIGINT NOT NULL DEFAULT 0, "
            "expires_at DOUBLE PRECISION NOT NULL DEFAULT 0)"
        )
        db.execute(
            f"INSERT INTO {table} (name, holder, epoch, version, expires_at) VALUES ('orders', 'a', 3, 7, 0)"
        )
        old = inspect_lease(db, "orders", table)
        assert old is not None and (old.holder, old.epoch, old.term) == ("a", 3, None)
    store = SqlLeaseStore(any_dsn, table)
    try:
        taken = store.acquire("orders", "b", TTL)  # first use adds acquired_at
        assert taken is not None and taken.epoch == 4 and taken.term is not None
    finally:
        store.close()
    with Database(any_dsn) as db:
        view = inspect_lease(db, "orders", table)
        assert view is not None and view.holder == "b" and view.term is not None and view.term >= 0
