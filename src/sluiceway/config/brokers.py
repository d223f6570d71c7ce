"""Connection settings of the message brokers beyond Kafka, shared by the harvester's ``target:``
and the pipeline's sinks and sources (one model each, so both validate them the same way).

Field names are camelCase in the harvester's YAML (goharvest's style) and snake_case in pipeline
specs; both spellings load either way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from sluiceway.config.types import Duration, StrictModel


def _matching(pattern: str, expected: str) -> AfterValidator:
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not regex.match(value):
            raise ValueError(expected)
        return value

    return AfterValidator(check)


#: A JetStream stream name.
StreamName = Annotated[
    str, _matching(r"^[A-Za-z0-9_-]{1,255}$", "a JetStream stream name: letters, digits, '_' and '-'")
]
#: A RabbitMQ exchange name ("" is the default exchange).
ExchangeName = Annotated[
    str, _matching(r"^[A-Za-z0-9_.:-]{0,255}$", "an exchange name: letters, digits, '_', '-', '.' and ':'")
]


class BrokerSettings(StrictModel):
    """What every broker client shares: how long to wait for an acknowledgement, how to back off
    while the broker is unreachable, and when to give a record up as failed."""

    #: How long one connection attempt may take (the start-up check's bound, too).
    connect_timeout: Duration = Field(5.0, alias="connectTimeout", gt=0)
    #: How long one publish waits for the broker's acknowledgement before it is tried again.
    ack_timeout: Duration = Field(5.0, alias="ackTimeout")
    #: First wait after a failed attempt (doubling up to ``maxBackoff``).
    backoff: Duration = 0.1
    max_backoff: Duration = Field(2.0, alias="maxBackoff")
    #: A record still unacknowledged this long after it was handed over fails (the harvester then
    #: resets and re-marks it; a pipeline sink fails the batch and retries it).
    delivery_timeout: Duration = Field(30.0, alias="deliveryTimeout")
    #: Records awaiting an acknowledgement at once, across keys (at most one per key).
    max_in_flight: int = Field(1000, alias="maxInFlight", ge=1)

    def describe(self) -> str:
        """The broker in one line for logs and errors (passwords masked); each broker says more."""
        return type(self).__name__


def redact_url(url: str) -> str:
    """A URL fit for logs: any password masked."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


class NatsSettings(BrokerSettings):
    """NATS JetStream: subject = the record's topic (namespace)."""

    servers: list[str] = Field(default_factory=lambda: ["nats://127.0.0.1:4222"], min_length=1)
    #: The stream that must store the subjects (``Nats-Expected-Stream``): a record whose subject
    #: no stream or another stream captures is refused instead of landing elsewhere.
    stream: StreamName | None = None

    def describe(self) -> str:
        where = ",".join(redact_url(s) for s in self.servers)
        return f"nats {where}" + (f" stream {self.stream}" if self.stream else "")


class RabbitMqSettings(BrokerSettings):
    """RabbitMQ (AMQP 0-9-1): routing key = the record's topic, published to ``exchange``."""

    url: str = "amqp://guest:guest@127.0.0.1:5672/"
    #: The exchange to publish to ("" is the default exchange: routing key = queue name).
    exchange: ExchangeName = ""
    #: Unroutable records (no queue bound for the routing key) fail instead of being dropped.
    mandatory: bool = False

    def describe(self) -> str:
        return f"rabbitmq {redact_url(self.url)} exchange {self.exchange or '(default)'}"

    @property
    def server(self) -> str:
        """The URL with its password masked (names the server and user in errors)."""
        return redact_url(self.url)


class RedisSettings(BrokerSettings):
    """Redis Streams: stream = the record's topic (namespace)."""

    url: str = "redis://127.0.0.1:6379/0"
    #: Trim each stream to about this many entries (``XADD … MAXLEN ~ n``); 0 = never trim.
    max_len: int = Field(0, alias="maxLen", ge=0)

    def describe(self) -> str:
        return f"redis {redact_url(self.url)}"

    @property
    def server(self) -> str:
        """The URL with its password masked (names the server in errors)."""
        return redact_url(self.url)


class _Target(StrictModel):
    """What a harvester target adds to the connection settings."""

    #: Prefix of each record's message id (``<prefix><outbox id>``). Default: derived from the
    #: outbox's data source and table, so outboxes that share a stream never share ids.
    msg_id_prefix: str | None = Field(None, alias="msgIdPrefix")


class NatsTarget(NatsSettings, _Target):
    type: Literal["nats"]


class RabbitMqTarget(RabbitMqSettings, _Target):
    type: Literal["rabbitmq"]


class RedisTarget(RedisSettings, _Target):
    type: Literal["redis"]


BrokerTarget = Annotated[NatsTarget | RabbitMqTarget | RedisTarget, Field(discriminator="type")]


def describe_destination(
    target: BrokerTarget | None,
    journal: str | Path | None,
    kafka: Mapping[str, Any] | None,
) -> str:
    """A harvester's or a capture's destination in one line for logs, events, metrics and
    ``sluice status`` (passwords masked): the broker target if there is one, else the journal
    if there is one, else Kafka — ``nats nats://host:4222 stream ORDERS``, ``journal ./journal``,
    ``kafka 127.0.0.1:9092``."""
    if target is not None:
        return target.describe()
    if journal is not None:
        return f"journal {journal}"
    return f"kafka {(kafka or {}).get('bootstrap.servers', '')}"
