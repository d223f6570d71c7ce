"""One trace from the request that wrote the outbox row to the worker that processed its feed item
(issue 41), every process exporting to one real OTLP/HTTP receiver started by the test:

an application stashes three rows, each inside a request span of its own → ``sluice reap``
publishes them to Kafka → ``sluice pipeline run`` reads the topic and writes a Parquet sink and a
feed sink → ``sluice feed worker --tracing`` hands each item to an HTTP processor served by the
test. Every span is in one of the three requests' traces: the harvester's publish, the pipeline
driver's span per sink per batch (the batch carries three traces: it links to each), the write
span of each part on an executor (a Python worker: another process), the worker's span per item
(its request's child), and the HTTP request the processor sent carries the worker span's
``traceparent``. The records reach Parquet with their ``traceparent`` header unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from sluiceway.db import Database
from sluiceway.outbox import init_outbox
from sluiceway.testing import wait_until
from tests.support import ROOT
from tests.support.http import Quiet, serving
from tests.support.metrics import sluice_process
from tests.support.otlp import PARENTS, Receiver, Span, otlp_receiver, stash
from tests.support.outbox import outbox_count
from tests.support.waterfall import waterfall

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

#: OTLP's span kinds.
PRODUCER, CONSUMER = 4, 5


@contextmanager
def processor() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An HTTP processor: completes each item, and keeps its body and ``traceparent`` header."""
    seen: list[dict[str, Any]] = []

    class Handler(Quiet):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"item": body, "traceparent": self.headers.get("traceparent")})
            self.reply(200, b'{"done": true}', "application/json")

    with serving(Handler) as url:
        yield f"{url}/item", seen


def run(args: list[str], log: Path, env: dict[str, str], timeout: float = 240) -> None:
    with sluice_process(args, log, env=env) as proc:
        assert proc.wait(timeout) == 0, log.read_text()[-3000:]


def test_one_trace_from_the_request_to_the_worker(tmp_path: Path, kafka: Any) -> None:
    shop, feed_db = tmp_path / "shop.db", tmp_path / "work.db"
    dsn, feed = f"sqlite:///{shop}", f"sqlite:///{feed_db}"
    with Database(dsn) as database:
        init_outbox(database)
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    reaper = tmp_path / "reaper.yaml"
    harvest = {
        "dataSource": dsn,
        "baseKafkaConfig": {"bootstrap.servers": kafka.bootstrap},
        "election": {"kind": "database"},
        "tracing": {"enabled": True},
    }
    reaper.write_text(yaml.safe_dump({"harvest": harvest, "logging": {"level": "Warn"}}))
    pipeline = tmp_path / "orders.yaml"
    spec = {
        "name": "orders",
        "source": {"type": "kafka", "topic": topic, "config": {"bootstrap.servers": kafka.bootstrap}},
        "sinks": [
            {"name": "lake", "type": "parquet", "path": str(tmp_path / "lake")},
            {"name": "work", "type": "feed", "dsn": feed, "partition": "{key}"},
        ],
        "checkpoint": str(tmp_path / "checkpoints"),
        "tracing": {"enabled": True},
    }
    pipeline.write_text(yaml.safe_dump({"pipeline": spec}))
    with otlp_receiver() as receiver, processor() as (url, seen):
        requests = stash(receiver.url, shop, topic, "a", "b", "c")
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        with sluice_process(["reap", "-f", str(reaper)], tmp_path / "reap.log", env=env) as reap:
            wait_until(lambda: outbox_count(dsn) == 0, timeout=60, message="the outbox to drain")
            reap.send_signal(signal.SIGTERM)
            assert reap.wait(30) == 0, (tmp_path / "reap.log").read_text()[-2000:]
        run(["pipeline", "run", str(pipeline), "--once", "--master", "local[2]"], tmp_path / "run.log", env)
        worker = ["feed", "worker", "--dsn", feed, "--processor", url, "--until-idle", "--tracing"]
        run(worker, tmp_path / "worker.log", env, timeout=60)
        wait_until(
            lambda: len(spans_of(receiver, "sluice-feed-worker")) == 3, timeout=30, message="3 item spans"
        )

        traces = {trace for trace, _span in requests.values()}
        request_spans = set(requests.values())
        # Every span sluiceway made is in one of the requests' traces or links to them.
        made = [s for s in receiver.spans if s.service != "shop"]
        for s in made:
            assert s.trace_id in traces or set(s.links) <= request_spans, s
        # The harvester: a publish span per send, continuing the requests.
        published = spans_of(receiver, "sluice-reap")
        assert published and all(s.kind == PRODUCER for s in published)
        assert {s.attributes["messaging.destination.name"] for s in published} == {topic}
        assert continued(published) == request_spans
        # The pipeline's driver: one span per sink for the batch of three, linking each request.
        pipeline_spans = spans_of(receiver, "sluice-pipeline")
        driver = [s for s in pipeline_spans if s.name.startswith("process ")]
        assert sorted(s.name for s in driver) == ["process orders.lake", "process orders.work"]
        for s in driver:
            assert s.kind == CONSUMER and s.status_code != 2
            assert sorted(s.links) == sorted(request_spans) and s.parent_span_id == ""
            assert s.attributes["messaging.system"] == "kafka"
            assert s.attributes["messaging.batch.message_count"] == 3
        # The feed sink's parts, written by executors' Python workers (Parquet is Spark's own).
        writes = [s for s in pipeline_spans if s.name.startswith("write ")]
        assert writes and {s.name for s in writes} == {"write work"}
        assert continued(writes) == request_spans
        assert {s.pid for s in writes}.isdisjoint({s.pid for s in driver}), "the tasks' own processes"
        # The worker: each item's span is its request's child, current while the processor ran.
        items = spans_of(receiver, "sluice-feed-worker")
        assert {(s.trace_id, s.parent_span_id) for s in items} == request_spans
        assert all(s.kind == CONSUMER and s.status_code != 2 for s in items)
        assert sorted(s.attributes["messaging.destination.name"] for s in items) == ["a", "b", "c"]
        sent = {entry["traceparent"] for entry in seen}
        assert sent == {f"00-{s.trace_id}-{s.span_id}-01" for s in items}
        assert sorted(entry["item"]["attributes"]["traceparent"] for entry in seen) == sorted(
            PARENTS[k] for k in "abc"
        )
        # The picture of request a's trace in docs/operations.md.
        picture = tmp_path / "trace.svg"
        drawn = waterfall(receiver.spans, requests["a"][0], "One order's trace, outbox to worker", picture)
        # request, publish, the two sinks' batch spans, the write of its part, its item: 6 (and a
        # background and four services' colours)
        assert len(drawn) == 6 and picture.read_text().count("<rect") == 1 + 6 + 4
        if os.environ.get("SLUICE_DOCS_SHOTS") == "1":
            shutil.copy(picture, ROOT / "docs" / "images" / "trace-waterfall.svg")
    # The records reached the lake with their headers unchanged.
    table = pq.read_table(tmp_path / "lake")
    landed = {row["key"]: dict((h["key"], h["value"]) for h in row["headers"]) for row in table.to_pylist()}
    assert {key: headers["traceparent"] for key, headers in landed.items()} == {k: PARENTS[k] for k in "abc"}


def spans_of(receiver: Receiver, service: str) -> list[Span]:
    return receiver.of(service)


def continued(spans: list[Span]) -> set[tuple[str, str]]:
    """The request spans these spans continue: their parents, and what they link to."""
    found = {(s.trace_id, s.parent_span_id) for s in spans if s.parent_span_id}
    return found | {link for s in spans for link in s.links}
