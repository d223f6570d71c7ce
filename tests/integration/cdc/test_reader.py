"""The capture on a real PostgreSQL with logical decoding, read back from its journal as a sink
would: copy while a writer works, then sync; the sink equals the source, per key no change comes
out of order; types, TOAST, keyless tables, DDL, truncate; restarts mid-copy; bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sluiceway.cdc import CaptureOptions, CaptureService, CdcError, LostChangesError
from sluiceway.cdc.postgres import CdcSession
from sluiceway.cdc.state import SourceState
from sluiceway.testing import wait_until
from tests.support.cdc import (
    TABLES,
    Sink,
    Writer,
    capture_records,
    create_tables,
    source_state,
    version_regressions,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def options(dsn: str, state: Path, name: str, **overrides: Any) -> CaptureOptions:
    values: dict[str, Any] = {
        "dsn": dsn,
        "tables": TABLES,
        "slot": f"{name}_slot",
        "publication": f"{name}_pub",
        "state_dir": str(state / "state"),
        "chunk_size": 500,
    }
    values.update(overrides)
    return CaptureOptions(**values)


class Reader:
    """A capture into ``<tmp>/log`` that the test runs to now, then reads what it appended."""

    def __init__(self, opts: CaptureOptions, tmp: Path) -> None:
        self.options, self.log, self.seen = opts, tmp / "log", 0

    def prepare(self) -> None:
        service = CaptureService(self.options, self.log)
        try:
            service.prepare()
        finally:
            service.close()

    def drain(self, sink: Sink) -> None:
        """Capture every change committed so far (copying first, if due); apply what is new."""
        service = CaptureService(self.options, self.log)
        service.prepare()
        service.catch_up(timeout=120)
        records = capture_records(self.log)
        sink.apply(records[self.seen :])
        self.seen = len(records)


@pytest.fixture(scope="module")
def tables(cdc_dsn: str) -> str:
    create_tables(cdc_dsn, orders=4_000, lines=3_000, customers=600)
    return cdc_dsn


def test_copy_while_a_writer_works_then_sync_equals_the_source_in_per_key_order(
    tables: str, tmp_path: Path
) -> None:
    opts = options(tables, tmp_path, "main")
    service = CaptureService(opts, tmp_path / "log")
    service.prepare()
    writer = Writer(tables)
    writer.start()
    try:
        service.start()
        wait_until(lambda: writer.ops > 3_000 or service.error, timeout=120, message="the writer")
        assert service.error is None, service.error
    finally:
        writer.stop()
        service.close()
    reader = Reader(opts, tmp_path)
    sink = Sink()
    reader.drain(sink)
    assert writer.ops > 3_000
    state = SourceState(opts.state_dir).load()
    assert all(state.tables[t].done for t in TABLES)
    assert state.tables["public.orders"].chunks >= 8  # copied in chunks, not in one transaction
    assert sink.modes() == {"copy", "sync"}
    assert version_regressions(sink.records) == []
    expected = source_state(tables)
    assert sink.state.keys() == expected.keys()
    assert [k for k in expected if sink.state[k] != expected[k]] == []


def test_types_round_trip_the_same_in_copy_and_in_sync(cdc_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute(
            """CREATE TYPE mood AS ENUM ('sad', 'happy');
            CREATE DOMAIN positive AS int CHECK (VALUE > 0);
            CREATE TYPE pair AS (a int, b text);
            CREATE TABLE typed (
              id int PRIMARY KEY, i2 smallint, i8 bigint, f4 real, f8 double precision, n numeric,
              b boolean, t text, vc varchar(5), ch char(3), ts timestamp, tstz timestamptz, d date,
              tm time, iv interval, j json, jb jsonb, u uuid, by bytea, ia int[], ta text[],
              ma int[][], tsa timestamptz[], m mood, p positive, pr pair, r int4range, nn text
            )"""
        )
        row = (
            "1, -3, 9007199254740993, 1.5, 'NaN', 123456789.123456789, true, 'quote \" back\\\\ \n tab\t é', "
            "'abc', 'ab', '2024-02-29 23:59:59.123456', '2024-05-01 12:00:00+02', '0044-03-15', '13:14:15', "
            "'1 day 2 hours', '{\"a\": [1, 2.50, null]}', '{\"b\": {\"c\": true}}', "
            "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x00ff10', '{1, NULL, 3}', "
            '\'{"x y", "NULL", NULL, "a,b"}\', '
            "'{{1,2},{3,4}}', '{\"2024-01-01 00:00:00+00\"}', 'happy', 7, '(1,\"two\")', '[1,10)', NULL"
        )
        conn.execute(f"INSERT INTO typed VALUES ({row})")
        conn.execute("INSERT INTO typed (id, f8, n, ts) VALUES (2, 'Infinity', 'NaN', 'infinity')")
    before = expected_rows(cdc_dsn)
    reader = Reader(options(cdc_dsn, tmp_path, "types", tables=("public.typed",)), tmp_path)
    sink = Sink()
    reader.drain(sink)
    assert {int(key): value for (_, key), value in sink.state.items()} == before
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO typed VALUES ({row.replace('1, -3', '3, -3', 1)})")
        conn.execute("UPDATE typed SET nn = 'x' WHERE id = 1")
        conn.execute("UPDATE typed SET i2 = 4 WHERE id = 2")
    reader.drain(sink)
    synced = [r for r in sink.records if {"key": "sluice.mode", "value": "sync"} in r["headers"]]
    assert [r["key"] for r in synced] == ["3", "1", "2"]
    assert {int(r["key"]): json.loads(r["value"]) for r in synced} == expected_rows(cdc_dsn)


def expected_rows(dsn: str) -> dict[int, Any]:
    """The table as PostgreSQL's to_json sees it — but composites as their text form (documented)."""
    rows = {row["id"]: row for row in source_state(dsn, ["public.typed"]).values()}
    for row in rows.values():
        row["pr"] = None if row["pr"] is None else "(1,two)"
    return rows


def test_unchanged_toasted_columns_are_filled_with_full_identity_and_named_without(
    cdc_dsn: str, tmp_path: Path
) -> None:
    big = "".join(f"{i:08x}" for i in range(2_000))  # incompressible enough to be stored out of line
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs_d (id int PRIMARY KEY, v int, body text)")
        conn.execute("CREATE TABLE docs_f (id int PRIMARY KEY, v int, body text)")
        conn.execute("ALTER TABLE docs_f REPLICA IDENTITY FULL")
    reader = Reader(options(cdc_dsn, tmp_path, "toast", tables=("public.docs_d", "public.docs_f")), tmp_path)
    sink = Sink()
    reader.drain(sink)
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        for table in ("docs_d", "docs_f"):
            conn.execute(f"INSERT INTO {table} VALUES (1, 0, %s)", (big,))
            conn.execute(f"UPDATE {table} SET v = 1 WHERE id = 1")
    reader.drain(sink)
    updates = {r["namespace"]: r for r in sink.records if r["op"] == "update"}
    full = json.loads(updates["public.docs_f"]["value"])
    assert full == {"id": 1, "v": 1, "body": big}
    default = updates["public.docs_d"]
    assert json.loads(default["value"]) == {"id": 1, "v": 1}  # not silently missing: named in a header
    assert {"key": "pg.unchanged-toast", "value": "body"} in default["headers"]


def test_a_table_without_a_primary_key_needs_replica_identity_full(cdc_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (at int, what text)")
        conn.execute("INSERT INTO events SELECT g, 'e' || g FROM generate_series(1, 1200) g")
    reader = Reader(options(cdc_dsn, tmp_path, "nokey", tables=("public.events",)), tmp_path)
    with pytest.raises(CdcError, match=r"table public\.events has no primary key.*REPLICA IDENTITY FULL"):
        reader.prepare()
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE events REPLICA IDENTITY FULL")
    opts = options(cdc_dsn, tmp_path, "nokey", tables=("public.events",), chunk_size=100)
    reader = Reader(opts, tmp_path)
    sink = Sink()
    reader.drain(sink)
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("UPDATE events SET what = 'changed' WHERE at <= 10")
        conn.execute("DELETE FROM events WHERE at > 1100")
    reader.drain(sink)
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT at, what FROM events").fetchall()
    assert sorted((v["at"], v["what"]) for v in sink.state.values()) == sorted(rows)
    assert SourceState(opts.state_dir).load().tables["public.events"].chunks > 3


def test_a_column_added_during_sync_appears_in_later_rows(cdc_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE grow (id int PRIMARY KEY, a text)")
        conn.execute("INSERT INTO grow VALUES (1, 'one')")
    reader = Reader(options(cdc_dsn, tmp_path, "grow", tables=("public.grow",)), tmp_path)
    sink = Sink()
    reader.drain(sink)
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO grow VALUES (2, 'two')")
        conn.execute("ALTER TABLE grow ADD COLUMN b int DEFAULT 5")
        conn.execute("INSERT INTO grow VALUES (3, 'three', 7)")
        conn.execute("UPDATE grow SET a = 'uno' WHERE id = 1")
    reader.drain(sink)
    assert [json.loads(r["value"]) for r in sink.records] == [
        {"id": 1, "a": "one"},
        {"id": 2, "a": "two"},
        {"id": 3, "a": "three", "b": 7},
        {"id": 1, "a": "uno", "b": 5},
    ]


def test_a_restart_mid_copy_resumes_from_the_last_chunk(tables: str, tmp_path: Path) -> None:
    # Small chunks (40 or more for the table): the stop lands mid-copy even when the copy runs fast.
    opts = options(tables, tmp_path, "resume", tables=("public.orders",), chunk_size=100)
    store = SourceState(opts.state_dir)
    first = CaptureService(opts, tmp_path / "log")
    first.prepare()
    first.start()
    try:
        wait_until(
            lambda: (
                store.load().tables.get("public.orders") is not None
                and store.load().tables["public.orders"].chunks >= 3
            ),
            timeout=60,
            message="three chunks copied",
        )
    finally:
        first.close()  # a stop mid-copy
    taken = store.load().tables["public.orders"].chunks
    with psycopg.connect(tables) as conn:  # earlier tests in this module wrote to the table
        count = conn.execute("SELECT count(*) FROM orders").fetchone()[0]
    assert 0 < taken < count // 100
    sink = Sink()
    Reader(opts, tmp_path).drain(sink)
    progress = store.load().tables["public.orders"]
    copied_rows = sum(1 for r in sink.records if {"key": "sluice.mode", "value": "copy"} in r["headers"])
    assert progress.done and progress.rows < count + 2 * 100  # went on from where it was
    assert copied_rows <= progress.rows
    assert version_regressions(sink.records) == []
    assert sink.state == source_state(tables, ["public.orders"])


def test_a_chunk_left_open_by_a_capture_that_died_is_abandoned_and_taken_again(
    tables: str, tmp_path: Path
) -> None:
    opts = options(tables, tmp_path, "dead", tables=("public.customers",))
    reader = Reader(opts, tmp_path)
    reader.prepare()  # slot and publication, before the watermark below
    store = SourceState(opts.state_dir)
    # A taker that wrote its L watermark and died before reading the chunk.
    state = store.load()
    state.open, state.next_chunk = 1, 2
    store.save(state)
    session = CdcSession(tables)
    try:
        session.emit("sluice-cdc:dead_slot", "L 1 public.customers")
    finally:
        session.close()
    sink = Sink()
    reader.drain(sink)
    state = store.load()
    assert state.open is None
    assert "1" not in state.closes  # abandoned, and forgotten once the journal passed its close
    assert sink.state == source_state(tables, ["public.customers"])


def test_truncate_reaches_the_sink(cdc_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE scratch (id int PRIMARY KEY)")
        conn.execute("INSERT INTO scratch SELECT generate_series(1, 20)")
    reader = Reader(options(cdc_dsn, tmp_path, "trunc", tables=("public.scratch",)), tmp_path)
    sink = Sink()
    reader.drain(sink)
    assert len(sink.state) == 20
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE scratch")
        conn.execute("INSERT INTO scratch VALUES (99)")
    reader.drain(sink)
    assert [r["op"] for r in sink.records[-2:]] == ["truncate", "insert"]
    assert list(sink.state) == [("public.scratch", "99")]


# --- bad input: one clear line, nothing changed ------------------------------------------------
def test_wal_level_replica_is_named_with_the_fix(postgres_dsn: str, tmp_path: Path) -> None:
    reader = Reader(options(postgres_dsn, tmp_path, "replica"), tmp_path)
    with pytest.raises(CdcError, match=r"wal_level is 'replica'.*ALTER SYSTEM SET wal_level = logical"):
        reader.prepare()


def test_a_missing_table_is_named_and_nothing_is_created(cdc_dsn: str, tmp_path: Path) -> None:
    reader = Reader(options(cdc_dsn, tmp_path, "missing", tables=("public.nope",)), tmp_path)
    with pytest.raises(CdcError, match=r"table 'public.nope' does not exist"):
        reader.prepare()
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'missing_slot'"
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM pg_publication WHERE pubname = 'missing_pub'"
        ).fetchone() == (0,)


def test_a_role_without_replication_is_told_what_it_lacks(cdc_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS cdc_reader_plain")
        conn.execute("CREATE ROLE cdc_reader_plain LOGIN")
    dsn = cdc_dsn.replace("user=postgres", "user=cdc_reader_plain")
    reader = Reader(options(dsn, tmp_path, "plain"), tmp_path)
    with pytest.raises(CdcError, match=r"role 'cdc_reader_plain' cannot read replication slots.*REPLICATION"):
        reader.prepare()


def test_a_slot_another_running_capture_reads_is_refused(tables: str, tmp_path: Path) -> None:
    one = CaptureService(
        options(tables, tmp_path / "one", "shared", snapshot="never"), tmp_path / "one" / "log"
    )
    two = CaptureService(
        options(tables, tmp_path / "two", "shared", snapshot="never"), tmp_path / "two" / "log"
    )
    try:
        one.prepare()
        one.start()
        wait_until(lambda: _active(tables, "shared_slot"), timeout=10, message="the slot in use")
        with pytest.raises(CdcError, match=r"slot 'shared_slot' is being read by another process"):
            two.prepare()
        one.close()
        wait_until(lambda: not _active(tables, "shared_slot"), timeout=10, message="the slot released")
        two.prepare()  # once the first has gone
    finally:
        one.close()
        two.close()


def _active(dsn: str, slot: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return bool(row and row[0])


def test_a_journal_behind_the_slot_is_refused_as_lost_changes(cdc_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE lost (id int PRIMARY KEY)")
    reader = Reader(options(cdc_dsn, tmp_path, "lost", tables=("public.lost",), snapshot="never"), tmp_path)
    reader.drain(Sink())
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO lost VALUES (1)")
        conn.execute("SELECT pg_replication_slot_advance('lost_slot', pg_current_wal_lsn())")
    with pytest.raises(LostChangesError, match=r"the changes in between are gone"):
        reader.prepare()


def test_the_pipeline_checks_the_server_before_spark_starts(postgres_dsn: str, cdc_dsn: str) -> None:
    """``sluice pipeline run`` checks a CDC source before it builds a Spark session: read-only."""
    from sluiceway.pipeline.sources.adapters import adapter
    from sluiceway.pipeline.spec import PipelineSpec

    def spec(dsn: str, table: str) -> PipelineSpec:
        return PipelineSpec.from_dict(
            {
                "name": "pre",
                "source": {"type": "postgres-cdc", "dsn": dsn, "tables": [table], "slot": "pre_slot",
                           "publication": "pre_pub"},
                "sinks": [{"name": "out", "type": "console"}],
                "checkpoint": "/tmp/unused-pre",
            }
        )  # fmt: skip

    replica = spec(postgres_dsn, "public.t")
    with pytest.raises(CdcError, match=r"wal_level is 'replica'.*ALTER SYSTEM SET wal_level = logical"):
        adapter(replica).check(replica)
    missing = spec(cdc_dsn, "public.nope_pre")
    with pytest.raises(CdcError, match=r"table 'public.nope_pre' does not exist"):
        adapter(missing).check(missing)
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pre_slot'"
        ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_publication WHERE pubname = 'pre_pub'").fetchone() == (
            0,
        )
