"""The harvester's publish spans: the term's publisher wrapped by :func:`traced`.

One span per dispatched batch of sends (one batch is what the engine hands over at once: to a
publisher that takes batches whole, in one call; to one sent to record by record, inside its
:meth:`~TracedPublisher.batch`), from the hand-over to the destination until the last of its
records is reported (acknowledged or failed), following
OpenTelemetry's messaging conventions (kind ``PRODUCER``, ``messaging.operation.type = send``,
``messaging.system``, ``messaging.destination.name``, ``messaging.batch.message_count``;
``messaging.message.id`` for a batch of one). Its place in the trace: the child of the record's
own span (its ``traceparent`` header, written by the Stasher) for a batch of one; for a batch of
many, a span of its own that *links* to each record's span (a batch carries many traces), as the
conventions say. A record that failed makes the span's status an error, with the destination's
reason.

The harvester follows the application's sampling decision: a send whose records carry no sampled
trace (no ``traceparent``, or its sampled flag off) gets no span at all, so that tracing costs
the harvester only a look at the headers of the records nobody traces (a span, even one the
sampler drops, costs more than publishing the record). For the same reason a batch sent record
by record (Kafka's, the journal's) waits for the reports of its *traced* records only: its span
ends with the last of them, an error if one of them failed; the others' reports go to the engine
untouched. A span per batch rather than per traced record: at 1 % sampling the spans' making and
exporting, not the look at the headers, were what tracing cost the harvester.

The records and their headers are passed on unchanged, so the ``traceparent`` reaches the
destination and its consumers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sluiceway.harvest.ports import ColumnsDone, Delivery, Publisher, SendsColumns, SendsMany, is_inline
from sluiceway.outbox.record import MarkedRecord, RecordColumns
from sluiceway.tracing import continuing, end_span, sampled_contexts, sampled_parent


def traced(inner: Publisher, tracer: Any, *, system: str) -> Publisher:
    """``inner`` with a span per send batch (see the module docstring). It has ``inner``'s
    abilities — ``send_many`` (:class:`~sluiceway.harvest.ports.SendsMany`), ``send_columns``
    (:class:`~sluiceway.harvest.ports.SendsColumns`) — and no other but its own ``batch``
    (:class:`~sluiceway.harvest.ports.SendsInBatches`): its callers send to it as they would to
    ``inner``."""
    many, columns = isinstance(inner, SendsMany), isinstance(inner, SendsColumns)
    kind = {
        (False, False): TracedPublisher,
        (True, False): TracedBatchPublisher,
        (False, True): TracedColumnsPublisher,
        (True, True): TracedBatchColumnsPublisher,
    }[(many, columns)]
    return kind(inner, tracer, system=system)


class TracedPublisher:
    """``inner`` with a span per batch of sends (:meth:`batch`), or per record sent outside one
    (see the module docstring)."""

    def __init__(self, inner: Publisher, tracer: Any, *, system: str) -> None:
        self.inner = inner
        self.tracer = tracer
        self.system = system
        self.inline = is_inline(inner)
        self._local = threading.local()  # .batch: the batch this thread is sending, if any

    def batch(self, records: list[MarkedRecord]) -> _Batch:
        """The batch whose ``send`` calls follow on this thread: one span for them all."""
        return _Batch(self, records)

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        if not sampled_parent(record.headers):  # most records, at a low sampling rate: as is
            self.inner.send(record, on_done)
            return
        batch: _Batch | None = getattr(self._local, "batch", None)
        if batch is not None:
            try:
                self.inner.send(record, batch.traced(record, on_done))
            except BaseException as exc:  # refused at once: the engine hears of it; and the span
                batch.ending.one(str(exc))
                raise
            return
        done, span = self._span([record], on_done)
        try:
            self.inner.send(record, done)
        except BaseException as exc:  # refused at once: the engine hears of it; the span ends so
            self._refused(span, exc)
            raise

    def _refused(self, span: Any, exc: BaseException) -> None:
        if span is not None:
            end_span(span, str(exc))

    def flush(self, timeout: float) -> int:
        return self.inner.flush(timeout)

    def close(self) -> None:
        self.inner.close()

    def _span(
        self, records: list[MarkedRecord], on_done: Callable[[Delivery], None]
    ) -> tuple[Callable[[Delivery], None], Any]:
        """The span of one send and the report that ends it; ``(on_done, None)`` — no span, no
        cost beyond reading the headers — when no record carries a sampled trace."""
        span = self._start([r.headers for r in records], [r.topic for r in records], records[0])
        if span is None:
            return on_done, None
        return _reporting(on_done, _Ending(span, len(records))), span

    def _start(self, headers: list[Any], topics: list[str], first: MarkedRecord) -> Any:
        """A started span for the records with these ``headers`` and ``topics`` (``first``: the
        first of them, named when it is alone); ``None`` when none carries a sampled trace."""
        contexts = sampled_contexts(headers)
        if not contexts:
            return None
        return self._open(contexts, len(headers), set(topics), first)

    def _open(
        self,
        contexts: list[Any],
        count: int,
        topics: set[str],
        first: MarkedRecord,
        start_time: int | None = None,
    ) -> Any:
        """The started span of ``count`` records sent to ``topics`` that carry the sampled traces
        ``contexts`` (not empty; ``first``: the record, when it is alone)."""
        destination = next(iter(topics)) if len(topics) == 1 else "(several)"
        attributes: dict[str, Any] = {
            "messaging.system": self.system,
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": destination,
            "messaging.batch.message_count": count,
        }
        if count == 1:
            attributes["messaging.message.id"] = str(first.id)
            attributes["messaging.message.conversation_id"] = first.key
        return continuing(
            self.tracer, f"publish {destination}", contexts, records=count, kind="PRODUCER",
            attributes=attributes, start_time=start_time,
        )  # fmt: skip


def _reporting(on_done: Callable[[Delivery], None], ending: _Ending) -> Callable[[Delivery], None]:
    """``on_done``, and then the record counted as reported towards its span's end."""

    def done(delivery: Delivery) -> None:
        try:
            on_done(delivery)
        finally:
            ending.one(delivery.error)

    return done


class _Ending:
    """Ends a span once each of its ``count`` records is reported (from any thread); an error if
    any failed, with the first reason. ``span`` ``None``: the span is still to be made (a batch
    being sent, :class:`_Batch`), each record counted in by :meth:`expect` as it goes; it ends when it is
    :meth:`started` and all are reported, at the last report's time."""

    def __init__(self, span: Any, count: int) -> None:
        self.span, self.left = span, count
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.last_at: int | None = None

    def expect(self) -> None:
        """One more record to wait for."""
        with self.lock:
            self.left += 1

    def one(self, error: str | None, n: int = 1) -> None:
        with self.lock:
            if error is not None:
                self.failures.append(error)
            self.left -= n
            last = self.left == 0 and self.span is not None
            if self.left == 0 and self.span is None:
                self.last_at = time.time_ns()
        if last:
            self._end(None)

    def started(self, span: Any) -> None:
        """The span is made: it ends now if every record is reported already."""
        with self.lock:
            self.span = span
            last = self.left == 0
        if last:
            self._end(self.last_at)

    def _end(self, at: int | None) -> None:
        if self.failures:
            self.span.set_attribute("sluiceway.failed_count", len(self.failures))
        end_span(self.span, self.failures[0] if self.failures else None, end_time=at)


class _Batch:
    """The sends of one dispatched batch, on one thread (:meth:`TracedPublisher.batch`). The traced
    records among them are noted as they are sent; when the batch is handed over, one span is made
    for all of it, back-dated to the batch's start (the child of the record's span when the batch
    is that one record, else linking each traced record's span), ended by the last traced
    record's report."""

    __slots__ = ("ending", "publisher", "records", "start", "traced_records")

    def __init__(self, publisher: TracedPublisher, records: list[MarkedRecord]) -> None:
        self.publisher, self.records = publisher, records
        self.traced_records: list[MarkedRecord] = []
        self.ending = _Ending(None, 0)  # its span made at the hand-over
        self.start = 0

    def __enter__(self) -> _Batch:
        self.start = time.time_ns()
        self.publisher._local.batch = self
        return self

    def traced(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> Callable[[Delivery], None]:
        """The report to send ``record`` (whose ``traceparent`` is sampled) with."""
        self.traced_records.append(record)
        self.ending.expect()
        return _reporting(on_done, self.ending)

    def __exit__(self, *exc_info: object) -> None:
        self.publisher._local.batch = None
        contexts = sampled_contexts([record.headers for record in self.traced_records])
        if not contexts:  # nothing traced in it (or only malformed headers): no span
            return
        topics = {record.topic for record in self.records}
        first = self.traced_records[0]
        self.ending.started(self.publisher._open(contexts, len(self.records), topics, first, self.start))


class TracedBatchPublisher(TracedPublisher):
    """``inner``, which takes send batches whole, with a span per batch."""

    def send_many(self, records: list[MarkedRecord], on_done: Callable[[Delivery], None]) -> None:
        if not any(sampled_parent(r.headers) for r in records):
            self.inner.send_many(records, on_done)  # type: ignore[attr-defined]
            return
        done, span = self._span(records, on_done)
        try:
            self.inner.send_many(records, done)  # type: ignore[attr-defined]
        except BaseException as exc:
            self._refused(span, exc)
            raise


class _TracedDone:
    """A :class:`~sluiceway.harvest.ports.ColumnsDone` that also ends the span of the records."""

    def __init__(self, done: ColumnsDone, ending: _Ending) -> None:
        self.done, self.ending = done, ending

    def acked(self, count: int) -> None:
        try:
            self.done.acked(count)
        finally:
            self.ending.one(None, count)

    def failed(self, index: int, delivery: Delivery) -> None:
        try:
            self.done.failed(index, delivery)
        finally:
            self.ending.one(delivery.error or "failed")


class TracedColumnsPublisher(TracedPublisher):
    """``inner``, which takes records made column-wise (``sluice capture``), with a span per call."""

    def send_columns(self, columns: RecordColumns, done: ColumnsDone) -> None:
        if not any(map(sampled_parent, columns.headers)):
            self.inner.send_columns(columns, done)  # type: ignore[attr-defined]
            return
        span = self._start(columns.headers, columns.topics, columns.record(0))
        reported: ColumnsDone = done if span is None else _TracedDone(done, _Ending(span, len(columns)))
        try:
            self.inner.send_columns(columns, reported)  # type: ignore[attr-defined]
        except BaseException as exc:
            self._refused(span, exc)
            raise


class TracedBatchColumnsPublisher(TracedColumnsPublisher, TracedBatchPublisher):
    """Both: batches whole, and records made column-wise."""
