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

from sluiceway.harvest.ports import Delivery, Publisher, SendsMany, is_inline
from sluiceway.outbox.record import MarkedRecord
from sluiceway.tracing import context_of

#: The most links one span carries (OpenTelemetry's default span limit).
MAX_LINKS = 128


def traced(inner: Publisher, tracer: Any, *, system: str) -> Publisher:
    """``inner`` with a span per send (a batch of one), or per send batch where ``inner`` takes
    batches whole (:class:`~sluiceway.harvest.ports.SendsMany`): it keeps ``inner``'s abilities,
    no more (the engine sends to it exactly as it would to ``inner``)."""
    if isinstance(inner, SendsMany):
        return TracedBatchPublisher(inner, tracer, system=system)
    return TracedPublisher(inner, tracer, system=system)


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
        done, span = self._span([record], on_done)
        try:
            self.inner.send(record, done)
        except BaseException as exc:  # refused at once: the engine hears of it; the span ends so
            self._refused(span, exc)
            raise

    def _refused(self, span: Any, exc: BaseException) -> None:
        if span is None:
            return
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(exc)))
        span.end()

    def flush(self, timeout: float) -> int:
        return self.inner.flush(timeout)

    def close(self) -> None:
        self.inner.close()

    def _span(
        self, records: list[MarkedRecord], on_done: Callable[[Delivery], None]
    ) -> tuple[Callable[[Delivery], None], Any]:
        """The span of one send and the report that ends it; ``(on_done, None)`` — no span, no
        cost beyond reading the headers — when no record carries a sampled trace."""
        sampled = []
        seen = set()
        for record in records:
            found = context_of(record.headers)
            if (
                found is not None
                and found.trace_flags.sampled
                and (found.trace_id, found.span_id) not in seen
            ):
                seen.add((found.trace_id, found.span_id))
                sampled.append(found)
                if len(sampled) == MAX_LINKS:
                    break
        if not sampled:
            return on_done, None
        trace = self._trace
        topics = {r.topic for r in records}
        destination = records[0].topic if len(topics) == 1 else "(several)"
        attributes: dict[str, Any] = {
            "messaging.system": self.system,
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": destination,
            "messaging.batch.message_count": len(records),
        }
        context = None
        links = []
        if len(records) == 1:
            attributes["messaging.message.id"] = str(records[0].id)
            attributes["messaging.message.conversation_id"] = records[0].key
            context = trace.set_span_in_context(trace.NonRecordingSpan(sampled[0]))
        else:
            links = [trace.Link(linked) for linked in sampled]
        span = self.tracer.start_span(
            f"publish {destination}", context=context, kind=trace.SpanKind.PRODUCER, attributes=attributes,
            links=links,
        )  # fmt: skip
        left = [len(records)]
        lock = threading.Lock()
        failures: list[str] = []

        def done(delivery: Delivery) -> None:
            try:
                on_done(delivery)
            finally:
                with lock:
                    if delivery.error is not None:
                        failures.append(delivery.error)
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    if failures:
                        span.set_status(trace.Status(trace.StatusCode.ERROR, failures[0]))
                        span.set_attribute("sluiceway.failed_count", len(failures))
                    span.end()

        return done, span


class TracedBatchPublisher(TracedPublisher):
    """``inner``, which takes send batches whole, with a span per batch."""

    def send_many(self, records: list[MarkedRecord], on_done: Callable[[Delivery], None]) -> None:
        if not records:
            return
        done, span = self._span(records, on_done)
        try:
            self.inner.send_many(records, done)  # type: ignore[attr-defined]
        except BaseException as exc:
            self._refused(span, exc)
            raise
