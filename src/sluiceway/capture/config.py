"""``capture.yaml``: which tables to capture, and where their changes go.

One file per capture (one replication slot, or one binlog reader)::

    capture:
      name: shop-cdc
      dsn: postgresql://app@db/shop
      tables: [public.orders, public.lines]      # or one regular expression over schema.table
      slot: shop_cdc
      publication: shop_cdc
      topic: "cdc.{schema}.{table}"              # or one name for every table
      kafka: {bootstrap.servers: "kafka:9092"}   # or target: {type: nats | rabbitmq | redis, …}
                                                 # or journal: {path: ./journal}

MariaDB/MySQL (the binlog, read as a replica): ``dsn: mysql://…`` and ``serverId: 4201`` in place
of ``slot`` and ``publication``.

Parsing is strict, as everywhere in sluiceway: an unknown key is an error naming it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sluiceway.config.brokers import BrokerTarget, describe_destination
from sluiceway.config.loader import load_file, validate
from sluiceway.config.types import (
    DataSourceString,
    Duration,
    KafkaSettings,
    SchemaName,
    StartupTimeout,
    StrictModel,
    TracingSettings,
)
from sluiceway.election.lease import lease_table
from sluiceway.harvest.config import GAPLESS_PRODUCER, Logging

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: What a topic template may name.
_FIELDS = {"schema", "table", "namespace"}


def _pg_name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{what}: use lower-case letters, digits and '_' (at most 63), starting with a letter"
        )
    return value


class JournalDestination(StrictModel):
    """Publish into a local journal (each change's topic is its namespace there)."""

    path: str
    fsync: bool = True
    segment_bytes: int = Field(64 << 20, alias="segmentBytes", ge=1 << 16)


class DeadLetterDestination(StrictModel):
    """Where a change the destination refuses for good goes, so the stream goes on: a ``topic``
    (Kafka topic, NATS subject, RabbitMQ routing key or Redis stream) of the capture's own
    destination, or a ``journal`` (whatever the size of the change)."""

    topic: str | None = None
    journal: JournalDestination | None = None

    @model_validator(mode="after")
    def _one(self) -> DeadLetterDestination:
        if (self.topic is None) == (self.journal is None):
            raise ValueError("give a topic of the destination or a journal: {path: …}, exactly one")
        return self


class CaptureElection(StrictModel):
    """``database`` (default): a lease row in the captured database. ``kafka``: goharvest's NELI
    (a consumer group on a leader topic), for Kafka destinations."""

    kind: Literal["database", "kafka"] = "database"
    #: The lease's name (database) or the group id (kafka). Default: ``capture.<slot>``.
    name: str | None = None
    lease_timeout: Duration = Field(5.0, alias="leaseTimeout", gt=0)
    #: The schema the lease table lives in (kind database): one the role may create a table in,
    #: or where one was made for it. Default: the role's search_path (usually ``public``).
    lease_schema: SchemaName | None = Field(None, alias="schema")

    @model_validator(mode="after")
    def _schema_for_a_lease(self) -> CaptureElection:
        if self.lease_schema is not None and self.kind != "database":
            raise ValueError("schema is where the database lease lives: it needs kind 'database'")
        return self


class CaptureSection(StrictModel):
    name: str = "sluiceway-capture"
    dsn: DataSourceString
    tables: list[str] | str
    #: PostgreSQL: the logical replication slot and the publication (created if missing).
    slot: str | None = None
    publication: str | None = None
    #: MariaDB/MySQL: this capture's server id among the server's replicas (unique per capture).
    server_id: int | None = Field(None, alias="serverId", ge=1, le=4_294_967_295)
    #: ``initial``: copy every table first (DBLog chunks, resumable); ``never``: changes only.
    snapshot: Literal["initial", "never"] = "initial"
    chunk_size: int = Field(10_000, alias="chunkSize", ge=1, le=1_000_000)
    #: Where the copy keeps its progress and chunk files. Processes that may lead in turn should
    #: share it (a standby with a directory of its own copies what is left again, from the start).
    state_dir: str | None = Field(None, alias="stateDir")
    #: Topic (Kafka), subject (NATS), routing key (RabbitMQ) or stream (Redis) per change:
    #: a template over ``{schema}``, ``{table}`` and ``{namespace}`` (``schema.table``).
    topic: str = "cdc.{schema}.{table}"
    #: After each delete, a record with the key and no value (for compacted Kafka topics).
    tombstones: bool = False
    kafka: KafkaSettings | None = None
    target: BrokerTarget | None = None
    journal: JournalDestination | None = None
    election: CaptureElection = Field(default_factory=CaptureElection)
    #: A change the destination can never take goes here, and the stream goes on. Without it the
    #: capture stops on such a change (``sluice capture inspect`` shows it, ``skip`` passes it).
    dead_letter: DeadLetterDestination | None = Field(None, alias="deadLetter")
    #: How long a batch of changes may wait for the destination's acknowledgements before the
    #: capture gives up on this connection, reconnects and sends again from the confirmed position.
    delivery_timeout: Duration = Field(60.0, alias="deliveryTimeout", gt=0)
    #: Backoff between attempts while the database or the destination is away.
    retry_backoff: Duration = Field(1.0, alias="retryBackoff", gt=0)
    #: How long ``sluice capture`` waits at start for the database or the destination while
    #: they are out of reach, before it gives up with one line: a duration, or ``forever``.
    startup_timeout: StartupTimeout = Field(30.0, alias="startupTimeout")
    metrics_addr: str | None = Field(None, alias="metricsAddr")
    #: Spans for every publish (docs/operations.md, "Tracing"), continuing the trace a change's
    #: ``traceColumn`` names.
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    #: A column of the captured tables that holds the W3C ``traceparent`` of the request that
    #: wrote the row (as Debezium's outbox router reads one): each change gets it as a
    #: ``traceparent`` header, and its publish span continues that trace.
    trace_column: str | None = Field(None, alias="traceColumn", min_length=1)
    #: Publish from a process of its own (the default), so that reading and decoding the slot and
    #: publishing run on two cores; ``false``: from a thread of the capture's own process.
    publish_process: bool = Field(True, alias="publishProcess")

    @field_validator("slot")
    @classmethod
    def _slot(cls, value: str | None) -> str | None:
        return None if value is None else _pg_name(value, "slot")

    @field_validator("publication")
    @classmethod
    def _publication(cls, value: str | None) -> str | None:
        return None if value is None else _pg_name(value, "publication")

    @field_validator("tables")
    @classmethod
    def _tables(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, str):
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        elif not value:
            raise ValueError("list at least one table (or give a regular expression)")
        return value

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        names = set(re.findall(r"{([^{}]*)}", value))
        unknown = names - _FIELDS
        if unknown:
            raise ValueError(
                f"the topic template names {', '.join(sorted(unknown))}; it may use {{schema}}, "
                "{table} and {namespace}"
            )
        return value

    @model_validator(mode="after")
    def _one_destination(self) -> CaptureSection:
        given = [n for n in ("kafka", "target", "journal") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one destination: kafka: {bootstrap.servers: …}, target: {type: nats | "
                "rabbitmq | redis, …} or journal: {path: …} "
                f"(got {', '.join(given) or 'none'})"
            )
        if self.kafka is not None and not self.kafka.get("bootstrap.servers"):
            raise ValueError("kafka: needs bootstrap.servers")
        if self.election.kind == "kafka" and self.kafka is None:
            raise ValueError("election.kind 'kafka' needs a kafka: destination")
        if self.binlog:
            if self.server_id is None or self.slot is not None or self.publication is not None:
                raise ValueError(
                    "a MariaDB/MySQL capture reads the binlog as a replica: give serverId (unique among "
                    "the server's replicas), not slot or publication"
                )
        elif self.slot is None or self.publication is None or self.server_id is not None:
            raise ValueError(
                "a PostgreSQL capture needs slot and publication (serverId is for MariaDB/MySQL)"
            )
        return self

    # -- derived ----------------------------------------------------------------------------
    @property
    def binlog(self) -> bool:
        """Whether the database is MariaDB/MySQL (its binlog is read), not PostgreSQL (a slot)."""
        from sluiceway.db.dsn import Dialect, parse_dsn

        return parse_dsn(self.dsn).dialect is Dialect.MYSQL

    @property
    def stream_name(self) -> str:
        """What names this capture's stream: the slot, or ``server<serverId>`` for a binlog."""
        return self.slot if self.slot is not None else f"server{self.server_id}"

    @property
    def table_list(self) -> tuple[str, ...] | str:
        return self.tables if isinstance(self.tables, str) else tuple(self.tables)

    @property
    def destination(self) -> str:
        if self.target is not None:
            return self.target.type
        return "kafka" if self.kafka is not None else "journal"

    def describe_destination(self) -> str:
        """One line, passwords masked: ``kafka 127.0.0.1:9092``, ``nats nats://…``, ``journal ./j``."""
        journal = self.journal.path if self.journal is not None else None
        return describe_destination(self.target, journal, self.kafka)

    @property
    def producer_config(self) -> dict[str, Any]:
        """Kafka producer settings: idempotent and gapless (a failed change is never followed on
        the broker by a later change of its partition), a short linger; the user's settings win."""
        return {"linger.ms": 2, **GAPLESS_PRODUCER, **(self.kafka or {})}

    @property
    def election_name(self) -> str:
        return self.election.name or f"capture.{self.stream_name}"

    @property
    def lease_table(self) -> str:
        """The lease table (database election), in ``election.schema`` when one is given."""
        return lease_table(self.election.lease_schema)

    @property
    def state_path(self) -> str:
        return self.state_dir or f"./.sluice/capture/{self.stream_name}"


class CaptureConfig(StrictModel):
    """The whole file: a ``capture:`` section and an optional ``logging:`` one.

    >>> CaptureConfig.from_dict({"capture": {"dsn": "postgresql://localhost/app", "tables": ["public.t"],
    ...     "slot": "s", "publication": "p", "journal": {"path": "./j"}}}).capture.destination
    'journal'
    """

    capture: CaptureSection
    logging: Logging = Field(default_factory=Logging)

    @classmethod
    def from_file(cls, path: str | Path) -> CaptureConfig:
        return load_file(cls, path)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaptureConfig:
        return validate(cls, data)
