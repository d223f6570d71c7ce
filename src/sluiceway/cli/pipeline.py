"""``sluice pipeline``: run a pipeline spec on Spark, and the operator tools around it."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from sluiceway.cli.common import (
    METRICS_ADDR_HELP,
    console,
    err_console,
    fail,
    friendly_errors,
    setup_logging,
    styled,
)

if TYPE_CHECKING:
    from sluiceway.cdc.progress import CdcStatus

app = typer.Typer(
    help=(
        "Run a pipeline (source → namespace filter → transforms → sinks) on Spark, one streaming "
        "query per sink, and inspect or steer it.\n\n"
        "Examples:\n\n"
        "  sluice pipeline run orders.yaml --once\n\n"
        "  sluice pipeline run orders.yaml --master sc://spark-connect:15002\n\n"
        "  sluice pipeline status orders.yaml\n\n"
        "  sluice pipeline inspect orders.yaml --from 120 --to 130\n\n"
        "  sluice pipeline skip orders.yaml --sink db --offset 127\n\n"
        "  sluice pipeline step orders.yaml --sink db\n\n"
        "  sluice pipeline drop-slot orders.yaml"
    ),
    no_args_is_help=True,
)

SPEC = typer.Argument(..., help="The pipeline spec (YAML with a top-level 'pipeline:' key).")
MASTER = typer.Option(
    "local[*]", "--master", help="local[*] (default), local[N], spark://host:port or sc://host:port"
)
LOG_FORMAT = typer.Option("text", "--log-format", help="text or json")


def parse_offset(text: str, option: str) -> int:
    """An offset: a number (for CDC, an offset in the capture's journal, as the sinks count)."""
    try:
        return int(text)
    except ValueError:
        raise fail(f"{option}: expected an offset (a whole number), got {text!r}") from None


def _spec(path: str) -> Any:
    from sluiceway.pipeline.spec import PipelineSpec

    return PipelineSpec.from_yaml(path)


def _pipeline(spec: Any, master: str, metrics: Any = None) -> Any:
    """A Pipeline on a session for ``master``; ``spec`` is a path or a parsed spec."""
    from sluiceway.pipeline.runner import Pipeline
    from sluiceway.pipeline.session import build_session

    if isinstance(spec, str):
        spec = _spec(spec)
    if spec.tracing.enabled:
        from sluiceway.tracing import require_tracing

        require_tracing()  # the otel extra, before a JVM starts
    spark = build_session(master, app_name=f"sluice-{spec.name}", conf=dict(spec.spark))
    if not master.startswith("sc://"):
        # Our runner reports each sink's failure in one line; Spark's own stack traces are noise here.
        spark.sparkContext.setLogLevel("FATAL")
    return Pipeline(spec, spark, metrics=metrics)


@app.command("run")
@friendly_errors
def run(
    spec: str = SPEC,
    once: bool = typer.Option(False, "--once", help="Process what is there now, then stop."),
    master: str = MASTER,
    log_format: str = LOG_FORMAT,
    metrics_addr: str = typer.Option(None, "--metrics-addr", help=METRICS_ADDR_HELP),
) -> None:
    """Run every sink's query until stopped (SIGTERM/Ctrl-C stop cleanly), or with --once until caught up.

    Examples:

      sluice pipeline run orders.yaml

      sluice pipeline run orders.yaml --once --master local[2]

      sluice pipeline run orders.yaml --metrics-addr :9466
    """
    setup_logging(logging.INFO, log_format)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # A sink that stops is reported in one line below; py4j would print its proxy traceback too.
    logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # Py4J also logs through the root logger (a Ctrl-C while Spark starts: "Exception while
        # sending command." and two tracebacks); the run says what happened in its own line.
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_from_py4j)
    from sluiceway.pipeline.checkpoint import CheckpointLock
    from sluiceway.pipeline.errors import PipelineError, SpecError
    from sluiceway.pipeline.preflight import check_checkpoint
    from sluiceway.pipeline.runner import first_line
    from sluiceway.pipeline.sinks.kinds import check_sinks
    from sluiceway.pipeline.sources.adapters import adapter
    from sluiceway.pipeline.state import RunState

    parsed = _spec(spec)
    # Before Spark starts: a wrong path, DSN or server is one line at once (Pipeline.start checks again).
    try:
        check_checkpoint(parsed)
        in_use = CheckpointLock(parsed.checkpoint).holder()
        if in_use is not None:  # before Spark starts: the run itself takes the lock
            raise PipelineError(in_use)
        adapter(parsed).check(parsed)
        check_sinks(parsed)
    except PipelineError as exc:
        raise fail(f"{spec}: {exc}") from None
    endpoint = None
    metrics = None
    if metrics_addr:
        from sluiceway.metrics import serve_metrics
        from sluiceway.pipeline.metrics import PipelineMetrics

        metrics = PipelineMetrics(parsed)
        endpoint = serve_metrics(metrics.registry, metrics_addr)
        logging.getLogger("sluiceway.pipeline").info(
            "metrics on http://%s:%d/metrics", endpoint.host, endpoint.port
        )
    try:
        runs = _pipeline(parsed, master, metrics).run(once=once)
    except SpecError as exc:  # found once Spark could look (a sql: transform's column)
        raise fail(f"{spec}: {exc}") from None
    finally:
        if endpoint is not None:
            endpoint.close()
    failed = [r for r in runs.values() if r.state is RunState.FAILED]
    for r in runs.values():
        if r.state is RunState.FAILED:
            at = f" at offset {r.offset}" if r.offset is not None else ""
            cause = first_line(r.error)  # shown as written: the consoles read no markup
            err_console.print(
                styled(("error:", "bold red"), f" sink {r.sink!r} stopped{at}: {cause}"), highlight=False
            )
        else:
            err_console.print(f"sink {r.sink!r}: {r.state}", highlight=False)
    if failed:
        raise typer.Exit(1)


def _not_from_py4j(record: logging.LogRecord) -> bool:
    return f"{os.sep}py4j{os.sep}" not in record.pathname


@app.command("status")
@friendly_errors
def status_cmd(
    spec: str = SPEC, as_json: bool = typer.Option(False, "--json", help="One JSON object per sink.")
) -> None:
    """Per sink: state, committed batch and source position, lag, records written, last error.

    Example:

      sluice pipeline status orders.yaml --json
    """
    from sluiceway.pipeline.operator import source_status, status

    parsed = _spec(spec)
    rows = status(parsed)
    source = source_status(parsed)
    if as_json:
        for r in rows:
            console.print_json(json.dumps(r.as_dict(), default=str))
        if source is not None:
            console.print_json(json.dumps({"source": asdict(source)}, default=str))
        return
    if source is not None:
        _print_cdc(source)
    table = Table(title="pipeline sinks")
    for col in ("sink", "state", "batch", "position", "lag", "last offset", "records", "dead", "last error"):
        table.add_column(col)
    for r in rows:
        err = r.error or {}
        at = f"@{err.get('offset')} " if err.get("offset") is not None else ""
        table.add_row(
            r.sink,
            r.state,
            str(r.committed_batch if r.committed_batch is not None else "-"),
            _position(r.position),
            "-" if r.lag is None else str(r.lag),
            "-" if r.last_offset is None else str(r.last_offset),
            str(r.records),
            str(r.dead_lettered),
            (at + str(err.get("message", "")).splitlines()[0])[:80] if err else "",
        )
    console.print(table)


def _position(position: Any) -> str:
    if position is None:
        return "no batch committed yet"
    return json.dumps(position) if isinstance(position, dict) else str(position)


def _print_cdc(source: CdcStatus) -> None:
    tables = Table(title="source tables")
    for col in ("table", "phase", "rows copied", "chunks", "copy complete at"):
        tables.add_column(col)
    for t in source.tables:
        tables.add_row(t.table, t.phase, str(t.rows_copied), str(t.chunks), t.complete_at or "-")
    console.print(tables)
    slot = source.slot
    if source.replica is not None:
        line = f"binlog: read as a replica, {source.replica}"
        binlog = source.binlog
        if binlog is not None:
            line += f", of server id {binlog.server_id} (its binlog ends at {binlog.end})"
            if binlog.behind_bytes is not None:
                line += f"; {binlog.behind_bytes:,} bytes of it still to capture"
            if binlog.gtids:
                line += f"; GTID checkpoint {binlog.gtids}"
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    elif slot is None:
        console.print("slot: not created yet")
    else:
        console.print(
            f"slot {slot.slot}: confirmed {slot.confirmed_lsn}, holds {slot.wal_retained_bytes:,} "
            "bytes of WAL" + (f", in use by pid {slot.active_pid}" if slot.active_pid else ""),
            highlight=False,
        )
    journal = source.journal
    if journal is not None:
        console.print(
            f"capture journal {journal.path}: {journal.records:,} records, holds the stream up to "
            f"{journal.position or '-'}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


@app.command("inspect")
@friendly_errors
def inspect_cmd(
    spec: str = SPEC,
    start: str = typer.Option(..., "--from", help="First offset (inclusive)."),
    end: str = typer.Option(..., "--to", help="Last offset (exclusive)."),
    limit: int = typer.Option(1000, "--limit", help="At most this many records."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per record."),
) -> None:
    """Show the source's records with FROM <= offset < TO (Kafka: in every partition).

    Example:

      sluice pipeline inspect orders.yaml --from 120 --to 130
    """
    from sluiceway.pipeline.operator import inspect
    from sluiceway.pipeline.sinks.console import render

    table = inspect(_spec(spec), parse_offset(start, "--from"), parse_offset(end, "--to"), limit=limit)
    for row in table.to_pylist():
        if as_json:
            value = row["value"]
            row["value"] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            row["timestamp"] = row["timestamp"].isoformat() if row["timestamp"] else None
            print(json.dumps(row))
        else:
            console.print(render(row), highlight=False, soft_wrap=True)
    if not as_json:
        err_console.print(f"{table.num_rows} record(s)")


@app.command("skip")
@friendly_errors
def skip_cmd(
    spec: str = SPEC,
    sink: str = typer.Option(..., "--sink", help="The sink that should pass over the record."),
    offset_text: str = typer.Option(..., "--offset", help="The record's offset (CDC: a number or an LSN)."),
) -> None:
    """Mark the record at OFFSET done for SINK without writing it (e.g. a poison record).

    Example:

      sluice pipeline skip orders.yaml --sink db --offset 127
    """
    from sluiceway.pipeline.operator import skip

    offset = parse_offset(offset_text, "--offset")
    if offset < 0:
        raise fail("--offset must be >= 0")
    skip(_spec(spec), sink, offset)
    console.print(f"sink {sink!r} will skip offset {offset} (run the pipeline to move past it)")


@app.command("step")
@friendly_errors
def step_cmd(
    spec: str = SPEC,
    sink: str = typer.Option(..., "--sink", help="The sink to advance."),
    master: str = MASTER,
) -> None:
    """Process exactly one record for SINK, then stop (after a fix, or to watch a record go through).

    Example:

      sluice pipeline step orders.yaml --sink db
    """
    setup_logging(logging.WARNING)
    pipeline = _pipeline(spec, master)
    result = pipeline.step(sink)
    if result["written"]:
        console.print(f"sink {sink!r}: wrote the record at offset {result['offset']}")
    else:
        console.print(f"sink {sink!r}: nothing to write (caught up)")


@app.command("drop-slot")
@friendly_errors
def drop_slot_cmd(spec: str = SPEC) -> None:
    """Drop a CDC pipeline's replication slot, releasing the WAL it holds.

    A slot keeps every change from its confirmed position on, also while the pipeline is
    stopped: PostgreSQL keeps that WAL on disk. Drop the slot of a pipeline you retire. Its
    checkpoint then no longer matches the server: delete it before running the pipeline
    again (which copies the tables anew).

    Example:

      sluice pipeline drop-slot orders.yaml
    """
    from sluiceway.cdc.postgres import CdcSession
    from sluiceway.errors import DatabaseError
    from sluiceway.pipeline.sources.adapters import adapter

    parsed = _spec(spec)
    slot = adapter(parsed).slot(parsed)
    if slot is None:
        raise fail(f"pipeline {parsed.name!r} reads {parsed.source.type!r}, which has no replication slot")
    session = CdcSession(slot.dsn)
    try:
        info = session.slot(slot.name)
        if info is None:
            raise fail(f"slot {slot.name!r} does not exist (nothing to drop)")
        try:
            session.drop_slot(slot.name)
        except DatabaseError as exc:
            raise fail(f"cannot drop slot {slot.name!r} (is the pipeline still running?): {exc}") from None
    finally:
        session.close()
    console.print(
        f"dropped slot {slot.name!r}, which held {info.retained:,} bytes of WAL; delete "
        f"{parsed.checkpoint} before running the pipeline again (it will copy the tables anew)",
        highlight=False,
    )
