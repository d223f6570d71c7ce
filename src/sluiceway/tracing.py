"""OpenTelemetry tracing: one trace from the request that wrote an outbox row to what published it.

Two halves, both optional:

* **In the application** (:func:`trace_headers`): the :class:`~sluiceway.outbox.Stasher` adds the
  current span's W3C ``traceparent`` (and ``tracestate``) to the record's headers. Only when a span
  is really recording something: with OpenTelemetry not imported, or its API without an SDK (the
  no-op tracer), there is no header and next to no cost — one dictionary look-up.
* **In sluiceway's own processes** (:func:`start_tracing`), switched on by ``tracing: {enabled:
  true}`` in the process's configuration: an SDK tracer provider exporting OTLP over HTTP, set up
  the standard way by the ``OTEL_*`` environment variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
  ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``…). Spans continue the record's trace from its
  ``traceparent`` header (:func:`context_of`). It needs the ``otel`` extra.

The headers themselves travel with the record unchanged, to every destination, so a consumer can
continue the trace too.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sluiceway.errors import SluicewayError

log = logging.getLogger("sluiceway.tracing")

#: The W3C trace context headers (https://www.w3.org/TR/trace-context/).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: The instrumentation scope of sluiceway's spans.
SCOPE = "sluiceway"
#: The most links one span carries (OpenTelemetry's default span limit).
MAX_LINKS = 128
#: Spans per export unless ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` says (the SDK's default is 512).
EXPORT_BATCH = 32
#: How long a stopping part waits for its spans to be exported (its process goes on).
FLUSH_TIMEOUT = 10.0


class TracingError(SluicewayError):
    """Tracing is asked for and cannot be set up (the ``otel`` extra is missing, say)."""


def trace_headers() -> list[tuple[str, str]]:
    """The current span's ``traceparent`` (and ``tracestate``), or ``[]`` when there is no
    recording span (OpenTelemetry not imported, no SDK, no span, or a span not sampled)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or getattr(trace.__spec__, "_initializing", False):
        # The application does not use OpenTelemetry, or another thread is importing it now (a
        # half-made module has no get_current_span yet; no span can be current before it is made).
        return []
    span = trace.get_current_span()
    context = span.get_span_context()
    if not context.is_valid or not span.is_recording():
        return []
    flags = int(context.trace_flags)
    headers = [(TRACEPARENT, f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}")]
    state = context.trace_state.to_header() if context.trace_state else ""
    if state:
        headers.append((TRACESTATE, state))
    return headers


def sampled_parent(headers: Sequence[tuple[str, str]]) -> bool:
    """Whether the headers hold a ``traceparent`` whose sampled flag is set: a look at the
    strings only, for the records of traces nobody samples (most, at 1 %), before
    :func:`context_of` makes anything of one."""
    for name, value in headers:
        if name == TRACEPARENT:
            return len(value) >= 55 and value[-1] in _ODD
    return False


#: The last hex digit of trace flags with the sampled bit (``01``, ``03``…) set.
_ODD = frozenset("13579bdfBDF")


def context_of(headers: Sequence[tuple[str, str]]) -> Any:
    """The span context a record's ``traceparent`` names (``None``: it has none, or it is
    malformed — a bad header is the application's, never a reason to stop publishing)."""
    parent = state = None
    for name, value in headers:
        if name == TRACEPARENT:
            parent = value
        elif name == TRACESTATE:
            state = value
    if parent is None:
        return None
    parts = parent.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    api = _api()
    return api.SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=api.TraceFlags(flags & 1),
        trace_state=api.TraceState.from_header([state]) if state else None,
    )


def sampled_contexts(rows: Iterable[Sequence[tuple[str, str]]]) -> list[Any]:
    """The distinct sampled span contexts named by the ``traceparent`` of each of ``rows`` (one
    record's headers each), in order, at most :data:`MAX_LINKS`: what a span over these records
    continues. Records without a sampled trace cost a look at their headers only."""
    found: list[Any] = []
    seen: set[tuple[int, int]] = set()
    for headers in rows:
        if not sampled_parent(headers):
            continue
        context = context_of(headers)
        if context is None or (context.trace_id, context.span_id) in seen:
            continue
        seen.add((context.trace_id, context.span_id))
        found.append(context)
        if len(found) == MAX_LINKS:
            break
    return found


def continuing(
    tracer: Any,
    name: str,
    contexts: Sequence[Any],
    *,
    records: int,
    kind: str,
    attributes: Mapping[str, Any],
    start_time: int | None = None,
) -> Any:
    """A started span over ``records`` records that carry ``contexts`` (:func:`sampled_contexts`,
    not empty): the child of the record's span for one record, or for a batch a span of its own
    that links to each, as OpenTelemetry's messaging conventions say (which also say that a span
    of one message has no ``messaging.batch.message_count``: it is left out). ``kind``: the
    ``SpanKind`` by name (``"PRODUCER"``, ``"CONSUMER"``…); ``start_time`` in ns since the epoch
    (``None``: now)."""
    api = _api()
    parent = links = None
    if records == 1:
        parent = api.set_span_in_context(api.NonRecordingSpan(contexts[0]))
        # The conventions: a span of one message carries no batch count.
        attributes = {k: v for k, v in attributes.items() if k != "messaging.batch.message_count"}
    else:
        links = [api.Link(context) for context in contexts]
    return tracer.start_span(
        name, context=parent, kind=getattr(api.SpanKind, kind), attributes=dict(attributes), links=links,
        start_time=start_time,
    )  # fmt: skip


def end_span(span: Any, error: str | None = None, *, end_time: int | None = None) -> None:
    """End ``span``; with an ``error``, as failed for that reason."""
    if error is not None:
        api = _api()
        span.set_status(api.Status(api.StatusCode.ERROR, error))
    span.end(end_time=end_time)


_API: Any = None


def _api() -> Any:
    """``opentelemetry.trace``, imported once (a record's context is read per record)."""
    global _API
    if _API is None:
        from opentelemetry import trace

        _API = trace
    return _API


class Tracing:
    """Tracing in one of sluiceway's processes: its tracer, and the provider to flush at exit.
    ``owned``: the provider is sluiceway's (shut down at exit), not the application's."""

    def __init__(self, provider: Any, *, owned: bool = True) -> None:
        self.provider = provider
        self.owned = owned
        self.tracer = provider.get_tracer(SCOPE)
        self._lock = threading.Lock()
        self._shut = False

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Export the spans ended so far (a part of sluiceway stopping inside a process that goes
        on: the provider stays, for the application's spans and for a part started again)."""
        try:
            if not self.provider.force_flush(int(timeout * 1000)):
                log.warning("tracing: spans not exported within %g s", timeout)
        except Exception:  # an exporter that cannot reach its collector must not fail the stop
            log.warning("tracing: spans could not be exported", exc_info=True)

    def shutdown(self) -> None:
        """At the process's exit: export what is left (bounded by the exporter's own timeout) and
        stop our provider, once; an application's provider is only flushed (its own to stop)."""
        global _STARTED
        with self._lock:
            if self._shut:
                return
            self._shut = True
        with _START_LOCK:
            if _STARTED is self:
                _STARTED = None
        if not self.owned:
            self.flush()
            return
        try:
            self.provider.shutdown()
        except Exception:  # an exporter that cannot reach its collector must not fail the exit
            log.warning("tracing: the last spans could not be exported", exc_info=True)


def require_tracing() -> None:
    """Raise :class:`TracingError` (one line naming the fix) unless the ``otel`` extra is
    installed: checked before a process that traces starts anything."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
        from opentelemetry import trace  # noqa: F401
    except ImportError as exc:
        raise TracingError(
            f"tracing is enabled but {exc.name} is missing: pip install 'sluiceway[otel]'"
        ) from None


_STARTED: Tracing | None = None
_START_LOCK = threading.Lock()


def otel_environment() -> dict[str, str]:
    """This process's ``OTEL_*`` environment variables: what a process started elsewhere (a Spark
    executor's Python worker) needs to export its spans where this one does."""
    return {name: value for name, value in os.environ.items() if name.startswith("OTEL_")}


def start_tracing(service: str, environment: Mapping[str, str] | None = None) -> Tracing:
    """This process's tracing: an SDK tracer provider exporting OTLP over HTTP in batches,
    configured by the ``OTEL_*`` environment variables (``service`` names it unless
    ``OTEL_SERVICE_NAME`` does), made the global provider so that libraries that trace join the
    same traces, and shut down (its last spans exported) at exit. Started once per process: a
    second call returns the first's. ``environment``: ``OTEL_*`` variables to use when this
    process has none of its own (:func:`otel_environment` of the process that asked for it;
    never mixed with this process's own: an endpoint with another's headers)."""
    global _STARTED
    with _START_LOCK:
        if _STARTED is not None:
            return _STARTED
        require_tracing()
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            # An application that embeds sluiceway (``Harvest``, ``Feed``) and set up its own SDK:
            # our spans join its pipeline (its exporter, sampler, resource); a second provider
            # could not be made the global one, and would export the same traces elsewhere.
            _STARTED = Tracing(current, owned=False)
            return _STARTED
        if environment and not otel_environment():  # all of theirs, or all of this process's own
            os.environ.update(environment)

        named = Resource.create({"service.name": service, "process.pid": os.getpid()})
        resource = named.merge(OTELResourceDetector().detect())
        provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER, else parent-based
        # Small exports: encoding a batch holds the interpreter, and a long hold stalls the
        # process's I/O threads far beyond its own CPU time (docs/benchmarks.md, "Tracing").
        batch = None if "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" in os.environ else EXPORT_BATCH
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), max_export_batch_size=batch))
        trace.set_tracer_provider(provider)
        _STARTED = Tracing(provider)
        atexit.register(_STARTED.shutdown)
        return _STARTED
