"""A real OTLP/HTTP trace receiver for the tests: an HTTP server that decodes what OpenTelemetry's
exporters POST to ``/v1/traces`` (``ExportTraceServiceRequest`` protobuf, gzip or not) with the
``opentelemetry-proto`` messages, and keeps every span with its service, parent and links."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import ROOT
from tests.support.http import Quiet, serving


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    #: (trace id, span id) of each link, hex.
    links: list[tuple[str, str]]
    status_code: int
    #: The exporting process (its ``process.pid`` resource attribute; 0: not given).
    pid: int = 0
    #: When it started and ended (ns since the epoch).
    start: int = 0
    end: int = 0


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Receiver:
    url: str
    spans: list[Span] = field(default_factory=list)
    requests: int = 0

    def of(self, service: str) -> list[Span]:
        return [s for s in self.spans if s.service == service]


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    lock = threading.Lock()
    receiver = Receiver("")

    class Handler(Quiet):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            request = ExportTraceServiceRequest.FromString(body)
            found = []
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                service = resource.get("service.name", "")
                for scope in resource_spans.scope_spans:
                    for s in scope.spans:
                        found.append(
                            Span(
                                service=service,
                                name=s.name,
                                kind=s.kind,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_span_id=s.parent_span_id.hex(),
                                attributes={a.key: _value(a.value) for a in s.attributes},
                                links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                                status_code=s.status.code,
                                pid=int(resource.get("process.pid", 0)),
                                start=s.start_time_unix_nano,
                                end=s.end_time_unix_nano,
                            )
                        )
            with lock:
                receiver.spans.extend(found)
                receiver.requests += 1
            self.reply(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

    with serving(Handler) as url:
        receiver.url = url
        yield receiver


#: The application: each argument a key; "-" before one stashes it outside any span.
APP = """
import sqlite3, sys
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sluiceway import OutboxRecord, Stasher

provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1] + "/v1/traces")))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("shop")
conn = sqlite3.connect(sys.argv[2])
stash = Stasher().prepare(conn)
for key in sys.argv[4:]:
    record = OutboxRecord(sys.argv[3], key.lstrip("-"), '{"order": "%s"}' % key)
    if key.startswith("-"):
        stash.stash(record)
    else:
        with tracer.start_as_current_span("POST /orders/" + key) as span:
            stash.stash(record)
            carrier = {}  # the header as OpenTelemetry's own W3C propagator writes it
            TraceContextTextMapPropagator().inject(carrier)
            print(key, format(span.get_span_context().trace_id, "032x"),
                  format(span.get_span_context().span_id, "016x"), carrier["traceparent"], flush=True)
conn.commit()
provider.shutdown()
"""


def stash(receiver_url: str, db: Path, topic: str, *keys: str) -> dict[str, tuple[str, str]]:
    """Run the application; (trace id, span id) of each key's request span (and its
    ``traceparent`` as OpenTelemetry's propagator writes it, in ``PARENTS``)."""
    done = subprocess.run(
        [sys.executable, "-c", APP, receiver_url, str(db), topic, *keys],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = {}
    for key, trace_id, span_id, parent in (line.split() for line in done.stdout.splitlines()):
        found[key] = (trace_id, span_id)
        PARENTS[key] = parent
    return found


PARENTS: dict[str, str] = {}
