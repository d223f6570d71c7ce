"""``sluice feed``: run feed workers, add work, inspect the feed, retry or resolve failures."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from sluiceway.cli.common import METRICS_ADDR_HELP, console, fail, friendly_errors, setup_logging, styled
from sluiceway.clock import duration_seconds
from sluiceway.config.types import parse_startup_timeout
from sluiceway.db import Database
from sluiceway.errors import ConfigError, DatabaseError, SluicewayError
from sluiceway.feed import (
    Feed,
    FeedSettingsError,
    FeedStatus,
    FeedWorker,
    FeedWorkerSettings,
    RateLimit,
    ScheduledWork,
    Status,
)
from sluiceway.heap import tune_collector
from sluiceway.signals import stopping_on_signals

app = typer.Typer(
    help=(
        "A database-backed fan-out/fan-in work queue: partitions of items, processed gate by gate.\n\n"
        "Examples:\n\n"
        "  sluice feed add --dsn sqlite:///app.db --partition folder-1 --item a.pdf --item b.pdf\n\n"
        "  sluice feed worker --dsn sqlite:///app.db --processor myapp.ocr:process --concurrency 4\n\n"
        "  sluice feed status --dsn sqlite:///app.db"
    ),
    no_args_is_help=True,
)

DSN_HELP = (
    "Data source: libpq string / postgresql:// URL, sqlite:///path.db or mysql://user:pass@host:port/db"
)
PREFIX_HELP = "Table name prefix (tables <prefix>partitions and <prefix>items; 'schema.' allowed)."


@app.command("init")
@friendly_errors
def init(
    dsn: Annotated[str, typer.Option("--dsn", help=DSN_HELP)],
    prefix: Annotated[str, typer.Option("--prefix", help=PREFIX_HELP)] = "feed_",
) -> None:
    """Create the feed's tables and indexes (idempotent; workers and producers also do it).

    Example: sluice feed init --dsn postgresql://postgres@127.0.0.1/app
    """
    with Feed(dsn, prefix=prefix) as feed:
        tables = (feed.store.partitions_table, feed.store.items_table)
    console.print(styled("feed tables ", (tables[0], "bold"), " and ", (tables[1], "bold"), " ready"))


@app.command("add")
@friendly_errors
def add(
    dsn: Annotated[str, typer.Option("--dsn", help=DSN_HELP)],
    partition: Annotated[str, typer.Option("--partition", "-p", help="Partition name.")],
    item: Annotated[
        list[str] | None, typer.Option("--item", "-i", help="An item's data (UTF-8 text); repeat for more.")
    ] = None,
    file: Annotated[Path | None, typer.Option("--file", help="A file with one item per line.")] = None,
    gate: Annotated[int, typer.Option("--gate", help="The items' gate.")] = 0,
    attributes: Annotated[
        str | None, typer.Option("--attributes", help="Partition attributes as a JSON object.")
    ] = None,
    at: Annotated[
        str | None,
        typer.Option("--at", help="Not before this time: ISO 8601 with a time zone (2026-12-01T09:00:00Z)."),
    ] = None,
    in_: Annotated[
        str | None, typer.Option("--in", help="Not before this long from now: a duration (30s, 5m, 1h30m).")
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option("--priority", help="A new partition's priority: workers lease higher ones first."),
    ] = None,
    item_priority: Annotated[
        int, typer.Option("--item-priority", help="The items' priority: claimed first within their gate.")
    ] = 0,
    prefix: Annotated[str, typer.Option("--prefix", help=PREFIX_HELP)] = "feed_",
    empty: Annotated[
        bool,
        typer.Option(
            "--empty",
            help=(
                "Create the partition without items, to add them later (workers complete an empty "
                "partition at once unless they run with --manual-checkpoint)."
            ),
        ),
    ] = False,
) -> None:
    """Add a partition with its items, or add items to an open partition (at or above its gate).

    Give the items with --item (repeatable) or --file (one per line); a partition without items
    needs --empty.

    With --at or --in the work is scheduled: not claimed before then (a new partition is not even
    leased), by the database's clock. Priorities are integers, higher first, 0 by default:
    --priority for a new partition (workers lease higher ones first), --item-priority for the
    items (claimed first within their gate).

    Examples:

      sluice feed add --dsn sqlite:///app.db -p folder-1 -i a.pdf -i b.pdf --gate 0

      sluice feed add --dsn sqlite:///app.db -p nightly -i report --at 2026-12-01T02:00:00+01:00

      sluice feed add --dsn sqlite:///app.db -p folder-1 -i c.pdf --in 5m

      sluice feed add --dsn sqlite:///app.db -p urgent -i a.pdf --priority 10 --item-priority 5
    """
    not_before = _not_before(at, in_)
    datas: list[bytes] = [i.encode("utf-8") for i in item or []]
    if file is not None:
        try:
            datas += [line.rstrip(b"\r\n") for line in file.read_bytes().splitlines() if line.strip()]
        except OSError as exc:
            raise fail(f"cannot read {file}: {exc.strerror or exc}") from None
    attrs: dict[str, Any] | None = None
    if attributes is not None:
        try:
            attrs = json.loads(attributes)
        except ValueError as exc:
            raise fail(f"--attributes is not JSON: {exc}") from None
        if not isinstance(attrs, dict):
            raise fail("--attributes must be a JSON object")
    _check_items(partition, len(datas), file, empty=empty)
    with Feed(dsn, prefix=prefix) as feed:
        when = "" if not_before is None else f", not before {_describe(not_before)}"
        if feed.partition(partition) is None:
            feed.add(
                partition,
                datas,
                gate=gate,
                attributes=attrs,
                not_before=not_before,
                priority=priority or 0,
                item_priority=item_priority,
            )
            console.print(
                styled(
                    "partition ",
                    (partition, "bold"),
                    f" added with {len(datas)} item(s) at gate {gate}{when}",
                    _priorities(priority, item_priority),
                )
            )
        else:
            if empty:
                raise fail(f"partition {partition!r} exists; --empty only applies when creating it", code=2)
            if attrs is not None:
                raise fail(f"partition {partition!r} exists; --attributes only apply when creating it")
            if priority is not None:
                raise fail(
                    f"partition {partition!r} exists; --priority only applies when creating it "
                    "(--item-priority sets the new items')"
                )
            n = feed.add_items(partition, datas, gate, not_before=not_before, item_priority=item_priority)
            console.print(
                styled(
                    f"{n} item(s) added to partition ",
                    (partition, "bold"),
                    f" at gate {gate}{when}",
                    _priorities(None, item_priority),
                )
            )


def _check_items(partition: str, count: int, file: Path | None, *, empty: bool) -> None:
    """Items were given, or --empty asked for none (a mistake in the command is exit 2).

    A partition added without items by accident is completed by the first worker that leases it,
    and the items meant for it are then refused: say so before anything is written."""
    if empty and count:
        raise fail(f"--empty, yet {count} item(s) given: leave out --empty, or the items", code=2)
    if empty or count:
        return
    read = f" ({file} holds none: blank lines are skipped)" if file is not None else ""
    raise fail(
        f"no items for partition {partition!r}{read}: give --item DATA (repeatable) or --file PATH "
        "(one item per line), or --empty for a partition without items",
        code=2,
    )


def _priorities(priority: int | None, item_priority: int) -> str:
    """The priorities an add was given, for its one line (nothing when they are the defaults)."""
    said = [] if not priority else [f"priority {priority}"]
    said += [] if not item_priority else [f"item priority {item_priority}"]
    return "" if not said else ", " + ", ".join(said)


def _not_before(at: str | None, in_: str | None) -> datetime | float | None:
    """--at / --in as a not_before (one of them at most); a bad value is one line and exit 1."""
    if at is not None and in_ is not None:
        raise fail("give --at or --in, not both")
    if in_ is not None:
        try:
            return duration_seconds(in_)
        except ValueError as exc:
            raise fail(f"--in: {exc}") from None
    if at is None:
        return None
    try:
        when = datetime.fromisoformat(at.strip())
    except ValueError:
        raise fail(f"--at: {at!r} is not an ISO 8601 time like 2026-12-01T09:00:00Z") from None
    if when.tzinfo is None:
        raise fail(f"--at: {at!r} has no time zone; add Z or an offset like +01:00")
    return when


def _describe(not_before: datetime | float) -> str:
    if isinstance(not_before, datetime):
        return not_before.astimezone(UTC).isoformat(timespec="seconds")
    return f"{not_before:g}s from now"


#: The worker options' defaults are the settings model's own.
_DEFAULT = FeedWorkerSettings()


@app.command("worker")
@friendly_errors
def worker(
    dsn: Annotated[str, typer.Option("--dsn", help=DSN_HELP)],
    processor: Annotated[
        str,
        typer.Option("--processor", help="'package.module:function' or an http(s):// URL to POST items to."),
    ],
    concurrency: Annotated[
        int, typer.Option("--concurrency", help="Items processed at once (threads).")
    ] = _DEFAULT.concurrency,
    max_attempts: Annotated[
        int, typer.Option("--max-attempts", help="Attempts per step before 'failed'.")
    ] = _DEFAULT.max_attempts,
    manual_checkpoint: Annotated[
        bool,
        typer.Option(
            "--manual-checkpoint", help="Never advance gates; leave it to 'sluice feed checkpoint'."
        ),
    ] = _DEFAULT.manual_checkpoint,
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Items claimed per statement.")
    ] = _DEFAULT.batch_size,
    lease: Annotated[
        float, typer.Option("--lease", help="Lease length in seconds (renewed every third).")
    ] = _DEFAULT.lease,
    poll_interval: Annotated[
        float,
        typer.Option("--poll-interval", help="Seconds between idle polls (without wake-ups)."),
    ] = _DEFAULT.poll_interval,
    wake_ups: Annotated[
        bool | None,
        typer.Option(
            "--wake-ups/--no-wake-ups",
            help="Rest on LISTEN/NOTIFY when idle instead of polling (PostgreSQL only; default: on there).",
        ),
    ] = _DEFAULT.wake_ups,
    fallback_poll: Annotated[
        float,
        typer.Option("--fallback-poll", help="With wake-ups: longest idle rest before polling anyway (s)."),
    ] = _DEFAULT.fallback_poll,
    http_timeout: Annotated[
        float, typer.Option("--http-timeout", help="HTTP processor timeout (s).")
    ] = _DEFAULT.http_timeout,
    http_encoding: Annotated[
        str, typer.Option("--http-encoding", help="Item data in HTTP bodies: base64|text.")
    ] = _DEFAULT.http_encoding,
    until_idle: Annotated[
        bool, typer.Option("--until-idle", help="Exit once there is nothing left to do.")
    ] = False,
    prefix: Annotated[str, typer.Option("--prefix", help=PREFIX_HELP)] = _DEFAULT.prefix,
    log_level: Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING, ERROR.")] = "INFO",
    log_format: Annotated[str, typer.Option("--log-format", help="text or json.")] = "text",
    metrics_addr: Annotated[str | None, typer.Option("--metrics-addr", help=METRICS_ADDR_HELP)] = None,
    tracing: Annotated[
        bool,
        typer.Option(
            "--tracing",
            help="A span per item whose partition carries a sampled trace, exported over OTLP as the "
            "OTEL_* variables say (needs the otel extra).",
        ),
    ] = _DEFAULT.tracing,
    startup_timeout: Annotated[
        str,
        typer.Option(
            "--startup-timeout",
            help="How long to wait at start for a database out of reach: seconds, a duration (2m), "
            "or forever.",
        ),
    ] = "30s",
) -> None:
    """Run a worker: lease partitions, process their items gate by gate, balance with other workers.

    Checks first that it can reach the database and create, read and write the feed's tables: a
    refusal (no such database, wrong password, a missing privilege) is one line naming the fix and
    exit 1; a database out of reach is waited for up to --startup-timeout, then one line and exit 1.

    SIGTERM/SIGINT stop it cleanly: items in flight finish, outcomes are written, leases released.

    Examples:

      sluice feed worker --dsn sqlite:///app.db --processor myapp.ocr:process

      sluice feed worker --dsn postgresql://app@db/app --processor http://127.0.0.1:8080/item --concurrency 16

      sluice feed worker --dsn sqlite:///app.db --processor myapp.ocr:process --metrics-addr :9465
    """
    try:
        wait_at_start = parse_startup_timeout(startup_timeout)
    except ConfigError as exc:
        raise fail(f"--startup-timeout: {exc.problem}") from None
    setup_logging(log_level.upper(), log_format)
    try:
        settings = FeedWorkerSettings.of(
            prefix=prefix,
            concurrency=concurrency,
            max_attempts=max_attempts,
            manual_checkpoint=manual_checkpoint,
            batch_size=batch_size,
            lease=lease,
            poll_interval=poll_interval,
            wake_ups=wake_ups,
            fallback_poll=fallback_poll,
            http_timeout=http_timeout,
            http_encoding=http_encoding,
            tracing=tracing,
        )
    except FeedSettingsError as exc:  # named by the option it came from, as a usage error
        raise fail(f"--{exc.field.replace('_', '-')}: {exc.problem}", code=2) from None
    w = FeedWorker(dsn, processor, settings)
    try:
        # Before any work: a refusal is said once with its fix, not retried by a worker for ever.
        w.check(wait_at_start, setting="--startup-timeout", credentials="--dsn")
    except SluicewayError as exc:
        w.close()
        raise fail(f"cannot start: {' '.join(str(exc).split())}") from None

    endpoint = None
    if metrics_addr:
        from sluiceway.feed.metrics import FeedMetrics
        from sluiceway.metrics import serve_metrics

        metrics = FeedMetrics(w, prefix, dsn=dsn)
        endpoint = serve_metrics(metrics.registry, metrics_addr)
        logging.getLogger("sluiceway.feed").info(
            "metrics on http://%s:%d/metrics", endpoint.host, endpoint.port
        )
    tune_collector()
    try:
        with stopping_on_signals(lambda name: w.request_stop()):
            if until_idle:
                w.run_until_idle()
            else:
                w.run()
    finally:
        w.close()
        if endpoint is not None:
            endpoint.close()
            metrics.close()
    s = w.stats
    console.print(
        f"worker {s.owner} stopped: {s.processed} processed, {s.completed} completed, "
        f"{s.failed} failed, {s.partitions_completed} partition(s) completed",
        soft_wrap=True,
    )


@contextlib.contextmanager
def _reading(dsn: str, prefix: str) -> Iterator[Feed]:
    """The feed for a command that only looks: a read-only connection (a missing SQLite file is
    not created) and no migration; errors name the --dsn flag."""
    with Database(dsn, read_only=True) as db:
        try:
            yield Feed(db, prefix=prefix, migrate=False)
        except DatabaseError as exc:
            named = db.source.redacted()
            where = "--dsn" if named in str(exc) else f"--dsn {named}"
            raise type(exc)(f"{where}: {exc}", code=exc.code) from exc


def _age(when: datetime | None) -> str:
    if when is None:
        return "-"
    seconds = (when - datetime.now(UTC)).total_seconds()
    return f"in {seconds:.1f}s" if seconds >= 0 else f"{-seconds:.1f}s ago"


def _rate_json(limit: RateLimit) -> dict[str, Any]:
    return {
        "attribute": limit.attribute,
        "value": limit.value,
        "max_rate": limit.max_rate,
        "burst": limit.burst,
        "tokens": round(limit.tokens, 3),
    }


def _rates_table(limits: list[RateLimit]) -> Table:
    table = Table(title="rate limits (items/s, shared by all workers)")
    for col in ("applies to", "max rate", "burst", "tokens now"):
        table.add_column(col, justify="left" if col == "applies to" else "right")
    for limit in limits:
        table.add_row(Text(str(limit.key)), f"{limit.max_rate:g}", f"{limit.burst:g}", f"{limit.tokens:.1f}")
    return table


def _scheduled_json(scheduled: ScheduledWork) -> dict[str, Any]:
    due = scheduled.next_due
    return {
        "partitions": scheduled.partitions,
        "items": scheduled.items,
        "next_due": None if due is None else due.isoformat(),
    }


def _scheduled_table(scheduled: ScheduledWork) -> Table:
    table = Table(title="scheduled (not due yet)")
    for col in ("of", "count"):
        table.add_column(col, justify="left" if col == "of" else "right")
    table.add_row("partitions", str(scheduled.partitions))
    table.add_row("items", str(scheduled.items))
    due = scheduled.next_due
    table.add_row("next due", "-" if due is None else f"{_age(due)} ({due.isoformat(timespec='seconds')})")
    return table


def _status_json(s: FeedStatus) -> dict[str, Any]:
    return {
        "partitions": [{"status": st, "gate": g, "count": n} for st, g, n in s.partitions],
        "items": s.items,
        "ready_items": s.ready_items,
        "open_by_priority": [{"of": of, "priority": p, "count": n} for of, p, n in s.open_by_priority],
        "rate_limits": [_rate_json(limit) for limit in s.rate_limits],
        "scheduled": _scheduled_json(s.scheduled),
        "oldest_available_age_seconds": s.oldest_available_age,
        "workers": [
            {
                "owner": w.owner,
                "partitions": w.partitions,
                "lease_until": None if w.latest_expiry is None else w.latest_expiry.isoformat(),
                "live": w.live,
            }
            for w in s.workers
        ],
    }


@app.command("status")
@friendly_errors
def status(
    dsn: Annotated[str, typer.Option("--dsn", help=DSN_HELP)],
    prefix: Annotated[str, typer.Option("--prefix", help=PREFIX_HELP)] = "feed_",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
) -> None:
    """Partitions by status and gate, items by status, lag, and the workers holding leases.

    Example: sluice feed status --dsn sqlite:///app.db
    """
    with _reading(dsn, prefix) as feed:
        s = feed.status()
    if as_json:
        console.print_json(json.dumps(_status_json(s)))
        return
    parts = Table(title="partitions")
    for col in ("status", "gate", "count"):
        parts.add_column(col, justify="right" if col != "status" else "left")
    for st, gate, n in s.partitions:
        parts.add_row(st, str(gate), str(n))
    items = Table(title="items")
    items.add_column("status")
    items.add_column("count", justify="right")
    for st in Status:
        items.add_row(st.value, str(s.items.get(st.value, 0)))
    items.add_row("ready now", str(s.ready_items))
    lag = "-" if s.oldest_available_age is None else f"{s.oldest_available_age:.1f}s"
    items.add_row("lag (oldest open item)", lag)
    workers = Table(title="workers (leases)")
    for col in ("owner", "partitions", "lease expires", "live"):
        workers.add_column(col)
    for w in s.workers:
        workers.add_row(w.owner, str(w.partitions), _age(w.latest_expiry), "yes" if w.live else "expired")
    console.print(parts)
    console.print(items)
    if any(p != 0 for _, p, _ in s.open_by_priority):  # only when priorities are in use
        by_priority = Table(title="open work by priority")
        for col in ("of", "priority", "count"):
            by_priority.add_column(col, justify="left" if col == "of" else "right")
        for of, p, n in s.open_by_priority:
            by_priority.add_row(of, str(p), str(n))
        console.print(by_priority)
    if s.scheduled.partitions or s.scheduled.items:
        console.print(_scheduled_table(s.scheduled))
    if s.rate_limits:
        console.print(_rates_table(s.rate_limits))
    console.print(workers)


@app.command("partitions")
@friendly_errors
def partitions(
    dsn: Annotated[str, typer.Option("--dsn", help=DSN_HELP)],
    status_filter: Annotated[
        str | None, typer.Option("--status", help="available, failed or complete.")
    ] = None,
    after: Annotated[
        int, typer.Option("--after", min=0, help="Show partitions with ids above this (paging).")
    ] = 0,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="Page size.")] = 50,
    prefix: Annotated[str, typer.Option("--prefix", help=PREFIX_HELP)] = "feed_",
) -> None:
    """List partitions, one page at a time (continue with --after <last id>).

    Example: sluice feed partitions --dsn sqlite:///app.db --status failed
    """
    if status_filter is not None and status_filter not in {s.value for s in Status}:
        raise fail(f"--status must be available, failed or complete, not {status_filter!r}")
    with _reading(dsn, prefix) as feed:
        page = feed.partitions(status_filter, after=after, limit=limit)
    table = Table(title="partitions")
    for col in ("id", "name", "status", "gate", "priority", "owner", "lease"):
        table.add_column(col)
    for p in page.rows:
        cells = (str(p.id), p.name, p.status.value, str(p.gate), str(p.priority), p.owner or "-")
        table.add_row(*cells, _age(p.lease_until))
    console.print(table)
    if page.next_after is not None:
        console.print(f"more: --after {page.next_after}")


def _settle(action: str, dsn: str, partition: str | None, item: int | None, prefix: str) -> None:
    with Feed(dsn, prefix=prefix, migrate=False) as feed:
        n = feed.retry(partition, item) if action == "retry" else feed.resolve(partition, item)
    scope = f" of partition {partition!r}" if partition else ""
    scope += f" (item {item})" if item is not None else ""
    verb = "made available again" if action == "retry" else "resolved (marked complete)"
    console.print(f"{n} failed item(s){scope} {verb}")


@app.command("retry")
@friendly_errors
def retry(
    dsn: Annotated[str, typer.Option("--dsn", help=DSN_HELP)],
    partition: Annotated[
        str | None, typer.Option("--partition", "-p", help="Only this partition's failed items.")
    ] = None,
    item: Annotated[int | None, typer.Option("--item", help="Only this item id.")] = None,
    prefix: Annotated[str, typer.Option("--prefix", help=PREFIX_HELP)] = "feed_",
) -> None:
    """Retry failed items (fresh attempts, at once); without options, every failed item.

    Example: sluice feed retry --dsn sqlite:///app.db --partition folder-1
    """
    _settle("retry", dsn, partition, item, prefix)


@app.command("resolve")
@friendly_errors
def resolve(
    dsn: Annotated[str, typer.Option("--dsn", help=DSN_HELP)],
    partition: Annotated[
        str | None, typer.Option("--partition", "-p", help="Only this partition's failed items.")
    ] = None,
    item: Annotated[int | None, typer.Option("--item", help="Only this item id.")] = None,
    prefix: Annotated[str, typer.Option("--prefix", help=PREFIX_HELP)] = "feed_",
) -> None:
    """Mark failed items complete without processing them, unblocking their gate.

    Example: sluice feed resolve --dsn sqlite:///app.db --item 42
    """
    _settle("resolve", dsn, partition, item, prefix)


@app.command("checkpoint")
@friendly_errors
def checkpoint(
    dsn: Annotated[str, typer.Option("--dsn", help=DSN_HELP)],
    partition: Annotated[str, typer.Option("--partition", "-p", help="Partition name.")],
    prefix: Annotated[str, typer.Option("--prefix", help=PREFIX_HELP)] = "feed_",
) -> None:
    """Advance a partition's gate by hand (workers run with --manual-checkpoint).

    Example: sluice feed checkpoint --dsn sqlite:///app.db --partition folder-1
    """
    with Feed(dsn, prefix=prefix, migrate=False) as feed:
        p = feed.checkpoint(partition)
    if p.status is Status.COMPLETE:
        console.print(styled("partition ", (partition, "bold"), " is complete"))
    else:
        console.print(styled("partition ", (partition, "bold"), f" is now at gate {p.gate}"))


rate_app = typer.Typer(
    help=(
        "Rate limits: items per second for the whole feed or per partition attribute value, "
        "kept in the database and obeyed by every worker.\n\n"
        "Examples:\n\n"
        "  sluice feed rate set --dsn sqlite:///app.db --max-rate 50\n\n"
        "  sluice feed rate set --dsn sqlite:///app.db --max-rate 5 --per tenant=acme\n\n"
        "  sluice feed rate show --dsn sqlite:///app.db"
    ),
    no_args_is_help=True,
)
app.add_typer(rate_app, name="rate")

PER_HELP = "Only partitions whose attribute has this value, as ATTRIBUTE=VALUE (default: the whole feed)."


def _per(per: str | None) -> tuple[str | None, str | None]:
    if per is None:
        return None, None
    attribute, sep, value = per.partition("=")
    if not sep or not attribute:
        raise fail(f"--per takes ATTRIBUTE=VALUE (for example tenant=acme), not {per!r}")
    return attribute, value


@rate_app.command("set")
@friendly_errors
def rate_set(
    dsn: Annotated[str, typer.Option("--dsn", help=DSN_HELP)],
    max_rate: Annotated[float, typer.Option("--max-rate", help="Items per second, all workers together.")],
    per: Annotated[str | None, typer.Option("--per", help=PER_HELP)] = None,
    burst: Annotated[
        float | None, typer.Option("--burst", help="Tokens the bucket holds (default: one second's worth).")
    ] = None,
    prefix: Annotated[str, typer.Option("--prefix", help=PREFIX_HELP)] = "feed_",
) -> None:
    """Set (or change) a rate limit; workers obey a new one from their next lease renewal.

    Example: sluice feed rate set --dsn sqlite:///app.db --max-rate 5 --per tenant=acme
    """
    attribute, value = _per(per)
    with Feed(dsn, prefix=prefix) as feed:
        limit = feed.set_rate(max_rate, attribute=attribute, value=value, burst=burst)
    console.print(
        styled("rate limit for ", (str(limit.key), "bold"), f": {limit.max_rate:g}/s, burst {limit.burst:g}")
    )


@rate_app.command("clear")
@friendly_errors
def rate_clear(
    dsn: Annotated[str, typer.Option("--dsn", help=DSN_HELP)],
    per: Annotated[str | None, typer.Option("--per", help=PER_HELP)] = None,
    prefix: Annotated[str, typer.Option("--prefix", help=PREFIX_HELP)] = "feed_",
) -> None:
    """Remove a rate limit (exit 1 if there was none).

    Example: sluice feed rate clear --dsn sqlite:///app.db --per tenant=acme
    """
    attribute, value = _per(per)
    with Feed(dsn, prefix=prefix) as feed:
        cleared = feed.clear_rate(attribute=attribute, value=value)
    what = "the whole feed" if per is None else per
    if not cleared:
        raise fail(f"no rate limit for {what}")
    console.print(styled("rate limit for ", (what, "bold"), " removed"))


@rate_app.command("show")
@friendly_errors
def rate_show(
    dsn: Annotated[str, typer.Option("--dsn", help=DSN_HELP)],
    prefix: Annotated[str, typer.Option("--prefix", help=PREFIX_HELP)] = "feed_",
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array instead of a table.")] = False,
) -> None:
    """The feed's rate limits and how full each bucket is now.

    Example: sluice feed rate show --dsn sqlite:///app.db
    """
    with _reading(dsn, prefix) as feed:
        limits = feed.rates()
    if as_json:
        console.print_json(json.dumps([_rate_json(limit) for limit in limits]))
    elif limits:
        console.print(_rates_table(limits))
    else:
        console.print("no rate limits")


if __name__ == "__main__":
    app()
