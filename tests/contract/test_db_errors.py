"""Real conflicts on real databases arrive as our typed errors: deadlocks, serialization
failures and lock timeouts, raised by the database and mapped by ``Database`` in one place."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from sluiceway import ConflictError, DatabaseError, DeadlockError, LockTimeoutError
from sluiceway.db import Database, Dialect, parse_dsn

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def table(any_dsn: str) -> Iterator[tuple[str, str]]:
    name = f"errors_{uuid.uuid4().hex[:8]}"
    with Database(any_dsn) as db:
        db.execute(f"CREATE TABLE {name} (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        db.execute(f"INSERT INTO {name} (id, n) VALUES (1, 0), (2, 0)")
    yield any_dsn, name


def test_the_deadlock_victim_gets_a_deadlock_error(table: tuple[str, str]) -> None:
    dsn, name = table
    if parse_dsn(dsn).dialect is Dialect.SQLITE:
        pytest.skip("SQLite transactions take the write lock up front (BEGIN IMMEDIATE): no deadlocks")
    both_locked_one = threading.Barrier(2, timeout=10)
    outcomes: list[BaseException | None] = [None, None]

    def worker(index: int, first: int, second: int) -> None:
        with Database(dsn) as db:
            try:
                with db.transaction():
                    db.execute(f"UPDATE {name} SET n = n + 1 WHERE id = {first}")
                    both_locked_one.wait()
                    db.execute(f"UPDATE {name} SET n = n + 1 WHERE id = {second}")
            except DatabaseError as exc:
                outcomes[index] = exc

    threads = [
        threading.Thread(target=worker, args=(0, 1, 2)),
        threading.Thread(target=worker, args=(1, 2, 1)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [o for o in outcomes if o is not None]
    assert len(failed) == 1, outcomes
    assert isinstance(failed[0], DeadlockError) and failed[0].code in ("40P01", "1213")
    with Database(dsn) as db:
        assert db.fetchall(f"SELECT n FROM {name} ORDER BY id") == [(1,), (1,)], "the victim rolled back"


def test_a_serialization_failure_is_a_conflict(postgres_dsn: str) -> None:
    name = f"errors_{uuid.uuid4().hex[:8]}"
    with Database(postgres_dsn) as reader, Database(postgres_dsn) as writer:
        writer.execute(f"CREATE TABLE {name} (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        writer.execute(f"INSERT INTO {name} VALUES (1, 0)")
        with pytest.raises(ConflictError) as caught, reader.transaction():
            reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            reader.fetchall(f"SELECT n FROM {name}")  # takes the snapshot
            writer.execute(f"UPDATE {name} SET n = 1 WHERE id = 1")
            reader.execute(f"UPDATE {name} SET n = 2 WHERE id = 1")
        assert caught.value.code == "40001" and not isinstance(caught.value, DeadlockError)
        assert reader.fetchall(f"SELECT n FROM {name}") == [(1,)], "the connection is still usable"


def test_waiting_too_long_for_a_lock_is_a_lock_timeout(table: tuple[str, str]) -> None:
    dsn, name = table
    with Database(dsn) as holder, Database(dsn, connect_timeout=0.2) as waiter:
        dialect = holder.dialect
        if dialect is Dialect.POSTGRES:
            waiter.execute("SET lock_timeout = '200ms'")
        elif dialect is Dialect.MYSQL:
            waiter.execute("SET SESSION innodb_lock_wait_timeout = 1")
        # (SQLite: the waiter's busy_timeout follows its connect timeout, 200 ms.)
        with holder.transaction():
            holder.execute(f"UPDATE {name} SET n = n + 1 WHERE id = 1")
            with pytest.raises(LockTimeoutError) as caught:
                waiter.execute(f"UPDATE {name} SET n = n + 1 WHERE id = 1")
        expected = {Dialect.POSTGRES: "55P03", Dialect.MYSQL: "1205", Dialect.SQLITE: "SQLITE_BUSY"}
        assert caught.value.code == expected[dialect]
        assert waiter.execute(f"UPDATE {name} SET n = n + 1 WHERE id = 1") == 1, (
            "usable once the lock is gone"
        )


# --- a refused connection is permanent: raised at once, never retried -----------------------------
def _missing_database_dsns() -> list[str]:
    from tests.conftest import MYSQL_SERVER, PG_SERVER, pg_database_dsn

    missing = f"nosuch_{uuid.uuid4().hex[:8]}"
    return [pg_database_dsn(PG_SERVER, missing), MYSQL_SERVER.rsplit("/", 1)[0] + f"/{missing}"]


@pytest.mark.parametrize("dsn", _missing_database_dsns(), ids=["postgres", "mysql"])
def test_a_missing_database_is_refused_for_good(dsn: str) -> None:
    from sluiceway.errors import DatabaseRefusedError, DatabaseUnavailableError, NoSuchDatabaseError

    with Database(dsn) as db, pytest.raises(NoSuchDatabaseError) as caught:
        db.fetchall("SELECT 1")
    assert isinstance(caught.value, DatabaseRefusedError)
    assert not isinstance(caught.value, DatabaseUnavailableError)  # what the retry loops retry
    assert caught.value.code in ("3D000", "1049")
    assert "nosuch_" in str(caught.value)


def test_an_unknown_postgres_role_is_refused_for_good() -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from sluiceway.errors import DatabaseRefusedError
    from tests.conftest import PG_SERVER

    params = conninfo_to_dict(PG_SERVER)
    params["user"] = f"nosuch_{uuid.uuid4().hex[:8]}"
    with Database(make_conninfo(**params)) as db, pytest.raises(DatabaseRefusedError) as caught:  # type: ignore[arg-type]
        db.fetchall("SELECT 1")
    assert caught.value.code == "28000"


def test_a_postgres_that_is_down_is_only_unavailable() -> None:
    from sluiceway.errors import DatabaseUnavailableError
    from sluiceway.testing import free_port

    down = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    with Database(down, connect_timeout=2) as db, pytest.raises(DatabaseUnavailableError):
        db.fetchall("SELECT 1")


def test_a_postgres_sink_on_a_missing_database_is_unreachable_for_good() -> None:
    import pyarrow as pa

    from sluiceway.pipeline.errors import DestinationUnreachable
    from sluiceway.pipeline.sinks.postgres import PostgresSink

    dsn = _missing_database_dsns()[0]
    sink = PostgresSink(dsn, "orders", "key", "db")
    with pytest.raises(DestinationUnreachable) as caught:
        sink.write(pa.table({"offset": [0], "key": ["a"], "value": [b"{}"]}), "t0")
    assert caught.value.permanent  # the sink stops at once: no outage wait, no record blamed
    assert "does not exist" in caught.value.problem
