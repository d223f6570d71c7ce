"""The sink port: every writer takes an Arrow table of records (in order) and a token.

``token`` identifies exactly this slice of exactly this batch of this checkpoint's life; a
writer that can store it atomically with the data (journal register, Postgres progress row,
file name) uses it to make a replayed write a no-op. Writers are created where a part of the batch is
written (a Spark task on an executor; the driver for ``step``) and never pickled.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import pyarrow as pa

if TYPE_CHECKING:
    from sluiceway.pipeline.spec import (
        ConsoleSinkSpec,
        DeltaSinkSpec,
        FeedSinkSpec,
        FilesSinkSpec,
        IcebergSinkSpec,
        JournalSinkSpec,
        KafkaSinkSpec,
        NatsSinkSpec,
        PostgresSinkSpec,
        RabbitMqSinkSpec,
        RedisSinkSpec,
        SinkSpec,
    )

Client = TypeVar("Client")


class SinkWriter(Protocol):
    def write(self, table: pa.Table, token: str) -> None: ...

    def close(self) -> None: ...


class ClientSink(ABC, Generic[Client]):
    """A writer that holds one client (a connection, a producer, an open journal) across writes:
    opened by the first write, where the batch runs, and dropped after any failed write, so the
    retry starts from a fresh one — a failed append, a lost connection or a producer's stale queue
    may leave the old one unusable. A subclass says how to open, write, release and discard it,
    and which failures are the destination's rather than a record's (:meth:`_failure`).
    """

    _client: Client | None = None

    @abstractmethod
    def _open(self) -> Client:
        """Open the client (a failure here goes through :meth:`_failure` too)."""

    @abstractmethod
    def _write(self, client: Client, table: pa.Table, token: str) -> None: ...

    @abstractmethod
    def _release(self, client: Client) -> None:
        """Close the client after the last write (let it finish what it holds)."""

    def _discard(self, client: Client) -> None:
        """Drop the client after a failed write (the write is retried whole)."""
        self._release(client)

    def _failure(self, exc: Exception) -> Exception | None:
        """What a failed write raises instead of ``exc`` (None: ``exc`` itself). Called before
        the client is dropped, so it can still ask the client (a broken connection?)."""
        return None

    def write(self, table: pa.Table, token: str) -> None:
        try:
            if self._client is None:
                self._client = self._open()
            self._write(self._client, table, token)
        except Exception as exc:
            raised = self._failure(exc)
            self._drop()
            if raised is None or raised is exc:
                raise
            raise raised from exc
        except BaseException:
            self._drop()
            raise

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            self._discard(client)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            self._release(client)


def make_writer(spec: SinkSpec, *, sink_name: str, staged: bool = False) -> SinkWriter:
    """The writer for a sink spec (``sink_name`` names the register/progress row it keeps), built
    by the spec's kind's entry in :data:`WRITERS`.

    ``staged``: file sinks write into ``<path>/.staging`` and list what they wrote in ``staged``,
    for the driver to put in place (see :mod:`~sluiceway.pipeline.sinks.distributed`)."""
    build = WRITERS[spec.type]
    return build(spec, sink_name, staged)


# One builder per kind. Each imports its writer lazily: a sink's client library is only needed
# when the sink is used.
def _journal(spec: JournalSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.journal import JournalSink

    return JournalSink(spec.path, sink_name)


def _kafka(spec: KafkaSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.kafka import KafkaSink

    return KafkaSink(spec.topic, dict(spec.config))


def _postgres(spec: PostgresSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.postgres import PostgresSink

    return PostgresSink(spec.dsn, spec.table, spec.key, sink_name, create=spec.create)


def _files(spec: FilesSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.files import FileSink

    return FileSink(spec.path, spec.type, staged=staged)


def _console(spec: ConsoleSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.console import ConsoleSink

    return ConsoleSink(sink_name, spec.limit)


def _feed(spec: FeedSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.feed import FeedSink

    return FeedSink(spec.dsn, spec.partition, gate=spec.gate, prefix=spec.prefix, if_exists=spec.if_exists)


def _broker(
    spec: NatsSinkSpec | RabbitMqSinkSpec | RedisSinkSpec, sink_name: str, staged: bool
) -> SinkWriter:
    from sluiceway.pipeline.sinks.brokers import BrokerSink

    return BrokerSink(spec, spec.topic)


def _lake(spec: DeltaSinkSpec | IcebergSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.lakehouse.sink import LakeWriter

    return LakeWriter(spec, sink_name)


#: The writer builder of each sink kind (the spec's ``type``).
WRITERS: dict[str, Callable[[Any, str, bool], SinkWriter]] = {
    "journal": _journal,
    "kafka": _kafka,
    "postgres": _postgres,
    "parquet": _files,
    "json": _files,
    "csv": _files,
    "console": _console,
    "feed": _feed,
    "nats": _broker,
    "rabbitmq": _broker,
    "redis": _broker,
    "delta": _lake,
    "iceberg": _lake,
}
