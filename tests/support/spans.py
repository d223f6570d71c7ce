"""Spans kept in memory: this process's tracing (what :func:`sluiceway.tracing.start_tracing`
returns) held by an SDK provider with an in-memory exporter, for the unit tests of the span
wrappers; the process's own tracing is put back after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import sluiceway.tracing as tracing


@contextmanager
def spans_in_memory() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tracing._START_LOCK:
        before, tracing._STARTED = tracing._STARTED, tracing.Tracing(provider)
    try:
        yield exporter
    finally:
        with tracing._START_LOCK:
            tracing._STARTED = before


def traceparent(n: int, sampled: bool = True) -> str:
    """A W3C ``traceparent`` of trace ``n`` and span ``n``."""
    return f"00-{n:032x}-{n:016x}-{'01' if sampled else '00'}"
