"""Shared bench plumbing: throwaway databases, result tables and the closing JSON line."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.table import Table

PG_SERVER = os.environ.get("SLUICE_BENCH_POSTGRES", "host=127.0.0.1 port=5432 user=postgres dbname=postgres")


@contextmanager
def scratch_postgres(prefix: str = "sluice_bench") -> Iterator[str]:
    """A fresh Postgres database for one bench run, dropped afterwards."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_SERVER, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(PG_SERVER)
    params["dbname"] = name
    try:
        yield make_conninfo(**params)  # type: ignore[arg-type]
    finally:
        with psycopg.connect(PG_SERVER, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def report(title: str, rows: list[tuple[str, str]], summary: dict[str, Any]) -> None:
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
    print(json.dumps(summary))


def timed_drain(config: Any, rows: int, left: Any) -> float:
    """Records/s of an embedded harvester with ``config`` draining ``rows`` rows: timed from
    leadership until ``left()`` (rows still in the outbox) is 0."""
    import threading
    import time

    from sluiceway.harvest import Harvest, LeaderAcquired
    from sluiceway.testing import wait_until

    acquired = threading.Event()
    harvest = Harvest(config)
    harvest.set_event_handler(lambda e: acquired.set() if isinstance(e, LeaderAcquired) else None)
    harvest.start()
    try:
        wait_until(acquired.is_set, timeout=30)
        start = time.perf_counter()
        wait_until(lambda: left() == 0, timeout=900, interval=0.01)
        elapsed = time.perf_counter() - start
    finally:
        harvest.stop()
    return rows / elapsed


_OTLP_SINK = """
import sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

received = [0]
lock = threading.Lock()

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = ExportTraceServiceRequest.FromString(body)
        with lock:
            received[0] += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        body = str(received[0]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextmanager
def otlp_sink() -> Iterator[tuple[str, Any]]:
    """An OTLP/HTTP endpoint that takes trace exports and counts their spans, in a process of its
    own (as a collector is: its decoding must not share the measured process's core): ``(url,
    count)``, ``count()`` the spans received so far."""
    import subprocess
    import sys
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-c", _OTLP_SINK], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = f"http://127.0.0.1:{int(proc.stdout.readline())}"

        def count() -> int:
            with urllib.request.urlopen(url + "/count", timeout=10) as response:
                return int(response.read())

        yield url, count
    finally:
        proc.terminate()
        proc.wait(10)
