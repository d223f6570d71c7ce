"""``sluice status`` and ``sluice ui``: one view of every outbox, journal, pipeline, feed and capture
that a workspace file (``sluice.yaml``) names."""

from __future__ import annotations

import ipaddress
import json
import secrets
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sluiceway.cli.common import console, err_console, fail, friendly_errors, styled
from sluiceway.metrics import parse_metrics_addr
from sluiceway.overview import StatusReport, Workspace, collect, unhealthy
from sluiceway.overview.report import CaptureEntry, Entry, Leader, Scheduled

CONFIG = typer.Option(Path("sluice.yaml"), "--config", "-c", help="The workspace file: what to watch.")
_HEALTH_STYLE = {"ok": "green", "stuck": "bold yellow", "unavailable": "bold red"}


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.command("ui")(ui)


def _workspace(path: Path) -> Workspace:
    if not path.exists():
        raise fail(f"no workspace file at {path} (write one, or give --config; see docs/operations.md)")
    return Workspace.from_file(path)


def _age(seconds: Any) -> str:
    if seconds is None:
        return "-"
    value = float(seconds)
    return (
        f"{value:.1f}s" if value < 120 else f"{value / 60:.1f}m" if value < 7200 else f"{value / 3600:.1f}h"
    )


def _n(value: Any) -> str:
    return "-" if value is None else str(value)


def _scheduled(scheduled: Scheduled | None) -> str:
    """A feed's scheduled work: "2 partitions, 5 items, next 2030-01-01T08:00:00Z", or "-"."""
    if not scheduled or not (scheduled.partitions or scheduled.items):
        return "-"
    due = str(scheduled.next_due).split(".")[0].replace("+00:00", "") + "Z"
    return f"{scheduled.partitions} partitions, {scheduled.items} items, next {due}"


def _health(entry: Entry) -> Text:
    return styled((entry.health, _HEALTH_STYLE.get(entry.health, "")))


def _leader(leader: Leader | None) -> tuple[str, str]:
    """The holder and its term, as two cells ("-" when nobody holds the lease)."""
    return ("-", "-") if leader is None else (leader.holder, _age(leader.term_seconds))


def _tables(report: StatusReport) -> Group:
    out: list[Table] = []
    if report.outboxes:
        t = Table(title="outboxes", title_justify="left")
        for col in ("name", "health", "rows", "oldest row", "in flight", "dead letters", "leader", "term"):
            t.add_column(col)
        for o in report.outboxes:
            t.add_row(
                o.name, _health(o), _n(o.rows), _age(o.oldest_age_seconds), _n(o.in_flight),
                _n(o.dead_letters), *_leader(o.leader),
            )  # fmt: skip
        out.append(t)
    if report.journals:
        t = Table(title="journals", title_justify="left")
        for col in ("name", "health", "head", "segments", "bytes", "consumers (lag)"):
            t.add_column(col)
        for j in report.journals:
            consumers = ", ".join(f"{c.name} ({c.lag})" for c in j.consumers or [])
            t.add_row(j.name, _health(j), _n(j.head), _n(j.segments), _n(j.bytes), consumers or "-")
        out.append(t)
    if report.pipelines:
        t = Table(title="pipelines", title_justify="left")
        for col in (
            "pipeline",
            "health",
            "sink",
            "state",
            "committed offset",
            "lag",
            "records",
            "last error",
        ):
            t.add_column(col)
        for p in report.pipelines:
            for i, s in enumerate(p.sinks or [None]):
                head = (p.name, _health(p)) if i == 0 else ("", "")
                if s is None:
                    t.add_row(*head, "-", "-", "-", "-", "-", "")
                    continue
                err = s.error or {}
                at = f"@{err['offset']} " if err.get("offset") is not None else ""
                message = (at + str(err.get("message", "")).splitlines()[0])[:60] if err else ""
                offset = s.committed_offset
                position = json.dumps(offset) if isinstance(offset, dict) else offset
                t.add_row(*head, s.name, s.state, _n(position), _n(s.lag), _n(s.records), message)
        out.append(t)
    if report.feeds:
        t = Table(title="feeds", title_justify="left")
        columns = ("name", "health", "partitions", "items (status@gate)", "ready", "scheduled", "live leases")
        for col in (*columns, "expired"):
            t.add_column(col)
        for f in report.feeds:
            parts = ", ".join(f"{g.count} {g.status}@{g.gate}" for g in f.partitions or [])
            items = ", ".join(f"{g.count} {g.status}@{g.gate}" for g in f.items or [])
            t.add_row(
                f.name, _health(f), parts or "-", items or "-", _n(f.ready_items),
                _scheduled(f.scheduled), _n(f.live_leases), _n(f.expired_leases),
            )  # fmt: skip
        out.append(t)
    if report.captures:
        t = Table(title="captures", title_justify="left")
        for col in ("name", "health", "destination", "slot", "confirmed", "WAL retained", "published",
                    "leader", "tables copying", "skipped / dead letters"):  # fmt: skip
            t.add_column(col)
        for c in report.captures:
            copying = [x.table for x in c.tables or [] if x.phase == "copy"]
            refused = c.refusals
            t.add_row(
                c.name, _health(c), c.destination or "-", c.slot_name or "-",
                *_slot_cells(c),
                c.published_lsn or "-", _leader(c.leader)[0], ", ".join(copying) or "-",
                "- / -" if refused is None else f"{refused.skipped} / {refused.dead_lettered}",
            )  # fmt: skip
        out.append(t)
    problems = unhealthy(report)
    footer = Table.grid()
    footer.add_row(
        styled(("nothing stuck", "green")) if not problems else styled(("problems:", "bold yellow"))
    )
    for problem in problems:
        footer.add_row(f"  - {problem}")
    return Group(*out, footer)


def _slot_cells(c: CaptureEntry) -> tuple[str, str]:
    """The "confirmed" and "WAL retained" cells: a slot's, or for a binlog capture the GTIDs its
    checkpoint holds and the binlog bytes it has yet to publish."""
    if c.slot is not None:
        return c.slot.confirmed_lsn, _n(c.slot.wal_retained_bytes)
    if c.binlog is not None:
        behind = c.binlog.behind_bytes
        return c.binlog.gtids or "-", "-" if behind is None else f"{behind:,} behind"
    return "-", _n(None)


@friendly_errors
def status(
    config: Path = CONFIG,
    fmt: str = typer.Option(
        "table", "--format", help="table or json (one object; with --watch, one per line)."
    ),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until Ctrl-C."),
    interval: float = typer.Option(
        2.0, "--interval", min=0.2, help="Seconds between refreshes with --watch."
    ),
    check: bool = typer.Option(
        False, "--check", help="Exit 1 when something is stuck or unavailable (the workspace's checks:)."
    ),
) -> None:
    """Is anything stuck, where, since when: every outbox, journal, pipeline, feed and capture watched.

    Exits 0; with --check, 1 when a threshold is crossed (oldest outbox row, pipeline lag, expired
    feed leases, WAL a slot retains…), a sink has failed, a capture has no slot or no leader, or
    something cannot be read.

    Examples:

      sluice status

      sluice status --config ops/sluice.yaml --format json

      sluice status --watch

      sluice status --check || page-the-operator
    """
    if fmt not in ("table", "json"):
        raise fail(f"--format must be table or json, got {fmt!r}")
    workspace = _workspace(config)
    report = collect(workspace)
    if not watch:
        if fmt == "json":
            typer.echo(json.dumps(report.to_json(), default=str))
        else:
            console.print(_tables(report))
    else:
        try:
            if fmt == "json":
                while True:
                    typer.echo(json.dumps(report.to_json(), default=str))
                    time.sleep(interval)
                    report = collect(workspace)
            with Live(_tables(report), console=console, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    report = collect(workspace)
                    live.update(_tables(report), refresh=True)
        except KeyboardInterrupt:
            pass
    if check and unhealthy(report):
        for problem in unhealthy(report):
            err_console.print(
                styled(("stuck:", "bold yellow"), " ", problem), highlight=False, soft_wrap=True
            )
        raise typer.Exit(1)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (a name other than ``localhost`` is not)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@friendly_errors
def ui(
    config: Path = CONFIG,
    addr: str = typer.Option(
        "127.0.0.1:8080", "--addr", help="HOST:PORT to listen on (loopback by default)."
    ),
    allow_actions: bool = typer.Option(
        False,
        "--allow-actions",
        help="Offer the operator actions (retry, resolve, skip, step) to holders of the token.",
    ),
    token: str = typer.Option(
        None, "--token", envvar="SLUICE_UI_TOKEN", help="The token (default: a new one, printed at start-up)."
    ),
    refresh: float = typer.Option(5.0, "--refresh", min=0, help="Seconds between page refreshes (0: off)."),
) -> None:
    """Serve a web console over the workspace: an overview, and a page per outbox, journal, pipeline, feed.

    Read-only unless --allow-actions; actions then need the token printed at start-up (open the
    link it prints). Listens on loopback unless told otherwise; another address needs --token,
    and then every page needs it too. A port already taken is one line and exit 1; SIGTERM or
    Ctrl-C stops it, exit 0. Port 0 picks a free one (the printed address names it).

    Examples:

      sluice ui

      sluice ui --config ops/sluice.yaml --addr 127.0.0.1:9000 --allow-actions

      SLUICE_UI_TOKEN=… sluice ui --addr 0.0.0.0:8080
    """
    try:
        from sluiceway.overview.history import open_history
        from sluiceway.ui import Console, create_app
        from sluiceway.ui.serve import listen, serve
    except ImportError as exc:
        raise fail(
            f"sluice ui needs the ui extra ({exc.name} is missing): pip install 'sluiceway[ui]'"
        ) from None
    workspace = _workspace(config)
    host, port = parse_metrics_addr(addr, option="addr")
    local = is_loopback(host)
    if not local and not token:
        raise fail(
            f"{host} is not a loopback address: give a --token (or SLUICE_UI_TOKEN) so that only its holders "
            "can see the console"
        )
    generated = allow_actions and not token
    if generated:
        token = secrets.token_urlsafe(24)
    # Bound before it is announced: a busy port is one line, not a promise and then a failure.
    sock = listen(host, port)
    history, sampler = open_history(workspace)
    app = create_app(
        Console(
            workspace,
            allow_actions=allow_actions,
            token=token,
            token_for_reads=not local,
            refresh_seconds=refresh,
            history=history,
        )
    )
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}/"
    mode = "actions on" if allow_actions else "read-only"
    typer.echo(f"sluice ui on {url} ({mode}; workspace {config})")
    if generated:
        typer.echo(f"token: {token}")
        typer.echo(f"open: {url}?token={token}")
    elif token:
        typer.echo(f"token: the one given (--token or SLUICE_UI_TOKEN); open {url}?token=…")
    if history is None:
        typer.echo("history: off")
    else:
        typer.echo(f"history: {_history_source(workspace)}")
    if sampler is not None:
        sampler.start()
    try:
        serve(app, sock)  # until SIGTERM or Ctrl-C: a clean stop, exit 0
    finally:
        if sampler is not None:
            sampler.stop()
        if history is not None:
            history.close()


def _history_source(workspace: Workspace) -> str:
    if workspace.prometheus is not None:
        return f"read from Prometheus at {workspace.prometheus.url}"
    h = workspace.history
    return f"kept in {h.path} (every {h.every:g} s, for {h.retention / 86400:g} days)"
