"""The harvester's publish spans (harvest/tracing.py) over a publisher held by the test: a child
span for one record of a sampled trace, one span linking every sampled trace for a batch, no
span at all for records nobody traces (or whose trace is not sampled), errors kept, abilities
unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from sluiceway.harvest.ports import Delivery, SendsInBatches, SendsMany, is_inline
from sluiceway.harvest.tracing import TracedBatchPublisher, TracedPublisher, traced
from sluiceway.outbox.record import MarkedRecord


class Held:
    inline = True

    def __init__(self) -> None:
        self.sent: list[tuple[MarkedRecord, Callable[[Delivery], None]]] = []

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        self.sent.append((record, on_done))

    def flush(self, timeout: float) -> int:
        return 0

    def close(self) -> None:
        pass


class HeldMany(Held):
    def send_many(self, records: list[MarkedRecord], on_done: Callable[[Delivery], None]) -> None:
        for record in records:
            self.send(record, on_done)


def parent(n: int, sampled: bool = True) -> tuple[str, str]:
    return ("traceparent", f"00-{n:032x}-{n:016x}-{'01' if sampled else '00'}")


def record(i: int, *headers: tuple[str, str]) -> MarkedRecord:
    return MarkedRecord(i, None, "orders", f"k{i}", b"{}", headers, "leader")


@pytest.fixture
def spans() -> tuple[Any, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def test_one_record_is_a_child_span_ended_by_its_acknowledgement(spans: Any) -> None:
    tracer, exporter = spans
    inner = Held()
    publisher = traced(inner, tracer, system="kafka")
    assert (
        type(publisher) is TracedPublisher and is_inline(publisher) and not isinstance(publisher, SendsMany)
    )
    reported: list[Delivery] = []
    publisher.send(record(7, ("h", "1"), parent(5)), reported.append)
    assert exporter.get_finished_spans() == (), "open until acknowledged"
    sent, done = inner.sent[0]
    assert sent.headers == (("h", "1"), parent(5)), "the record goes on unchanged"
    done(Delivery(sent, offset=3))
    (span,) = exporter.get_finished_spans()
    assert reported == [Delivery(sent, offset=3)]
    assert (span.name, span.kind, span.parent.span_id, span.context.trace_id) == (
        "publish orders",
        SpanKind.PRODUCER,
        5,
        5,
    )
    assert span.attributes["messaging.system"] == "kafka" and span.attributes["messaging.message.id"] == "7"


def test_a_batch_links_each_sampled_trace_and_keeps_a_failure(spans: Any) -> None:
    tracer, exporter = spans
    inner = HeldMany()
    publisher = traced(inner, tracer, system="redis")
    assert type(publisher) is TracedBatchPublisher and isinstance(publisher, SendsMany)
    batch = [record(1, parent(1)), record(2, parent(2, sampled=False)), record(3), record(4, parent(1))]
    publisher.send_many(batch, lambda d: None)
    for i, (sent, done) in enumerate(inner.sent):
        done(Delivery(sent, error="refused" if i == 2 else None))
    (span,) = exporter.get_finished_spans()
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [(1, 1)]
    assert span.parent is None and span.attributes["messaging.batch.message_count"] == 4
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "refused"


def test_nobody_traces_these_so_no_span(spans: Any) -> None:
    tracer, exporter = spans
    inner = HeldMany()
    publisher = traced(inner, tracer, system="nats")
    publisher.send_many(
        [record(1), record(2, parent(2, sampled=False)), record(3, ("traceparent", "junk"))], print
    )
    publisher.send(record(4), print)
    for sent, done in inner.sent:
        done(Delivery(sent))
    assert exporter.get_finished_spans() == ()


def test_a_send_refused_at_once_ends_its_span_and_raises(spans: Any) -> None:
    tracer, exporter = spans

    class Refusing(Held):
        def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
            raise BufferError("queue full")

    with pytest.raises(BufferError):
        traced(Refusing(), tracer, system="kafka").send(record(1, parent(9)), print)
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and "queue full" in span.status.description


def test_a_batch_sent_record_by_record_is_one_span_ended_by_its_traced_records(spans: Any) -> None:
    tracer, exporter = spans
    inner = Held()
    publisher = traced(inner, tracer, system="kafka")
    assert isinstance(publisher, SendsInBatches)
    batch = [record(1, parent(1)), record(2), record(3, parent(3)), record(4, parent(1)), record(5)]
    reported: list[Delivery] = []
    with publisher.batch(batch):
        for r in batch:
            publisher.send(r, reported.append)
        inner.sent[0][1](Delivery(inner.sent[0][0]))  # acknowledged before the batch is handed over
    assert exporter.get_finished_spans() == (), "two traced records still unreported"
    for i in (1, 4, 3):  # the untraced ones and the third: its report ends nothing
        inner.sent[i][1](Delivery(inner.sent[i][0]))
    assert exporter.get_finished_spans() == ()
    inner.sent[2][1](Delivery(inner.sent[2][0], error="refused"))
    (span,) = exporter.get_finished_spans()
    assert [d.record.id for d in reported] == [1, 2, 5, 4, 3], "every report reaches the engine"
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [(1, 1), (3, 3)]
    assert span.parent is None and span.attributes["messaging.batch.message_count"] == 5
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "refused"
    assert [s for s, _ in inner.sent] == batch, "the records go on unchanged, in order"


def test_a_batch_of_one_traced_record_is_its_child_and_ends_at_its_report(spans: Any) -> None:
    tracer, exporter = spans
    inner = Held()
    publisher = traced(inner, tracer, system="journal")
    with publisher.batch([one := record(9, parent(4))]):
        publisher.send(one, print)
        sent, done = inner.sent[0]
        done(Delivery(sent))  # reported while the batch is still being handed over
    (span,) = exporter.get_finished_spans()
    assert (span.parent.span_id, span.context.trace_id, span.attributes["messaging.message.id"]) == (
        4,
        4,
        "9",
    )
    assert "messaging.batch.message_count" not in span.attributes
    assert span.start_time <= span.end_time


def test_a_batch_nobody_traces_has_no_span_and_a_refusal_inside_one_fails_it(spans: Any) -> None:
    tracer, exporter = spans
    with traced(inner := Held(), tracer, system="kafka").batch([record(1), record(2, parent(2, False))]) as b:
        for r in (record(1), record(2, parent(2, False))):
            b.publisher.send(r, print)
    for sent, done in inner.sent:
        done(Delivery(sent))
    assert exporter.get_finished_spans() == ()

    class Refusing(Held):
        def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
            raise BufferError("queue full")

    publisher = traced(Refusing(), tracer, system="kafka")
    with pytest.raises(BufferError), publisher.batch([r := record(1, parent(8)), record(2)]):
        publisher.send(r, print)
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and "queue full" in span.status.description
