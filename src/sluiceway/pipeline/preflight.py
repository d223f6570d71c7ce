"""Checks at start, before Spark runs any batch: can every source be read and every sink reached?

A wrong path, DSN, server or stream is then one line and a non-zero exit at once — not a "bad
record", a stack trace and a sink stopped at offset 0. Here are the ways to reach a place (a
directory, a database, a Kafka cluster, a broker), shared by both sides: each kind of sink names
its check in :data:`~sluiceway.pipeline.sinks.kinds.SINK_KINDS` (run by
:func:`~sluiceway.pipeline.sinks.kinds.check_sinks`), each kind of source checks itself
(``SourceAdapter.check`` in :mod:`~sluiceway.pipeline.sources.adapters`). Each check connects
with a short timeout and closes again; it writes nothing. This module imports no sink or
source: they import it.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluiceway.errors import BrokerError, DatabaseError
from sluiceway.pipeline.errors import DestinationUnreachable, PipelineError, one_line

if TYPE_CHECKING:
    from sluiceway.pipeline.spec import PipelineSpec

#: Seconds a check waits for a server to answer.
CONNECT_TIMEOUT = 5.0


def writable_dir(path: str) -> None:
    """``path`` is a directory we can write in, or can be created (its nearest existing parent is).

    Nothing is created: the directory (or its nearest existing parent) is asked for by a file
    made and removed at once, so a read-only file system or an ACL says no here too (a
    permission bit would not, for root)."""
    p = Path(path).absolute()
    if p.exists():
        if not p.is_dir():
            raise DestinationUnreachable(f"{path} is not a directory", permanent=True)
        _probe(p, f"{path}")
        return
    parent = next(a for a in p.parents if a.exists())
    if not parent.is_dir():
        raise DestinationUnreachable(f"cannot create {path}: {parent} is not a directory", permanent=True)
    _probe(parent, f"cannot create {path}: {parent}")


def _probe(directory: Path, what: str) -> None:
    if not os.access(directory, os.W_OK | os.X_OK):
        raise DestinationUnreachable(f"{what}: permission denied", permanent=True)
    try:
        fd, name = tempfile.mkstemp(prefix=".sluice-probe-", dir=directory)
    except OSError as exc:
        raise DestinationUnreachable(f"{what}: {exc.strerror or exc}", permanent=True) from None
    os.close(fd)
    os.unlink(name)


def reach_database(dsn: str) -> None:
    """A connection to the database of ``dsn``, opened and closed (a sink's or a source's)."""
    from sluiceway.db.connection import open_raw
    from sluiceway.db.dsn import parse_dsn

    try:
        open_raw(parse_dsn(dsn), connect_timeout=CONNECT_TIMEOUT).close()
    except DatabaseError as exc:
        raise DestinationUnreachable(error_text(exc), permanent=True) from None


def reach_kafka(config: dict[str, str]) -> None:
    """One metadata request to the brokers (librdkafka's own log lines silenced: we say it once)."""
    from confluent_kafka.admin import AdminClient

    servers = config.get("bootstrap.servers", "")
    try:
        AdminClient({**config, "log_level": "0"}).list_topics(timeout=CONNECT_TIMEOUT)
    except Exception as exc:
        raise DestinationUnreachable(f"kafka {servers}: {error_text(exc)}", permanent=True) from None


def reach_broker(settings: Any) -> None:
    """A connection to the NATS or RabbitMQ server of ``settings``, opened and closed."""
    from sluiceway.brokers import open_client

    async def reach() -> None:
        client = open_client(settings)
        try:
            await asyncio.wait_for(client.connect(), CONNECT_TIMEOUT + 1)
        finally:
            await client.close()

    _run(reach(), settings)


def reach_redis(settings: Any) -> None:
    """A ping to the Redis server of ``settings`` (a source's or a sink's)."""
    from sluiceway.brokers.redis import connect_redis, map_error

    async def reach() -> None:
        client = connect_redis(settings)
        try:
            await client.ping()
        except Exception as exc:
            raise map_error(exc, "connect") from exc
        finally:
            await client.aclose()

    _run(reach(), settings)


def _run(check: Any, settings: Any) -> None:
    try:
        asyncio.run(check)
    except TimeoutError:
        raise DestinationUnreachable(
            f"{settings.describe()}: no answer within {CONNECT_TIMEOUT + 1:g} s"
        ) from None
    except BrokerError as exc:
        raise DestinationUnreachable(f"{settings.describe()}: {error_text(exc)}", permanent=True) from None


def check_checkpoint(spec: PipelineSpec) -> None:
    """The checkpoint directory can be written: Spark's own error for it is a Java stack."""
    try:
        writable_dir(str(spec.checkpoint))
    except DestinationUnreachable as exc:
        raise PipelineError(f"checkpoint: {exc.problem}") from None


def error_text(exc: BaseException) -> str:
    """A driver's or broker's error in one line, in its own words."""
    err: Any = exc.args[0] if exc.args else None
    if callable(getattr(err, "str", None)):  # a KafkaException: its KafkaError's own words
        return one_line(err.str())
    return one_line(exc) or type(exc).__name__
