"""The pipeline spec: YAML (``pipeline:`` at the top) or Python, validated into frozen models.

>>> spec = (PipelineSpec.builder("orders")
...         .source("journal", path="./data/journal")
...         .namespace(r"^orders\\.")
...         .transform(sql="SELECT * FROM input WHERE op <> 'delete'")
...         .sink("lake", "parquet", path="./data/lake")
...         .checkpoint("./data/checkpoints")
...         .build())
>>> spec.sinks[0].name
'lake'

An invalid spec raises :class:`~sluiceway.pipeline.errors.SpecError` naming the field
(``pipeline.sinks[1].table: required but missing``).
"""

from __future__ import annotations

import difflib
import re
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Self, Union, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from sluiceway.config.brokers import NatsSettings, RabbitMqSettings, RedisSettings, StreamName, redact_url
from sluiceway.config.loader import interpolate, load_yaml
from sluiceway.config.paths import rooted, rooted_dsn
from sluiceway.config.types import (
    Duration,
    KafkaSettings,
    SettingText,
    SqlIdentifier,
    TableName,
    TracingSettings,
)
from sluiceway.config.types import StrictModel as _Model
from sluiceway.errors import ConfigError
from sluiceway.pipeline.destinations import Place, check_places
from sluiceway.pipeline.errors import SpecError

#: The directory in ``checkpoint`` where a postgres-cdc source keeps its state and journal.
CDC_STATE = "_cdc"
_SINK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    return value


def _needs_bootstrap(value: dict[str, str]) -> dict[str, str]:
    if "bootstrap.servers" not in value:
        raise ValueError("needs 'bootstrap.servers'")
    return value


class RetrySpec(_Model):
    """How a sink retries: a failing batch ``attempts`` times with exponential backoff, then
    record by record, each record ``record_attempts`` times. A destination that cannot be
    reached is no record's fault: the sink waits for it (backoff up to ``max_backoff``) for up to
    ``outage``, then stops saying so."""

    attempts: int = Field(3, ge=1)
    backoff: Duration = 0.5
    max_backoff: Duration = 10.0
    record_attempts: int = Field(2, ge=1)
    outage: Duration = 60.0


# --- sources --------------------------------------------------------------------------------------
class _Source(_Model):
    max_records_per_batch: int | None = Field(None, ge=1)
    #: Extra options passed to the Spark data source as they are (numbers, true/false as text).
    options: dict[str, SettingText] = Field(default_factory=dict)


class JournalSourceSpec(_Source):
    type: Literal["journal"]
    path: str
    starting_offset: Literal["earliest", "latest"] | int = "earliest"


class KafkaSourceSpec(_Source):
    type: Literal["kafka"]
    topic: str | list[str]
    #: librdkafka settings (numbers and true/false as YAML writes them); ``bootstrap.servers`` required.
    config: KafkaSettings = Field(default_factory=dict)
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    #: Drop records the harvester re-sent: per key, only a sluice-id above the last (pipeline/dedup.py).
    dedup: bool = False

    _bootstrap = field_validator("config")(_needs_bootstrap)

    @property
    def topics(self) -> list[str]:
        return [self.topic] if isinstance(self.topic, str) else list(self.topic)


class OutboxSourceSpec(_Source):
    type: Literal["outbox"]
    dsn: str
    table: TableName = "outbox"
    partitions: int = Field(1, ge=1, le=256)
    lease_ttl: Duration = 10.0


_SLOT = re.compile(r"^[a-z0-9_]{1,63}$")
_PUBLICATION = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class _CdcSource(_Source):
    """What every change data capture source has: its tables, the copy, the tasks per batch."""

    dsn: str
    #: Tables as ``schema.table`` (MariaDB/MySQL: ``db.table``, or a bare name in the DSN's
    #: database), or one regular expression over those names.
    tables: list[str] | str
    #: ``initial``: copy every table first; ``never``: changes from the capture's start on only.
    snapshot: Literal["initial", "never"] = "initial"
    #: Rows per copied chunk (each chunk is one short transaction).
    chunk_size: int = Field(10_000, ge=1, le=1_000_000)
    #: Tasks per micro-batch (records split by key, so each key's records stay in order in one).
    partitions: int = Field(1, ge=1, le=256)

    @field_validator("tables")
    @classmethod
    def _tables(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, str):
            return _regex(value)
        if not value:
            raise ValueError("list at least one table (or give a regular expression)")
        return value


class PostgresCdcSourceSpec(_CdcSource):
    """Change data capture from PostgreSQL: copy each table, then follow its changes (docs/cdc.md)."""

    type: Literal["postgres-cdc"]
    #: The logical replication slot (created if missing, for pgoutput).
    slot: str
    #: The publication (created if missing, for the tables).
    publication: str

    @field_validator("slot")
    @classmethod
    def _slot(cls, value: str) -> str:
        if not _SLOT.match(value):
            raise ValueError("use lower-case letters, digits and '_' (at most 63), as PostgreSQL requires")
        return value

    @field_validator("publication")
    @classmethod
    def _publication(cls, value: str) -> str:
        if not _PUBLICATION.match(value):
            raise ValueError("use lower-case letters, digits and '_' (at most 63), starting with a letter")
        return value


class MysqlCdcSourceSpec(_CdcSource):
    """Change data capture from MariaDB/MySQL's binlog: copy each table, then follow its changes
    (docs/cdc.md, "MariaDB and MySQL")."""

    type: Literal["mysql-cdc"]
    #: This capture's server id among the server's replicas (unique per capture).
    server_id: int = Field(ge=1, le=4_294_967_295)


class NatsSourceSpec(_Source, NatsSettings):
    """A JetStream stream; offsets are stream sequences."""

    type: Literal["nats"]
    stream: StreamName
    #: Only messages whose subject matches (NATS wildcards); default: the whole stream.
    subject: str | None = None
    starting_offset: Literal["earliest", "latest"] | int = "earliest"


class RedisSourceSpec(_Source, RedisSettings):
    """One Redis stream; offsets are entry ids."""

    type: Literal["redis"]
    stream: str
    starting_offset: Literal["earliest", "latest"] = "earliest"


SourceSpec = Annotated[
    JournalSourceSpec
    | KafkaSourceSpec
    | OutboxSourceSpec
    | PostgresCdcSourceSpec
    | MysqlCdcSourceSpec
    | NatsSourceSpec
    | RedisSourceSpec,
    Field(discriminator="type"),
]


# --- transforms -----------------------------------------------------------------------------------
class TransformSpec(_Model):
    """Exactly one of ``python`` (record → record | None | list), ``pandas``/``arrow`` (a batch
    function, ``module:function``) or ``sql`` (a query over the view ``input``). ``schema``: the
    output schema (Spark DDL) of a python/pandas/arrow function that changes the columns."""

    python: str | None = None
    pandas: str | None = None
    arrow: str | None = None
    sql: str | None = None
    schema_: str | None = Field(None, alias="schema")

    @model_validator(mode="after")
    def _one(self) -> Self:
        given = [k for k in ("python", "pandas", "arrow", "sql") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("give exactly one of python, pandas, arrow or sql")
        kind = given[0]
        if kind != "sql" and not _REF.match(getattr(self, kind)):
            raise ValueError(f"{kind}: expected 'module:function', got {getattr(self, kind)!r}")
        if kind == "sql" and self.schema_:
            raise ValueError("schema: not used with sql (the query decides its columns)")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("python", "pandas", "arrow", "sql") if getattr(self, k))

    @property
    def ref(self) -> str:
        return str(getattr(self, self.kind))


# --- sinks ----------------------------------------------------------------------------------------
class _Sink(_Model):
    name: str = ""
    namespace: str = ".*"
    retry: RetrySpec = Field(default_factory=lambda: RetrySpec.model_validate({}))
    dead_letter: SinkSpec | None = None
    #: Spark tasks writing each batch of an ordered sink (kafka, postgres, feed; journal: 1), the
    #: batch split by key; default: the cluster's cores. File sinks keep the source's parts.
    parallelism: int | None = Field(None, ge=1, le=1024)

    _ns = field_validator("namespace")(_regex)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value and not _SINK_NAME.match(value):
            raise ValueError("use letters, digits, '_' and '-' (at most 63), starting with a letter or digit")
        return value

    @field_validator("dead_letter")
    @classmethod
    def _flat(cls, value: SinkSpec | None) -> SinkSpec | None:
        if value is not None and value.dead_letter is not None:
            raise ValueError("a dead-letter sink cannot have its own dead_letter")
        return value

    def place(self, sink: str, field: str) -> Place | None:
        """The place only this sink may write to (a directory, a table; see
        :mod:`~sluiceway.pipeline.destinations`), ``field`` naming this sink in the spec
        (``sinks[1]``); ``None`` where records of several sinks may meet (a topic, an upsert)."""
        return None


class JournalSinkSpec(_Sink):
    type: Literal["journal"]
    path: str

    def place(self, sink: str, field: str) -> Place | None:
        return Place.of_path(sink, f"{field}.path", self.path)


class KafkaSinkSpec(_Sink):
    type: Literal["kafka"]
    #: Topic for every record; when empty each record goes to the topic named by its namespace.
    topic: str | None = None
    #: librdkafka settings (numbers and true/false as YAML writes them); ``bootstrap.servers`` required.
    config: KafkaSettings = Field(default_factory=dict)

    _bootstrap = field_validator("config")(_needs_bootstrap)


class PostgresSinkSpec(_Sink):
    type: Literal["postgres"]
    dsn: str
    table: SqlIdentifier
    #: The column(s) the upsert is keyed on: ``key``, or e.g. ``[namespace, key]`` when records
    #: of several tables or topics share one target table.
    key: SqlIdentifier | list[SqlIdentifier] = "key"
    #: Create the table when it is missing (columns from the record shape).
    create: bool = True


class FilesSinkSpec(_Sink):
    type: Literal["parquet", "json", "csv"]
    path: str

    def place(self, sink: str, field: str) -> Place | None:
        return Place.of_path(sink, f"{field}.path", self.path)


class _LakeSink(_Sink):
    """What the table-format sinks (``delta``, ``iceberg``) share; see
    :mod:`sluiceway.pipeline.sinks.lakehouse`."""

    #: ``append``: every record a row; ``mirror``: the table keeps the last record of every key.
    mode: Literal["append", "mirror"] = "append"
    #: ``mirror``: the column(s) a row is keyed on.
    key: SqlIdentifier | list[SqlIdentifier] = Field(default_factory=lambda: ["namespace", "key"])
    #: ``record``: the record's own columns; ``json``: the value, a JSON object, unpacked into
    #: columns (typed by ``schema``, the rest inferred), beside ``namespace``, ``key``, ``op``,
    #: ``offset`` and ``timestamp``.
    columns: Literal["record", "json"] = "record"
    #: ``columns: json``: the type of some or all columns (``string``, ``long``, ``int``,
    #: ``double``, ``boolean``, ``timestamp``, ``date``, ``binary``); others are inferred.
    schema_: dict[str, str] = Field(default_factory=dict, alias="schema")
    #: Columns the table is partitioned by (identity partitions), when it is created.
    partition_by: list[SqlIdentifier] = Field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return [self.key] if isinstance(self.key, str) else list(self.key)

    @field_validator("schema_")
    @classmethod
    def _types(cls, value: dict[str, str]) -> dict[str, str]:
        from sluiceway.pipeline.record import LAKE_TYPES

        for column, kind in value.items():
            if kind not in LAKE_TYPES:
                raise ValueError(f"{column}: unknown type {kind!r} (one of: {', '.join(LAKE_TYPES)})")
        return value

    @model_validator(mode="after")
    def _lake(self) -> Self:
        if self.dead_letter is not None:
            raise ValueError(
                "dead_letter: a table sink commits each batch whole, so no record is set aside; "
                "a record it cannot write stops the sink (skip it with `sluice pipeline skip`)"
            )
        if self.schema_ and self.columns != "json":
            raise ValueError("schema: only with columns: json (the record's own columns have fixed types)")
        return self


class DeltaSinkSpec(_LakeSink):
    type: Literal["delta"]
    #: The table: a directory, or an object-store URI (``s3://…``) with ``storage_options``.
    path: str
    storage_options: dict[str, SettingText] = Field(default_factory=dict)
    #: Compact small files every this many batches (0: never).
    optimize_every: int = Field(0, ge=0)

    def place(self, sink: str, field: str) -> Place | None:
        return Place.of_path(sink, f"{field}.path", self.path)


class IcebergSinkSpec(_LakeSink):
    type: Literal["iceberg"]
    #: ``namespace.table`` in the catalog; namespace and table are created when missing.
    table: str
    #: pyiceberg catalog properties (``type: sql``, ``uri``, ``warehouse``; ``type: rest``, ``uri``…).
    catalog: dict[str, SettingText]

    @field_validator("table")
    @classmethod
    def _qualified(cls, value: str) -> str:
        if "." not in value.strip(".") or any(not part for part in value.split(".")):
            raise ValueError(f"expected namespace.table, got {value!r}")
        return value

    def place(self, sink: str, field: str) -> Place | None:
        catalog = self.catalog.get("uri") or self.catalog.get("type", "")
        return Place.of_table(
            sink, f"{field}.table", f"{self.table} (catalog {redact_url(catalog)})", f"{catalog} {self.table}"
        )

    @field_validator("catalog")
    @classmethod
    def _catalog(cls, value: dict[str, str]) -> dict[str, str]:
        if "uri" not in value and value.get("type") != "in-memory":
            raise ValueError(
                "needs 'uri' (a SQL catalog: sqlite:///path or postgresql+psycopg://…; "
                "a REST catalog: its URL)"
            )
        return value


class ConsoleSinkSpec(_Sink):
    type: Literal["console"]
    #: Rows printed per batch (the rest are counted).
    limit: int = Field(20, ge=0)


class FeedSinkSpec(_Sink):
    type: Literal["feed"]
    dsn: str
    #: Partition name per record: a template over ``{namespace}``, ``{key}``, ``{offset}``.
    partition: str = "{namespace}/{key}/{offset}"
    gate: int = Field(0, ge=0)
    prefix: str = "feed_"
    if_exists: Literal["skip", "append"] = "skip"

    @field_validator("partition")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            value.format(namespace="n", key="k", offset=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"template may use {{namespace}}, {{key}} and {{offset}} only ({exc})") from None
        return value


class NatsSinkSpec(_Sink, NatsSettings):
    type: Literal["nats"]
    #: Subject for every record; when empty each record goes to the subject named by its namespace.
    topic: str | None = None


class RabbitMqSinkSpec(_Sink, RabbitMqSettings):
    type: Literal["rabbitmq"]
    #: Routing key for every record; when empty, the record's namespace.
    topic: str | None = None


class RedisSinkSpec(_Sink, RedisSettings):
    type: Literal["redis"]
    #: Stream for every record; when empty, the stream named by the record's namespace.
    topic: str | None = None


SinkSpec = Annotated[
    JournalSinkSpec
    | KafkaSinkSpec
    | PostgresSinkSpec
    | FilesSinkSpec
    | ConsoleSinkSpec
    | FeedSinkSpec
    | NatsSinkSpec
    | RabbitMqSinkSpec
    | RedisSinkSpec
    | DeltaSinkSpec
    | IcebergSinkSpec,
    Field(discriminator="type"),
]
for _m in (
    JournalSinkSpec,
    KafkaSinkSpec,
    PostgresSinkSpec,
    FilesSinkSpec,
    ConsoleSinkSpec,
    FeedSinkSpec,
    NatsSinkSpec,
    RabbitMqSinkSpec,
    RedisSinkSpec,
    DeltaSinkSpec,
    IcebergSinkSpec,
):
    _m.model_rebuild()


def _mirror_keys(sink: DeltaSinkSpec | IcebergSinkSpec, index: int, *, transformed: bool) -> None:
    """A mirror's key columns must be columns its rows will have: record columns, or with
    ``columns: json`` a column typed in ``schema`` (a transform may add its own columns)."""
    from sluiceway.pipeline.record import JSON_META, RECORD_COLUMNS

    known = set(JSON_META) | set(sink.schema_) if sink.columns == "json" else set(RECORD_COLUMNS)
    missing = [k for k in sink.keys if k not in known]
    if missing and not (transformed and sink.columns == "record"):
        hint = (
            "give its type in schema"
            if sink.columns == "json"
            else f"columns are {', '.join(RECORD_COLUMNS)}"
        )
        raise ValueError(
            f"sinks[{index}].key: no column {missing[0]!r} in the rows this sink writes ({hint})"
        )


class TriggerSpec(_Model):
    """``interval``: time between micro-batches when running continuously (``--once`` ignores it)."""

    interval: Duration = 1.0


class PipelineSpec(_Model):
    """A validated pipeline: one source, filters and transforms, sinks (one query each)."""

    name: str
    source: SourceSpec
    namespace: str = ".*"
    transforms: list[TransformSpec] = Field(default_factory=list)
    sinks: list[SinkSpec] = Field(min_length=1)
    checkpoint: str
    trigger: TriggerSpec = Field(default_factory=TriggerSpec)
    #: Extra Spark settings for the session ``sluice pipeline run`` builds.
    spark: dict[str, SettingText] = Field(default_factory=dict)
    #: Spans per sink batch and per part written (:mod:`sluiceway.pipeline.sinks.tracing`).
    tracing: TracingSettings = Field(default_factory=TracingSettings)

    _ns = field_validator("namespace")(_regex)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _SINK_NAME.match(value):
            raise ValueError("use letters, digits, '_' and '-' (at most 63), starting with a letter or digit")
        return value

    @model_validator(mode="after")
    def _sinks(self) -> Self:
        seen: set[str] = set()
        for i, sink in enumerate(self.sinks):
            if not sink.name:
                raise ValueError(f"sinks[{i}].name: required but missing")
            if sink.name in seen:
                raise ValueError(f"sinks[{i}].name: {sink.name!r} is used by another sink")
            seen.add(sink.name)
        for i, sink in enumerate(self.sinks):
            if isinstance(sink, DeltaSinkSpec | IcebergSinkSpec) and sink.mode == "mirror":
                _mirror_keys(sink, i, transformed=bool(self.transforms))
        places = []
        for i, sink in enumerate(self.sinks):
            places.append(sink.place(sink.name, f"sinks[{i}]"))
            if sink.dead_letter is not None:
                places.append(sink.dead_letter.place(f"{sink.name}.dead_letter", f"sinks[{i}].dead_letter"))
        # The checkpoint directory holds one directory per sink and the CDC source's journal
        # (CDC_STATE: cdc_root in pipeline/sources/adapters.py).
        reserved = [*(sink.name for sink in self.sinks), CDC_STATE]
        check_places([p for p in places if p is not None], checkpoint=self.checkpoint, reserved=reserved)
        if self.source.type == "outbox" and len(self.sinks) > 1:
            raise ValueError(
                "sinks: an outbox source feeds exactly one sink (its rows are purged when that sink's "
                "query commits); to fan out, harvest the outbox into a journal and read the journal"
            )
        return self

    def sink(self, name: str) -> SinkSpec:
        for s in self.sinks:
            if s.name == name:
                return s
        raise SpecError(
            f"no sink named {name!r} (sinks: {', '.join(s.name for s in self.sinks)})", path="sinks"
        )

    def checkpoint_dir(self, sink: str) -> Path:
        return Path(self.checkpoint) / sink

    def rooted(self, root: str | Path) -> PipelineSpec:
        """This spec as ``sluice pipeline`` run in ``root`` reads it: the checkpoint, every local
        ``path`` (a journal, files, a Delta table) and every SQLite ``dsn`` of the source, the sinks
        and their dead-letter sinks made absolute from ``root`` (what a workspace file's reader
        needs, :meth:`~sluiceway.overview.Workspace.rooted`).

        >>> spec = PipelineSpec.builder("p").source("journal", path="j").sink("lake", "parquet",
        ...     path="out").checkpoint("cp").build().rooted("/srv")
        >>> spec.checkpoint, spec.source.path, spec.sinks[0].path
        ('/srv/cp', '/srv/j', '/srv/out')
        """

        def fix(model: Any) -> Any:
            # Every local path in a spec is a field called ``path``, every database a ``dsn``.
            update: dict[str, Any] = {}
            if isinstance(getattr(model, "path", None), str):
                update["path"] = rooted(model.path, root)
            if isinstance(getattr(model, "dsn", None), str):
                update["dsn"] = rooted_dsn(model.dsn, root)
            if getattr(model, "dead_letter", None) is not None:
                update["dead_letter"] = fix(model.dead_letter)
            return model.model_copy(update=update)

        return self.model_copy(
            update={
                "checkpoint": rooted(self.checkpoint, root),
                "source": fix(self.source),
                "sinks": [fix(sink) for sink in self.sinks],
            }
        )

    # -- loading ----------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, *, source: str = "", env: dict[str, str] | None = None) -> PipelineSpec:
        """Validate a parsed spec: either ``{"pipeline": {...}}`` or the inner mapping."""
        if not isinstance(data, dict):
            raise SpecError(f"expected a mapping, got {type(data).__name__}", source=source)
        prefix = ""
        if "pipeline" in data:
            if set(data) != {"pipeline"}:
                extra = sorted(set(data) - {"pipeline"})
                problem = "unknown key (a spec holds one top-level key, 'pipeline')"
                if len(extra) > 1:
                    problem += "; " + "; ".join(f"{k}: unknown key" for k in extra[1:])
                raise SpecError(problem, path=str(extra[0]), source=source)
            data, prefix = data["pipeline"], "pipeline"
            if not isinstance(data, dict):
                raise SpecError("expected a mapping", path="pipeline", source=source)
        try:
            data = interpolate(data, env, prefix)
            return cls.model_validate(data)
        except ConfigError as exc:
            raise SpecError(exc.problem, path=exc.path, source=source) from None
        except ValidationError as exc:
            path, problem = describe(exc, prefix)
            raise SpecError(problem, path=path, source=source) from None

    @classmethod
    def from_yaml(cls, path: str | Path, *, env: dict[str, str] | None = None) -> PipelineSpec:
        try:
            data = load_yaml(path)
        except ConfigError as exc:
            raise SpecError(exc.problem, source=str(path)) from None
        return cls.from_dict(data, source=str(path), env=env)

    @classmethod
    def builder(cls, name: str) -> SpecBuilder:
        return SpecBuilder(name)


_TAGS = {
    "journal",
    "kafka",
    "outbox",
    "postgres-cdc",
    "mysql-cdc",
    "postgres",
    "parquet",
    "json",
    "csv",
    "console",
    "feed",
    "nats",
    "rabbitmq",
    "redis",
}


def describe(exc: ValidationError, prefix: str = "") -> tuple[str, str]:
    """Every problem of a pydantic error, unknown keys first: (the first one's path, all of them).

    ``("pipeline.sinks[0].paht", "unknown key (did you mean 'path'?); pipeline.sinks[0].path:
    required but missing")`` — the caller prints ``<file>: <path>: <problems>``.
    """
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    problems = [_problem(err, prefix) for err in errors]
    path, msg = problems[0]
    rest = [f"{p}: {m}" if p else m for p, m in problems[1:]]
    return path, "; ".join([msg, *rest])


def _problem(err: Any, prefix: str) -> tuple[str, str]:
    """One pydantic error as (``pipeline.sinks[1].table``, what was expected)."""
    parts: list[str] = [prefix] if prefix else []
    for p in err["loc"]:
        if isinstance(p, int):
            parts[-1:] = [f"{parts[-1]}[{p}]"] if parts else [f"[{p}]"]
        elif str(p) in _TAGS or str(p).startswith("function-"):
            continue  # pydantic's tagged-union step, not a field
        else:
            parts.append(str(p))
    path = ".".join(parts)
    kind = err["type"]
    if kind == "extra_forbidden":
        msg = "unknown key"
        guess = _did_you_mean(err["loc"], top=not prefix)
        msg += f" (did you mean {guess!r}?)" if guess else " (check its spelling and indentation)"
    elif kind == "missing":
        msg = "required but missing"
    elif kind == "union_tag_invalid":
        msg = f"unknown type {err.get('input', {}).get('type')!r}; expected one of " + str(
            err.get("ctx", {}).get("expected_tags", "")
        )
    elif kind == "union_tag_not_found":
        msg = "needs a 'type'"
    else:
        msg = str(err["msg"]).removeprefix("Value error, ")
        if kind not in ("value_error", "assertion_error") and "input" in err:
            msg += f" (got {err['input']!r})"
    if kind.startswith("union_tag"):
        path = f"{path}.type" if path else "type"
    # Model-level checks name their own sub-field ("sinks[1].name: …"): fold it into the path.
    m = re.match(r"^(\w+(?:\[\d+\])?(?:\.\w+(?:\[\d+\])?)*): (.*)$", msg, re.S)
    if m and kind == "value_error" and not m.group(1).startswith("give"):
        path = f"{path}.{m.group(1)}" if path else m.group(1)
        msg = m.group(2)
    return path, msg


def _did_you_mean(loc: tuple[Any, ...], *, top: bool) -> str | None:
    """The known key closest to an unknown one, from the models at that place in the spec."""
    models: list[Any] = [PipelineSpec]
    for step in loc[:-1]:
        models = [m for model in models for m in _descend(model, step)]
    keys: set[str] = {"pipeline"} if top and len(loc) == 1 else set()
    for model in models:
        if isinstance(model, type) and issubclass(model, BaseModel):
            for name, info in model.model_fields.items():
                keys.update(k for k in (name, info.alias) if k and not k.endswith("_"))
    close = difflib.get_close_matches(str(loc[-1]), sorted(keys), n=1, cutoff=0.6)
    return close[0] if close else None


def _members(tp: Any) -> list[Any]:
    """The types a field may hold: ``Annotated``, unions and ``None`` unwrapped."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _members(get_args(tp)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in get_args(tp) for m in _members(arg)]
    return [] if tp is type(None) else [tp]


def _descend(tp: Any, step: Any) -> list[Any]:
    """The types one step of an error's location leads to from ``tp``."""
    if isinstance(step, int):
        return _members(get_args(tp)[0]) if get_origin(tp) is list and get_args(tp) else []
    if not (isinstance(tp, type) and issubclass(tp, BaseModel)):
        return []
    for name, info in tp.model_fields.items():
        if step in (name, info.alias):
            return _members(info.annotation)
    tag = tp.model_fields.get("type")
    if tag is not None and step in get_args(tag.annotation):
        return [tp]  # pydantic's tagged-union step: the member the tag chose
    return []


class SpecBuilder:
    """Build a :class:`PipelineSpec` in Python; ``build()`` validates exactly like YAML."""

    def __init__(self, name: str) -> None:
        self._data: dict[str, Any] = {"name": name, "transforms": [], "sinks": []}

    def source(self, type: str, **options: Any) -> SpecBuilder:
        self._data["source"] = {"type": type, **options}
        return self

    def namespace(self, pattern: str) -> SpecBuilder:
        self._data["namespace"] = pattern
        return self

    def transform(self, **kind: Any) -> SpecBuilder:
        self._data["transforms"].append(kind)
        return self

    def sink(self, name: str, type: str, **options: Any) -> SpecBuilder:
        self._data["sinks"].append({"name": name, "type": type, **options})
        return self

    def checkpoint(self, path: str | Path) -> SpecBuilder:
        self._data["checkpoint"] = str(path)
        return self

    def trigger(self, interval: str | float) -> SpecBuilder:
        self._data["trigger"] = {"interval": interval}
        return self

    def spark(self, **conf: str) -> SpecBuilder:
        self._data["spark"] = dict(conf)
        return self

    def tracing(self, enabled: bool = True) -> SpecBuilder:
        self._data["tracing"] = {"enabled": enabled}
        return self

    def build(self) -> PipelineSpec:
        return PipelineSpec.from_dict(self._data, env={})
