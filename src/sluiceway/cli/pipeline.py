"""``sluice pipeline``: run a pipeline spec on Spark, and the operator tools around it."""

from __future__ import annotations

import json
import logging
from typing import Any

import typer
from rich.table import Table

from sluiceway.cli.common import console, err_console, fail, friendly_errors, setup_logging

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
        "  sluice pipeline step orders.yaml --sink db"
    ),
    no_args_is_help=True,
)

SPEC = typer.Argument(..., help="The pipeline spec (YAML with a top-level 'pipeline:' key).")
MASTER = typer.Option(
    "local[*]", "--master", help="local[*] (default), local[N], spark://host:port or sc://host:port"
)
LOG_FORMAT = typer.Option("text", "--log-format", help="text or json")


def _spec(path: str) -> Any:
    from sluiceway.pipeline.spec import PipelineSpec

    return PipelineSpec.from_yaml(path)


def _pipeline(path: str, master: str) -> Any:
    from sluiceway.pipeline.runner import Pipeline
    from sluiceway.pipeline.session import build_session

    spec = _spec(path)
    spark = build_session(master, app_name=f"sluice-{spec.name}", conf=dict(spec.spark))
    if not master.startswith("sc://"):
        # Our runner reports each sink's failure in one line; Spark's own stack traces are noise here.
        spark.sparkContext.setLogLevel("FATAL")
    return Pipeline(spec, spark)


@app.command("run")
@friendly_errors
def run(
    spec: str = SPEC,
    once: bool = typer.Option(False, "--once", help="Process what is there now, then stop."),
    master: str = MASTER,
    log_format: str = LOG_FORMAT,
) -> None:
    """Run every sink's query until stopped (SIGTERM/Ctrl-C stop cleanly), or with --once until caught up.

    Examples:

      sluice pipeline run orders.yaml

      sluice pipeline run orders.yaml --once --master local[2]
    """
    setup_logging(logging.INFO, log_format)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    pipeline = _pipeline(spec, master)
    runs = pipeline.run(once=once)
    failed = [r for r in runs.values() if r.state == "failed"]
    for r in runs.values():
        if r.state == "failed":
            at = f" at offset {r.offset}" if r.offset is not None else ""
            err_console.print(f"[bold red]error:[/] sink {r.sink!r} stopped{at}: {r.error}", highlight=False)
        else:
            err_console.print(f"sink {r.sink!r}: {r.state}", highlight=False)
    if failed:
        raise typer.Exit(1)


@app.command("status")
@friendly_errors
def status_cmd(
    spec: str = SPEC, as_json: bool = typer.Option(False, "--json", help="One JSON object per sink.")
) -> None:
    """Per sink: state, committed batch and source position, lag, records written, last error.

    Example:

      sluice pipeline status orders.yaml --json
    """
    from sluiceway.pipeline.operator import status

    rows = status(_spec(spec))
    if as_json:
        for r in rows:
            console.print_json(json.dumps(r.as_dict(), default=str))
        return
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
            json.dumps(r.position) if isinstance(r.position, dict) else str(r.position),
            "-" if r.lag is None else str(r.lag),
            "-" if r.last_offset is None else str(r.last_offset),
            str(r.records),
            str(r.dead_lettered),
            (at + str(err.get("message", "")).splitlines()[0])[:80] if err else "",
        )
    console.print(table)


@app.command("inspect")
@friendly_errors
def inspect_cmd(
    spec: str = SPEC,
    start: int = typer.Option(..., "--from", help="First offset (inclusive)."),
    end: int = typer.Option(..., "--to", help="Last offset (exclusive)."),
    limit: int = typer.Option(1000, "--limit", help="At most this many records."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per record."),
) -> None:
    """Show the source's records with FROM <= offset < TO (Kafka: in every partition).

    Example:

      sluice pipeline inspect orders.yaml --from 120 --to 130
    """
    from sluiceway.pipeline.operator import inspect
    from sluiceway.pipeline.sinks.console import render

    table = inspect(_spec(spec), start, end, limit=limit)
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
    offset: int = typer.Option(..., "--offset", help="The record's offset."),
) -> None:
    """Mark the record at OFFSET done for SINK without writing it (e.g. a poison record).

    Example:

      sluice pipeline skip orders.yaml --sink db --offset 127
    """
    from sluiceway.pipeline.operator import skip

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
