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

from sluiceway.db import Dialect, map_db_error, quote_identifier
from sluiceway.db.identifiers import check_identifier
from sluiceway.errors import DatabaseRefusedError, DatabaseUnavailableError
from sluiceway.pipeline.errors import DestinationUnreachable, one_line
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


class PostgresSink(ClientSink[Any]):
    def __init__(self, dsn: str, table: str, key: str | list[str], sink: str, *, create: bool = True) -> None:
        self.dsn = dsn
        self.table = check_identifier(table)
        self.keys = [check_identifier(k, what="column") for k in ([key] if isinstance(key, str) else key)]
        self.sink = sink
        self.create = create
        #: The columns written, learnt on each new connection (None: not yet on this one).
        self._columns: list[str] | None = None

    def _open(self) -> Any:
        from sluiceway.db.connection import open_raw
        from sluiceway.db.dsn import parse_dsn

        try:
            return open_raw(parse_dsn(self.dsn))
        except (DatabaseUnavailableError, DatabaseRefusedError) as exc:
            # Not the records' fault: the sink waits for the server (a refusal: it stops at
            # once), then stops saying so.
            permanent = isinstance(exc, DatabaseRefusedError)
            raise DestinationUnreachable(one_line(exc), permanent=permanent) from None

    def _prepare(self, conn: Any, schema: pa.Schema) -> list[str]:
        """Create the progress table (and the table, if asked); the columns to write."""
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {PROGRESS_TABLE} (sink TEXT PRIMARY KEY, token TEXT NOT NULL)"
        )
        if self.create:
            cols = ", ".join(f"{q(f.name)} {pg_type(f.type)}" for f in schema)
            primary = ", ".join(q(k) for k in self.keys)
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {quote_identifier(self.table, Dialect.POSTGRES)} "
                f"({cols}, PRIMARY KEY ({primary}))"
            )
        schema_name, _, name = self.table.rpartition(".")
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "AND table_schema = COALESCE(%s, current_schema())",
            (name, schema_name or None),
        ).fetchall()
        existing = {r[0] for r in rows}
        missing = [k for k in self.keys if k not in existing]
        if missing:
            raise ValueError(f"table {self.table!r} has no column {missing[0]!r} to upsert on")
        return [f.name for f in schema if f.name in existing]

    def _write(self, conn: Any, table: pa.Table, token: str) -> None:
        if self._columns is None:
            self._columns = self._prepare(conn, table.schema)
        cols = self._columns
        wanted = cols + [c for c in ("op", "namespace") if c not in cols and c in table.column_names]
        rows = table.select(wanted).to_pylist()
        nested = {f.name for f in table.schema if pa.types.is_nested(f.type)}
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(f"SELECT token FROM {PROGRESS_TABLE} WHERE sink = %s FOR UPDATE", (self.sink,))
            done = cur.fetchone()
            if done is not None and done[0] == token:
                return  # this exact write already committed: a replay
            for segment, truncate in _segments(rows):
                self._apply(cur, segment, cols, nested)
                if truncate is not None:
                    self._truncate(cur, truncate, cols)
            cur.execute(
                f"INSERT INTO {PROGRESS_TABLE} (sink, token) VALUES (%s, %s) "
                "ON CONFLICT (sink) DO UPDATE SET token = EXCLUDED.token",
                (self.sink, token),
            )

    def _failure(self, exc: Exception) -> Exception | None:
        if self._client is not None and self._client.broken:
            # The connection dropped mid-write (a restart, a network cut): wait for it.
            return DestinationUnreachable(f"lost the connection: {one_line(exc)}")
        if isinstance(map_db_error(exc, "write"), DatabaseRefusedError):
            # No privilege on the table (42501): the destination's set-up, not a record.
            return DestinationUnreachable(one_line(exc), permanent=True)
        return None

    def _apply(self, cur: Any, rows: list[dict[str, Any]], cols: list[str], nested: set[str]) -> None:
        from psycopg.types.json import Jsonb

        target = quote_identifier(self.table, Dialect.POSTGRES)
        latest = last_per_key(rows, self.keys)
        upserts = [r for r in latest if r.get("op") != "delete"]
        deletes = [tuple(r[k] for k in self.keys) for r in latest if r.get("op") == "delete"]
        if upserts:
            updates = ", ".join(f"{q(c)} = EXCLUDED.{q(c)}" for c in cols if c not in self.keys)
            names, marks = ", ".join(q(c) for c in cols), ", ".join(["%s"] * len(cols))
            conflict = ", ".join(q(k) for k in self.keys)
            insert = f"INSERT INTO {target} ({names}) VALUES ({marks}) ON CONFLICT ({conflict}) DO " + (
                f"UPDATE SET {updates}" if updates else "NOTHING"
            )
            cur.executemany(
                insert,
                [
                    tuple(Jsonb(r[c]) if c in nested and r[c] is not None else r[c] for c in cols)
                    for r in upserts
                ],
            )
        if deletes:
            where = " AND ".join(f"{q(k)} = %s" for k in self.keys)
            cur.executemany(f"DELETE FROM {target} WHERE {where}", deletes)

    def _truncate(self, cur: Any, namespace: str | None, cols: list[str]) -> None:
        if "namespace" not in cols:
            raise ValueError(
                f"a truncate of {namespace!r} reached table {self.table!r}, which has no namespace column "
                "to tell that table's rows apart"
            )
        cur.execute(
            f"DELETE FROM {quote_identifier(self.table, Dialect.POSTGRES)} WHERE namespace = %s", (namespace,)
        )

    def _release(self, conn: Any) -> None:
        self._columns = None
        conn.close()


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
