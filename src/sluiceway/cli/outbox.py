"""``sluice outbox``: create and inspect outbox tables."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.table import Table

from sluiceway.cli.common import console, friendly_errors, styled
from sluiceway.db import Database
from sluiceway.errors import ConfigError, DatabaseError
from sluiceway.outbox import (
    discover,
    init_outbox,
    list_dead_letters,
    outbox_stats,
    resolve_dead_letter,
    retry_dead_letter,
)
from sluiceway.outbox.table import OutboxLocation, locate_outbox

app = typer.Typer(
    help="Create and inspect outbox tables.\n\nExample: sluice outbox init --dsn sqlite:///app.db",
    no_args_is_help=True,
)

DSN_HELP = (
    "Data source: libpq string / postgresql:// URL, sqlite:///path.db or mysql://user:pass@host:port/db"
)


@app.command("init")
@friendly_errors
def init(
    dsn: str = typer.Option(..., "--dsn", help=DSN_HELP),
    table: str = typer.Option("outbox", "--table", help="Outbox table name (schema.table allowed)."),
    partition_column: bool = typer.Option(
        False, "--partition-column", help="Add kafka_partition (explicit partition)."
    ),
    binary_value: bool = typer.Option(False, "--binary-value", help="Make kafka_value binary (bytea/BLOB)."),
    notify: bool = typer.Option(
        False,
        "--notify",
        help="PostgreSQL: add a trigger whose NOTIFY wakes an idle harvester (no polling while empty).",
    ),
) -> None:
    """Create the outbox table, its indexes and its dead-letter table (idempotent).

    Example: sluice outbox init --dsn postgresql://postgres@127.0.0.1/app --table outbox --notify
    """
    with Database(dsn) as db:
        layout = init_outbox(
            db, table, partition_column=partition_column, binary_value=binary_value, notify=notify
        )
    extras = [
        name
        for name, on in (
            ("kafka_partition", layout.has_partition),
            ("binary value", layout.binary_value),
            ("the notify trigger", layout.notify),
        )
        if on
    ]
    suffix = f" (with {', '.join(extras)})" if extras else ""
    console.print(
        styled(
            "outbox table ", (layout.table, "bold"), " and ", (layout.dead_table, "bold"), f" ready{suffix}"
        )
    )


@contextlib.contextmanager
def reading(
    dsn: str, table: str, *, dsn_from: str = "--dsn", table_from: str = "--table"
) -> Iterator[tuple[Database, OutboxLocation]]:
    """A read-only connection and the outbox found there, for commands that only look: a missing
    SQLite file is not created, and nothing else is written. Errors name where the data source
    and the table came from (``dsn_from``, ``table_from``: the flags, or a file and its key)."""
    with Database(dsn, read_only=True) as db:
        try:
            location = locate_outbox(db, table)
        except ConfigError as exc:
            raise ConfigError(exc.problem, path=table_from) from None
        except DatabaseError as exc:
            named = db.source.redacted()
            where = dsn_from if named in str(exc) else f"{dsn_from} {named}"
            raise type(exc)(f"{where}: {exc}", code=exc.code) from exc
        yield db, location


@app.command("stats")
@friendly_errors
def stats(
    dsn: str = typer.Option(None, "--dsn", help=DSN_HELP),
    table: str = typer.Option("outbox", "--table", help="Outbox table name."),
    file: Path = typer.Option(
        None, "-f", "--file", help="A reaper.yaml: its dataSource and outboxTable, and its destination shown."
    ),
) -> None:
    """Print row count, oldest row age, rows marked (in flight) and dead letters.

    With -f, the data source and table come from the harvester's configuration, and the
    destination it publishes to (Kafka, journal, NATS, RabbitMQ, Redis) is shown too.

    Example: sluice outbox stats --dsn sqlite:///app.db
    Example: sluice outbox stats -f reaper.yaml
    """
    destination = None
    dsn_from, table_from = "--dsn", "--table"
    if file is not None:
        from sluiceway.harvest import HarvestConfig

        harvest = HarvestConfig.from_file(file).harvest
        dsn, table, destination = harvest.data_source, harvest.outbox_table, harvest.describe_destination()
        dsn_from, table_from = f"{file}: dataSource", f"{file}: outboxTable"
    if not dsn:
        raise typer.BadParameter("give --dsn or -f reaper.yaml", param_hint="--dsn")
    with reading(dsn, table, dsn_from=dsn_from, table_from=table_from) as (db, location):
        layout = location.layout
        s = outbox_stats(db, layout)
    grid = Table(title=f"outbox table {layout.table}", show_header=False)
    grid.add_row("database", f"{db.dialect.value} {location.database or '(in memory)'}")
    if destination:
        grid.add_row("destination", destination)
    grid.add_row("rows", str(s.rows))
    grid.add_row("oldest row age", "-" if s.oldest_age_seconds is None else f"{s.oldest_age_seconds:.3f}s")
    grid.add_row("rows marked", str(s.marked))
    grid.add_row("dead letters", str(s.dead))
    console.print(grid)


dead_app = typer.Typer(
    help=(
        "Dead letters: list them, retry one (back at the head of its key) or resolve one (discard it, "
        "releasing its key).\n\nExample: sluice outbox dead list --dsn sqlite:///app.db"
    ),
    no_args_is_help=True,
)
app.add_typer(dead_app, name="dead")


@dead_app.command("list")
@friendly_errors
def dead_list(
    dsn: str = typer.Option(..., "--dsn", help=DSN_HELP),
    table: str = typer.Option("outbox", "--table", help="Outbox table name."),
    after: int = typer.Option(0, "--after", help="Only letters with a higher id (paging)."),
    limit: int = typer.Option(100, "--limit", help="At most this many."),
) -> None:
    """List dead letters, oldest first. PARKED ones hold their key: its later records wait.

    Example: sluice outbox dead list --dsn sqlite:///app.db
    """
    with reading(dsn, table) as (db, location):
        layout = location.layout
        letters = list_dead_letters(db, layout, after=after, limit=limit)
    grid = Table(title=f"dead letters of {layout.table}")
    for column in ("id", "topic", "key", "attempts", "state", "dead since", "error"):
        grid.add_column(column, overflow="fold")
    for d in letters:
        state = styled(("PARKED", "bold yellow")) if d.parked else "-"
        grid.add_row(str(d.id), d.topic, d.key, str(d.attempts), state, str(d.dead_time), d.error[:200])
    console.print(grid)


@dead_app.command("retry")
@friendly_errors
def dead_retry(
    ids: list[int] = typer.Argument(..., help="Dead letter ids (see `dead list`)."),
    dsn: str = typer.Option(..., "--dsn", help=DSN_HELP),
    table: str = typer.Option("outbox", "--table", help="Outbox table name."),
) -> None:
    """Put dead letters back into the outbox: a parked one at the head of its key (its own id),
    so the key resumes from it, in order; the harvester picks it up at once.

    Example: sluice outbox dead retry 1042 --dsn sqlite:///app.db
    """
    with Database(dsn) as db:
        layout = discover(db, table)
        for record_id in ids:
            head = retry_dead_letter(db, layout, record_id)
            where = "at the head of its key" if head else "at the tail (its key had gone on)"
            console.print(f"dead letter {record_id} back in {layout.table}, {where}")


@dead_app.command("resolve")
@friendly_errors
def dead_resolve(
    ids: list[int] = typer.Argument(..., help="Dead letter ids (see `dead list`)."),
    dsn: str = typer.Option(..., "--dsn", help=DSN_HELP),
    table: str = typer.Option("outbox", "--table", help="Outbox table name."),
) -> None:
    """Discard dead letters without publishing them, releasing their keys: the keys' later
    records are published without them.

    Example: sluice outbox dead resolve 1042 --dsn sqlite:///app.db
    """
    with Database(dsn) as db:
        layout = discover(db, table)
        for record_id in ids:
            resolve_dead_letter(db, layout, record_id)
            console.print(f"dead letter {record_id} discarded; its key is released")
