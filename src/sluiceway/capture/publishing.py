"""A term's publishing, from configuration: its publisher, its dead letters and the target over them.

One place for what a term opens, whether it publishes from the capture's own process or from a
process of its own (:mod:`sluiceway.capture.offload`): both call :func:`open_target` with the same
configuration, so the two ways cannot drift apart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from sluiceway.capture.config import CaptureSection
from sluiceway.capture.mapping import TopicMap
from sluiceway.capture.metrics import PublishMeter
from sluiceway.capture.refusals import RefusalLog
from sluiceway.capture.target import DeadLetter, DeliveryFailed, PositionFile, PublishTarget
from sluiceway.db.dsn import parse_dsn
from sluiceway.errors import LeadershipError, PublishError
from sluiceway.harvest.ports import Publisher
from sluiceway.journal import JournalError

#: Wraps a term's publisher (a benchmark's timer, a test's fault injector).
Wrapper = Callable[[Publisher], Publisher]


def published_file(c: CaptureSection) -> PositionFile:
    """Where a broker target records what it published (see :class:`PositionFile`)."""
    return PositionFile(Path(c.state_path) / "published.lsn")


def open_publisher(c: CaptureSection, epoch: int, may_send: Callable[[], bool]) -> Publisher:
    """The term's client of its destination, ready to send (``may_send``: still the leader)."""
    if c.target is not None:
        from sluiceway.harvest.brokers import BrokerPublisher

        prefix = c.target.msg_id_prefix or msg_id_prefix(c.dsn, c.stream_name)
        # A refusal (RabbitMQ's unroutable, with mandatory) is final: the capture stops on it,
        # or, with a dead letter destination, sends it there and goes on with the key's next.
        refused: Literal["pass", "stop"] = "pass" if c.dead_letter is not None else "stop"
        return BrokerPublisher(c.target, prefix=prefix, may_send=may_send, refused=refused)
    if c.journal is not None:
        from sluiceway.harvest.journal_target import JournalPublisher

        return JournalPublisher(
            c.journal.path,
            epoch=epoch,
            register=f"sluiceway.capture.{c.stream_name}.epoch",
            segment_bytes=c.journal.segment_bytes,
            fsync=c.journal.fsync,
        )
    from sluiceway.harvest.kafka import KafkaPublisher

    publisher = KafkaPublisher(c.producer_config)
    publisher.wait_ready()
    return publisher


def open_dead_letter(c: CaptureSection, publisher: Publisher, epoch: int) -> DeadLetter | None:
    """The term's dead letter destination (``deadLetter:``): a topic of its own destination,
    through the term's publisher, or a journal of its own."""
    if c.dead_letter is None:
        return None
    if c.dead_letter.journal is None:
        return DeadLetter(publisher, c.dead_letter.topic)
    from sluiceway.harvest.journal_target import JournalPublisher

    journal = c.dead_letter.journal
    try:
        letters = JournalPublisher(
            journal.path,
            epoch=epoch,
            register=f"sluiceway.capture.{c.stream_name}.dead-letters.epoch",
            segment_bytes=journal.segment_bytes,
            fsync=journal.fsync,
        )
    except (LeadershipError, JournalError) as exc:
        raise DeliveryFailed(f"cannot open the dead letter journal {journal.path}: {exc}") from exc
    return DeadLetter(letters)


def open_target(
    c: CaptureSection,
    epoch: int,
    *,
    may_continue: Callable[[], bool],
    meter: PublishMeter | None,
    publisher_factory: Callable[[int], Publisher] | None = None,
    wrap: Wrapper | None = None,
    max_in_flight: int = 20_000,
) -> PublishTarget:
    """The term's :class:`PublishTarget`: its publisher (``publisher_factory``'s, else the
    configured destination's, wrapped by ``wrap``), its dead letters, what it published and refused."""
    try:
        if publisher_factory is not None:
            publisher = publisher_factory(epoch)
        else:
            publisher = open_publisher(c, epoch, may_continue)
    except PublishError as exc:
        raise DeliveryFailed(f"cannot open the destination: {exc}") from exc
    if c.tracing.enabled:
        from sluiceway.harvest.tracing import traced
        from sluiceway.tracing import start_tracing

        publisher = traced(publisher, start_tracing("sluice-capture").tracer, system=c.destination)
    if wrap is not None:
        publisher = wrap(publisher)
    try:
        dead_letter = open_dead_letter(c, publisher, epoch)
    except BaseException:
        publisher.close()
        raise
    return PublishTarget(
        publisher,
        TopicMap(c.topic),
        leader=f"{c.name}:{epoch}",
        tombstones=c.tombstones,
        trace_column=c.trace_column,
        timeout=c.delivery_timeout,
        max_in_flight=max_in_flight,
        may_continue=may_continue,
        meter=meter,
        position_file=published_file(c),
        refusals=RefusalLog(c.state_path),
        dead_letter=dead_letter,
    )


def msg_id_prefix(dsn: str, slot: str) -> str:
    """Message ids ``<prefix><sluice-id>``: the prefix names the database and slot (password left
    out), so captures that share a stream never share ids."""
    where = parse_dsn(dsn).redacted()
    return f"{hashlib.sha1(f'{where}|slot {slot}'.encode()).hexdigest()[:10]}:"
