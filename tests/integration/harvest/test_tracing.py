"""One trace from the request that wrote the outbox row to the publish that sent it (issue 41):
an application process stashes rows inside request spans (OpenTelemetry's SDK, exporting to a
real OTLP/HTTP receiver started by the test); ``sluice reap`` with ``tracing: {enabled: true}``
publishes them to Redis Streams and exports its own spans to the same receiver (configured only
by the ``OTEL_*`` variables). Rows marked together are published as one batch: its span links to
each row's request span; a row published alone gets a child span of its request's. The
``traceparent`` header travels to the broker unchanged; a row stashed outside any span has none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sluiceway.db import Database
from sluiceway.outbox import init_outbox
from sluiceway.testing import wait_until
from tests.support import ROOT
from tests.support.brokers import make_place
from tests.support.journal import make_journal
from tests.support.metrics import sluice_process
from tests.support.otlp import PARENTS, otlp_receiver, stash
from tests.support.outbox import outbox_count

pytestmark = pytest.mark.timeout(120)

#: OTLP's SPAN_KIND_PRODUCER.
PRODUCER = 4


def test_a_trace_runs_from_the_request_through_the_harvester_to_the_broker(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    dsn = f"sqlite:///{db}"
    with Database(dsn) as database:
        init_outbox(database)
    place = make_place("redis")
    topic = place.topic("orders")
    config = tmp_path / "reaper.yaml"
    harvest = {"dataSource": dsn, "target": place.target(), "tracing": {"enabled": True}}
    config.write_text(yaml.safe_dump({"harvest": harvest, "logging": {"level": "Warn"}}))
    try:
        with otlp_receiver() as receiver:
            # Three rows before the harvester runs (marked, and so published, together), one
            # outside any span.
            spans = stash(receiver.url, db, topic, "a", "b", "c", "-plain")
            env = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                "OTEL_SERVICE_NAME": "reaper-under-test",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            }
            with sluice_process(["reap", "-f", str(config)], tmp_path / "reap.log", env=env) as proc:
                wait_until(lambda: outbox_count(dsn) == 0, timeout=60, message="the outbox to drain")
                spans |= stash(receiver.url, db, topic, "d")  # alone: a batch of one
                wait_until(lambda: outbox_count(dsn) == 0, timeout=60, message="the last row")
                wait_until(lambda: place.count() == 5, timeout=30, message="five messages in Redis")
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(30) == 0, (tmp_path / "reap.log").read_text()[-2000:]
            # The application's spans reached the receiver; the harvester's were flushed at exit.
            assert {s.name for s in receiver.of("shop")} == {f"POST /orders/{k}" for k in "abcd"}
            published = receiver.of("reaper-under-test")
            assert published and all(s.kind == PRODUCER for s in published)
            for s in published:
                assert s.attributes["messaging.system"] == "redis" and s.status_code != 2
                assert s.attributes["messaging.destination.name"] == topic
                assert s.attributes["messaging.operation.type"] == "send"
            # d went alone: a child of its request span, in its trace.
            d_trace, d_span = spans["d"]
            (child,) = [s for s in published if s.parent_span_id == d_span]
            assert child.trace_id == d_trace and "messaging.batch.message_count" not in child.attributes
            assert child.name == f"publish {topic}" and child.attributes["messaging.message.id"]
            # a, b and c went together: one span linking to each request span (and the untraced
            # row adds no link).
            (batch,) = [s for s in published if s.attributes.get("messaging.batch.message_count", 1) > 1]
            assert sorted(batch.links) == sorted(spans[k] for k in "abc")
            assert batch.parent_span_id == "" and batch.attributes["messaging.batch.message_count"] == 4
        # The header reached Redis unchanged, with each message; the plain row has none.
        seen = {key: dict(headers) for key, _value, headers in place.read(topic)}
        for key in "abcd":
            trace_id, span_id = spans[key]
            assert seen[key]["traceparent"] == PARENTS[key]  # as OpenTelemetry's propagator writes it
            assert seen[key]["traceparent"].startswith(f"00-{trace_id}-{span_id}-")
        assert "traceparent" not in seen["plain"]
    finally:
        place.cleanup()


def test_no_sdk_no_span_no_header(tmp_path: Path) -> None:
    """The API without an SDK (or no span at all) writes no header and costs no export."""
    import sqlite3

    from opentelemetry import trace

    from sluiceway import OutboxRecord, Stasher
    from sluiceway.tracing import context_of, trace_headers

    db = tmp_path / "shop.db"
    with Database(f"sqlite:///{db}") as database:
        init_outbox(database)
    conn = sqlite3.connect(db)
    with trace.get_tracer("no-sdk").start_as_current_span("ignored"):
        assert trace_headers() == []
        Stasher().stash(conn, OutboxRecord("t", "k", "{}"))
    conn.commit()
    (headers,) = conn.execute("SELECT kafka_header_keys FROM outbox").fetchone()
    assert "traceparent" not in (headers or "")
    # A malformed traceparent is the application's: no context, and no error.
    zero, short = "00-" + "0" * 32 + "-" + "1" * 16 + "-01", "00-" + "a" * 32 + "-" + "b" * 15 + "-01"
    for bad in ("", "00-xyz", zero, short):
        assert context_of([("traceparent", bad)]) is None
    good = context_of([("traceparent", "00-" + "a" * 32 + "-" + "b" * 16 + "-01"), ("tracestate", "k=v")])
    assert good.trace_id == int("a" * 32, 16) and good.is_remote and good.trace_state.get("k") == "v"


#: The application on PostgreSQL: each argument a transaction, its rows "id:id:…", each row
#: written inside a span of its own with that span's traceparent in the ``trace`` column.
PG_APP = """
import sys, psycopg
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1] + "/v1/traces")))
tracer = provider.get_tracer("shop")
with psycopg.connect(sys.argv[2]) as conn:
    for group in sys.argv[3:]:
        with conn.transaction():
            for row in group.split(":"):
                with tracer.start_as_current_span("POST /orders/" + row, context=None) as span:
                    carrier = {}
                    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
                    parent = carrier["traceparent"]
                    conn.execute("INSERT INTO traced (id, trace) VALUES (%s, %s)", (int(row), parent))
                    c = span.get_span_context()
                    print(row, format(c.trace_id, "032x"), format(c.span_id, "016x"), parent, flush=True)
provider.shutdown()
"""


def test_a_capture_continues_the_trace_its_trace_column_names(cdc_dsn: str, tmp_path: Path) -> None:
    import psycopg

    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE traced (id int PRIMARY KEY, note text, trace text)")
    place = make_place("redis")
    capture = {
        "name": "traced", "dsn": cdc_dsn, "tables": ["public.traced"], "slot": "traced",
        "publication": "traced", "snapshot": "never", "stateDir": str(tmp_path / "state"),
        "target": place.target(), "topic": f"{place.prefix}.{{table}}",
        "tracing": {"enabled": True}, "traceColumn": "trace", "election": {"leaseTimeout": "2s"},
    }  # fmt: skip
    config = tmp_path / "capture.yaml"
    config.write_text(yaml.safe_dump({"capture": capture, "logging": {"level": "Warn"}}))

    def slot_active() -> bool:
        with psycopg.connect(cdc_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = 'traced'"
            ).fetchone()
        return bool(row and row[0])

    try:
        with otlp_receiver() as receiver:
            env = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                "OTEL_SERVICE_NAME": "capture-under-test",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            }
            with sluice_process(["capture", "-f", str(config)], tmp_path / "capture.log", env=env) as proc:
                wait_until(slot_active, timeout=60, message="the capture to read its slot")
                rows: dict[str, tuple[str, str, str]] = {}
                app_env = {**os.environ, "PYTHONPATH": str(ROOT)}
                # Row 1's transaction published before the next is written: two transactions
                # read together would go as one batch, a span linking to both.
                for groups, published_by_then in ((["1"], 1), (["2:3:4"], 4)):
                    done = subprocess.run(
                        [sys.executable, "-c", PG_APP, receiver.url, cdc_dsn, *groups],
                        capture_output=True, text=True, timeout=60, env=app_env,
                    )  # fmt: skip
                    assert done.returncode == 0, done.stderr
                    rows |= {
                        r: (t, s, p) for r, t, s, p in (line.split() for line in done.stdout.splitlines())
                    }
                    wait_until(
                        lambda n=published_by_then: place.count() == n,
                        timeout=60,
                        message="the changes in Redis",
                    )
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(30) == 0, (tmp_path / "capture.log").read_text()[-2000:]
            published = receiver.of("capture-under-test")
            assert published and all(s.kind == PRODUCER for s in published)
            assert all(s.attributes["messaging.system"] == "redis" for s in published)
            # Row 1's transaction alone: a child of its request span.
            trace_1, span_1, _ = rows["1"]
            (child,) = [s for s in published if s.parent_span_id == span_1]
            assert child.trace_id == trace_1 and "messaging.batch.message_count" not in child.attributes
            # Rows 2, 3, 4 in one transaction: their publish links to each of their traces.
            linked = {link for s in published for link in s.links}
            assert {(rows[r][0], rows[r][1]) for r in "234"} <= linked
        # Each change carries its row's traceparent to Redis.
        seen = {key: dict(headers) for key, _value, headers in place.read(f"{place.prefix}.traced")}
        assert {key: h["traceparent"] for key, h in seen.items()} == {r: rows[r][2] for r in "1234"}
    finally:
        place.cleanup()


def test_tracing_without_the_otel_extra_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    """An ``opentelemetry`` with no SDK or exporter in it (the extra not installed) shadows the real
    one: ``sluice reap``, ``sluice capture``, ``sluice pipeline run`` and ``sluice feed worker
    --tracing`` each say so in one line, exit 1, and create nothing (no Spark session starts)."""
    shadow = tmp_path / "shadow" / "opentelemetry"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    db = tmp_path / "shop.db"
    with Database(f"sqlite:///{db}") as database:
        init_outbox(database)
    reaper = tmp_path / "reaper.yaml"
    reaper.write_text(yaml.safe_dump({"harvest": {
        "dataSource": f"sqlite:///{db}", "journal": {"path": str(tmp_path / "j")},
        "tracing": {"enabled": True},
    }}))  # fmt: skip
    capture = tmp_path / "capture.yaml"
    capture.write_text(yaml.safe_dump({"capture": {
        "dsn": "host=127.0.0.1 port=1 user=postgres dbname=x", "tables": ["public.t"], "slot": "s1",
        "publication": "s1", "journal": {"path": str(tmp_path / "cj")}, "tracing": {"enabled": True},
    }}))  # fmt: skip
    make_journal(tmp_path / "src", [])
    pipeline = tmp_path / "orders.yaml"
    pipeline.write_text(yaml.safe_dump({"pipeline": {
        "name": "orders", "source": {"type": "journal", "path": str(tmp_path / "src")},
        "sinks": [{"name": "copy", "type": "journal", "path": str(tmp_path / "pj")}],
        "checkpoint": str(tmp_path / "cp"), "tracing": {"enabled": True},
    }}))  # fmt: skip
    work = f"sqlite:///{tmp_path / 'work.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(ROOT / "src")])}
    for args in (
        ["reap", "-f", str(reaper)],
        ["capture", "-f", str(capture)],
        ["pipeline", "run", str(pipeline)],
        ["feed", "worker", "--dsn", work, "--processor", "json:dumps", "--tracing"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "sluiceway.cli.main", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode == 1 and len(errors) == 1, done.stderr
        assert (
            "tracing is enabled but opentelemetry" in errors[0]
            and "pip install 'sluiceway[otel]'" in errors[0]
        )
        assert "Traceback" not in done.stderr
    assert not any((tmp_path / name).exists() for name in ("j", "cj", "pj", "cp", "work.db"))
