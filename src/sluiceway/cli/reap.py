"""``sluice reap -f reaper.yaml`` (also ``reaper -f reaper.yaml``): the standalone harvester."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sluiceway.cli.common import METRICS_ADDR_HELP, fail, friendly_errors, setup_logging
from sluiceway.errors import SluicewayError
from sluiceway.heap import tune_collector
from sluiceway.signals import run_service

if TYPE_CHECKING:
    from sluiceway.harvest.events import Stats

log = logging.getLogger("sluiceway.reaper")

#: The latency percentiles a meter line shows, in this order (the engine measures more).
_METER_PERCENTILES = ("p50", "p99", "max")


def meter_line(stats: Stats) -> str:
    """One meter reading as a log line, latencies (row created → acknowledged) in milliseconds.

    >>> from sluiceway.harvest.events import Stats
    >>> meter_line(Stats(5.0, 120.4, 3, 0, 600, 600, 598, 0, 0, {"p50": 1.234, "p90": 2.0, "p99": 3.45}))
    'meter: 120 rec/s, in flight 3, pending 0, marked 600, purged 598, reset 0, dead 0, latency p50 1.2 ms p99 3.5 ms'
    >>> meter_line(Stats(5.0, 0.0, 0, 0, 0, 0, 0, 0, 0)).endswith("latency -")
    True
    """  # noqa: E501
    shown = [
        f"{name} {stats.latency_ms[name]:.1f} ms" for name in _METER_PERCENTILES if name in stats.latency_ms
    ]
    return (
        f"meter: {stats.throughput:.0f} rec/s, in flight {stats.in_flight}, pending {stats.pending}, "
        f"marked {stats.marked}, purged {stats.purged}, reset {stats.reset}, dead {stats.dead}, "
        f"latency {' '.join(shown) or '-'}"
    )


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

    Checks first what it needs: the destination (a NATS, RabbitMQ or Redis target's credentials and
    stream or exchange, a Kafka cluster, a journal's directory), the outbox table and the right to
    update and delete its rows, and the lease table. A refusal is one line naming the fix and exit
    1; a database or broker out of reach is waited for up to startupTimeout (30 s; forever waits
    for ever).

    Example: sluice reap -f reaper.yaml --metrics-addr 127.0.0.1:9464
    """
    from sluiceway.harvest import Harvest, HarvestConfig
    from sluiceway.harvest.events import Event, LeaderAcquired, LeaderRefreshed, MeterRead

    config = HarvestConfig.from_file(file)
    if metrics_addr:
        data: dict[str, Any] = config.model_dump(by_alias=True, exclude_none=True)
        data["harvest"]["metricsAddr"] = metrics_addr
        config = HarvestConfig.model_validate(data)
    setup_logging(config.logging.python_level, log_format)
    harvest = Harvest(config)
    try:
        # Before campaigning: a missing table or privilege, a wrong password or a missing stream
        # is said once with its fix, not retried for ever by a harvester that starts and takes
        # leadership; a database or broker out of reach is waited for up to startupTimeout.
        harvest.check()
    except SluicewayError as exc:
        raise fail(f"cannot start: {' '.join(str(exc).split())}") from None

    def on_event(event: Event) -> None:
        if isinstance(event, MeterRead):
            log.info("%s", meter_line(event.stats))
        elif isinstance(event, LeaderAcquired):
            # Not the lease holder id logged just before: this one is written into the rows this
            # term marks, and changes on every term and refresh.
            log.info("leading: marking outbox rows with leader id %s, publishing to %s", event.leader_id,
                     event.destination or config.harvest.describe_destination())  # fmt: skip
        elif isinstance(event, LeaderRefreshed):
            log.info("new leader id %s: pending rows will be marked again", event.leader_id)
        else:
            log.info("event: %s", event)

    harvest.set_event_handler(on_event)

    def started() -> None:
        log.info(
            "harvester %s started (outbox %s, election %s, publishing to %s)",
            config.harvest.name,
            config.harvest.outbox_table,
            config.harvest.election_kind,
            config.harvest.describe_destination(),
        )

    tune_collector()
    run_service(
        harvest,
        log=log,
        stopping="stopping (finishing in-flight deliveries, releasing leadership)",
        started=started,
    )
    log.info("harvester stopped")
