"""The harvester's publish spans: the term's publisher wrapped by :func:`traced`.

One span per send (per batch, for a publisher that takes batches whole), from the hand-over to
the destination until the last of its records is reported (acknowledged or failed), following
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
sampler drops, costs more than publishing the record).

The records and their headers are passed on unchanged, so the ``traceparent`` reaches the
destination and its consumers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sluiceway.harvest.ports import ColumnsDone, Delivery, Publisher, SendsColumns, SendsMany, is_inline
from sluiceway.outbox.record import MarkedRecord, RecordColumns
from sluiceway.tracing import continuing, end_span, sampled_contexts, sampled_parent


def traced(inner: Publisher, tracer: Any, *, system: str) -> Publisher:
    """``inner`` with a span per send (see the module docstring). It has exactly ``inner``'s
    abilities — ``send_many`` (:class:`~sluiceway.harvest.ports.SendsMany`), ``send_columns``
    (:class:`~sluiceway.harvest.ports.SendsColumns`) — no more: its callers send to it as they
    would to ``inner``."""
    many, columns = isinstance(inner, SendsMany), isinstance(inner, SendsColumns)
    kind = {
        (False, False): TracedPublisher,
        (True, False): TracedBatchPublisher,
        (False, True): TracedColumnsPublisher,
        (True, True): TracedBatchColumnsPublisher,
    }[(many, columns)]
    return kind(inner, tracer, system=system)


class TracedPublisher:
    """``inner`` with a span per record sent (see the module docstring)."""

    def __init__(self, inner: Publisher, tracer: Any, *, system: str) -> None:
        from opentelemetry import trace

        self.inner = inner
        self.tracer = tracer
        self.system = system
        self._trace = trace
        self.inline = is_inline(inner)

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        if not sampled_parent(record.headers):  # most records, at a low sampling rate: as is
            self.inner.send(record, on_done)
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
        ending = _Ending(span, len(records), self._trace)

        def done(delivery: Delivery) -> None:
            try:
                on_done(delivery)
            finally:
                ending.one(delivery.error)

        return done, span

    def _start(self, headers: list[Any], topics: list[str], first: MarkedRecord) -> Any:
        """A started span for the records with these ``headers`` and ``topics`` (``first``: the
        first of them, named when it is alone); ``None`` when none carries a sampled trace."""
        contexts = sampled_contexts(headers)
        if not contexts:
            return None
        count = len(headers)
        destination = topics[0] if len(set(topics)) == 1 else "(several)"
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
            attributes=attributes,
        )  # fmt: skip


class _Ending:
    """Ends a span once each of its ``count`` records is reported (from any thread); an error if
    any failed, with the first reason."""

    def __init__(self, span: Any, count: int, trace: Any) -> None:
        self.span, self.left, self.trace = span, count, trace
        self.failures: list[str] = []
        self.lock = threading.Lock()

    def one(self, error: str | None, n: int = 1) -> None:
        with self.lock:
            if error is not None:
                self.failures.append(error)
            self.left -= n
            last = self.left == 0
        if last:
            if self.failures:
                self.span.set_attribute("sluiceway.failed_count", len(self.failures))
            end_span(self.span, self.failures[0] if self.failures else None)


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
        reported: ColumnsDone = (
            done if span is None else _TracedDone(done, _Ending(span, len(columns), self._trace))
        )
        try:
            self.inner.send_columns(columns, reported)  # type: ignore[attr-defined]
        except BaseException as exc:
            self._refused(span, exc)
            raise


class TracedBatchColumnsPublisher(TracedColumnsPublisher, TracedBatchPublisher):
    """Both: batches whole, and records made column-wise."""
