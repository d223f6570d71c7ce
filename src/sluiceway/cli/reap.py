"""``sluice reap -f reaper.yaml`` (also ``reaper -f reaper.yaml``): the standalone harvester."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

import typer

from sluiceway.cli.common import METRICS_ADDR_HELP, fail, friendly_errors, setup_logging
from sluiceway.errors import SluicewayError

log = logging.getLogger("sluiceway.reaper")


def register(app: typer.Typer) -> None:
    app.command("reap")(reap)


@friendly_errors
def reap(
    file: Path = typer.Option(
        ..., "-f", "--file", help="goharvest-style reaper.yaml (sluiceway keys allowed)."
    ),
    metrics_addr: str = typer.Option(None, "--metrics-addr", help=METRICS_ADDR_HELP),
    log_format: str = typer.Option("text", "--log-format", help="text or json"),
) -> None:
    """Harvest an outbox while this process is the elected leader, until SIGTERM/SIGINT.

    Checks first that the outbox database is reachable and has the outbox table, and that a NATS,
    RabbitMQ or Redis target accepts the connection and has its stream or exchange (exit 1 if not).

    Example: sluice reap -f reaper.yaml --metrics-addr 127.0.0.1:9464
    """
    from sluiceway.harvest import Harvest, HarvestConfig
    from sluiceway.harvest.events import Event, MeterRead

    config = HarvestConfig.from_file(file)
    if metrics_addr:
        data: dict[str, Any] = config.model_dump(by_alias=True, exclude_none=True)
        data["harvest"]["metricsAddr"] = metrics_addr
        config = HarvestConfig.model_validate(data)
    setup_logging(config.logging.python_level, log_format)
    harvest = Harvest(config)
    try:
        # Before campaigning: a missing table, an unreachable database or broker, a wrong password
        # or a missing stream is a set-up error, said once, not a harvester that starts, takes
        # leadership and then retries forever. The destination first: the source check logs the
        # database it found, which only helps once the run can go on.
        harvest.check_destination()
        harvest.check_source()
    except SluicewayError as exc:
        raise fail(f"cannot start: {' '.join(str(exc).split())}") from None

    def on_event(event: Event) -> None:
        if isinstance(event, MeterRead):
            s = event.stats
            log.info(
                "meter: %.0f rec/s, in flight %d, pending %d, marked %d, purged %d, reset %d, dead %d, "
                "latency %s",
                s.throughput,
                s.in_flight,
                s.pending,
                s.marked,
                s.purged,
                s.reset,
                s.dead,
                {k: round(v, 1) for k, v in s.latency_ms.items()},
            )
        else:
            log.info("event: %s", event)

    harvest.set_event_handler(on_event)
    done = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info(
            "received %s: stopping (finishing in-flight deliveries, releasing leadership)",
            signal.Signals(signum).name,
        )
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    harvest.start()
    log.info(
        "harvester %s started (outbox %s, election %s, publishing to %s)",
        config.harvest.name,
        config.harvest.outbox_table,
        config.harvest.election_kind,
        config.harvest.describe_destination(),
    )
    try:
        while not done.is_set():
            if harvest.wait(timeout=0.2):
                break
    finally:
        harvest.stop()
    log.info("harvester stopped")
