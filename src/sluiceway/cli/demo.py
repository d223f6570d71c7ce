"""``sluice demo``: watch the whole system work, no servers needed."""

from __future__ import annotations

import typer

from sluiceway.cli.common import friendly_errors


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


@friendly_errors
def demo(
    records: int = typer.Option(20_000, "--records", "-n", help="How many order events the shop writes."),
    data_dir: str = typer.Option("sluice-demo", "--data-dir", help="Where outputs go (cleared at start)."),
    kafka: str = typer.Option(None, "--kafka", help="Use this Kafka bootstrap instead of the journal."),
    postgres: str = typer.Option(None, "--postgres", help="Use this Postgres DSN instead of SQLite."),
) -> None:
    """Run orders → outbox → harvester → journal → Spark pipeline → Parquet + feed → feed workers,
    then check that nothing was lost and every customer's events stayed in order.

    Example: sluice demo --records 5000
    """
    from sluiceway.demo import run_demo

    report = run_demo(records, data_dir=data_dir, kafka=kafka, postgres=postgres)
    if not report.ok:
        raise typer.Exit(1)
