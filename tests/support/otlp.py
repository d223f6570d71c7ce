"""A real OTLP/HTTP trace receiver for the tests: an HTTP server that decodes what OpenTelemetry's
exporters POST to ``/v1/traces`` (``ExportTraceServiceRequest`` protobuf, gzip or not) with the
``opentelemetry-proto`` messages, and keeps every span with its service, parent and links."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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

    class Handler(BaseHTTPRequestHandler):
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
                service = next(
                    (_value(a.value) for a in resource_spans.resource.attributes if a.key == "service.name"),
                    "",
                )
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
                            )
                        )
            with lock:
                receiver.spans.extend(found)
                receiver.requests += 1
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
