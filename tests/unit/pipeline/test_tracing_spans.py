"""The pipeline's spans (pipeline/sinks/tracing.py) and the feed worker's (feed/tracing.py), kept
in memory: a part's write span is the child of its one record's trace, links to each sampled trace
of many, fails with the part's error and names the traces for the driver; the driver's batch span
starts when the batch did; a worker's span is current while its processor runs; nothing traced,
no span."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from sluiceway.feed.model import Item
from sluiceway.feed.tracing import TracedProcessor
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.sinks.part import PartResult
from sluiceway.pipeline.sinks.tracing import BatchSpan, TraceSetup, traced_part, traceparents
from sluiceway.tracing import trace_headers
from tests.support.spans import spans_in_memory, traceparent

SETUP = TraceSetup("orders", "kafka")


def batch(*parents: str | None) -> pa.Table:
    rows = [
        {
            "offset": i, "namespace": "orders", "op": "insert", "key": f"k{i}", "value": b"{}",
            "headers": [{"key": "h", "value": "1"}] + ([{"key": "traceparent", "value": p}] if p else []),
            "timestamp": None,
        }
        for i, p in enumerate(parents)
    ]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)


def part(table: pa.Table, written: PartResult) -> PartResult:
    return traced_part(SETUP, table, sink="work", sink_kind="feed", batch=7, part=2, write=lambda: written)


def test_a_part_of_one_record_is_its_child_and_names_its_trace() -> None:
    with spans_in_memory() as exporter:
        result = part(batch(traceparent(5)), PartResult(2, rows=1, written=1))
    (span,) = exporter.get_finished_spans()
    assert (span.name, span.kind, span.parent.span_id, span.context.trace_id) == (
        "write work", SpanKind.PRODUCER, 5, 5
    )  # fmt: skip
    assert span.attributes["sluiceway.pipeline.part"] == 2 and span.attributes["sluiceway.written_count"] == 1
    assert result.traces == [traceparent(5)]


def test_a_part_of_many_links_each_sampled_trace_once_and_keeps_its_failure() -> None:
    table = batch(traceparent(1), traceparent(2, sampled=False), None, traceparent(1), traceparent(3))
    with spans_in_memory() as exporter:
        result = part(table, PartResult(2, rows=5, written=2, error="refused: too big"))
    (span,) = exporter.get_finished_spans()
    assert span.parent is None and [link.context.trace_id for link in span.links] == [1, 3]
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "refused: too big"
    assert span.attributes["messaging.batch.message_count"] == 5
    assert sorted(result.traces) == [traceparent(1), traceparent(3)]


def test_nothing_traced_no_span() -> None:
    with spans_in_memory() as exporter:
        result = part(batch(None, traceparent(2, sampled=False)), PartResult(2, rows=2, written=2))
        assert traceparents(batch()) == [] and traceparents(batch(None).drop_columns(["headers"])) == []
        BatchSpan(SETUP, "work", "feed", 7).end([], 2, None)
    assert exporter.get_finished_spans() == () and result.traces == []


def test_a_write_that_raises_ends_its_span_failed() -> None:
    def boom() -> PartResult:
        raise OSError("disk on fire")

    with spans_in_memory() as exporter, pytest.raises(OSError):
        traced_part(SETUP, batch(traceparent(4)), sink="s", sink_kind="json", batch=0, part=0, write=boom)
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "disk on fire"


def test_the_batch_span_starts_with_the_batch_and_continues_its_records() -> None:
    with spans_in_memory() as exporter:
        one = BatchSpan(SETUP, "lake", "parquet", 3)
        time.sleep(0.01)
        one.end([traceparent(9)], 1, None)
        many = BatchSpan(SETUP, "lake", "parquet", 4)
        many.end([traceparent(1), traceparent(2)], 40, "stopped at offset 3")
    first, second = exporter.get_finished_spans()
    assert (first.name, first.kind, first.parent.span_id) == ("process orders.lake", SpanKind.CONSUMER, 9)
    assert first.start_time == one.started and first.end_time - first.start_time >= 10_000_000
    assert first.attributes["messaging.system"] == "kafka"
    assert first.attributes["messaging.consumer.group.name"] == "orders.lake"
    assert second.parent is None and [link.context.trace_id for link in second.links] == [1, 2]
    assert second.status.status_code is StatusCode.ERROR


def item(attributes: dict[str, Any]) -> Item:
    return Item(11, "orders/k1", 0, b"{}", 1, 3, attributes)


def test_a_worker_span_is_current_while_the_processor_runs() -> None:
    inside: list[list[tuple[str, str]]] = []

    def processor(it: Item) -> dict[str, bool]:
        inside.append(trace_headers())  # what an HTTP processor sends on
        if it.attributes.get("fail"):
            raise ValueError("bad item")
        return {"done": True}

    with spans_in_memory() as exporter:
        traced = TracedProcessor(processor, "feed_")
        assert traced(item({"traceparent": traceparent(6), "tracestate": "k=v"})) == {"done": True}
        assert traced(item({})) == {"done": True}
        assert traced(item({"traceparent": traceparent(8, sampled=False)})) == {"done": True}
        with pytest.raises(ValueError):
            traced(item({"traceparent": traceparent(7), "fail": True}))
    ok, failed = exporter.get_finished_spans()
    assert (ok.name, ok.kind, ok.parent.span_id, ok.context.trace_id) == (
        "process feed_",
        SpanKind.CONSUMER,
        6,
        6,
    )
    assert ok.attributes["messaging.message.id"] == "11" and ok.parent.trace_state.get("k") == "v"
    assert inside[0][0] == ("traceparent", f"00-{6:032x}-{ok.context.span_id:016x}-01")
    assert inside[1] == [] and inside[2] == []
    assert failed.status.status_code is StatusCode.ERROR and failed.status.description == "bad item"


def test_tracing_that_cannot_start_writes_the_part_all_the_same(monkeypatch: Any, caplog: Any) -> None:
    from sluiceway.tracing import TracingError

    def missing(self: TraceSetup) -> Any:
        raise TracingError("tracing is enabled but opentelemetry.sdk is missing")

    monkeypatch.setattr(TraceSetup, "start", missing)
    written = PartResult(0, rows=1, written=1)
    with spans_in_memory() as exporter:
        result = part(batch(traceparent(3)), written)
    assert result is written and result.traces == [traceparent(3)]
    assert exporter.get_finished_spans() == ()
    assert "no span for part 2 of batch 7: tracing is enabled but opentelemetry.sdk" in caplog.text


def test_a_batch_span_that_fails_is_a_warning_not_the_batch(caplog: Any) -> None:
    from sluiceway.pipeline.sinks.handler import BatchHandler
    from sluiceway.pipeline.spec import JournalSinkSpec

    class Broken(BatchSpan):
        def end(self, parents: Any, records: int, error: str | None) -> None:
            raise RuntimeError("collector\nunreachable")

    handler = BatchHandler("orders", JournalSinkSpec(name="copy", type="journal", path="/nowhere"), "/tmp")
    handler._end_span(Broken(SETUP, "copy", "journal", 5), None, [PartResult(0, traces=[traceparent(1)])])
    assert "sink copy: no span for batch 5: collector unreachable" in caplog.text


def test_attributes_with_a_trace_of_their_own_take_nothing_from_the_span() -> None:
    from sluiceway.feed.client import _traced

    span = {"traceparent": traceparent(1), "tracestate": "span=1"}
    assert _traced({"traceparent": "00-mine"}, span) == {"traceparent": "00-mine"}
    assert _traced({"team": "a"}, span) == {"team": "a", **span}
    assert _traced(None, span) == span and _traced({"team": "a"}, {}) == {"team": "a"}


def test_no_headers_while_another_thread_is_importing_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    # An application thread stashes while another imports OpenTelemetry for the first time (redis-py
    # does, lazily): sys.modules holds the half-made module, without get_current_span yet.
    import importlib.machinery
    import sys
    import types

    half_made = types.ModuleType("opentelemetry.trace")
    half_made.__spec__ = importlib.machinery.ModuleSpec("opentelemetry.trace", None)
    half_made.__spec__._initializing = True  # type: ignore[attr-defined]  # as importlib marks it
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", half_made)
    assert trace_headers() == []
