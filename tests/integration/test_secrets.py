"""No password or token reaches a log, an error line, ``status``, the console or a Spark property.

Every test runs sluiceway as a user does — ``sluice`` in child processes, the console's real
server — with one known secret in every place a secret can be given: the password of the
PostgreSQL, MariaDB, RabbitMQ and Redis URLs and libpq strings, Kafka's ``sasl.password``, the
console's token. It keeps every byte each run prints (stdout, stderr, log lines, the metrics
endpoints, the console's pages and JSON) and then greps them all for the secret. Each output is
also checked to say what it should (a start-up line, an error naming the server), so a run that
printed nothing, or failed for another reason, cannot pass by saying nothing.

The PostgreSQL server trusts loopback connections: a password in the DSN is accepted and ignored,
so runs against it succeed with the secret in their DSNs. MariaDB, RabbitMQ and Redis refuse a
wrong password: there the secret is in a failing connection, and the error line is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict

from sluiceway.feed import Feed
from sluiceway.overview import Workspace
from sluiceway.testing import Broker, free_port, wait_until
from sluiceway.ui import Console, create_app
from tests.support import ROOT
from tests.support.overview import build

pytestmark = pytest.mark.timeout(120)

#: The one secret of this module: every password and token below is this string.
SECRET = f"s3cr3t-{uuid.uuid4().hex}"


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "sluiceway.cli.main", *args]


def child_env() -> dict[str, str]:
    """As tests/support/cli.py runs ``sluice``: this tree's code first, 200 columns."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "COLUMNS": "200"}


class Outputs:
    """Everything the runs printed, by name; :meth:`check` fails naming each output holding the secret."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}

    def add(self, name: str, text: str | bytes) -> str:
        shown = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        assert shown.strip(), f"{name}: printed nothing (the secret check would prove nothing)"
        self.texts[name] = shown
        return shown

    def run(self, cwd: Path, runs: dict[str, tuple[list[str], int]]) -> dict[str, tuple[str, str]]:
        """Each ``name: (sluice arguments, exit code)`` at once, in child processes as a user runs
        them; both streams kept (either may be empty, not both) and the exit codes checked.
        Returns ``name: (stdout, stderr)``."""
        procs = {
            name: subprocess.Popen(
                command(*args),
                cwd=cwd,
                env=child_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name, (args, _) in runs.items()
        }
        results = {}
        try:
            for name, proc in procs.items():
                stdout, stderr = proc.communicate(timeout=90)
                self.add(name, f"{stdout}\n{stderr}")
                assert proc.returncode == runs[name][1], f"{name}: exit {proc.returncode}\n{stdout}{stderr}"
                assert "Traceback" not in stderr, f"{name}:\n{stderr}"
                results[name] = (stdout, stderr)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return results

    def check(self) -> None:
        leaks = [name for name, text in self.texts.items() if SECRET in text]
        assert not leaks, "the secret is in: " + "; ".join(
            f"{name}: {line.strip()}"
            for name in leaks
            for line in self.texts[name].splitlines()
            if SECRET in line
        )


@pytest.fixture
def outputs() -> Iterator[Outputs]:
    collected = Outputs()
    yield collected
    collected.check()


def pg_url(libpq: str, *, port: int | None = None) -> str:
    """The fixture's database as a URL carrying the secret as its password."""
    params = conninfo_to_dict(libpq)
    return f"postgresql://postgres:{SECRET}@127.0.0.1:{port or params.get('port', 5432)}/{params['dbname']}"


def pg_libpq(libpq: str) -> str:
    """The fixture's libpq string with the secret as ``password=``."""
    return f"{libpq} password={SECRET}"


@contextlib.contextmanager
def running(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``sluice …`` running, stdout and stderr into ``log``; killed if the test leaves it running."""
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            command(*args), stdout=sink, stderr=subprocess.STDOUT, cwd=log.parent, env=child_env()
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stop(proc: subprocess.Popen[bytes], *, code: int = 0) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == code


def scrape(port: int, outputs: Outputs, name: str, expect: str) -> str:
    def body() -> str | None:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
        except httpx.HTTPError:
            return None
        return text if expect in text else None

    return outputs.add(name, wait_until(body, timeout=20, message=f"{name} to show {expect}"))


# --- outbox and harvester --------------------------------------------------------------------
@pytest.mark.kafka
def test_outbox_and_harvester_print_no_secret(
    postgres_dsn: str, kafka: Broker, tmp_path: Path, outputs: Outputs
) -> None:
    dsn = pg_url(postgres_dsn)
    outputs.run(tmp_path, {"outbox init": (["outbox", "init", "--dsn", dsn], 0)})

    # The harvester, its producer with SASL settings against a PLAINTEXT broker: it starts (the
    # start-up check asks the cluster with baseKafkaConfig), leads, and its producer cannot reach
    # the broker; everything it logs at debug level is kept.
    sasl = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "sluice",
        "sasl.password": SECRET,
    }
    harvest = {
        "name": "secrets",
        "baseKafkaConfig": {"bootstrap.servers": kafka.bootstrap},
        "producerKafkaConfig": sasl,
        "dataSource": dsn,
        "election": {"kind": "database"},
        "startupTimeout": "2s",  # the unreachable ones below: one line after 2 s
    }
    config = tmp_path / "reaper.yaml"
    config.write_text(yaml.safe_dump({"harvest": harvest, "logging": {"level": "Debug"}}))
    # Set-up errors: the database where nothing listens or refusing the password; Kafka and
    # RabbitMQ refusing it; Redis where nothing listens.
    wrong = {
        "kafka refused": dict(harvest, baseKafkaConfig={"bootstrap.servers": kafka.bootstrap, **sasl}),
        "unreachable outbox": dict(harvest, dataSource=pg_url(postgres_dsn, port=free_port())),
        "mariadb refused": dict(harvest, dataSource=f"mysql://root:{SECRET}@127.0.0.1:3306/test"),
        "rabbitmq refused": dict(
            harvest,
            baseKafkaConfig={},
            target={"type": "rabbitmq", "url": f"amqp://guest:{SECRET}@127.0.0.1:5672/", "exchange": ""},
        ),
        "redis unreachable": dict(
            harvest,
            baseKafkaConfig={},
            target={"type": "redis", "url": f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"},
        ),
    }
    runs = {
        "outbox stats": (["outbox", "stats", "--dsn", pg_libpq(postgres_dsn)], 0),
        "outbox stats -f": (["outbox", "stats", "-f", str(config)], 0),
        "outbox stats unreachable": (["outbox", "stats", "--dsn", pg_url(postgres_dsn, port=free_port())], 1),
    }
    for name, section in wrong.items():
        path = tmp_path / f"{name.replace(' ', '-')}.yaml"
        path.write_text(yaml.safe_dump({"harvest": section}))
        runs[f"reap: {name}"] = (["reap", "-f", str(path)], 1)

    port = free_port()
    log = tmp_path / "reap.log"
    with running(["reap", "-f", str(config), "--metrics-addr", f"127.0.0.1:{port}"], log) as proc:
        results = outputs.run(tmp_path, runs)
        scrape(port, outputs, "reap metrics", 'sluice_harvest_leader{harvest="secrets"} 1.0')
        stop(proc)
    text = outputs.add("reap", log.read_bytes())
    assert "harvester secrets started" in text and "harvester stopped" in text
    for name in wrong:
        assert "error: cannot start:" in results[f"reap: {name}"][1]
    assert "cannot connect" in results["outbox stats unreachable"][1]


# --- feed ------------------------------------------------------------------------------------
def test_feed_prints_no_secret(postgres_dsn: str, tmp_path: Path, outputs: Outputs) -> None:
    dsn = pg_url(postgres_dsn)
    outputs.run(tmp_path, {"feed init": (["feed", "init", "--dsn", dsn], 0)})
    outputs.run(
        tmp_path, {"feed add": (["feed", "add", "--dsn", dsn, "-p", "folder", "-i", "a", "-i", "b"], 0)}
    )
    processor = ["--processor", "tests.support.processors:done"]
    runs = {}
    for name, bad in (
        ("unreachable", pg_url(postgres_dsn, port=free_port())),
        ("mariadb refused", f"mysql://root:{SECRET}@127.0.0.1:3306/test"),
    ):
        runs[f"feed status: {name}"] = (["feed", "status", "--dsn", bad], 1)
        runs[f"feed worker: {name}"] = (["feed", "worker", "--dsn", bad, *processor], 1)
    port = free_port()
    log = tmp_path / "worker.log"
    args = ["feed", "worker", "--dsn", pg_libpq(postgres_dsn), *processor, "--log-level", "DEBUG",
            "--metrics-addr", f"127.0.0.1:{port}"]  # fmt: skip
    with running(args, log) as proc, Feed(dsn) as feed:
        outputs.run(tmp_path, runs)
        wait_until(lambda: feed.status().items.get("complete") == 2, timeout=30, message="the worker")
        scrape(port, outputs, "feed worker metrics", "sluice_feed_items_total")
        stop(proc)
    outputs.add("feed worker", log.read_bytes())
    outputs.run(tmp_path, {
        "feed status": (["feed", "status", "--dsn", dsn], 0),
        "feed status --json": (["feed", "status", "--dsn", dsn, "--json"], 0),
    })  # fmt: skip


# --- status and the console ------------------------------------------------------------------
def console_get(config: Path, url: str) -> httpx.Response:
    app = create_app(Console(Workspace.from_file(config)))

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as web:
            return await web.get(url)

    return asyncio.run(get())


def test_status_and_console_show_no_secret(postgres_dsn: str, tmp_path: Path, outputs: Outputs) -> None:
    built = build(tmp_path / "ws", pg_url(postgres_dsn), feed_dsn=pg_libpq(postgres_dsn))
    workspace = yaml.safe_load(built.config.read_text())
    # A second outbox and feed that cannot be reached: their errors are shown too.
    workspace["outboxes"].append({"name": "gone", "dsn": pg_url(postgres_dsn, port=free_port())})
    workspace["feeds"].append({"name": "refused", "dsn": f"mysql://root:{SECRET}@127.0.0.1:3306/test"})
    built.config.write_text(yaml.safe_dump(workspace))
    cwd = built.config.parent

    # The real console server with the secret as its token, while ``status`` runs beside it.
    port = free_port()
    log = tmp_path / "ui.log"
    args = [
        "ui",
        "-c",
        str(built.config),
        "--addr",
        f"127.0.0.1:{port}",
        "--token",
        SECRET,
        "--allow-actions",
    ]
    with running(args, log) as proc:
        shown = outputs.run(cwd, {
            "status": (["status", "-c", str(built.config)], 0),
            "status json": (["status", "-c", str(built.config), "--format", "json"], 0),
            "status --check": (["status", "-c", str(built.config), "--check"], 1),
        })  # fmt: skip
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(base + "/api/status", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=30, message="sluice ui to listen")
        # Its pages with the token, a refusal, and the start-up link, which must not echo the
        # token back in a page or a URL (the cookie carries it to its holder, nothing else).
        bearer = {"Authorization": f"Bearer {SECRET}"}
        for url in ("/", "/api/status", "/outboxes/shop", "/feeds/work"):
            response = httpx.get(base + url, headers=bearer, timeout=10)
            outputs.add(f"ui {url}", f"{response.status_code}\n{response.text}")
        refused = httpx.post(
            base + "/api/feeds/work/retry", headers={"Authorization": "Bearer x"}, timeout=10
        )
        assert refused.status_code in (401, 403, 404), refused.text
        outputs.add("ui refusal", f"{refused.status_code}\n{refused.headers}\n{refused.text}")
        link = httpx.get(f"{base}/?token={SECRET}", timeout=10)
        headers = {k: v for k, v in link.headers.items() if k.lower() != "set-cookie"}
        outputs.add("ui start-up link", f"{link.status_code}\n{headers}\n{link.text}")
        stop(proc, code=0)  # sluice ui: SIGTERM is a clean stop
    text = outputs.add("ui", log.read_bytes())
    assert "sluice ui on" in text and "token: the one given" in text
    assert "shop" in shown["status"][0] and "gone" in shown["status"][0]
    report = json.loads(shown["status json"][0])
    assert report["outboxes"][1]["error"] and report["feeds"][1]["error"]

    # The console in this process: every page and the JSON.
    for url in ("/", "/api/status", "/outboxes/shop", "/outboxes/gone", "/feeds/work", "/feeds/refused",
                "/pipelines/orders", "/journals/bus"):  # fmt: skip
        response = console_get(built.config, url)
        outputs.add(f"console {url}", f"{response.status_code}\n{response.headers}\n{response.text}")


# --- change data capture -----------------------------------------------------------------------
def test_capture_start_up_errors_show_no_secret(postgres_dsn: str, tmp_path: Path, outputs: Outputs) -> None:
    dsns = {
        # The shared server runs wal_level = replica.
        "replica": pg_url(postgres_dsn),
        "replica libpq": pg_libpq(postgres_dsn),
        "unreachable": pg_url(postgres_dsn, port=free_port()),
    }
    runs = {}
    for name, dsn in dsns.items():
        section = {"dsn": dsn, "tables": ["public.items"], "slot": "s", "publication": "p",
                   "journal": {"path": str(tmp_path / "j")}, "startupTimeout": "2s"}  # fmt: skip
        path = tmp_path / f"{name.replace(' ', '-')}.yaml"
        path.write_text(yaml.safe_dump({"capture": section}))
        runs[f"capture: {name}"] = (["capture", "-f", str(path)], 1)
    results = outputs.run(tmp_path, runs)
    for name in dsns:
        (line,) = [line for line in results[f"capture: {name}"][1].splitlines() if line.strip()]
        assert line.startswith("error: cannot start:"), line
        assert ("wal_level is 'replica'" in line) == name.startswith("replica"), line


# --- pipeline ----------------------------------------------------------------------------------
def pipeline_spec(path: Path, source_dsn: str, sink_dsn: str) -> Path:
    spec = {
        "pipeline": {
            "name": "orders",
            "source": {"type": "outbox", "dsn": source_dsn},
            "sinks": [{"name": "db", "type": "postgres", "dsn": sink_dsn, "table": "orders"}],
            "checkpoint": str(path.parent / "checkpoints"),
        }
    }
    path.write_text(yaml.safe_dump(spec))
    return path


def test_pipeline_prints_and_gives_spark_no_secret(
    postgres_dsn: str, tmp_path: Path, outputs: Outputs
) -> None:
    from sluiceway.pipeline.runner import source_format
    from sluiceway.pipeline.session import REDACTED_OPTIONS, session_settings
    from sluiceway.pipeline.spec import PipelineSpec

    good = pg_url(postgres_dsn)
    gone = pg_url(postgres_dsn, port=free_port())
    specs = {
        "ok": pipeline_spec(tmp_path / "ok.yaml", good, pg_libpq(postgres_dsn)),
        "source unreachable": pipeline_spec(tmp_path / "source.yaml", gone, good),
        "sink unreachable": pipeline_spec(tmp_path / "sink.yaml", good, gone),
        "sink refused": pipeline_spec(
            tmp_path / "refused.yaml", good, f"mysql://root:{SECRET}@127.0.0.1:3306/t"
        ),
    }
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (key text, value text)")
    runs = {
        "pipeline status": (["pipeline", "status", str(specs["ok"])], 0),
        "pipeline status --json": (["pipeline", "status", str(specs["ok"]), "--json"], 0),
    }
    # Each refused before Spark starts, by the checks `run` makes first.
    for name in ("source unreachable", "sink unreachable", "sink refused"):
        runs[f"pipeline run: {name}"] = (["pipeline", "run", str(specs[name]), "--once"], 1)
    results = outputs.run(tmp_path, runs)
    assert "db" in results["pipeline status"][0]
    for name in ("source unreachable", "sink unreachable", "sink refused"):
        assert results[f"pipeline run: {name}"][1].startswith("error:"), name

    # What Spark is given: its settings carry no secret; the source options that must (the DSN the
    # executors connect with) have names Spark masks wherever it shows a plan.
    spec = PipelineSpec.from_yaml(specs["ok"])
    for master in ("local[2]", "spark://127.0.0.1:7077"):
        settings = session_settings(master, conf=dict(spec.spark))
        assert settings and not [k for k, v in settings.items() if SECRET in v], master
    _, options = source_format(spec, "db")
    carrying = [key for key, value in options.items() if SECRET in value]
    assert carrying == ["dsn"]
    assert all(re.search(REDACTED_OPTIONS, key) for key in carrying)
    assert session_settings("local[2]")["spark.sql.redaction.options.regex"] == REDACTED_OPTIONS
