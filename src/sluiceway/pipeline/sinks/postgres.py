"""Postgres sink: upsert by key — the table holds the latest record of every key.

Each write is one transaction: the batch's records reduced to the last one per key (in order,
so the newest wins), ``INSERT … ON CONFLICT (key) DO UPDATE`` for those, ``DELETE`` for keys
whose last record is a delete (``op = 'delete'``), and the write's token stored in
``sluice_sink_progress`` — a replay of a write already committed is skipped, so the sink is
exactly-once per batch. The key may be several columns (``[namespace, key]``). A ``truncate``
record (change data capture) deletes every row of its namespace, in its place in the batch.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sluiceway.db import Database, Dialect, load_queries, quote_identifier
from sluiceway.db.identifiers import check_identifier
from sluiceway.db.queries import render
from sluiceway.errors import DatabaseRefusedError, DatabaseUnavailableError
from sluiceway.pipeline.errors import DestinationUnreachable, RecordRefused, one_line
from sluiceway.pipeline.sinks.base import ClientSink

PROGRESS_TABLE = "sluice_sink_progress"


def q(name: str) -> str:
    return quote_identifier(name, Dialect.POSTGRES, what="column")


def pg_type(t: pa.DataType) -> str:
    if pa.types.is_int64(t):
        return "BIGINT"
    if pa.types.is_integer(t):
        return "INTEGER"
    if pa.types.is_floating(t):
        return "DOUBLE PRECISION"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "BYTEA"
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ"
    if pa.types.is_date(t):
        return "DATE"
    if pa.types.is_nested(t):
        return "JSONB"
    return "TEXT"


def last_per_key(rows: list[dict[str, Any]], keys: list[str]) -> list[dict[str, Any]]:
    """The last row of each key, in the order each key was last seen."""
    latest: dict[Any, dict[str, Any]] = {}
    for row in rows:
        k = tuple(row.get(c) for c in keys)
        latest.pop(k, None)  # re-insert so dict order follows the last occurrence
        latest[k] = row
    return list(latest.values())


class PostgresSink(ClientSink[Database]):
    def __init__(self, dsn: str, table: str, key: str | list[str], sink: str, *, create: bool = True) -> None:
        self.dsn = dsn
        self.table = check_identifier(table)
        self.keys = [check_identifier(k, what="column") for k in ([key] if isinstance(key, str) else key)]
        self.sink = sink
        self.create = create
        #: The columns written, learnt on each new connection (None: not yet on this one).
        self._columns: list[str] | None = None

    def _sql(self, name: str, **raw: str) -> str:
        """A named block of ``sinks/sql/postgres.sql`` with this sink's table and progress table."""
        sql = load_queries("sluiceway.pipeline.sinks", Dialect.POSTGRES)[name]
        return render(sql, Dialect.POSTGRES, table=self.table, progress=PROGRESS_TABLE, **raw)

    def _open(self) -> Database:
        db = Database(self.dsn)
        try:
            db.raw  # noqa: B018 - connect now: a failure here is the destination's, not a write's
        except (DatabaseUnavailableError, DatabaseRefusedError) as exc:
            # Not the records' fault: the sink waits for the server (a refusal: it stops at
            # once), then stops saying so.
            permanent = isinstance(exc, DatabaseRefusedError)
            raise DestinationUnreachable(one_line(exc), permanent=permanent) from None
        return db

    def _prepare(self, db: Database, schema: pa.Schema) -> list[str]:
        """Create the progress table (and the table, if asked); the columns to write."""
        with db.transaction():
            db.execute(self._sql("create_lock"), what="lock the sink's set-up")
            db.execute(self._sql("create_progress"), what="create the sink's progress table")
            if self.create:
                columns = ", ".join(f"{q(f.name)} {pg_type(f.type)}" for f in schema)
                key = ", ".join(q(k) for k in self.keys)
                db.execute(self._sql("create_table", raw_columns=columns, raw_key=key), what="create table")
        schema_name, _, name = self.table.rpartition(".")
        rows = db.fetchall(
            self._sql("table_columns"), {"name": name, "schema": schema_name or None}, what="read columns"
        )
        existing = {r[0] for r in rows}
        missing = [k for k in self.keys if k not in existing]
        if missing:
            # The destination's set-up, not a record: stop at once, saying what to fix.
            raise DestinationUnreachable(
                f"table {self.table!r} has no column {missing[0]!r} to upsert on", permanent=True
            )
        return [f.name for f in schema if f.name in existing]

    def _write(self, db: Database, table: pa.Table, token: str) -> None:
        if self._columns is None:
            self._columns = self._prepare(db, table.schema)
        cols = self._columns
        wanted = cols + [c for c in ("op", "namespace") if c not in cols and c in table.column_names]
        rows = table.select(wanted).to_pylist()
        nested = {f.name for f in table.schema if pa.types.is_nested(f.type)}
        with db.transaction():
            done = db.fetchone(self._sql("lock_progress"), {"sink": self.sink}, what="read sink progress")
            if done is not None and done[0] == token:
                return  # this exact write already committed: a replay
            for segment, truncate in _segments(rows):
                self._apply(db, segment, cols, nested)
                if truncate is not None:
                    self._truncate(db, truncate, cols)
            db.execute(
                self._sql("save_progress"), {"sink": self.sink, "token": token}, what="save sink progress"
            )

    def _failure(self, exc: Exception) -> Exception | None:
        if isinstance(exc, DatabaseUnavailableError):
            # The connection dropped mid-write (a restart, a network cut): wait for it.
            return DestinationUnreachable(f"lost the connection: {one_line(exc)}")
        if isinstance(exc, DatabaseRefusedError):
            # No privilege on the table (42501): the destination's set-up, not a record.
            return DestinationUnreachable(one_line(exc), permanent=True)
        return None  # a record's error (DatabaseError, RecordRefused), or ours

    def _apply(self, db: Database, rows: list[dict[str, Any]], cols: list[str], nested: set[str]) -> None:
        from psycopg.types.json import Jsonb  # the one driver type: nested values as JSONB

        latest = last_per_key(rows, self.keys)
        upserts = [r for r in latest if r.get("op") != "delete"]
        deletes = [r for r in latest if r.get("op") == "delete"]
        # Positional parameters, a tuple per row: this runs once per record, and building a dict of
        # formatted names per row cost the sink a tenth of its rate (bench/pipeline.py).
        if upserts:
            updates = ", ".join(f"{q(c)} = EXCLUDED.{q(c)}" for c in cols if c not in self.keys)
            insert = self._sql(
                "upsert",
                raw_columns=", ".join(q(c) for c in cols),
                raw_values=", ".join(["%s"] * len(cols)),
                raw_key=", ".join(q(k) for k in self.keys),
                raw_action=f"UPDATE SET {updates}" if updates else "NOTHING",
            )
            params = [
                tuple(Jsonb(r[c]) if c in nested and r[c] is not None else r[c] for c in cols)
                for r in upserts
            ]
            db.executemany(insert, params, what=f"upsert into {self.table}")
        if deletes:
            match = " AND ".join(f"{q(k)} = %s" for k in self.keys)
            keys = [tuple(r[k] for k in self.keys) for r in deletes]
            db.executemany(self._sql("delete", raw_key_match=match), keys, what=f"delete from {self.table}")

    def _truncate(self, db: Database, namespace: str | None, cols: list[str]) -> None:
        if "namespace" not in cols:
            raise RecordRefused(
                f"a truncate of {namespace!r} reached table {self.table!r}, which has no namespace column "
                "to tell that table's rows apart"
            )
        db.execute(self._sql("truncate_namespace"), {"namespace": namespace}, what=f"truncate {namespace}")

    def _release(self, db: Database) -> None:
        self._columns = None
        db.close()


def _segments(rows: list[dict[str, Any]]) -> list[tuple[list[dict[str, Any]], str | None]]:
    """The rows split at ``truncate`` records: (rows before it, its namespace), in order."""
    out: list[tuple[list[dict[str, Any]], str | None]] = []
    current: list[dict[str, Any]] = []
    for row in rows:
        if row.get("op") == "truncate":
            out.append((current, row.get("namespace")))
            current = []
        else:
            current.append(row)
    out.append((current, None))
    return out
