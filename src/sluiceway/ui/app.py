"""The web console: server-rendered pages over :mod:`sluiceway.overview`, refreshing themselves.

Read-only unless started with ``allow_actions``; then the operator actions (dead-letter retry
and resolve, pipeline skip and step, feed retry: :mod:`sluiceway.overview.actions`) are POST forms
that need the token — from the ``Authorization: Bearer`` header or from the cookie that opening
the start-up link (``/?token=…``) sets. The cookie is ``HttpOnly`` and ``SameSite=Strict``, and a
POST whose ``Origin`` is another site is refused, so another page cannot act with an operator's
cookie. With ``token_for_reads`` (any address other than loopback) every page needs the token.

Handlers are module-level functions that find the console in ``request.app.state``; page handlers
are plain functions run on Starlette's thread pool: each request opens its own database
connections and journal readers, as the CLI does, and closes them. Every refusal (no token, actions
off, another site, a bad request, nothing by that name) is an ``HTTPException``, rendered by one
handler as the ``message.html`` page.
"""

from __future__ import annotations

import functools
import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from sluiceway.errors import SluicewayError
from sluiceway.overview import Workspace, actions, collect
from sluiceway.overview.actions import StepLauncher, Steps, launch_step
from sluiceway.overview.detail import feed_listing, journal_records, stopped_records
from sluiceway.overview.history import History, HistoryError, headline, part_id, range_seconds, split_part
from sluiceway.overview.outbox import DeadLetter, OutboxRow, outbox_listings
from sluiceway.overview.remedies import remedies
from sluiceway.overview.report import (
    CaptureEntry,
    Entry,
    FeedEntry,
    Health,
    JournalEntry,
    OutboxEntry,
    PipelineEntry,
)
from sluiceway.overview.status import collect_one, watched
from sluiceway.overview.workspace import NotWatchedError

log = logging.getLogger("sluiceway.ui")

E = TypeVar("E", bound=Entry)

COOKIE = "sluice_token"
#: Records a journal page shows when no range is asked for.
DEFAULT_RECORDS = 50


@dataclass(frozen=True)
class Console:
    """What one ``sluice ui`` serves, and how it guards it."""

    workspace: Workspace
    allow_actions: bool = False
    token: str | None = None
    #: Every request needs the token, pages too (set when listening beyond loopback).
    token_for_reads: bool = False
    refresh_seconds: float = 5.0
    #: Starts one ``sluice pipeline step`` (a test passes its own).
    step: StepLauncher = launch_step
    #: Where ``/api/history`` and the charts read from (``None``: no history, no charts).
    history: History | None = None

    def presented(self, request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.cookies.get(COOKIE)

    def authorised(self, request: Request) -> bool:
        given = self.presented(request)
        return self.token is not None and given is not None and hmac.compare_digest(given, self.token)

    def same_origin(self, request: Request) -> bool:
        origin = request.headers.get("origin")
        return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"


def _format_seconds(value: Any) -> str:
    if value is None:
        return "-"
    seconds = float(value)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _format_bytes(value: Any) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def _when(value: Any) -> str:
    """Seconds since the epoch as a UTC time: ``2026-12-03 09:12:03 UTC``."""
    if value is None:
        return "-"
    return datetime.fromtimestamp(float(value), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _segment(value: Any) -> str:
    """``value`` as one segment of a URL path (``/`` too is escaped): a name is text, never URL
    structure. Workspace, pipeline and sink names are validated already; this does not rely on it."""
    return quote(str(value), safe="")


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("sluiceway.ui", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(
        seconds=_format_seconds, size=_format_bytes, number=_number, q=_segment, plain=asdict, when=_when
    )
    return Jinja2Templates(env=env)


def create_app(console: Console) -> Starlette:
    """The ASGI application of ``sluice ui`` for ``console``.

    For example::

        app = create_app(Console(Workspace()))
        uvicorn.run(app, host="127.0.0.1", port=8080)
    """
    app = Starlette(routes=ROUTES, exception_handlers={HTTPException: _refused})
    app.state.console = console
    app.state.templates = _templates()
    app.state.steps = Steps(console.step)
    return app


# -- rendering and refusing -----------------------------------------------------------------------
def _console(request: Request) -> Console:
    return cast(Console, request.app.state.console)


def _render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    templates = cast(Jinja2Templates, request.app.state.templates)
    return templates.TemplateResponse(request, name, context, status_code=status)


def _page(request: Request, name: str, **context: Any) -> Response:
    console = _console(request)
    context.update(
        console=console,
        request=request,
        message=request.query_params.get("msg"),
        actions=console.allow_actions,
        fragment=request.headers.get("x-sluice-fragment") == "1",
        history_on=console.history is not None,
    )
    return _render(request, name, context)


def _detail(request: Request, name: str, kind: str, entry: Entry, **context: Any) -> Response:
    """A part's page: its history's section, and when its trouble started and what clears it."""
    history = _console(request).history
    part = part_id(kind, entry.name)
    since = None
    if history is not None and entry.health is not Health.OK:
        try:
            since = history.trouble_since(part)
        except HistoryError as exc:
            log.warning("history: %s", exc)
    return _page(request, name, entry=entry, part=part, since=since, fixes=remedies(entry), **context)


def _refused(request: Request, exc: Exception) -> Response:
    """The one error path: every ``HTTPException`` as the message page, with its status (as
    ``{"error": …}`` for the JSON API)."""
    refusal = cast(HTTPException, exc)  # create_app registers it for HTTPException alone
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": refusal.detail}, status_code=refusal.status_code)
    context = {"console": _console(request), "request": request, "title": "refused", "text": refusal.detail}
    return _render(request, "message.html", {**context, "fragment": False}, refusal.status_code)


# -- pages ----------------------------------------------------------------------------------------
Page = Callable[[Request], Response]


def _guarded(handler: Page) -> Page:
    """A page: the start-up link's token becomes a cookie; beyond loopback, the token is needed."""

    @functools.wraps(handler)
    def run(request: Request) -> Response:
        console = _console(request)
        token = request.query_params.get("token")
        if token is not None and console.token is not None and hmac.compare_digest(token, console.token):
            # The start-up link: keep the token in a cookie, and the URL clean.
            rest = {k: v for k, v in request.query_params.items() if k != "token"}
            target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
            return response
        if console.token_for_reads and not console.authorised(request):
            raise HTTPException(401, "this console needs its token: open the link sluice ui printed")
        return handler(request)

    return run


def _status(request: Request, kind: str, of: type[E]) -> E:
    """The status entry of what the page is about (its ``name``); 404 if nothing is watched by it."""
    try:
        entry = collect_one(_console(request).workspace, kind, request.path_params["name"])
    except NotWatchedError as exc:
        raise HTTPException(404, str(exc)) from exc
    assert isinstance(entry, of), f"{kind} holds {type(entry).__name__}"
    return entry


@_guarded
def overview(request: Request) -> Response:
    return _page(request, "overview.html", report=collect(_console(request).workspace))


@_guarded
def api_status(request: Request) -> Response:
    return JSONResponse(collect(_console(request).workspace).to_json())


@_guarded
def outbox(request: Request) -> Response:
    entry = _status(request, "outboxes", OutboxEntry)
    rows: list[OutboxRow] = []
    dead: list[DeadLetter] = []
    error = None
    if entry.error is None:
        try:
            rows, dead = outbox_listings(_console(request).workspace.outbox(entry.name))
        except SluicewayError as exc:
            error = str(exc)
    return _detail(request, "outbox.html", "outbox", entry, rows=rows, dead=dead, error=error)


@_guarded
def journal(request: Request) -> Response:
    entry = _status(request, "journals", JournalEntry)
    records: list[dict[str, Any]] = []
    start = end = 0
    error = None
    if entry.error is None and entry.path is not None:
        head, first = entry.head or 0, entry.start or 0
        try:
            end = int(request.query_params.get("to") or head)
            start = int(request.query_params.get("from") or max(first, end - DEFAULT_RECORDS))
            records = journal_records(entry.path, start, end)
        except ValueError:
            error = "from and to are offsets: whole numbers"
        except SluicewayError as exc:
            error = str(exc)
    return _detail(
        request, "journal.html", "journal", entry, records=records, start=start, end=end, error=error
    )


@_guarded
def pipeline(request: Request) -> Response:
    entry = _status(request, "pipelines", PipelineEntry)
    stopped = stopped_records(entry, _console(request).workspace.root)
    return _detail(request, "pipeline.html", "pipeline", entry, stopped=stopped)


@_guarded
def feed(request: Request) -> Response:
    entry = _status(request, "feeds", FeedEntry)
    listing, error = None, None
    if entry.error is None:
        try:
            after = int(request.query_params.get("after") or 0)
            listing = feed_listing(_console(request).workspace.feed(entry.name), after=after)
        except ValueError:
            error = "after is a partition id: a whole number"
        except SluicewayError as exc:
            error = str(exc)
    return _detail(request, "feed.html", "feed", entry, listing=listing, error=error)


@_guarded
def capture(request: Request) -> Response:
    entry = _status(request, "captures", CaptureEntry)
    history = _console(request).history
    terms = []
    if history is not None:
        try:
            terms = history.terms(part_id("captures", entry.name))
        except HistoryError as exc:
            log.warning("history: %s", exc)
    return _detail(request, "capture.html", "capture", entry, terms=terms)


#: The longest range ``/api/history`` answers (Prometheus keeps what it keeps; the console's own
#: file keeps its retention).
LONGEST_RANGE = 366 * 86400.0


@_guarded
def api_history(request: Request) -> Response:
    """``GET /api/history?part=<kind>/<name>&range=1h``: a part's series (docs/operations.md);
    without ``part``, every watched part's headline series (the overview's sparklines)."""
    history = _console(request).history
    if history is None:
        raise HTTPException(404, "history is off in this workspace (history: {enabled: false})")
    text = request.query_params.get("range", "1h")
    try:
        span = range_seconds(text)
    except ValueError as exc:
        raise HTTPException(400, f"range: {exc}") from None
    if not 0 < span <= LONGEST_RANGE:
        raise HTTPException(400, f"range: between 1s and 366d, got {text!r}")
    only = [s for s in request.query_params.get("series", "").split(",") if s] or None
    part = request.query_params.get("part")
    parts = [part_id(kind, name) for kind, name in watched(_console(request).workspace)]
    if part is not None:
        try:
            split_part(part)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        if part not in parts:
            raise HTTPException(404, f"the workspace watches no {part}")
    try:
        if part is not None:
            return JSONResponse({"range": text, **history.read(part, span, only=only).to_json()})
        charts = [history.read(p, span, only=[headline(split_part(p)[0]).name]).to_json() for p in parts]
        return JSONResponse({"range": text, "parts": charts})
    except HistoryError as exc:
        raise HTTPException(503, str(exc)) from None


# -- actions --------------------------------------------------------------------------------------
#: An action: the request and its form in, the page to go back to and the operator's message out.
Perform = Callable[[Request, dict[str, str]], tuple[str, str]]


def _action(perform: Perform) -> Callable[[Request], Awaitable[Response]]:
    """A POST form: refused unless actions are on, the request is from this site and carries the
    token; a refusal of the action itself (a bad value, nothing by that name) is a 400."""

    @functools.wraps(perform)
    async def run(request: Request) -> Response:
        console = _console(request)
        if not console.allow_actions:
            raise HTTPException(403, "actions are off: start sluice ui with --allow-actions")
        if not console.same_origin(request):
            raise HTTPException(403, "refused: the request came from another site")
        if not console.authorised(request):
            raise HTTPException(
                403, "this action needs the token printed when sluice ui started: open its link"
            )
        body = (await request.body()).decode("utf-8", "replace")
        form = {k: v[-1] for k, v in parse_qs(body).items()}
        try:
            target, message = await run_in_threadpool(perform, request, form)
        except (SluicewayError, ValueError) as exc:
            raise HTTPException(400, str(exc)) from exc
        log.info("action %s: %s", request.url.path, message)
        return RedirectResponse(f"{target}?{urlencode({'msg': message})}", status_code=303)

    return run


@_action
def retry_dead(request: Request, form: dict[str, str]) -> tuple[str, str]:
    name, dead_id = request.path_params["name"], int(request.path_params["id"])
    return f"/outbox/{_segment(name)}", actions.retry_dead(_console(request).workspace, name, dead_id)


@_action
def resolve_dead(request: Request, form: dict[str, str]) -> tuple[str, str]:
    name, dead_id = request.path_params["name"], int(request.path_params["id"])
    return f"/outbox/{_segment(name)}", actions.resolve_dead(_console(request).workspace, name, dead_id)


@_action
def skip(request: Request, form: dict[str, str]) -> tuple[str, str]:
    name, sink = request.path_params["name"], request.path_params["sink"]
    offset = int(form.get("offset", ""))
    return f"/pipeline/{_segment(name)}", actions.skip(_console(request).workspace, name, sink, offset)


@_action
def step(request: Request, form: dict[str, str]) -> tuple[str, str]:
    name, sink = request.path_params["name"], request.path_params["sink"]
    steps = cast(Steps, request.app.state.steps)
    return f"/pipeline/{_segment(name)}", steps.start(_console(request).workspace, name, sink)


@_action
def retry_feed(request: Request, form: dict[str, str]) -> tuple[str, str]:
    name = request.path_params["name"]
    partition = form.get("partition") or None
    item = int(form["item"]) if form.get("item") else None
    return f"/feed/{_segment(name)}", actions.retry_feed(_console(request).workspace, name, partition, item)


ROUTES = [
    Route("/", overview),
    Route("/api/status", api_status),
    Route("/outbox/{name}", outbox),
    Route("/journal/{name}", journal),
    Route("/pipeline/{name}", pipeline),
    Route("/feed/{name}", feed),
    Route("/capture/{name}", capture),
    Route("/api/history", api_history),
    Route("/outbox/{name}/dead/{id:int}/retry", retry_dead, methods=["POST"]),
    Route("/outbox/{name}/dead/{id:int}/resolve", resolve_dead, methods=["POST"]),
    Route("/pipeline/{name}/sinks/{sink}/skip", skip, methods=["POST"]),
    Route("/pipeline/{name}/sinks/{sink}/step", step, methods=["POST"]),
    Route("/feed/{name}/retry", retry_feed, methods=["POST"]),
    Mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static"),
]
