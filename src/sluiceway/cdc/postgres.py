"""The PostgreSQL edge of change data capture: checks, slot and publication, decoding, chunks.

One :class:`CdcSession` is one psycopg connection with pinned session settings (the text forms
:mod:`sluiceway.cdc.values` relies on, and commits that flush). Statements live in
``sql/postgres.sql``; the chunk ``SELECT`` is built here from a table's catalog description,
with quoted identifiers only.

Why SQL functions and not the streaming replication protocol: a Spark micro-batch must be
replayable until every sink has committed it. ``pg_logical_slot_peek_binary_changes`` reads a
range without consuming it, and ``pg_replication_slot_advance`` moves the slot exactly when the
slowest sink has committed — the two operations the offset model needs, on an ordinary
connection (psycopg 3 has no replication protocol). The price: every peek decodes from the
slot's confirmed position, so a sink far ahead of a stopped one re-reads the WAL the stopped one
holds back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.cdc.columnar import json_column
from sluiceway.cdc.errors import CdcError
from sluiceway.cdc.model import Snapshot
from sluiceway.cdc.values import PgType, TypeRow, resolve, row_key
from sluiceway.db.connection import Database, map_db_error
from sluiceway.db.dsn import Dialect, parse_dsn
from sluiceway.db.queries import QuerySet
from sluiceway.errors import DatabaseError

log = logging.getLogger("sluiceway.cdc")

_SLOT = re.compile(r"^[a-z0-9_]{1,63}$")
_PUBLICATION = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_slot_name(name: str) -> str:
    if not _SLOT.match(name):
        raise CdcError(
            f"slot {name!r}: use lower-case letters, digits and '_' (at most 63), as PostgreSQL requires"
        )
    return name


def check_publication_name(name: str) -> str:
    if not _PUBLICATION.match(name):
        raise CdcError(
            f"publication {name!r}: use lower-case letters, digits and '_' (at most 63), "
            "starting with a letter"
        )
    return name


def quote(name: str) -> str:
    """A catalog name as a quoted SQL identifier (catalog names may hold any character)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A captured table as the catalog describes it."""

    oid: int
    schema: str
    name: str
    #: ``(name, type oid)`` of every replicated column, in attribute order.
    columns: tuple[tuple[str, int], ...]
    #: Primary key columns; ``None``: no primary key, every column identifies a row (FULL identity).
    key: tuple[str, ...] | None
    identity: str

    @property
    def namespace(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def sql_name(self) -> str:
        return f"{quote(self.schema)}.{quote(self.name)}"


@dataclass(frozen=True, slots=True)
class SlotInfo:
    plugin: str
    slot_type: str
    database: str | None
    confirmed: int
    restart: int
    #: WAL bytes the slot keeps the server from recycling.
    retained: int
    active_pid: int | None


@dataclass(frozen=True, slots=True)
class ChunkRead:
    """One chunk of a table: rows after ``after`` in key order, read under ``snapshot``."""

    snapshot: Snapshot
    read_time: int
    keys: pa.Array  # string
    values: pa.Array  # binary (JSON objects)
    #: Where the next chunk starts (key column texts, or ``[page]`` for a table without a key).
    last: list[str] | None
    #: The table has no rows after this chunk.
    done: bool


class CdcSession:
    """One connection of a reader (not shared between threads)."""

    def __init__(self, dsn: str, *, connect_timeout: float = 10.0) -> None:
        self.source = parse_dsn(dsn)
        if self.source.dialect is not Dialect.POSTGRES:
            raise CdcError(
                f"change data capture needs PostgreSQL; {self.source.redacted()} is "
                f"{self.source.dialect.value}"
            )
        self.q = QuerySet("sluiceway.cdc", Dialect.POSTGRES)
        # Our text forms and flushing commits, set again on every (re)connection.
        self.db = Database(
            self.source,
            connect_timeout=connect_timeout,
            on_connect=lambda raw: raw.execute(self.q["session"]),
        )
        self._types: dict[int, TypeRow] = {}
        self._mapped: dict[int, PgType] = {}

    # -- connection ----------------------------------------------------------------------------
    @property
    def conn(self) -> Any:
        """The psycopg connection itself (for ``COPY`` and SQL literals)."""
        return self.db.raw

    def close(self) -> None:
        self.db.close()

    def _rows(
        self, sql: str, params: dict[str, Any] | Sequence[Any] | None, what: str
    ) -> list[tuple[Any, ...]]:
        return self.db.fetchall(sql, params, what=what)

    def rows(self, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return self._rows(self.q[name], params, f"cdc: {name}")

    def one(self, name: str, params: dict[str, Any] | None = None) -> tuple[Any, ...] | None:
        found = self.rows(name, params)
        return found[0] if found else None

    @contextlib.contextmanager
    def transaction(self, settings: str | None = None) -> Iterator[None]:
        """One transaction; ``settings`` names a ``SET TRANSACTION`` block run first (isolation…)."""
        with self.db.transaction():
            if settings is not None:
                self.db.execute(self.q[settings], what=f"cdc: {settings}")
            yield

    # -- checks ----------------------------------------------------------------------------------
    def check_server(self) -> str:
        """Raise :class:`CdcError` naming the setting or privilege logical decoding lacks; the role."""
        row = self.one("server")
        assert row is not None
        wal_level, encoding, user, can_replicate, database, version = row
        if wal_level != "logical":
            raise CdcError(
                f"PostgreSQL's wal_level is {wal_level!r}, and change data capture needs 'logical': run "
                "ALTER SYSTEM SET wal_level = logical; then restart the server"
            )
        if not can_replicate:
            raise CdcError(
                f"role {user!r} cannot read replication slots: it needs the REPLICATION attribute "
                f"(ALTER ROLE {quote(user)} REPLICATION) or to be a superuser"
            )
        if encoding not in ("UTF8", "SQL_ASCII"):
            raise CdcError(f"database {database!r} is encoded in {encoding}; change data capture reads UTF8")
        if int(version) < 150000:
            raise CdcError(f"change data capture needs PostgreSQL 15 or newer (this server is {version})")
        return str(user)

    def resolve_tables(self, tables: Sequence[str] | str) -> list[TableSpec]:
        """The configured tables (a list of names, or a regular expression over ``schema.table``)."""
        if isinstance(tables, str):
            pattern = re.compile(tables)
            names = [r[0] for r in self.rows("tables") if pattern.search(r[0])]
            if not names:
                raise CdcError(f"no table matches {tables!r}")
        else:
            names = list(tables)
        specs = [self.describe(name) for name in names]
        seen: set[str] = set()
        for spec in specs:
            if spec.namespace in seen:
                raise CdcError(f"table {spec.namespace} is listed twice")
            seen.add(spec.namespace)
        return specs

    def describe(self, name: str) -> TableSpec:
        try:
            row = self.one("table", {"name": name})
        except DatabaseError as exc:
            raise CdcError(f"table {name!r}: {exc}") from exc
        if row is None:
            raise CdcError(f"table {name!r} does not exist in database {self.source.redacted()}")
        oid, schema, relname, identity, readable = row
        namespace = f"{schema}.{relname}"
        if not readable:
            raise CdcError(
                f"this role may not read table {namespace}: GRANT SELECT ON {namespace} TO <the role>"
            )
        columns = tuple((str(n), int(t)) for n, t in self.rows("columns", {"oid": oid}))
        key = tuple(str(r[0]) for r in self.rows("primary_key", {"oid": oid})) or None
        if identity == "n":
            raise CdcError(
                f"table {namespace} has REPLICA IDENTITY NOTHING, so its updates and deletes cannot be "
                f"published: ALTER TABLE {namespace} REPLICA IDENTITY DEFAULT"
            )
        if key is None and identity != "f":
            raise CdcError(
                f"table {namespace} has no primary key: add one, or ALTER TABLE {namespace} REPLICA IDENTITY "
                "FULL (then every column together identifies a row)"
            )
        return TableSpec(int(oid), str(schema), str(relname), columns, key, str(identity))

    # -- types -----------------------------------------------------------------------------------
    def types(self, oids: Iterable[int]) -> dict[int, PgType]:
        """The JSON mapping of each type (cached; looks up domains' bases and arrays' elements)."""
        wanted = set(oids)
        missing = {o for o in wanted if o not in self._mapped}
        while missing:
            fresh = [o for o in missing if o not in self._types]
            for oid, typtype, category, element, delim, base in (
                self.rows("types", {"oids": fresh}) if fresh else []
            ):
                self._types[oid] = TypeRow(oid, typtype, category, element, delim, base)
            for oid in fresh:
                self._types.setdefault(oid, TypeRow(oid, "b", "U", 0, ",", 0))
            missing = {
                ref
                for oid in missing
                for ref in (self._types[oid].base, self._types[oid].element)
                if ref and ref not in self._types
            }
        for oid in wanted:
            self._mapped.setdefault(oid, resolve(oid, self._types))
        return {oid: self._mapped[oid] for oid in wanted}

    # -- publication and slot --------------------------------------------------------------------
    def ensure_publication(self, name: str, tables: Sequence[TableSpec]) -> None:
        """Create the publication for ``tables`` if missing; add tables it lacks (or say how)."""
        check_publication_name(name)
        listed = ", ".join(t.sql_name for t in tables)
        row = self.one("publication", {"name": name})
        if row is None:
            statement = (
                f"CREATE PUBLICATION {name} FOR TABLE {listed} WITH (publish_via_partition_root = true)"
            )
            self._ddl(statement, f"cannot create publication {name!r}")
            log.info("cdc: created publication %s for %s", name, listed)
            return
        pub_insert, pub_update, pub_delete, _truncate, all_tables = row
        if not (pub_insert and pub_update and pub_delete):
            raise CdcError(
                f"publication {name!r} does not publish every insert, update and delete: "
                f"ALTER PUBLICATION {name} "
                "SET (publish = 'insert, update, delete, truncate')"
            )
        if all_tables:
            return
        present = {r[0] for r in self.rows("publication_tables", {"name": name})}
        lacking = [t for t in tables if t.namespace not in present]
        if lacking:
            add = ", ".join(t.sql_name for t in lacking)
            self._ddl(f"ALTER PUBLICATION {name} ADD TABLE {add}", f"publication {name!r} lacks {add}")
            log.info("cdc: added %s to publication %s", add, name)

    def _ddl(self, statement: str, problem: str) -> None:
        try:
            self._rows(statement, None, "cdc: publication")
        except DatabaseError as exc:
            raise CdcError(f"{problem} ({exc.detail}); as the tables' owner, run: {statement}") from exc

    def slot(self, name: str) -> SlotInfo | None:
        row = self.one("slot", {"slot": name})
        if row is None:
            return None
        plugin, kind, database, confirmed, restart, retained, pid = row
        return SlotInfo(
            plugin, kind, database, int(confirmed or 0), int(restart or 0), int(retained or 0), pid
        )

    def ensure_slot(self, name: str) -> tuple[SlotInfo, bool]:
        """The slot, created (pgoutput) when missing; and whether it was created now."""
        check_slot_name(name)
        created = False
        info = self.slot(name)
        if info is None:
            self.rows("create_slot", {"slot": name})
            log.info("cdc: created replication slot %s", name)
            info, created = self.slot(name), True
            assert info is not None
        self.check_slot(name, info)
        return info, created

    def check_slot(self, name: str, info: SlotInfo) -> None:
        """An existing slot is one we can read: logical, for pgoutput, in this database."""
        if info.slot_type != "logical" or info.plugin != "pgoutput":
            raise CdcError(
                f"slot {name!r} is a {info.slot_type} slot for {info.plugin!r}; "
                "it must be logical, for pgoutput"
            )
        database = self.one("server")
        if database is not None and info.database != database[4]:
            raise CdcError(f"slot {name!r} belongs to database {info.database!r}, not {database[4]!r}")

    def drop_slot(self, name: str) -> None:
        self.rows("drop_slot", {"slot": check_slot_name(name)})

    def emit(self, prefix: str, content: str) -> int:
        """Write a watermark into the WAL (flushed); its position."""
        row = self.one("emit", {"prefix": prefix, "content": content})
        assert row is not None
        return int(row[0])

    # -- copying ---------------------------------------------------------------------------------
    def read_chunk(self, table: TableSpec, after: list[str] | None, size: int) -> ChunkRead:
        """The next ``size`` rows of ``table`` after ``after`` (key order), under a fresh snapshot.

        The server makes each row's JSON (``row_to_json``) and sends each column of the chunk
        as one text (see :meth:`_chunk_columns`): no Python work per row.
        """
        from psycopg import sql

        types = self.types(t for _, t in table.columns)
        select = ", ".join(
            f"{quote(c)}::text AS {quote(c)}" if types[t].as_text else quote(c) for c, t in table.columns
        )

        def literal(value: object) -> str:
            # COPY takes no parameters: values (key texts we read, numbers) go in as quoted literals.
            return sql.Literal(value).as_string(self.conn)

        if table.key is None:
            query, next_page, done = self._page_chunk(table, select, after, size, literal)
            texts: list[str] = []
        else:
            keys = ", ".join(quote(k) for k in table.key)
            where = f"WHERE ({keys}) > ({', '.join(literal(v) for v in after)})" if after else ""
            texts = [f"x.{quote(k)}::text" for k in table.key]
            query = f"(SELECT {select} FROM {table.sql_name} {where} ORDER BY {keys} LIMIT {literal(size)}) x"
        exprs = [*texts, "row_to_json(x.*)::text"]
        with self.transaction("chunk_transaction"):
            row = self.one("snapshot")
            assert row is not None
            columns = self._chunk_columns(query, exprs, len(texts), f"cdc: copy {table.namespace}")
        snapshot, read_time = Snapshot.parse(row[0]), int(row[1])
        n = len(texts)
        values = columns[n].cast(pa.binary())
        if table.key is None:
            key_arr = pa.array(
                [row_key(list(json.loads(v).values())) for v in columns[0].to_pylist()], pa.string()
            )
            return ChunkRead(snapshot, read_time, key_arr, values, next_page, done)
        rows = len(values)
        last = [str(columns[i][rows - 1]) for i in range(n)] if rows else after
        if n == 1:
            key_arr = columns[0]
        else:
            key_types = [types[dict(table.columns)[k]] for k in table.key]
            parts: list[object] = ["["]
            for i in range(n):
                parts.extend([json_column(columns[i], key_types[i]), "," if i < n - 1 else "]"])
            key_arr = pc.binary_join_element_wise(*parts, "")
        return ChunkRead(snapshot, read_time, key_arr, values, last, rows < size)

    def _chunk_columns(self, query: str, exprs: list[str], keys: int, what: str) -> list[pa.Array]:
        """The chunk's columns, each aggregated by the server into one text separated by U+001E.

        One value per column instead of one message per row (as ``COPY`` sends) makes reading a
        chunk a few large transfers that Arrow splits at C speed. JSON text cannot hold a raw
        U+001E; a key could, and then the chunk is read again as CSV through ``COPY``.
        """
        aggregates = ", ".join(f"string_agg({e}, E'\\x1e')" for e in exprs)
        clash = " OR ".join(f"strpos({e}, E'\\x1e') > 0" for e in exprs[:keys]) or "false"
        row = self._rows(f"SELECT {aggregates}, count(*), bool_or({clash}) FROM {query}", None, what)[0]
        count, clashed = int(row[-2]), bool(row[-1])
        if clashed:
            statement = f"COPY (SELECT {', '.join(exprs)} FROM {query}) TO STDOUT WITH (FORMAT csv)"
            return _csv_columns(self._copy_out(statement, what), len(exprs))
        columns = []
        for text in row[: len(exprs)]:
            parts = pc.split_pattern(pa.array([text or ""], pa.string()), "\x1e").flatten() if count else None
            columns.append(parts if parts is not None else pa.array([], pa.string()))
        return columns

    def _copy_out(self, statement: str, what: str) -> bytes:
        import psycopg

        try:
            with self.conn.cursor() as cur, cur.copy(statement) as copy:
                return b"".join(bytes(block) for block in copy)
        except psycopg.Error as exc:
            raise map_db_error(exc, what) from exc

    def _page_chunk(
        self,
        table: TableSpec,
        select: str,
        after: list[str] | None,
        size: int,
        literal: Callable[[object], str],
    ) -> tuple[str, list[str], bool]:
        """A table without a key is copied by ranges of heap pages (TID range scans)."""
        pages, tuples = self.rows("table_size", {"oid": table.oid})[0]
        first = int(after[0]) if after else 0  # a page number we wrote ourselves
        # Rows per page from the planner's statistics; a table never analysed gets a guess.
        per_page = float(tuples) / max(1, int(pages)) if float(tuples) > 0 else 64.0
        span = max(1, int(size / per_page))
        end = first + span
        lower = f"ctid >= {literal(f'({first},0)')}::tid"
        if end >= int(pages):
            return f"(SELECT {select} FROM {table.sql_name} WHERE {lower}) x", [str(end)], True
        upper = f"ctid < {literal(f'({end},0)')}::tid"
        return f"(SELECT {select} FROM {table.sql_name} WHERE {lower} AND {upper}) x", [str(end)], False


def _csv_columns(data: bytes, count: int) -> list[pa.Array]:
    """``count`` text columns of PostgreSQL's CSV output (no NULLs in what we copy)."""
    import io

    from pyarrow import csv

    names = [f"c{i}" for i in range(count)]
    if not data:
        return [pa.array([], pa.string()) for _ in names]
    table = csv.read_csv(
        io.BytesIO(data),
        read_options=csv.ReadOptions(column_names=names, block_size=max(1 << 20, len(data) // 4 + 1)),
        parse_options=csv.ParseOptions(newlines_in_values=True),
        convert_options=csv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string()),
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )
    return [table.column(name).combine_chunks() for name in names]
