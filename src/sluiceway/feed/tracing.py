"""A feed worker's spans (``tracing=True``, ``sluice feed worker --tracing``): one per item
processed whose partition carries a sampled trace.

An item's trace is its partition's ``traceparent`` (and ``tracestate``) attribute: written by the
pipeline's feed sink from the record's headers, or by :meth:`~sluiceway.feed.Feed.add` from the
span current where the application adds the partition. The span (``process <prefix>``, kind
``CONSUMER``, OpenTelemetry's messaging attributes, the item's id as ``messaging.message.id``) is
the child of that trace's span and is current while the processor runs, so what the processor
traces joins it — an HTTP processor sends it on as the request's ``traceparent``. A processor that
raises marks it failed with the reason. Items without a sampled trace get no span.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluiceway.feed.model import Item
from sluiceway.tracing import TRACEPARENT, TRACESTATE, continuing, end_span, sampled_contexts, start_tracing

#: The service name of a worker's spans, unless ``OTEL_SERVICE_NAME`` gives one.
SERVICE = "sluice-feed-worker"


class TracedProcessor:
    """``inner`` with a span per item that carries a sampled trace (see the module docstring)."""

    def __init__(self, inner: Callable[[Item], object], prefix: str) -> None:
        self.tracer = start_tracing(SERVICE).tracer  # first: the otel extra missing is one line
        from opentelemetry import trace

        self.inner = inner
        self.prefix = prefix
        self._trace = trace

    def __call__(self, item: Item) -> object:
        attributes = item.attributes
        parent = attributes.get(TRACEPARENT) if attributes else None
        if not isinstance(parent, str):  # most items: no trace, nothing to do
            return self.inner(item)
        headers = [(TRACEPARENT, parent)]
        state = attributes.get(TRACESTATE)
        if isinstance(state, str):
            headers.append((TRACESTATE, state))
        contexts = sampled_contexts([headers])
        if not contexts:
            return self.inner(item)
        span = continuing(
            self.tracer, f"process {self.prefix}", contexts, records=1, kind="CONSUMER",
            attributes={
                "messaging.system": "sluiceway.feed",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": item.partition,
                "messaging.message.id": str(item.id),
                "sluiceway.feed.gate": item.gate,
                "sluiceway.feed.attempt": item.attempt,
            },
        )  # fmt: skip
        try:
            with self._trace.use_span(span, end_on_exit=False, record_exception=False):
                result = self.inner(item)
        except BaseException as exc:
            end_span(span, str(exc) or type(exc).__name__)
            raise
        end_span(span)
        return result

    def close(self) -> None:
        close: Any = getattr(self.inner, "close", None)
        if callable(close):
            close()
