"""The Prometheus and Grafana pieces in deploy/: the alert rules pass ``promtool check rules`` and
their unit tests (``promtool test rules``), every dashboard query parses, and every ``sluice_*``
series and label they name is one the processes export — so renaming a metric or a label breaks
this test, not an operator's dashboard.

The exported series are read from the real metrics objects of each process kind (harvester,
capture, pipeline, feed worker), each made to report once, in the text format Prometheus scrapes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import generate_latest

from sluiceway.testing import free_port
from tests.support.overview import fill_outbox

pytestmark = pytest.mark.timeout(120)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "sluiceway.json"
SERIES = re.compile(r"\b(sluice_[a-z_]+)\b(\{[^}]*\})?")
LABEL_MATCHER = re.compile(r"([a-z_]+)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed: run `make test` (scripts/services.sh installs prometheus)")
    return found


def run(*args: str, cwd: Path) -> str:
    done = subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def alert_queries() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def test_the_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    assert "SUCCESS: 8 rules found" in run("check", "rules", ALERTS.name, cwd=ALERTS.parent)
    assert "SUCCESS" in run("test", "rules", "alerts_test.yml", cwd=ALERTS.parent)


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    # Grafana's variables as Prometheus would see them once Grafana has put them in.
    exprs = [re.sub(r'"\$[a-z_]+"', '".*"', q.replace("$__rate_interval", "5m")) for q in dashboard_queries()]
    recorded = [{"record": f"panel:{i}", "expr": e} for i, e in enumerate(exprs)]
    rules = {"groups": [{"name": "dashboard", "rules": recorded}]}
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(rules))
    assert f"SUCCESS: {len(exprs)} rules found" in run("check", "rules", "dashboard.yml", cwd=tmp_path)
    assert len(exprs) >= 20


def exported(text: str) -> dict[str, set[str]]:
    """Series name → its label names, from a scrape in the text format (a histogram's family
    gives its _bucket, _count and _sum; a family with no sample yet, its name)."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            found.setdefault(name, set())
            if kind == "histogram":
                for suffix in ("_bucket", "_count", "_sum"):
                    found.setdefault(name + suffix, set())
        elif line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            labels = {pair.split("=", 1)[0] for pair in rest.split("}")[0].split(",") if "=" in pair}
            found.setdefault(name.split()[0], set()).update(labels)
    return found


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    from sluiceway.capture.metrics import CaptureMeter
    from sluiceway.feed import Feed, FeedWorker
    from sluiceway.feed.metrics import FeedMetrics
    from sluiceway.harvest.events import KeyParked, LeaderAcquired, MeterRead, RecordDeadLettered, Stats
    from sluiceway.harvest.metrics import HarvestMetrics
    from sluiceway.journal import Journal
    from sluiceway.pipeline import PipelineSpec

    root = tmp_path_factory.mktemp("deploy")
    dsn = f"sqlite:///{root / 'app.db'}"
    fill_outbox(dsn)
    texts = []

    harvest = HarvestMetrics("h", destination="journal", outbox=(dsn, "outbox"))
    harvest.observe(LeaderAcquired(leader_id="x"))
    harvest.observe(MeterRead(Stats(1.0, 5.0, 1, 0, 5, 5, 5, 1, 1, {"p50": 2.0}, parked_keys=0)))
    harvest.observe(RecordDeadLettered(record_id=1, topic="t", key="k", error="e", attempts=1))
    harvest.observe(KeyParked(record_id=1, topic="t", key="k"))
    texts.append(generate_latest(harvest.registry).decode())
    harvest.close()

    capture = CaptureMeter("c", "kafka")
    host, port = capture.serve(f"127.0.0.1:{free_port()}")
    capture.count_published(1, 10, [0])
    capture.skipped(1)
    capture.dead_lettered()
    capture.position(10, 20)
    capture.leader(True)
    texts.append(httpx.get(f"http://{host}:{port}/metrics", timeout=10).text)
    capture.close()

    with Journal.open(root / "j", fsync=False) as j, j.append() as tx:
        tx.write("k", b"v")
    spec = (
        PipelineSpec.builder("p").source("journal", path=str(root / "j")).sink("s", "console")
        .checkpoint(root / "cp").build()
    )  # fmt: skip
    from sluiceway.pipeline.metrics import PipelineMetrics

    texts.append(generate_latest(PipelineMetrics(spec).registry).decode())

    with Feed(dsn):  # the feed's tables: its scheduled work is then read too
        pass
    worker = FeedWorker(dsn, lambda item: None)
    feed = FeedMetrics(worker, "feed_", dsn=dsn)
    texts.append(generate_latest(feed.registry).decode())
    feed.close()

    merged: dict[str, set[str]] = {}
    for text in texts:
        for name, labels in exported(text).items():
            merged.setdefault(name, set()).update(labels)
    return merged


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_series_and_label_named_is_exported(source: str, series: dict[str, set[str]]) -> None:
    queries = alert_queries() if source == "alerts" else dashboard_queries()
    for query in queries:
        names = [m.group(1) for m in SERIES.finditer(query)]
        assert names, f"a query over no sluice_* series: {query}"
        for m in SERIES.finditer(query):
            name, matchers = m.group(1), m.group(2) or ""
            assert name in series, f"{source}: {name} is not exported (by {sorted(series)})"
            for label in LABEL_MATCHER.findall(matchers):
                assert label in series[name], f"{source}: {name} has no label {label} ({query})"
        grouped = {g.strip() for by in GROUPING.findall(query) for g in by.split(",") if g.strip()}
        known = set().union(*(series[n] for n in names)) | {"le"}
        assert grouped <= known, f"{source}: grouping by {sorted(grouped - known)} that {names} lack"
