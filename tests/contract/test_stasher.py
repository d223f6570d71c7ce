"""The stasher on every dialect and connection kind: visible only on commit, nothing on rollback,
bad input rejected before anything is written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sluiceway import InvalidRecordError, OutboxRecord, SluicewayError, Stasher
from sluiceway.db import Database, Dialect, parse_dsn
from sluiceway.outbox import init_outbox
from tests.support.outbox import user_connection


@pytest.fixture
def outbox(any_dsn: str) -> Iterator[str]:
    with Database(any_dsn) as db:
        init_outbox(db, "outbox")
        db.execute("DELETE FROM outbox")
    yield any_dsn


def sqlalchemy_url(dsn: str) -> str:
    src = parse_dsn(dsn)
    if src.dialect is Dialect.POSTGRES:
        from psycopg.conninfo import conninfo_to_dict

        p = conninfo_to_dict(src.target)
        host, port = p.get("host", "127.0.0.1"), p.get("port", 5432)
        return f"postgresql+psycopg://{p.get('user', 'postgres')}@{host}:{port}/{p['dbname']}"
    if src.dialect is Dialect.SQLITE:
        return f"sqlite:///{src.target}"
    k = dict(src.mysql_kwargs)
    return f"mysql+pymysql://{k['user']}@{k['host']}:{k['port']}/{k['database']}"


def rows(dsn: str) -> list[tuple[Any, ...]]:
    with Database(dsn) as db:
        return db.fetchall(
            "SELECT kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values, leader_id "
            "FROM outbox ORDER BY id"
        )


def headers_of(row: tuple[Any, ...]) -> list[tuple[str, str]]:
    keys, values = row[3], row[4]
    if isinstance(keys, str):
        keys, values = json.loads(keys), json.loads(values)
    return list(zip(keys, values, strict=True))


RECORD = OutboxRecord("orders.created", "order-1", '{"total": 12}', [("app", "shop"), ("v", "1")])


def test_row_appears_only_when_caller_commits(outbox: str) -> None:
    conn = user_connection(outbox)
    try:
        Stasher("outbox").stash(conn, RECORD)
        assert rows(outbox) == []  # not visible before the caller commits
        conn.commit()
    finally:
        conn.close()
    (row,) = rows(outbox)
    assert row[:3] == ("orders.created", "order-1", '{"total": 12}')
    assert headers_of(row) == [("app", "shop"), ("v", "1")]
    assert row[5] is None


def test_rollback_leaves_nothing(outbox: str) -> None:
    conn = user_connection(outbox)
    try:
        stash = Stasher().prepare(conn)
        for i in range(5):
            stash.stash(OutboxRecord("t", f"k{i}", "v"))
        conn.rollback()
    finally:
        conn.close()
    assert rows(outbox) == []


def test_tombstone_and_empty_headers(outbox: str) -> None:
    conn = user_connection(outbox)
    try:
        Stasher().stash(conn, OutboxRecord("t", "gone"))
        conn.commit()
    finally:
        conn.close()
    (row,) = rows(outbox)
    assert row[2] is None and headers_of(row) == []


def test_prepared_stash_of_10000_records_in_one_transaction(outbox: str) -> None:
    conn = user_connection(outbox)
    try:
        with Stasher().prepare(conn) as stash:
            for i in range(10_000):
                stash.stash(OutboxRecord("bulk", f"key-{i % 100}", f"value-{i}", [("seq", str(i))]))
        conn.commit()
    finally:
        conn.close()
    got = rows(outbox)
    assert len(got) == 10_000
    assert [r[2] for r in got[:3]] == ["value-0", "value-1", "value-2"]
    assert headers_of(got[-1]) == [("seq", "9999")]


BAD = [
    (OutboxRecord("t", ""), "key"),
    (OutboxRecord("t", "k" * 101), "key"),
    (OutboxRecord("x" * 250, "k"), "topic"),
    (OutboxRecord("bad topic!", "k"), "topic"),
    (OutboxRecord("", "k"), "topic"),
    (OutboxRecord("..", "k"), "topic"),
    (OutboxRecord("t", "k", headers=[("only-key",)]), "headers"),  # type: ignore[list-item]
    (OutboxRecord("t", "k", headers=[("k", 1)]), "headers"),  # type: ignore[list-item]
    (OutboxRecord("t", "k", headers="k=v"), "headers"),  # type: ignore[arg-type]
    (OutboxRecord("t", "k", "x" * 10_001), "value"),
    (OutboxRecord("t", "k", b"\xff\xfe"), "value"),
    (OutboxRecord("t", "k", 12), "value"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("record", "field"), BAD)
def test_bad_input_rejected_with_nothing_written(outbox: str, record: OutboxRecord, field: str) -> None:
    conn = user_connection(outbox)
    try:
        stash = Stasher().prepare(conn)
        stash.stash(OutboxRecord("t", "good-before"))
        with pytest.raises(InvalidRecordError) as info:
            stash.stash(record)
        assert info.value.field == field
        assert isinstance(info.value, SluicewayError)
        conn.commit()
    finally:
        conn.close()
    assert [r[1] for r in rows(outbox)] == ["good-before"]


def test_configured_value_limit(outbox: str) -> None:
    conn = user_connection(outbox)
    try:
        with pytest.raises(InvalidRecordError, match="maximum is 10"):
            Stasher(max_value_bytes=10).stash(conn, OutboxRecord("t", "k", "eleven char"))
    finally:
        conn.close()


def test_sqlalchemy_connection(outbox: str) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine(sqlalchemy_url(outbox))
    try:
        with engine.connect() as conn:
            Stasher().stash(conn, RECORD)
            conn.rollback()
        assert rows(outbox) == []
        with engine.begin() as conn:
            stash = Stasher().prepare(conn)
            for i in range(3):
                stash.stash(OutboxRecord("sa", f"k{i}", f"v{i}", [("h", str(i))]))
        got = rows(outbox)
        assert [(r[0], r[1], r[2]) for r in got] == [("sa", f"k{i}", f"v{i}") for i in range(3)]
        assert headers_of(got[2]) == [("h", "2")]
    finally:
        engine.dispose()


def test_unknown_connection_type_is_a_clear_error() -> None:
    with pytest.raises(SluicewayError, match="cannot write through"):
        Stasher().stash(object(), RECORD)
