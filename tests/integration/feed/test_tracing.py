"""A partition added inside a recording span carries the span's trace in its attributes (its
worker continues it, feed/tracing.py); attributes that name their own trace keep it; outside any
span, or with OpenTelemetry's API and no SDK, nothing is added. On SQLite, PostgreSQL and MariaDB
(the contract fixtures)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from sluiceway.feed import Feed, NewPartition


def test_a_partition_added_in_a_span_carries_its_trace(feed: Feed) -> None:
    tracer = TracerProvider().get_tracer("shop")
    with tracer.start_as_current_span("POST /resumes") as span:
        feed.add("traced", [b"cv"], attributes={"team": "hiring"})
        feed.add_many([NewPartition("own", [b"cv"], attributes={"traceparent": "00-mine"})])
        context = span.get_span_context()
    with trace.get_tracer("no-sdk").start_as_current_span("ignored"):
        feed.add("no-sdk", [b"cv"])
    feed.add("plain", [b"cv"])
    traced = feed.partition("traced")
    assert traced is not None
    assert dict(traced.attributes) == {
        "team": "hiring",
        "traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}",
    }
    assert dict(feed.partition("own").attributes) == {"traceparent": "00-mine"}  # type: ignore[union-attr]
    assert dict(feed.partition("no-sdk").attributes) == {}  # type: ignore[union-attr]
    assert dict(feed.partition("plain").attributes) == {}  # type: ignore[union-attr]
