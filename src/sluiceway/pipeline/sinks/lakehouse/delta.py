"""Delta Lake tables through delta-rs (``deltalake``): no JVM, written from any Python process.

The marker is the log's ``txn`` action (application id, version): the same mechanism Spark's own
Delta streaming sink uses, so any Delta reader sees it. Appends use ``write_deltalake``; files a
Spark task wrote are added with one ``create_write_transaction``; the mirror is one ``MERGE``.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from sluiceway.pipeline.errors import DestinationUnreachable
from sluiceway.pipeline.sinks.lakehouse.port import move_into
from sluiceway.pipeline.sinks.lakehouse.shape import conform, evolve


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class DeltaLake:
    def __init__(
        self,
        path: str,
        *,
        storage_options: dict[str, str] | None = None,
        partition_by: list[str] | None = None,
    ) -> None:
        self.path = path
        self.storage_options = dict(storage_options or {}) or None
        self.partition_by = list(partition_by or [])

    @property
    def local(self) -> bool:
        return "://" not in self.path or self.path.startswith("file://")

    def _local_path(self) -> str:
        return self.path.removeprefix("file://")

    def _table(self) -> Any | None:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.path, storage_options=self.storage_options):
            return None
        return DeltaTable(self.path, storage_options=self.storage_options)

    def check(self) -> None:
        from sluiceway.pipeline.preflight import writable_dir

        if self.local:
            path = self._local_path()
            writable_dir(path)
            if os.path.isdir(path) and _foreign(path):
                raise DestinationUnreachable(
                    f"{path} is not a Delta table (no _delta_log) and is not empty; "
                    "give an empty or new directory",
                    permanent=True,
                )
            return
        try:
            self._table()
        except Exception as exc:  # the store's own error: credentials, bucket, network
            raise DestinationUnreachable(
                f"{self.path}: {type(exc).__name__}: {exc}", permanent=True
            ) from None

    def schema(self) -> pa.Schema | None:
        table = self._table()
        return None if table is None else _arrow_schema(table)

    def committed(self, app: str) -> int | None:
        table = self._table()
        return None if table is None else table.transaction_version(app)

    def _marker(self, app: str, batch: int) -> Any:
        from deltalake.transaction import CommitProperties, Transaction

        return CommitProperties(
            app_transactions=[Transaction(app, batch)],
            custom_metadata={"sluice.app": app, "sluice.batch": str(batch)},
        )

    def append(self, rows: pa.Table, app: str, batch: int) -> None:
        from deltalake import write_deltalake

        current = self.schema()
        if current is not None:
            evolve(current, rows.schema)
            rows = conform(rows, _merged(current, rows.schema))
        write_deltalake(
            self.path,
            rows,
            mode="append",
            schema_mode="merge" if current is not None else None,
            partition_by=self.partition_by or None,
            storage_options=self.storage_options,
            commit_properties=self._marker(app, batch),
        )

    def mirror(self, changes: pa.Table, truncated: list[str], keys: list[str], app: str, batch: int) -> None:
        table = self._table()
        if table is None:
            from deltalake import write_deltalake

            rows = _not_deleted(changes)
            write_deltalake(
                self.path,
                rows,
                partition_by=self.partition_by or None,
                storage_options=self.storage_options,
                commit_properties=self._marker(app, batch),
            )
            return
        current = _arrow_schema(table)
        evolve(current, changes.schema)
        source = conform(changes, _merged(current, changes.schema))
        # Null-safe: a record with no key (a Kafka record's, say) is one row, not a new row a batch.
        match = " AND ".join(f"(t.{_q(k)} IS NOT DISTINCT FROM s.{_q(k)})" for k in keys)
        live = "coalesce(s.op, '') <> 'delete'" if "op" in source.column_names else "true"
        merger = table.merge(
            source,
            match,
            source_alias="s",
            target_alias="t",
            merge_schema=True,
            commit_properties=self._marker(app, batch),
        )
        if "op" in source.column_names:
            merger = merger.when_matched_delete("s.op = 'delete'")
        merger = merger.when_matched_update_all(live).when_not_matched_insert_all(live)
        if truncated:
            emptied = ", ".join(_literal(ns) for ns in truncated)
            merger = merger.when_not_matched_by_source_delete(f"t.{_q('namespace')} IN ({emptied})")
        merger.execute()

    def staging_dir(self) -> str | None:
        return os.path.join(self._local_path(), ".sluice-staging") if self.local else None

    def add_files(self, staged: str, files: list[str], schema: pa.Schema, app: str, batch: int) -> None:
        from deltalake import Schema as DeltaSchema
        from deltalake.transaction import create_table_with_add_actions

        root = self._local_path()
        move_into(staged, files, root)
        actions = [_add_action(root, f, self.partition_by) for f in files]
        table = self._table()
        file_schema = pa.schema([f for f in schema if f.name not in self.partition_by])
        if table is None:
            full = pa.schema(list(file_schema) + [schema.field(c) for c in self.partition_by])
            create_table_with_add_actions(
                self.path,
                DeltaSchema.from_arrow(full),
                actions,
                mode="append",
                partition_by=self.partition_by or None,
                storage_options=self.storage_options,
                commit_properties=self._marker(app, batch),
            )
            return
        current = _arrow_schema(table)
        added = evolve(current, file_schema)
        if added:
            from deltalake.schema import Field

            table.alter.add_columns([Field.from_arrow(f) for f in added])
            table = self._table()
            assert table is not None
        table.create_write_transaction(
            actions,
            "append",
            table.schema(),
            partition_by=table.metadata().partition_columns or None,
            commit_properties=self._marker(app, batch),
        )

    def optimize(self) -> None:
        table = self._table()
        if table is not None:
            table.optimize.compact()


def _foreign(path: str) -> bool:
    """``path`` holds something besides a Delta table or what a first batch that died left of
    one (its staging directory, data files and partition directories written before the log)."""
    if os.path.isdir(os.path.join(path, "_delta_log")):
        return False
    return any(
        not (name.startswith((".", "_")) or name.endswith(".parquet") or "=" in name)
        for name in os.listdir(path)
    )


def _arrow_schema(table: Any) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def _merged(current: pa.Schema, batch: pa.Schema) -> pa.Schema:
    return pa.schema(list(current) + evolve(current, batch))


def _not_deleted(changes: pa.Table) -> pa.Table:
    if "op" not in changes.column_names:
        return changes
    import pyarrow.compute as pc

    return changes.filter(pc.fill_null(pc.not_equal(changes.column("op"), "delete"), True))


def _add_action(root: str, relative: str, partition_by: list[str]) -> Any:
    """The ``add`` action of a Parquet file under ``root``: size, partition values from its
    ``column=value`` directories, and the statistics readers skip files by."""
    import pyarrow.parquet as pq
    from deltalake.transaction import AddAction

    path = os.path.join(root, relative)
    st = os.stat(path)
    parts = dict(unquote(seg).split("=", 1) for seg in relative.split("/")[:-1] if "=" in seg)
    values = {
        c: (None if parts.get(c) == "__HIVE_DEFAULT_PARTITION__" else parts.get(c)) for c in partition_by
    }
    stats = _stats(pq.ParquetFile(path).metadata)
    return AddAction(relative, st.st_size, values, int(st.st_mtime * 1000), True, json.dumps(stats))


def _stats(meta: Any) -> dict[str, Any]:
    """numRecords, and per top-level primitive column its nulls, minimum and maximum."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    schema = meta.schema.to_arrow_schema()
    for i, name in enumerate(meta.schema.names):
        column = meta.schema.column(i)
        if column.path != name or name not in schema.names:
            continue  # a nested column's leaf: Delta keeps statistics of top-level columns here
        arrow_type = schema.field(name).type
        low = high = None
        count = 0
        for g in range(meta.num_row_groups):
            s = meta.row_group(g).column(i).statistics
            if s is None:
                low = high = None
                count = -1
                break
            if s.has_null_count and count >= 0:
                count += s.null_count
            if s.has_min_max:
                low = s.min if low is None else min(low, s.min)
                high = s.max if high is None else max(high, s.max)
        if count >= 0:
            nulls[name] = count
        if low is not None and _plain(arrow_type):
            mins[name], maxs[name] = _json_stat(low), _json_stat(high)
    return {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def _plain(t: pa.DataType) -> bool:
    # Not timestamps: Delta keeps them to the millisecond, and a maximum cut short would let a
    # reader skip a file holding a later instant.
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t))


def _json_stat(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value
