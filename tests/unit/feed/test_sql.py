"""The feed's SQL files: same statements in every dialect, every slot filled, prefixes checked."""

from __future__ import annotations

import pytest

from sluiceway.db import Database, Dialect, load_queries
from sluiceway.errors import ConfigError, InvalidIdentifierError
from sluiceway.feed.store import FeedStore, table_names


def test_every_dialect_defines_the_same_blocks() -> None:
    names = {d: set(load_queries("sluiceway.feed", d)) for d in Dialect}
    assert names[Dialect.SQLITE] == names[Dialect.POSTGRES] == names[Dialect.MYSQL], names


@pytest.mark.parametrize("dialect", list(Dialect))
def test_every_block_renders(dialect: Dialect) -> None:
    class FakeDb:
        pass

    db = FakeDb()
    db.dialect = dialect  # type: ignore[attr-defined]
    store = FeedStore(db, "app.work_")  # type: ignore[arg-type]
    for name in store.q.names():
        sql = store.q[name]
        assert "{" not in sql.replace("'{}'", "").replace("('{}')", ""), (name, sql)
    quote = "`" if dialect is Dialect.MYSQL else '"'
    assert f"{quote}app{quote}.{quote}work_items{quote}" in store.q["claim"]


def test_state_changes_are_conditional_on_version() -> None:
    # Optimistic concurrency: every write of item outcomes, gates and takes checks the version
    # it read (in its WHERE clause), not just bumps it.
    for dialect in Dialect:
        queries = load_queries("sluiceway.feed", dialect)
        for name in ("complete", "complete_done", "advance_gate", "close_partition", "steal"):
            sql = queries[name]
            assert "version + 1" in sql, (dialect, name)
            assert "version" in sql.rsplit("WHERE", 1)[1], (dialect, name)
        # A take checks the versions it read where it locks the rows (MySQL: a separate step).
        assert "version + 1" in queries["acquire"], dialect
        lock = queries["acquire_lock" if dialect is Dialect.MYSQL else "acquire"]
        assert "p.version = t.version" in lock or "(id, version) IN" in lock, dialect


def test_takes_never_wait_on_row_locks() -> None:
    # Concurrent takes lock in id order and skip rows others hold: they cannot deadlock.
    for dialect in (Dialect.POSTGRES, Dialect.MYSQL):
        queries = load_queries("sluiceway.feed", dialect)
        lock = queries["acquire_lock" if dialect is Dialect.MYSQL else "acquire"]
        assert "ORDER BY" in lock and "SKIP LOCKED" in lock, dialect


def test_prefixes_are_validated() -> None:
    assert table_names("feed_") == ("feed_partitions", "feed_items")
    assert table_names("") == ("partitions", "items")
    assert table_names("ops.q_") == ("ops.q_partitions", "ops.q_items")
    for bad in ("x; DROP TABLE y", "a-b_", "a.b.c_", '"q"', "x" * 60):
        with pytest.raises((ConfigError, InvalidIdentifierError)):
            table_names(bad)


def test_store_on_sqlite_memory_migrates_twice() -> None:
    with Database("sqlite:///:memory:") as db:
        store = FeedStore(db)
        store.migrate()
        store.migrate()
        tables = {r[0] for r in db.fetchall("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"feed_partitions", "feed_items"} <= tables
