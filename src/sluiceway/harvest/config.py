"""Harvester configuration: goharvest's ``reaper.yaml`` keys and defaults, plus sluiceway's additions.

A goharvest user's file loads unchanged and behaves the same. Like goharvest, parsing is strict:
an unknown key is an error. Durations accept Go syntax (``500ms``, ``5s``) or seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sluiceway.config.brokers import BrokerTarget, describe_destination
from sluiceway.config.loader import load_file, validate
from sluiceway.config.types import (
    Duration,
    KafkaSettings,
    SchemaName,
    StartupTimeout,
    StrictModel,
    TableName,
    TracingSettings,
)
from sluiceway.db.dsn import Dialect, parse_dsn
from sluiceway.election.lease import lease_table
from sluiceway.errors import ConfigError


class Limits(StrictModel):
    """goharvest's ``limits`` block. Unset values take goharvest's defaults (see :meth:`resolved`)."""

    io_error_backoff: Duration | None = Field(None, alias="ioErrorBackoff")
    poll_duration: Duration | None = Field(None, alias="pollDuration")
    min_poll_interval: Duration | None = Field(None, alias="minPollInterval")
    max_poll_interval: Duration | None = Field(None, alias="maxPollInterval")
    heartbeat_timeout: Duration | None = Field(None, alias="heartbeatTimeout")
    drain_interval: Duration | None = Field(None, alias="drainInterval")
    queue_timeout: Duration | None = Field(None, alias="queueTimeout")
    mark_backoff: Duration | None = Field(None, alias="markBackoff")
    max_in_flight_records: int | None = Field(None, alias="maxInFlightRecords", ge=1)
    send_concurrency: int | None = Field(None, alias="sendConcurrency", ge=1, le=256)
    send_buffer: int | None = Field(None, alias="sendBuffer", ge=1)
    mark_query_records: int | None = Field(None, alias="markQueryRecords", ge=1)
    min_metrics_interval: Duration | None = Field(None, alias="minMetricsInterval")
    #: sluiceway's: records of one key in flight at once; 1 (default) is goharvest's per-key barrier.
    per_key_in_flight: int | None = Field(None, alias="perKeyInFlight", ge=1, le=1000)
    #: sluiceway's: with the outbox's notify trigger (PostgreSQL), the longest an idle harvester
    #: waits for a notification before it marks anyway (a lost one); 0 = ignore the trigger.
    idle_poll: Duration | None = Field(None, alias="idlePoll", ge=0)

    def resolved(self) -> ResolvedLimits:
        """Fill goharvest's defaults, including the derived ones."""
        heartbeat = 5.0 if self.heartbeat_timeout is None else self.heartbeat_timeout
        max_poll = heartbeat / 2 if self.max_poll_interval is None else self.max_poll_interval
        queue_timeout = 30.0 if self.queue_timeout is None else self.queue_timeout
        return ResolvedLimits(
            io_error_backoff=0.5 if self.io_error_backoff is None else self.io_error_backoff,
            poll_duration=0.001 if self.poll_duration is None else self.poll_duration,
            min_poll_interval=0.1 if self.min_poll_interval is None else self.min_poll_interval,
            max_poll_interval=max_poll,
            heartbeat_timeout=heartbeat,
            drain_interval=min(max_poll, queue_timeout)
            if self.drain_interval is None
            else self.drain_interval,
            queue_timeout=queue_timeout,
            mark_backoff=0.01 if self.mark_backoff is None else self.mark_backoff,
            max_in_flight_records=self.max_in_flight_records or 1000,
            send_concurrency=self.send_concurrency or 8,
            send_buffer=self.send_buffer or 10,
            mark_query_records=self.mark_query_records or 100,
            min_metrics_interval=5.0 if self.min_metrics_interval is None else self.min_metrics_interval,
            per_key_in_flight=self.per_key_in_flight or 1,
            idle_poll=30.0 if self.idle_poll is None else self.idle_poll,
        )


class ResolvedLimits(StrictModel):
    """Limits with every default filled in: what the engine receives (frozen)."""

    io_error_backoff: float
    poll_duration: float
    min_poll_interval: float
    max_poll_interval: float
    heartbeat_timeout: float
    drain_interval: float
    queue_timeout: float
    mark_backoff: float
    max_in_flight_records: int
    send_concurrency: int
    send_buffer: int
    mark_query_records: int
    min_metrics_interval: float
    per_key_in_flight: int
    idle_poll: float


class JournalTarget(StrictModel):
    """Publish into a local journal instead of Kafka (each record's namespace is its topic)."""

    path: str
    segment_bytes: int = Field(64 << 20, alias="segmentBytes", ge=1 << 16)
    fsync: bool = True
    #: The register holding the leader epoch; a stale leader's appends are rejected.
    epoch_register: str = Field("sluiceway.harvest.epoch", alias="epochRegister")


class Election(StrictModel):
    """Which leader election to use. ``auto``: Kafka (NELI) when publishing to Kafka, else the database."""

    kind: Literal["auto", "kafka", "database"] = "auto"
    #: Name of the election (database lease row). Defaults to the leader group id.
    name: str | None = None
    lease_timeout: Duration | None = Field(None, alias="leaseTimeout")
    #: Where the lease table lives (database election): a PostgreSQL schema or a MySQL/MariaDB
    #: database the role may create a table in (or where one was made for it). Default: where
    #: the role's unqualified tables go (the search_path; the DSN's database).
    lease_schema: SchemaName | None = Field(None, alias="schema")


class DeadLetter(StrictModel):
    """Poison-record policy. ``maxAttempts`` 0 = unlimited (goharvest's behaviour)."""

    enabled: bool = True
    max_attempts: int = Field(0, alias="maxAttempts", ge=0)
    #: Also bury records the broker can never accept (too large, invalid topic).
    permanent_errors: bool = Field(True, alias="permanentErrors")
    #: A dead letter parks its key: the key's later records stay in the outbox, unsent, until an
    #: operator runs ``sluice outbox dead retry`` or ``resolve``. Other keys go on.
    park_key: bool = Field(True, alias="parkKey")


#: The keys of goharvest's ``harvest`` section (field names): a file that sets none of the others
#: is a goharvest file.
GOHARVEST_KEYS = frozenset(
    {
        "base_kafka_config",
        "producer_kafka_config",
        "leader_topic",
        "leader_group_id",
        "data_source",
        "outbox_table",
        "limits",
    }
)

#: What the idempotent producer needs to be gapless per partition (see ``perKeyInFlight``):
#: every error that could leave a gap becomes fatal, and no message times out locally (the one
#: failure the gapless guarantee does not cover).
GAPLESS_PRODUCER = {"enable.idempotence": True, "enable.gapless.guarantee": True, "message.timeout.ms": 0}


class Harvest(StrictModel):
    name: str = "sluiceway"
    base_kafka_config: KafkaSettings = Field(default_factory=dict, alias="baseKafkaConfig")
    producer_kafka_config: KafkaSettings = Field(default_factory=dict, alias="producerKafkaConfig")
    leader_topic: str | None = Field(None, alias="leaderTopic")
    leader_group_id: str | None = Field(None, alias="leaderGroupID")
    data_source: str = Field(
        "host=localhost port=5432 user=postgres password= dbname=postgres sslmode=disable", alias="dataSource"
    )
    outbox_table: TableName = Field("outbox", alias="outboxTable")
    limits: Limits = Field(default_factory=Limits)
    journal: JournalTarget | None = None
    #: A message broker instead of Kafka: ``{type: nats | rabbitmq | redis, …}`` (harvest/brokers.py).
    target: BrokerTarget | None = None
    election: Election = Field(default_factory=Election)
    dead_letter: DeadLetter = Field(default_factory=DeadLetter, alias="deadLetter")
    metrics_addr: str | None = Field(None, alias="metricsAddr")
    #: Spans for every publish, continuing each record's trace (its ``traceparent`` header).
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    #: How long ``sluice reap`` waits at start for the database or the destination while they
    #: are out of reach, before it gives up with one line: a duration, or ``forever``.
    startup_timeout: StartupTimeout = Field(30.0, alias="startupTimeout")
    #: ``sluice-id`` and ``sluice-leader`` headers on every record. Default: on, except for a
    #: goharvest file loaded unchanged (only goharvest's keys), which publishes exactly what
    #: goharvest would.
    sequence_headers_: bool | None = Field(None, alias="sequenceHeaders")

    @field_validator("data_source")
    @classmethod
    def _dsn(cls, value: str) -> str:
        try:
            parse_dsn(value)
        except ConfigError as exc:
            raise ValueError(exc.problem) from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Harvest:
        if self.journal is not None and self.target is not None:
            raise ValueError("two destinations: give either a journal: section or a target:, not both")
        if self.journal is None and self.target is None and not self.kafka_config.get("bootstrap.servers"):
            raise ValueError(
                "no destination: set baseKafkaConfig.bootstrap.servers (Kafka), "
                "a journal: section or a target:"
            )
        if self.journal is not None and self.election_kind == "kafka":
            raise ValueError(
                "a journal destination needs election.kind 'database': its leader epochs fence the journal"
            )
        if self.election_kind == "kafka" and not self.kafka_config.get("bootstrap.servers"):
            raise ValueError("election.kind is 'kafka' but baseKafkaConfig has no bootstrap.servers")
        if self.election.lease_schema is not None:
            if self.election_kind != "database":
                raise ValueError(
                    "election.schema is where the database lease lives: it needs election.kind 'database'"
                )
            if self.dialect is Dialect.SQLITE:
                raise ValueError("election.schema: SQLite has no schemas; leave it out")
        if (self.limits.per_key_in_flight or 1) > 1:
            self._check_pipelining()
        return self

    def _check_pipelining(self) -> None:
        """perKeyInFlight > 1 re-sends a key's unpurged suffix after a failure or failover: the
        consumer needs ``sluice-id`` to drop it, and the producer must be gapless per key."""
        if self.sequence_headers_ is False:
            raise ValueError(
                "limits.perKeyInFlight > 1 needs sequenceHeaders: consumers de-duplicate re-sent "
                "suffixes by sluice-id"
            )
        if self.journal is not None or self.target is not None:
            return  # the journal publisher and the broker Sender are gapless per key by design
        producer = {**self.kafka_config, **self.producer_kafka_config}
        for name, wanted in GAPLESS_PRODUCER.items():
            value = producer.get(name)
            if name == "message.timeout.ms" and value is None:
                value = producer.get("delivery.timeout.ms")
            if value is not None and str(value).lower() != str(wanted).lower():
                raise ValueError(
                    f"limits.perKeyInFlight > 1 needs the producer setting {name}={str(wanted).lower()} "
                    f"(got {value!r}): a failed record must never be followed on the broker by a later "
                    "record of its key (leave it unset: sluiceway sets it)"
                )

    # -- derived values --------------------------------------------------------------------
    @property
    def kafka_config(self) -> dict[str, Any]:
        return {str(k): v for k, v in self.base_kafka_config.items()}

    @property
    def producer_config(self) -> dict[str, Any]:
        """Producer settings: idempotent by default, the user's settings win.

        ``linger.ms`` defaults to 1 (librdkafka 2.x defaults to 5): with one record in flight per
        key, every millisecond a record waits for a batch is a millisecond its key is blocked.
        With ``perKeyInFlight`` > 1 the producer is also made gapless (:data:`GAPLESS_PRODUCER`;
        conflicting user settings are a configuration error).
        """
        gapless = GAPLESS_PRODUCER if (self.limits.per_key_in_flight or 1) > 1 else {}
        return {
            "enable.idempotence": True,
            "linger.ms": 1,
            **gapless,
            **self.kafka_config,
            **self.producer_kafka_config,
        }

    @property
    def sequence_headers(self) -> bool:
        """Whether records carry ``sluice-id``/``sluice-leader`` (see ``sequenceHeaders``)."""
        if self.sequence_headers_ is not None:
            return self.sequence_headers_
        return self.uses_sluiceway_keys

    @property
    def uses_sluiceway_keys(self) -> bool:
        """Whether any of sluiceway's own keys has a value other than its default (``metricsAddr``
        and ``tracing`` aside: serving metrics or spans changes nothing that is published).
        Values, not the keys present, decide, so a configuration dumped and loaded again gives
        the same answer."""
        fields = type(self).model_fields
        for name, info in fields.items():
            if name in GOHARVEST_KEYS or name in (
                "metrics_addr",
                "startup_timeout",
                "sequence_headers_",
                "tracing",
            ):
                continue
            if getattr(self, name) != info.get_default(call_default_factory=True):
                return True
        return self.limits.per_key_in_flight is not None or self.limits.idle_poll is not None

    @property
    def group_id(self) -> str:
        return self.leader_group_id or self.name

    @property
    def topic_for_leader(self) -> str:
        return self.leader_topic or f"{self.name}-leader"

    @property
    def election_kind(self) -> Literal["kafka", "database"]:
        if self.election.kind != "auto":
            return self.election.kind
        return "database" if self.journal is not None or self.target is not None else "kafka"

    @property
    def election_name(self) -> str:
        return self.election.name or self.group_id

    @property
    def lease_table(self) -> str:
        """The lease table (database election), in ``election.schema`` when one is given."""
        return lease_table(self.election.lease_schema)

    @property
    def destination(self) -> str:
        """What the harvester publishes to: ``kafka``, ``journal``, ``nats``, ``rabbitmq`` or ``redis``."""
        if self.target is not None:
            return self.target.type
        return "journal" if self.journal is not None else "kafka"

    def describe_destination(self) -> str:
        """The destination in one line for logs, events, metrics and ``sluice outbox stats``
        (passwords masked): ``nats nats://host:4222 stream ORDERS``, ``journal ./journal``…"""
        journal = self.journal.path if self.journal is not None else None
        return describe_destination(self.target, journal, self.kafka_config)

    @property
    def dialect(self) -> Dialect:
        return parse_dsn(self.data_source).dialect


class Logging(StrictModel):
    level: str = "Info"

    @field_validator("level")
    @classmethod
    def _level(cls, value: str) -> str:
        allowed = {"trace", "debug", "info", "warn", "warning", "error", "conf", "critical"}
        if value.lower() not in allowed:
            raise ValueError(f"expected one of Trace, Debug, Info, Warn, Error; got {value!r}")
        return value

    @property
    def python_level(self) -> int:
        import logging

        return {
            "trace": logging.DEBUG,
            "debug": logging.DEBUG,
            "info": logging.INFO,
            "conf": logging.INFO,
            "warn": logging.WARNING,
            "warning": logging.WARNING,
            "error": logging.ERROR,
            "critical": logging.CRITICAL,
        }[self.level.lower()]


class HarvestConfig(StrictModel):
    """The whole harvester configuration (the shape of goharvest's ``reaper.yaml``).

    >>> cfg = HarvestConfig.from_dict({"harvest": {
    ...     "dataSource": "sqlite:///app.db", "journal": {"path": "./journal"}}})
    >>> cfg.harvest.limits.resolved().max_in_flight_records
    1000
    """

    harvest: Harvest = Field(default_factory=Harvest)
    logging: Logging = Field(default_factory=Logging)

    @classmethod
    def from_file(cls, path: str | Path) -> HarvestConfig:
        return load_file(cls, path)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HarvestConfig:
        return validate(cls, data)

    @property
    def limits(self) -> ResolvedLimits:
        return self.harvest.limits.resolved()
