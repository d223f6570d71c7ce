"""The outbox table: creation (idempotent), column discovery, statistics.

Rows are decoded here (header arrays, JSON on SQLite/MySQL, values to bytes) so the harvester
core only ever sees :class:`~sluiceway.outbox.record.MarkedRecord`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sluiceway.db import Database, Dialect, QuerySet
from sluiceway.db.identifiers import bare_name, check_identifier, derived_name
from sluiceway.errors import ConfigError
from sluiceway.outbox.record import MarkedRecord

BASE_COLUMNS = (
    "id",
    "create_time",
    "kafka_topic",
    "kafka_key",
    "kafka_value",
    "kafka_header_keys",
    "kafka_header_values",
    "leader_id",
)


@dataclass(frozen=True, slots=True)
class OutboxLayout:
    """What one outbox table looks like: its name, dead-letter table and optional columns."""

    table: str
    has_partition: bool = False
    binary_value: bool = False
    #: The dead-letter table exists and has the ``parked`` column (dead letters can park keys).
    can_park: bool = False
    #: The table has sluiceway's notify trigger (PostgreSQL): inserts wake an idle harvester.
    notify: bool = False

    @property
    def dead_table(self) -> str:
        return f"{self.table}_dead"

    @property
    def columns(self) -> tuple[str, ...]:
        return BASE_COLUMNS + (("kafka_partition",) if self.has_partition else ())

    @property
    def notify_channel(self) -> str:
        """The channel the notify trigger wakes: one per outbox table (schema included)."""
        return derived_name(f"sluice_outbox_{self.table.replace('.', '_')}", fallback="sluice_outbox_")

    @property
    def notify_trigger(self) -> str:
        return derived_name(f"{bare_name(self.table)}_sluice_notify", fallback="sluice_notify_")

    @property
    def notify_function(self) -> str:
        schema, _, name = self.table.rpartition(".")
        return (f"{schema}." if schema else "") + derived_name(
            f"sluice_notify_{name}", fallback="sluice_notify_"
        )


def queries(dialect: Dialect, layout: OutboxLayout) -> QuerySet:
    columns = layout.columns
    return QuerySet(
        "sluiceway.outbox",
        dialect,
        outbox=layout.table,
        dead=layout.dead_table,
        raw_columns=", ".join(columns),
        # A retried letter goes back unmarked: the same columns with leader_id NULL.
        raw_restore_columns=", ".join("NULL" if c == "leader_id" else c for c in columns),
        raw_data_columns=", ".join(c for c in columns if c not in ("id", "leader_id")),
        raw_index=f"{bare_name(layout.table)}_leader_id_idx",
        raw_dead_index=f"{bare_name(layout.dead_table)}_parked_key_idx",
        notify_function=layout.notify_function,
        notify_channel=layout.notify_channel,
        raw_notify_trigger=layout.notify_trigger,
        # Built from a checked table name (letters, digits, underscores): safe as a literal.
        raw_channel_literal=f"'{layout.notify_channel}'",
    )


def init_outbox(
    db: Database,
    table: str = "outbox",
    *,
    partition_column: bool = False,
    binary_value: bool = False,
    notify: bool = False,
) -> OutboxLayout:
    """Create the outbox and its dead-letter table if missing (idempotent). ``notify``: add the
    trigger that wakes an idle harvester on every insert (PostgreSQL only)."""
    check_identifier(table)
    if notify and db.dialect is not Dialect.POSTGRES:
        raise ConfigError(
            f"wake-ups (--notify) need PostgreSQL's LISTEN/NOTIFY; on {db.dialect.value} the "
            "harvester polls every markBackoff",
            path="notify",
        )
    q = queries(db.dialect, OutboxLayout(table))
    db.execute(q["create_table"], what=f"create table {table}")
    db.execute(q["create_index"], what=f"create index on {table}")
    layout = discover(db, table)
    if partition_column and not layout.has_partition:
        db.execute(q["add_partition_column"], what="add kafka_partition column")
    if binary_value and not layout.binary_value:
        db.execute(q["binary_value_column"], what="make kafka_value binary")
    layout = discover(db, table)
    q = queries(db.dialect, layout)
    db.execute(q["create_dead_table"], what=f"create table {layout.dead_table}")
    if "extend_dead_table" in q:
        db.execute(q["extend_dead_table"], what=f"extend table {layout.dead_table}")
    if "parked" not in _column_types(db, layout.dead_table):
        db.execute(q["add_dead_parked_column"], what=f"add parked column to {layout.dead_table}")
    db.execute(q["create_dead_index"], what=f"create index on {layout.dead_table}")
    if notify:
        with db.transaction():
            db.execute(q["create_notify_function"], what=f"create function {layout.notify_function}")
            db.execute(q["drop_notify_trigger"], what=f"replace trigger {layout.notify_trigger}")
            db.execute(q["create_notify_trigger"], what=f"create trigger {layout.notify_trigger}")
    return discover(db, table)


def _column_types(db: Database, table: str) -> dict[str, str]:
    """Column name -> type of ``table`` (empty if the table does not exist)."""
    schema, _, name = table.rpartition(".")
    q = queries(db.dialect, OutboxLayout(table))
    rows = db.fetchall(
        q["columns"], {"table": name, "schema": schema or None}, what=f"list columns of {table}"
    )
    return {str(col).lower(): str(typ).lower() for col, typ in rows}


def discover(db: Database, table: str = "outbox") -> OutboxLayout:
    """Read the table's columns: which optional ones exist, and whether values are binary."""
    check_identifier(table)
    types = _column_types(db, table)
    if not types:
        raise ConfigError(
            f"outbox table {table!r} does not exist (create it with `sluice outbox init`)", path="outboxTable"
        )
    bare = OutboxLayout(table)
    notify = False
    if db.dialect is Dialect.POSTGRES:
        found = db.fetchone(
            queries(db.dialect, bare)["notify_trigger_exists"],
            {"table": table, "trigger": bare.notify_trigger},
            what=f"look for the notify trigger of {table}",
        )
        notify = bool(found and found[0])
    return OutboxLayout(
        table=table,
        has_partition="kafka_partition" in types,
        binary_value=types.get("kafka_value", "") in ("bytea", "blob", "varbinary", "longblob", "mediumblob"),
        can_park="parked" in _column_types(db, bare.dead_table),
        notify=notify,
    )


@dataclass(frozen=True, slots=True)
class OutboxLocation:
    """Where an outbox was found: the database a connection actually reached, and the table there."""

    #: ``current_database()`` on PostgreSQL, ``DATABASE()`` on MySQL, the file on SQLite.
    database: str
    layout: OutboxLayout


def locate_outbox(db: Database, table: str = "outbox") -> OutboxLocation:
    """Connect, ask the server which database this is, and find the outbox table in it.

    Raises :class:`~sluiceway.errors.DatabaseUnavailableError` when the database cannot be
    reached, and :class:`~sluiceway.errors.ConfigError` naming the database when the table is
    not there (a DSN can reach another database than its author meant: see ``dsn_warnings``).
    """
    check_identifier(table)
    row = db.fetchone(queries(db.dialect, OutboxLayout(table))["current_database"], what="current database")
    database = "" if row is None or row[0] is None else str(row[0])
    try:
        layout = discover(db, table)
    except ConfigError as exc:
        where = f"{db.dialect.value} database {database or '(in memory)'!r}"
        raise ConfigError(
            f"outbox table {table!r} does not exist in {where} (create it with `sluice outbox init`)",
            path=exc.path,
        ) from exc
    return OutboxLocation(database, layout)


@dataclass(frozen=True, slots=True)
class OutboxStats:
    rows: int
    oldest_age_seconds: float | None
    marked: int
    dead: int


def outbox_stats(db: Database, layout: OutboxLayout) -> OutboxStats:
    q = queries(db.dialect, layout)
    row = db.fetchone(q["stats"], what="outbox stats")
    assert row is not None
    dead_row = db.fetchone(q["dead_count"], what="dead-letter count")
    age = None if row[1] is None else max(0.0, float(row[1]))
    return OutboxStats(int(row[0]), age, int(row[2]), int(dead_row[0]) if dead_row else 0)


def head_age(db: Database, layout: OutboxLayout) -> float | None:
    """Seconds since the row at the head of the backlog (the lowest id) was written, by the
    database's clock; ``None`` when the outbox is empty. One index probe."""
    row = db.fetchone(queries(db.dialect, layout)["head_age"], what="outbox head age")
    return None if row is None or row[0] is None else max(0.0, float(row[0]))


# --- row codec ------------------------------------------------------------------------------
def encode_headers(dialect: Dialect, headers: Any) -> tuple[Any, Any]:
    keys = [h[0] for h in headers]
    values = [h[1] for h in headers]
    if dialect is Dialect.POSTGRES:
        return keys, values
    return json.dumps(keys), json.dumps(values)


def _decode_array(raw: Any) -> list[str]:
    if raw is None:
        return []
    if type(raw) is list:
        return raw  # Postgres text[]: already a list of str
    if isinstance(raw, list | tuple):
        return [str(x) for x in raw]
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")
    parsed = json.loads(raw) if raw else []
    return [str(x) for x in parsed]


def _to_datetime(raw: Any) -> datetime | None:
    if raw is None:
        return None
    if type(raw) is datetime and raw.tzinfo is not None:
        return raw
    if isinstance(raw, datetime):
        return raw if raw.tzinfo else raw.replace(tzinfo=UTC)
    text = str(raw).replace("Z", "+00:00")
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def decode_rows(rows: list[tuple[Any, ...]], layout: OutboxLayout, leader_id: str) -> list[MarkedRecord]:
    """Decode a marked batch. Postgres rows without optional columns take a fast path: this runs
    for every record the harvester publishes, so it avoids per-field type dispatch."""
    if layout.has_partition or not rows or type(rows[0][5]) is not list:
        return [decode_row(r, layout, leader_id) for r in rows]
    out = []
    for r in rows:
        value, hkeys, hvalues, created = r[4], r[5], r[6], r[1]
        if len(hkeys) != len(hvalues):
            return [decode_row(r, layout, leader_id) for r in rows]  # the slow path explains the error
        if type(value) is str:
            value = value.encode()
        elif value is not None and type(value) is not bytes:
            value = bytes(value)
        if created is not None and created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        out.append(
            MarkedRecord(
                r[0],
                created,
                r[2],
                r[3],
                value,
                tuple(zip(hkeys, hvalues, strict=True)) if hkeys else (),
                leader_id,
                None,
            )
        )
    return out


def decode_row(row: tuple[Any, ...], layout: OutboxLayout, leader_id: str | None = None) -> MarkedRecord:
    """Turn a row (in ``layout.columns`` order) into a MarkedRecord. ``leader_id``: the id the row
    was just marked with (saves converting the column back from the driver's UUID type)."""
    value = row[4]
    if isinstance(value, str):
        value = value.encode("utf-8")
    elif isinstance(value, memoryview | bytearray):
        value = bytes(value)
    keys = _decode_array(row[5])
    values = _decode_array(row[6])
    if len(keys) != len(values):
        from sluiceway.errors import InvalidRecordError

        raise InvalidRecordError(
            f"row {row[0]} has {len(keys)} header keys but {len(values)} header values", field="headers"
        )
    partition = None
    if layout.has_partition and row[8] is not None and int(row[8]) >= 0:
        partition = int(row[8])
    return MarkedRecord(
        id=int(row[0]),
        create_time=_to_datetime(row[1]),
        topic=str(row[2]),
        key=str(row[3]),
        value=value,
        headers=tuple(zip(keys, values, strict=True)),
        leader_id=leader_id if leader_id is not None else (None if row[7] is None else str(row[7])),
        partition=partition,
    )
