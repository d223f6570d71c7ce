"""A table sink's writer in its one task (:class:`LakeWriter`), what it shares with the driver's
side of a batch (:mod:`~sluiceway.pipeline.sinks.tables`) — opening the table, its failures as the
sink's, the batch's marker — and the check at start (:func:`check_table`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sluiceway.pipeline.errors import DestinationUnreachable, PipelineError, file_system_fault, one_line
from sluiceway.pipeline.preflight import writable_dir
from sluiceway.pipeline.sinks.lakehouse.shape import SchemaConflict, lake_rows, mirror_changes
from sluiceway.pipeline.sinks.part import batch_of_token

if TYPE_CHECKING:
    from sluiceway.pipeline.sinks.lakehouse.port import LakeTable
    from sluiceway.pipeline.spec import DeltaSinkSpec, IcebergSinkSpec

    LakeSinkSpec = DeltaSinkSpec | IcebergSinkSpec

log = logging.getLogger("sluiceway.pipeline.sink")

#: Failures of a table's store that waiting may cure (a commit race, a catalog or store that is
#: briefly away), by class name across the two libraries and their drivers.
_TRANSIENT = frozenset(
    {
        "CommitFailedError",
        "CommitFailedException",
        "OperationalError",
        "ConnectionError",
        "ConnectError",
        "TimeoutException",
        "ReadTimeout",
        "ServiceUnavailableError",
    }
)


class TableRefused(DestinationUnreachable):
    """A batch the table cannot take as it is (a column's type changed): permanent, and said
    plainly rather than as an unreachable destination."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem, permanent=True)
        PipelineError.__init__(self, f"the table refused the batch: {problem}")


def open_table(spec: LakeSinkSpec) -> LakeTable:
    if spec.type == "delta":
        from sluiceway.pipeline.sinks.lakehouse.delta import DeltaLake

        return DeltaLake(spec.path, storage_options=spec.storage_options, partition_by=spec.partition_by)
    from sluiceway.pipeline.sinks.lakehouse.iceberg import IcebergLake

    return IcebergLake(spec.catalog, spec.table, partition_by=spec.partition_by)


def app_id(sink: str, run: str) -> str:
    """The marker's application id: ``pipeline.sink`` and the checkpoint's life."""
    return f"sluice:{sink}:{run}"


def guarded(what: str, call: Any, *args: Any) -> Any:
    """``call(*args)``, its failures as the sink's: a batch that does not fit → :class:`TableRefused`;
    a full disk, a commit race, a store away → transient; anything else → permanent, named."""
    try:
        return call(*args)
    except DestinationUnreachable:
        raise
    except SchemaConflict as exc:
        raise TableRefused(str(exc)) from None
    except OSError as exc:
        fault = file_system_fault(exc, what)
        raise (fault or DestinationUnreachable(f"{what}: {one_line(exc)}")) from None
    except Exception as exc:
        transient = any(c.__name__ in _TRANSIENT for c in type(exc).__mro__)
        raise DestinationUnreachable(
            f"{what}: {type(exc).__name__}: {one_line(exc)}", permanent=not transient
        ) from None


def native(spec: LakeSinkSpec, staging: str | None) -> bool:
    """Written as files from the executors (see the package docstring)? ``staging``: the
    table's :meth:`~LakeTable.staging_dir`."""
    return (
        spec.mode == "append"
        and spec.columns == "record"
        and staging is not None
        and (spec.type == "delta" or not spec.partition_by)
    )


def where(spec: LakeSinkSpec) -> str:
    return spec.path if spec.type == "delta" else f"iceberg table {spec.table}"


class LakeWriter:
    """A table sink's writer in its one task: the whole part (the batch in offset order) in one
    commit, or none if the marker says the batch is in already."""

    def __init__(self, spec: LakeSinkSpec, sink_name: str) -> None:
        self.spec = spec
        #: ``pipeline.sink`` (the part's suffix off: a table sink's batch is one part).
        self.sink = sink_name.split("#", 1)[0]

    def write(self, table: pa.Table, token: str) -> None:
        run, batch = batch_of_token(token)
        app = app_id(self.sink, run)
        lake = open_table(self.spec)
        done = guarded(where(self.spec), lake.committed, app)
        if done is not None and done >= batch:
            log.info("sink %s: batch %d is in the table already; a replay commits nothing", self.sink, batch)
            return
        guarded(where(self.spec), self._commit, lake, table, app, batch)

    def _commit(self, lake: LakeTable, records: pa.Table, app: str, batch: int) -> None:
        spec = self.spec
        rows = lake_rows(records, spec.columns, lake.schema(), spec.schema_)
        if spec.mode == "mirror":
            changes, truncated = mirror_changes(rows, spec.keys)
            lake.mirror(changes, truncated, spec.keys, app, batch)
        else:
            lake.append(rows, app, batch)

    def close(self) -> None:
        pass


def check_table(spec: LakeSinkSpec) -> None:
    """At start: the table's directory or catalog can be reached; an existing table has the
    mirror's keys."""
    table = open_table(spec)
    table.check()
    staging = table.staging_dir()  # where Spark's writer puts a batch's files first
    if staging is not None:
        writable_dir(staging)
    schema = guarded(where(spec), table.schema)
    if schema is not None and spec.mode == "mirror":
        missing = [k for k in spec.keys if k not in schema.names]
        if missing:
            raise DestinationUnreachable(
                f"{where(spec)} has no column {missing[0]!r} to mirror on (key: {spec.keys})", permanent=True
            )
