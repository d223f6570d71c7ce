"""Apache Iceberg tables through pyiceberg, in any catalog it speaks (SQL on SQLite or
PostgreSQL, REST, …).

The marker is two snapshot summary properties, ``sluice.app`` and ``sluice.batch`` — what
Iceberg's own Spark streaming sink does with the query id and batch id — read back by walking the
current snapshot's ancestors. Each write is one pyiceberg transaction: schema changes and the
snapshots it makes reach the catalog in one atomic commit.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import defaultdict
from typing import Any

import pyarrow as pa

from sluiceway.config.brokers import redact_url
from sluiceway.pipeline.errors import DestinationUnreachable, one_line
from sluiceway.pipeline.sinks.lakehouse.port import move_into
from sluiceway.pipeline.sinks.lakehouse.shape import conform, evolve

APP, BATCH = "sluice.app", "sluice.batch"


class IcebergLake:
    def __init__(self, catalog: dict[str, str], table: str, *, partition_by: list[str] | None = None) -> None:
        self.properties = dict(catalog)
        self.identifier = table
        self.namespace = table.rsplit(".", 1)[0]
        self.partition_by = list(partition_by or [])
        self._catalog: Any = None

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            props = dict(self.properties)
            name = props.pop("name", "sluice")
            self._catalog = load_catalog(name, **props)
        return self._catalog

    def _table(self) -> Any | None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return self.catalog.load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None

    def check(self) -> None:
        try:
            self.catalog.list_namespaces()
            self._table()
        except Exception as exc:  # the catalog's own error: a server down, a database missing
            raise DestinationUnreachable(
                f"iceberg catalog {redact_url(self.properties.get('uri', ''))}: "
                f"{type(exc).__name__}: {_plain(exc)}",
                permanent=True,
            ) from None

    def schema(self) -> pa.Schema | None:
        table = self._table()
        return None if table is None else table.schema().as_arrow()

    def committed(self, app: str) -> int | None:
        table = self._table()
        if table is None:
            return None
        kept = table.properties.get(f"{BATCH}.{app}")
        return int(kept) if kept is not None else _committed(table, app)

    def _create(self, schema: pa.Schema) -> Any:
        try:
            self.catalog.create_namespace_if_not_exists(self.namespace)
        except Exception:
            # Another writer created it between the catalog's look and its insert (a SQL catalog
            # reports that as its database's unique-key error, not "already exists").
            if not self.catalog.namespace_exists(self.namespace):
                raise
        table = self.catalog.create_table_if_not_exists(self.identifier, schema=schema)
        if self.partition_by:
            spec = table.spec()
            if not spec.fields:
                with table.update_spec() as update:
                    for column in self.partition_by:
                        update.add_identity(column)
                table = self.catalog.load_table(self.identifier)
        return table

    def _marker(self, app: str, batch: int) -> dict[str, str]:
        return {APP: app, BATCH: str(batch)}

    @staticmethod
    def _property(app: str, batch: int) -> dict[str, str]:
        """The marker kept as a table property too, in the same commit: it survives a commit
        that makes no snapshot (a mirror batch that changed nothing) and expired snapshots."""
        return {f"{BATCH}.{app}": str(batch)}

    def _evolve(self, tx: Any, table: Any, schema: pa.Schema) -> pa.Schema:
        current = table.schema().as_arrow()
        added = evolve(current, schema)
        if added:
            with tx.update_schema() as update:
                update.union_by_name(pa.schema(added))
        return pa.schema(list(current) + added)

    def append(self, rows: pa.Table, app: str, batch: int) -> None:
        table = self._table() or self._create(_iceberg_schema(rows.schema))
        with table.transaction() as tx:
            schema = self._evolve(tx, table, rows.schema)
            tx.append(_iceberg_ready(conform(rows, schema)), snapshot_properties=self._marker(app, batch))
            tx.set_properties(self._property(app, batch))

    def mirror(self, changes: pa.Table, truncated: list[str], keys: list[str], app: str, batch: int) -> None:
        import pyarrow.compute as pc

        table = self._table() or self._create(_iceberg_schema(changes.schema))
        live = changes
        if "op" in changes.column_names:
            live = changes.filter(pc.fill_null(pc.not_equal(changes.column("op"), "delete"), True))
        marker = self._marker(app, batch)
        with table.transaction() as tx:
            schema = self._evolve(tx, table, changes.schema)
            condition = _key_filter(changes, keys, truncated)
            if condition is not None and table.current_snapshot() is not None:
                with warnings.catch_warnings():  # deleting keys the table lacks is normal here
                    warnings.filterwarnings("ignore", "Delete operation did not match any records")
                    tx.delete(condition, snapshot_properties=marker)
            if live.num_rows:
                tx.append(_iceberg_ready(conform(live, schema)), snapshot_properties=marker)
            tx.set_properties(self._property(app, batch))

    def staging_dir(self) -> str | None:
        table = self._table()
        if table is not None:
            root = _local(table.location())
            return None if root is None else os.path.join(root, "data", ".sluice-staging")
        if self.properties.get("type") == "rest":
            return None  # a REST catalog's warehouse is a name, not a place
        root = _local(self.properties.get("warehouse", ""))
        return None if root is None else os.path.join(root, ".sluice-staging", self.identifier)

    def add_files(self, staged: str, files: list[str], schema: pa.Schema, app: str, batch: int) -> None:
        table = self._table() or self._create(_iceberg_schema(schema))
        root = _local(table.location())
        if root is None:
            raise DestinationUnreachable(
                f"table {self.identifier} is at {table.location()}, not on this file system", permanent=True
            )
        data = os.path.join(root, "data")
        move_into(staged, files, data)
        with table.transaction() as tx:
            self._evolve(tx, table, _iceberg_schema(schema))
            tx.add_files([os.path.join(data, f) for f in files], snapshot_properties=self._marker(app, batch))
            tx.set_properties(self._property(app, batch))

    def optimize(self) -> None:
        """pyiceberg has no compaction: the spec allows ``optimize_every`` with Delta only."""


def _local(location: str) -> str | None:
    """The directory of a ``file:`` location or a plain path (``None``: an object store)."""
    if location.startswith("file:"):
        return re.sub(r"^file:(//)?", "", location) or None
    return location if location.startswith("/") else None


def _plain(exc: Exception) -> str:
    """The error's one line, without SQLAlchemy's pointer to its web page."""
    return re.sub(r"\s*\(Background on this error at: [^)]*\)", "", one_line(exc))


def _committed(table: Any, app: str) -> int | None:
    """The batch of the newest ancestor of the current snapshot that ``app`` committed."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary
        props = summary.additional_properties if summary is not None else {}
        if props.get(APP) == app:
            return int(props[BATCH])
        if snapshot.parent_snapshot_id is None:
            return None
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    return None


def _iceberg_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


def _iceberg_ready(rows: pa.Table) -> pa.Table:
    return rows.cast(_iceberg_schema(rows.schema))


def _key_filter(changes: pa.Table, keys: list[str], truncated: list[str]) -> Any:
    """A row filter matching every key in ``changes`` and every row of a truncated namespace:
    ``In`` over the last key column, grouped by the others."""
    from pyiceberg import expressions

    # Their typed signatures want bound terms; by name, as their documentation writes them.
    ex: Any = expressions
    And, EqualTo, In, IsNull, Or = ex.And, ex.EqualTo, ex.In, ex.IsNull, ex.Or

    columns = [changes.column(k).to_pylist() for k in keys]
    groups: dict[tuple[Any, ...], set[Any]] = defaultdict(set)
    for values in zip(*columns, strict=True):
        groups[values[:-1]].add(values[-1])
    terms: list[Any] = [EqualTo("namespace", ns) for ns in truncated]
    for prefix, last in groups.items():
        term: Any = (
            In(keys[-1], [v for v in last if v is not None]) if any(v is not None for v in last) else None
        )
        if None in last:
            term = IsNull(keys[-1]) if term is None else Or(term, IsNull(keys[-1]))
        for column, value in zip(keys[:-1], prefix, strict=True):
            term = And(IsNull(column) if value is None else EqualTo(column, value), term)
        terms.append(term)
    if not terms:
        return None
    condition = terms[0]
    for term in terms[1:]:
        condition = Or(condition, term)
    return condition
