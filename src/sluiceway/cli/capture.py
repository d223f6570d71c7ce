"""``sluice capture -f capture.yaml``: change data capture to a broker, no Spark."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import typer

from sluiceway.cli.common import METRICS_ADDR_HELP, fail, friendly_errors, setup_logging
from sluiceway.errors import SluicewayError
from sluiceway.heap import tune_collector
from sluiceway.signals import run_service

log = logging.getLogger("sluiceway.capture")


app = typer.Typer(invoke_without_command=True, no_args_is_help=False)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="capture")


@app.callback()
@friendly_errors
def capture(
    ctx: typer.Context,
    file: Path = typer.Option(
        None, "-f", "--file", help="capture.yaml: the tables, the slot, the destination."
    ),
    metrics_addr: str = typer.Option(None, "--metrics-addr", help=METRICS_ADDR_HELP),
    log_format: str = typer.Option("text", "--log-format", help="text or json"),
) -> None:
    """Stream a PostgreSQL replication slot to Kafka, NATS, RabbitMQ, Redis or a journal while
    this process is the elected leader, until SIGTERM/SIGINT.

    Checks first what it needs: the server allows logical decoding, the role may read the slots
    and the tables, the publication covers them (or may be made), the destination accepts the
    connection, the lease table may be made (election.schema). A refusal is one line naming the
    fix and exit 1; a database or broker out of reach is waited for up to startupTimeout (30 s;
    forever waits for ever), then one line and exit 1. Each change
    is published with its table's key, in commit order; the position confirmed to PostgreSQL is
    the end of the last transaction the destination acknowledged whole. A change the destination
    refuses for good stops it (exit 1; `sluice capture inspect` shows the change) unless the file
    names a deadLetter: destination.

    Examples:

      sluice capture -f capture.yaml --metrics-addr 127.0.0.1:9465

      sluice capture inspect -f capture.yaml

      sluice capture skip -f capture.yaml --lsn 0/1A2B3C8
    """
    if ctx.invoked_subcommand is not None:
        return
    if file is None:
        raise fail("give the capture's file: sluice capture -f capture.yaml (sluice capture --help)")
    _run(file, metrics_addr, log_format)


def _run(file: Path, metrics_addr: str | None, log_format: str) -> None:
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
    c = config.capture

    def started() -> None:
        log.info(
            "capture %s started (%s, election %s, publishing to %s)",
            c.name, f"slot {c.slot}" if c.slot else f"binlog replica {c.server_id}", c.election.kind,
            c.describe_destination(),
        )  # fmt: skip

    tune_collector()
    try:
        run_service(daemon, log=log, started=started)
    except SluicewayError as exc:
        raise fail(" ".join(str(exc).split())) from None
    log.info("capture stopped")


@app.command("inspect")
@friendly_errors
def inspect(
    file: Path = typer.Option(..., "-f", "--file", help="capture.yaml"),
    fmt: str = typer.Option("text", "--format", help="text or json"),
) -> None:
    """Show the change the capture stopped on because its destination refuses it (table, key,
    position, size, the destination's words), the changes told to be passed over, and how many
    were passed over or sent to the dead letter destination. Reads the state directory only.

    Example: sluice capture inspect -f capture.yaml
    """
    import json
    import shlex

    from sluiceway.capture import CaptureConfig
    from sluiceway.capture.refusals import RefusalLog

    if fmt not in ("text", "json"):
        raise fail(f"--format must be text or json, got {fmt!r}")
    config = CaptureConfig.from_file(file)
    refusals = RefusalLog(config.capture.state_path).read()
    if fmt == "json":
        typer.echo(json.dumps(refusals.to_json()))
        return
    stuck = refusals.stuck
    if stuck is None:
        typer.echo(f"capture {config.capture.name}: no change is stuck")
    else:
        lsn = stuck.where
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(stuck.at))
        typer.echo(f"capture {config.capture.name} stopped on a change its destination refuses:")
        place = f"{lsn} (change {stuck.index + 1} of its transaction)"
        label = "position" if config.capture.binlog else "lsn"
        for name, value in (
            ("table", stuck.table), ("key", stuck.key), (label, place), ("size", f"{stuck.size:,} bytes"),
            ("topic", stuck.topic), ("refusal", stuck.refusal), ("since", when),
        ):  # fmt: skip
            typer.echo(f"  {name:8} {value}")
        typer.echo(f"pass over it:  sluice capture skip -f {shlex.quote(str(file))} --lsn {shlex.quote(lsn)}")
        typer.echo("or give the capture a deadLetter: destination and start it again")
    for skip in refusals.skips:
        typer.echo(f"to pass over: {skip.describe()}")
    typer.echo(
        f"passed over so far: {refusals.skipped}; sent to the dead letters so far: {refusals.dead_lettered}"
    )


@app.command("skip")
@friendly_errors
def skip(
    file: Path = typer.Option(..., "-f", "--file", help="capture.yaml"),
    lsn: str = typer.Option(
        ...,
        "--lsn",
        "--position",
        help="The stuck change's position, as inspect prints it (X/Y; a binlog's binlog.000003:1234).",
    ),
) -> None:
    """Pass over the change the capture stopped on: recorded in the state directory, and the
    capture's next term passes over exactly that change (counted in sluice_capture_skipped_total
    and in status). Only the stuck change can be skipped: any other position is refused.

    Example: sluice capture skip -f capture.yaml --lsn 0/1A2B3C8
    (a MariaDB/MySQL capture: --lsn binlog.000003:1234)
    """
    from sluiceway.capture import CaptureConfig
    from sluiceway.capture.refusals import RefusalLog

    config = CaptureConfig.from_file(file)
    change = RefusalLog(config.capture.state_path).skip(lsn, binlog=config.capture.binlog)
    typer.echo(f"skipped {change.describe()}: the capture passes over it when it runs next")
