"""``sluice demo``: the whole system end to end on the embedded default, self-checking.

orders service (SQLite, 4 threads) ─► outbox ─► harvester ─► journal (or Kafka)
    ─► Spark pipeline (namespace filter, transform) ─► Parquet + feed ─► feed workers (2 gates)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sluiceway.db import Database
from sluiceway.demo.shop import ShopResult, check_order, prepare_shop, run_shop
from sluiceway.errors import SluicewayError


@dataclass
class Stage:
    name: str
    records: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


@dataclass
class DemoReport:
    data_dir: Path
    stages: list[Stage] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    duplicates: int = 0
    outputs: list[tuple[str, str]] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    #: The workspace file naming everything the demo made (for ``sluice status`` and ``sluice ui``).
    workspace: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


class DemoFailed(SluicewayError):
    pass


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _outbox_rows(dsn: str) -> int:
    with Database(dsn) as db:
        row = db.fetchone("SELECT count(*) FROM outbox")
        return int(row[0]) if row else 0


def run_demo(
    records: int = 20_000,
    *,
    data_dir: str | Path = "sluice-demo",
    kafka: str | None = None,
    postgres: str | None = None,
    console: Console | None = None,
) -> DemoReport:
    """Run the demo; return its report (``report.ok`` says whether every check passed)."""
    console = console or Console()
    root = Path(data_dir).resolve()
    if root.exists():
        shutil.rmtree(root)  # reuse the data dir: start each run from nothing
    root.mkdir(parents=True)
    report = DemoReport(root)
    dsn = postgres or f"sqlite:///{root / 'shop.db'}"
    journal_path = root / "journal"
    run_id = f"{time.time_ns():x}"
    # With Kafka, topics outlive the run: give this run its own, so it reads only its own events.
    prefix = f"sluice-demo-{run_id}." if kafka else ""
    topics = (f"{prefix}orders.created", f"{prefix}orders.paid")

    console.rule("[bold]sluiceway demo")
    console.print(
        # Paths and DSNs are the user's: escaped, so that a [bracket] in them is not read as markup.
        escape(
            f"data dir: {root}\noutbox:   {Database(dsn).source.redacted()}\n"
            f"bus:      {'Kafka at ' + kafka if kafka else 'journal at ' + str(journal_path)}\n"
        )
    )
    prepare_shop(dsn)
    if kafka:
        _ensure_topics(kafka, topics)

    # 1 + 2: the orders service writes while the harvester publishes, concurrently.
    harvest = _start_harvester(dsn, journal_path, kafka, root)
    try:
        with _progress(console) as progress:
            shop_task = progress.add_task("orders service → outbox", total=records)
            harvest_task = progress.add_task(
                "harvester → " + ("Kafka" if kafka else "journal"), total=records
            )
            written = [0]
            lock = threading.Lock()

            def tick(_: int) -> None:
                with lock:
                    written[0] += 1
                    if written[0] % 200 == 0:
                        progress.update(shop_task, completed=written[0])

            started = time.perf_counter()
            shop_box: list[ShopResult] = []
            shop_thread = threading.Thread(
                target=lambda: shop_box.append(run_shop(dsn, records, progress=tick, topic_prefix=prefix))
            )
            shop_thread.start()
            while shop_thread.is_alive():
                shop_thread.join(0.2)
                progress.update(harvest_task, completed=max(0, written[0] - _outbox_rows(dsn)))
            shop = shop_box[0] if shop_box else None
            if shop is None:
                raise DemoFailed("the orders service failed; see the log above")
            shop_seconds = time.perf_counter() - started
            progress.update(shop_task, completed=shop.events)
            deadline = time.monotonic() + 120
            while (left := _outbox_rows(dsn)) and time.monotonic() < deadline:
                progress.update(harvest_task, completed=shop.events - left)
                time.sleep(0.1)
            harvest_seconds = time.perf_counter() - started
            progress.update(harvest_task, completed=shop.events - _outbox_rows(dsn))
    finally:
        harvest.stop()
    report.stages.append(Stage("orders service (outbox rows)", shop.events, shop_seconds))
    report.stages.append(Stage("harvester (published)", shop.events - _outbox_rows(dsn), harvest_seconds))
    if _outbox_rows(dsn):
        report.problems.append(f"{_outbox_rows(dsn)} outbox rows were not harvested")

    published = _read_published(journal_path, kafka, topics)
    count, dups, problems = check_order(published, shop.expected(per_topic=bool(kafka)))
    report.duplicates += dups
    report.problems.extend(problems[:10])
    if count < shop.events:
        report.problems.append(f"only {count} of {shop.events} events reached the bus")
    report.outputs.append(
        ("journal", str(journal_path)) if not kafka else ("Kafka topics", ", ".join(topics))
    )
    if not kafka:
        report.commands.append(f"sluice journal read {journal_path} --from 0 --to 5")
        report.commands.append(f"sluice journal info {journal_path}")
    report.commands.append(f"sluice outbox stats --dsn {dsn}")

    # 3: the Spark pipeline: namespace filter, transform, Parquet + feed sinks.
    created = sum(len(v) for (t, _), v in shop.by_topic.items() if t.endswith("orders.created"))
    paid = sum(len(v) for (t, _), v in shop.by_topic.items() if t.endswith("orders.paid"))
    spec_path = _pipeline_spec(root, journal_path, kafka, topics)
    _run_pipeline(console, spec_path, root, report, created, paid)
    report.commands.append(f"sluice pipeline status {spec_path}")

    # 4: feed workers take each customer's paid orders through two gates.
    _run_feed(console, root, report, paid)
    report.commands.append(f"sluice feed status --dsn sqlite:///{root / 'feed.db'}")
    report.workspace = write_workspace(root, dsn, None if kafka else journal_path, spec_path)
    report.commands.append(f"sluice status --config {report.workspace}")
    _summary(console, report)
    return report


def write_workspace(root: Path, dsn: str, journal_path: Path | None, spec_path: Path) -> Path:
    """``sluice.yaml`` naming the demo's outbox (and its harvester's lease), journal, pipeline and
    feed, so that ``sluice status`` and ``sluice ui`` show them."""
    import yaml

    from sluiceway.config import validate
    from sluiceway.overview import Workspace

    data: dict[str, Any] = {
        # The demo's harvester is named "demo": its lease (election) has that name too.
        "outboxes": [{"name": "shop", "dsn": dsn, "election": "demo"}],
        "journals": [{"name": "bus", "path": str(journal_path)}] if journal_path else [],
        "pipelines": [str(spec_path)],
        "feeds": [{"name": "fulfilment", "dsn": f"sqlite:///{root / 'feed.db'}"}],
    }
    validate(Workspace, data)  # what we write must load
    path = root / "sluice.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _pipeline_spec(root: Path, journal_path: Path, kafka: str | None, topics: tuple[str, ...]) -> Path:
    """Write the demo's pipeline as YAML (so `sluice pipeline status` can read it afterwards)."""
    import yaml

    if kafka:
        source: dict[str, Any] = {
            "type": "kafka",
            "topic": list(topics),
            "config": {"bootstrap.servers": kafka},
            "starting_offsets": "earliest",
        }
    else:
        source = {"type": "journal", "path": str(journal_path)}
    spec = {
        "pipeline": {
            "name": "demo-orders",
            "source": source,
            "namespace": "(^|\\.)orders\\.",
            "transforms": [{"python": "sluiceway.demo.work:enrich"}],
            "sinks": [
                {
                    "name": "lake",
                    "type": "parquet",
                    "path": str(root / "lake"),
                    "namespace": "orders\\.created$",
                },
                {
                    "name": "fulfilment",
                    "type": "feed",
                    "dsn": f"sqlite:///{root / 'feed.db'}",
                    "namespace": "orders\\.paid$",
                    "partition": "{key}",
                    "if_exists": "append",
                },
            ],
            "checkpoint": str(root / "checkpoints"),
        }
    }
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _run_pipeline(
    console: Console, spec_path: Path, root: Path, report: DemoReport, created: int, paid: int
) -> None:
    import pyarrow.parquet as pq

    from sluiceway.pipeline import Pipeline, PipelineSpec
    from sluiceway.pipeline.session import build_session

    spec = PipelineSpec.from_yaml(spec_path)
    with console.status("[bold]Spark pipeline: starting a local Spark session…"):
        spark = build_session("local[2]", app_name="sluice-demo")
    started = time.perf_counter()
    with console.status("[bold]Spark pipeline: journal → namespace filter → enrich → Parquet + feed…"):
        runs = Pipeline(spec, spark).run(once=True)
    seconds = time.perf_counter() - started
    failed = [f"{name}: {run.error}" for name, run in runs.items() if getattr(run, "error", None)]
    report.problems.extend(f"pipeline sink {f}" for f in failed)
    mine = pq.read_table(root / "lake").to_pylist() if (root / "lake").exists() else []
    lake_keys = {(r["key"], json.loads(r["value"])["seq"]) for r in mine}
    if len(lake_keys) != created:
        report.problems.append(f"the lake holds {len(lake_keys)} distinct created events, expected {created}")
    if mine and not all(json.loads(r["value"]).get("total_with_vat_cents") for r in mine):
        report.problems.append("some lake records were not enriched")
    report.stages.append(Stage("Spark pipeline (2 sinks)", created + paid, seconds))
    report.outputs.append(("Parquet lake", str(root / "lake")))
    report.outputs.append(("feed", f"sqlite:///{root / 'feed.db'}"))


def _run_feed(console: Console, root: Path, report: DemoReport, paid: int) -> None:
    from sluiceway.demo.work import Fulfilment
    from sluiceway.feed import Feed, FeedWorker

    dsn = f"sqlite:///{root / 'feed.db'}"
    feed = Feed(dsn)
    processor = Fulfilment()
    started = time.perf_counter()
    worker = FeedWorker(dsn, processor, concurrency=4)
    with _progress(console) as progress:
        task = progress.add_task("feed workers (2 gates)", total=paid)
        worker.start()
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                status = feed.status()
                done = _completed_items(status)
                progress.update(task, completed=done)
                if done >= paid:
                    break
                time.sleep(0.2)
        finally:
            worker.stop()
    seconds = time.perf_counter() - started
    status = feed.status()
    done = _completed_items(status)
    feed.close()
    if done != paid:
        report.problems.append(f"feed: {done} of {paid} paid orders fulfilled")
    violations = processor.gate_violations()
    if violations:
        report.problems.append(f"feed: shipping started before charging finished for {violations[:5]}")
    steps = sum(len(v) for v in processor.spans.values())
    report.stages.append(Stage("feed workers (charge → ship)", steps, seconds))


def _completed_items(status: Any) -> int:
    return int(status.items.get("complete", 0))


def _start_harvester(dsn: str, journal_path: Path, kafka: str | None, root: Path) -> Any:
    from sluiceway.harvest import Harvest, HarvestConfig

    harvest_cfg: dict[str, Any] = {"name": "demo", "dataSource": dsn, "limits": {"minMetricsInterval": "1s"}}
    if kafka:
        harvest_cfg.update(baseKafkaConfig={"bootstrap.servers": kafka}, election={"kind": "database"})
    else:
        harvest_cfg["journal"] = {"path": str(journal_path)}
    return Harvest(HarvestConfig.from_dict({"harvest": harvest_cfg})).start()


def _ensure_topics(bootstrap: str, topics: tuple[str, ...]) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=10).topics
    missing = [NewTopic(t, num_partitions=3, replication_factor=1) for t in topics if t not in existing]
    for future in admin.create_topics(missing).values() if missing else []:
        try:
            future.result(15)
        except Exception as exc:
            error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
            if not (isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise DemoFailed(f"cannot create demo topics on {bootstrap}: {exc}") from exc


def _read_published(
    journal_path: Path, kafka: str | None, topics: tuple[str, ...]
) -> list[tuple[str, bytes | None]]:
    if kafka:
        return _read_kafka(kafka, topics)
    from sluiceway.journal import Journal

    with Journal.open(journal_path, read_only=True) as journal:
        return [(r.key, r.value) for r in journal.read()]


def _summary(console: Console, report: DemoReport) -> None:
    table = Table(title="what happened", show_lines=False)
    table.add_column("stage")
    table.add_column("records", justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("records/s", justify="right")
    for s in report.stages:
        table.add_row(s.name, f"{s.records:,}", f"{s.seconds:.1f}", f"{s.rate:,.0f}")
    console.print(table)
    if report.ok:
        console.print(
            f"[bold green]✓ per-key order verified[/]: every customer's events arrived in commit order "
            f"({report.duplicates} duplicate re-sends, collapsed)"
        )
    else:
        console.print("[bold red]✗ checks failed:[/]")
        for p in report.problems:
            console.print(f"  - {escape(p)}")
    console.print("\n[bold]outputs[/]")
    for name, where in report.outputs:
        console.print(escape(f"  {name:<12} {where}"))
    console.print("\n[bold]look at them[/]")
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        console.print(escape(f"  (first: source {os.path.join(bin_dir, 'activate')})"))
    for cmd in report.commands:
        console.print(escape(f"  $ {cmd}"))
    if report.workspace is not None:
        console.print(
            f"\n[bold]see it all in one place[/] (outbox, journal, pipeline, feed), in your browser:\n"
            f"  $ sluice ui --config {escape(str(report.workspace))}"
        )


def _read_kafka(bootstrap: str, topics: tuple[str, ...]) -> list[tuple[str, bytes | None]]:
    """Every event of this run's topics, grouped per topic and key (Kafka orders within a topic)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"sluice-demo-check-{topics[0]}",
            "enable.auto.commit": False,
        }
    )
    try:
        meta = consumer.list_topics(timeout=10)
        parts = [TopicPartition(t, p, 0) for t in topics for p in meta.topics[t].partitions]
        ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
        consumer.assign(parts)
        done = {k for k, end in ends.items() if end == 0}
        out: list[tuple[str, bytes | None]] = []
        deadline = time.monotonic() + 60
        while len(done) < len(ends) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                topic, partition, offset, key = msg.topic(), msg.partition(), msg.offset(), msg.key()
                if msg.error() or topic is None or partition is None or offset is None or key is None:
                    continue
                if offset + 1 >= ends[(topic, partition)]:
                    done.add((topic, partition))
                out.append((f"{topic}/{key.decode()}", msg.value()))
        return out
    finally:
        consumer.close()
