"""``sluice capture -f capture.yaml``: change data capture to a broker, no Spark."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

import typer

from sluiceway.cli.common import METRICS_ADDR_HELP, fail, friendly_errors, setup_logging
from sluiceway.errors import SluicewayError
from sluiceway.heap import tune_collector

log = logging.getLogger("sluiceway.capture")


def register(app: typer.Typer) -> None:
    app.command("capture")(capture)


@friendly_errors
def capture(
    file: Path = typer.Option(
        ..., "-f", "--file", help="capture.yaml: the tables, the slot, the destination."
    ),
    metrics_addr: str = typer.Option(None, "--metrics-addr", help=METRICS_ADDR_HELP),
    log_format: str = typer.Option("text", "--log-format", help="text or json"),
) -> None:
    """Stream a PostgreSQL replication slot to Kafka, NATS, RabbitMQ, Redis or a journal while
    this process is the elected leader, until SIGTERM/SIGINT.

    Checks first that the server allows logical decoding, that the tables exist, and that a NATS,
    RabbitMQ or Redis destination accepts the connection (exit 1 with one line if not). Each change
    is published with its table's key, in commit order; the position confirmed to PostgreSQL is
    the end of the last transaction the destination acknowledged whole.

    Example: sluice capture -f capture.yaml --metrics-addr 127.0.0.1:9465
    """
    from sluiceway.capture import Capture, CaptureConfig

    config = CaptureConfig.from_file(file)
    if metrics_addr:
        data = config.model_dump(by_alias=True, exclude_none=True)
        data["capture"]["metricsAddr"] = metrics_addr
        config = CaptureConfig.model_validate(data)
    setup_logging(config.logging.python_level, log_format)
    daemon = Capture(config)
    try:
        daemon.check()
    except SluicewayError as exc:
        raise fail(f"cannot start: {' '.join(str(exc).split())}") from None
    done = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    c = config.capture
    tune_collector()
    daemon.start()
    log.info(
        "capture %s started (slot %s, election %s, publishing to %s)",
        c.name, c.slot, c.election.kind, c.describe_destination(),
    )  # fmt: skip
    try:
        while not done.is_set():
            if daemon.wait(timeout=0.2):
                break
    except SluicewayError as exc:
        raise fail(" ".join(str(exc).split())) from None
    finally:
        daemon.stop()
    log.info("capture stopped")
