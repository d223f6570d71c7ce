"""Tracing in an application that embeds the harvester (``Harvest``): its spans join the
application's own OpenTelemetry SDK when it has one, and a stopped harvester leaves the process's
provider working — the application's later spans, and a harvester started again, still export.
Each case runs in a process of its own: OpenTelemetry's global provider is set once a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.otlp import otlp_receiver

pytestmark = pytest.mark.timeout(120)

#: The embedding application: argv[1] ``own`` (it sets up its SDK, exporting to memory),
#: ``none`` (no SDK of its own: the harvester's is the process's) or ``batch`` (its own SDK; three
#: requests stash a row each before one harvester publishes them); argv[2] a work directory.
APP = """
import json, sqlite3, sys, time
from pathlib import Path
from opentelemetry import trace
from sluiceway import Harvest, HarvestConfig, OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.outbox import init_outbox

mode, work = sys.argv[1], Path(sys.argv[2])
memory = None
if mode in ("own", "batch"):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
dsn = f"sqlite:///{work / 'app.db'}"
with Database(dsn) as db:
    init_outbox(db)
cfg = HarvestConfig.from_dict({"harvest": {
    "dataSource": dsn, "journal": {"path": str(work / "journal")}, "tracing": {"enabled": True},
}})
tracer = trace.get_tracer("shop")

# A request per key stashes its row, then one harvester publishes them all: the requests' span ids.
def run_once(*keys):
    conn = sqlite3.connect(work / "app.db")
    requests = []
    for key in keys:
        with tracer.start_as_current_span("POST /orders/" + key) as request:
            Stasher().stash(conn, OutboxRecord("orders", key, "{}"))
        requests.append(format(request.get_span_context().span_id, "016x"))
    conn.commit()
    with Harvest(cfg):
        deadline = time.monotonic() + 30
        while conn.execute("SELECT count(*) FROM outbox").fetchone()[0]:
            assert time.monotonic() < deadline, "the outbox did not drain"
            time.sleep(0.05)
    conn.close()
    return requests

if mode == "batch":
    requests = run_once("x", "y", "z")
    spans = [
        {"name": s.name, "parent": s.parent and format(s.parent.span_id, "016x"),
         "links": [format(link.context.span_id, "016x") for link in s.links],
         "count": s.attributes.get("messaging.batch.message_count"),
         "took": s.end_time - s.start_time}
        for s in memory.get_finished_spans() if s.name.startswith("publish")
    ]
    print(json.dumps({"requests": requests, "spans": spans}))
    sys.exit(0)
requests = run_once("a")
with tracer.start_as_current_span("after the harvester stopped"):
    pass
requests += run_once("b")  # a harvester started again in the same process
names = None
if memory is not None:
    names = [(s.name, s.parent and format(s.parent.span_id, "016x")) for s in memory.get_finished_spans()]
print(json.dumps({"requests": requests, "spans": names}))
"""


def run_app(mode: str, work: Path, env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", APP, mode, str(work)],
        capture_output=True, text=True, timeout=90,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Overriding" not in done.stderr, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_harvester_joins_the_applications_own_sdk_and_leaves_it_working(tmp_path: Path) -> None:
    out = run_app("own", tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    spans = out["spans"]
    # Each publish went to the application's exporter, a child of its request's span.
    publishes = [parent for name, parent in spans if name.startswith("publish")]
    assert publishes == out["requests"], spans
    assert ["after the harvester stopped", None] in spans


def test_a_stopped_harvester_leaves_the_process_provider_exporting(tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_SERVICE_NAME": "embedding-app",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        out = run_app("none", tmp_path, env)
        spans = receiver.of("embedding-app")
    names = [s.name for s in spans]
    # The first request ran before any SDK was set up (the harvester's is the process's): not
    # traced, so its publish has no span. Then the application's spans after the first harvester
    # stopped (the span between, the second request) exported through the same provider, and the
    # second harvester's publish, a child of the second request's span.
    assert out["requests"][0] == "0" * 16
    assert "after the harvester stopped" in names and "POST /orders/b" in names, names
    parents = [s.parent_span_id for s in spans if s.name.startswith("publish")]
    assert parents == [out["requests"][1]], (parents, out["requests"])


def test_rows_published_together_record_by_record_are_one_span_linking_each_request(tmp_path: Path) -> None:
    # The journal's publisher is sent to record by record (as Kafka's is): the three rows, marked
    # together, are one dispatched batch, and so one publish span that links each row's request.
    out = run_app("batch", tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    (span,) = out["spans"]
    assert span["parent"] is None and span["count"] == 3, span
    assert sorted(span["links"]) == sorted(out["requests"]) and span["took"] > 0, span
