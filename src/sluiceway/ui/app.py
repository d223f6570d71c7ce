"""The web console: server-rendered pages over :mod:`sluiceway.overview`, refreshing themselves.

Read-only unless started with ``allow_actions``; then the operator actions (dead-letter retry
and resolve, pipeline skip and step, feed retry) are POST forms that need the token — from the
``Authorization: Bearer`` header or from the cookie that opening the start-up link
(``/?token=…``) sets. The cookie is ``HttpOnly`` and ``SameSite=Strict``, and a POST whose
``Origin`` is another site is refused, so another page cannot act with an operator's cookie.
With ``token_for_reads`` (any address other than loopback) every page needs the token.

Handlers are plain functions run on Starlette's thread pool: each request opens its own database
connections and journal readers, as the CLI does, and closes them.
"""

from __future__ import annotations

import hmac
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from sluiceway.db import Database
from sluiceway.errors import SluicewayError
from sluiceway.feed import Feed
from sluiceway.outbox import discover
from sluiceway.outbox.deadletters import DeadLetterNotFoundError, resolve_dead_letter, retry_dead_letter
from sluiceway.overview import Workspace, collect
from sluiceway.overview.detail import feed_page, journal_records, stopped_record
from sluiceway.overview.outbox import dead_letters, oldest_rows
from sluiceway.overview.status import collect_one, pipeline_specs
from sluiceway.overview.workspace import SINGULAR

log = logging.getLogger("sluiceway.ui")

COOKIE = "sluice_token"
#: Records a journal page shows when no range is asked for.
DEFAULT_RECORDS = 50

StepLauncher = Callable[[str, str], Any]


def launch_step(spec: str, sink: str) -> subprocess.Popen[bytes]:
    """``sluice pipeline step SPEC --sink SINK`` in a process of its own (it starts Spark), its
    output in a log file; the sink's status shows the outcome."""
    log_file = Path(tempfile.gettempdir()) / f"sluice-step-{sink}-{int(time.time())}.log"
    with open(log_file, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sluiceway.cli.main", "pipeline", "step", spec, "--sink", sink],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


@dataclass
class Console:
    """What one ``sluice ui`` serves, and how it guards it."""

    workspace: Workspace
    allow_actions: bool = False
    token: str | None = None
    #: Every request needs the token, pages too (set when listening beyond loopback).
    token_for_reads: bool = False
    refresh_seconds: float = 5.0
    step: StepLauncher = launch_step
    _steps: list[Any] = field(default_factory=list)

    # -- the token ------------------------------------------------------------------------------
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

    # -- lookups --------------------------------------------------------------------------------
    def watched(self, kind: str, name: str) -> Any:
        """The workspace's entry ``name`` of ``kind`` (``outboxes``, ``journals``, ``feeds``), or None."""
        return next((w for w in getattr(self.workspace, kind) if w.name == name), None)


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


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("sluiceway.ui", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(seconds=_format_seconds, size=_format_bytes, number=_number, q=lambda v: quote(str(v)))
    return Jinja2Templates(env=env)


def create_app(console: Console) -> Starlette:
    """The ASGI application of ``sluice ui`` for ``console``.

    >>> app = create_app(Console(Workspace()))                        # doctest: +SKIP
    >>> uvicorn.run(app, host="127.0.0.1", port=8080)
    """
    templates = _templates()

    def page(request: Request, name: str, **context: Any) -> Response:
        context.update(
            console=console,
            request=request,
            message=request.query_params.get("msg"),
            actions=console.allow_actions,
            fragment=request.headers.get("x-sluice-fragment") == "1",
        )
        return templates.TemplateResponse(request, name, context)

    def refused(request: Request, status: int, text: str) -> Response:
        return templates.TemplateResponse(
            request,
            "message.html",
            {"console": console, "request": request, "title": "refused", "text": text, "fragment": False},
            status_code=status,
        )

    def guarded(handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def run(request: Request) -> Response:
            token = request.query_params.get("token")
            if token is not None and console.token is not None and hmac.compare_digest(token, console.token):
                # The start-up link: keep the token in a cookie, and the URL clean.
                rest = {k: v for k, v in request.query_params.items() if k != "token"}
                target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
                response = RedirectResponse(target, status_code=303)
                response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
                return response
            if console.token_for_reads and not console.authorised(request):
                return refused(request, 401, "this console needs its token: open the link sluice ui printed")
            return handler(request)

        return run

    # -- pages ----------------------------------------------------------------------------------
    def overview(request: Request) -> Response:
        return page(request, "overview.html", report=collect(console.workspace))

    def api_status(request: Request) -> Response:
        return JSONResponse(collect(console.workspace))

    def read(request: Request, kind: str) -> tuple[Any, dict[str, Any]] | Response:
        """The watched thing a page is about and its status entry, or a 404 page."""
        name = request.path_params["name"]
        watch = console.watched(kind, name) if kind != "pipelines" else name
        entry = collect_one(console.workspace, kind, name) if watch is not None else None
        if entry is None:
            return refused(request, 404, f"no {SINGULAR[kind]} named {name!r} in the workspace")
        return watch, entry

    def outbox(request: Request) -> Response:
        found = read(request, "outboxes")
        if isinstance(found, Response):
            return found
        watch, entry = found
        rows, dead, error = [], [], None
        if entry["error"] is None:
            try:
                with Database(watch.dsn) as db:
                    rows = oldest_rows(db, watch.table)
                    dead = dead_letters(db, watch.table)
            except SluicewayError as exc:
                error = str(exc)
        return page(request, "outbox.html", entry=entry, rows=rows, dead=dead, error=error)

    def journal(request: Request) -> Response:
        found = read(request, "journals")
        if isinstance(found, Response):
            return found
        watch, entry = found
        records: list[dict[str, Any]] = []
        start = end = 0
        error = None
        if entry["error"] is None:
            head, first = int(entry["head"]), int(entry["start"])
            try:
                end = int(request.query_params.get("to") or head)
                start = int(request.query_params.get("from") or max(first, end - DEFAULT_RECORDS))
                records = journal_records(watch.path, start, end)
            except ValueError:
                error = "from and to are offsets: whole numbers"
            except SluicewayError as exc:
                error = str(exc)
        return page(request, "journal.html", entry=entry, records=records, start=start, end=end, error=error)

    def pipeline(request: Request) -> Response:
        found = read(request, "pipelines")
        if isinstance(found, Response):
            return found
        _, entry = found
        stopped: dict[str, Any] = {}
        for sink in entry["sinks"] or []:
            offset = (sink["error"] or {}).get("offset")
            if sink["state"] == "failed" and isinstance(offset, int):
                try:
                    stopped[sink["name"]] = stopped_record(entry["spec"], offset)
                except Exception as exc:  # the page still shows the error without its record
                    stopped[sink["name"]] = {"error": f"cannot read the record: {exc}"}
        return page(request, "pipeline.html", entry=entry, stopped=stopped)

    def feed(request: Request) -> Response:
        found = read(request, "feeds")
        if isinstance(found, Response):
            return found
        watch, entry = found
        listing, error = None, None
        if entry["error"] is None:
            try:
                after = int(request.query_params.get("after") or 0)
                with Feed(watch.dsn, prefix=watch.prefix, migrate=False) as client:
                    listing = feed_page(client, after=after)
            except ValueError:
                error = "after is a partition id: a whole number"
            except SluicewayError as exc:
                error = str(exc)
        return page(request, "feed.html", entry=entry, listing=listing, error=error)

    # -- actions --------------------------------------------------------------------------------
    def action(perform: Callable[[Request, dict[str, str]], tuple[str, str]]) -> Callable[[Request], Any]:
        async def run(request: Request) -> Response:
            if not console.allow_actions:
                return refused(request, 403, "actions are off: start sluice ui with --allow-actions")
            if not console.same_origin(request):
                return refused(request, 403, "refused: the request came from another site")
            if not console.authorised(request):
                return refused(
                    request, 403, "this action needs the token printed when sluice ui started: open its link"
                )
            body = (await request.body()).decode("utf-8", "replace")
            form = {k: v[-1] for k, v in parse_qs(body).items()}
            try:
                target, message = await run_in_threadpool(perform, request, form)
            except (SluicewayError, ValueError) as exc:
                return refused(request, 400, str(exc))
            log.info("action %s: %s", request.url.path, message)
            return RedirectResponse(f"{target}?{urlencode({'msg': message})}", status_code=303)

        return run

    def retry_dead(request: Request, form: dict[str, str]) -> tuple[str, str]:
        def retry(db: Database, table: str, dead_id: int) -> str:
            head = retry_dead_letter(db, discover(db, table), dead_id)
            return "put back at the head of its key" if head else "put back into the outbox"

        return _dead_action(request, retry)

    def resolve_dead(request: Request, form: dict[str, str]) -> tuple[str, str]:
        def resolve(db: Database, table: str, dead_id: int) -> str:
            resolve_dead_letter(db, discover(db, table), dead_id)
            return "resolved (discarded; its key released)"

        return _dead_action(request, resolve)

    def _dead_action(request: Request, act: Callable[[Database, str, int], str]) -> tuple[str, str]:
        name, dead_id = request.path_params["name"], int(request.path_params["id"])
        watch = console.watched("outboxes", name)
        if watch is None:
            raise ValueError(f"no outbox named {name!r}")
        with Database(watch.dsn) as db:
            try:
                done = act(db, watch.table, dead_id)
            except DeadLetterNotFoundError:
                return f"/outbox/{quote(name)}", f"no dead letter {dead_id}"
        return f"/outbox/{quote(name)}", f"dead letter {dead_id} {done}"

    def skip(request: Request, form: dict[str, str]) -> tuple[str, str]:
        from sluiceway.pipeline import PipelineSpec
        from sluiceway.pipeline.operator import skip as skip_record

        name, sink = request.path_params["name"], request.path_params["sink"]
        spec = _spec_of(name)
        offset = int(form.get("offset", ""))
        skip_record(PipelineSpec.from_yaml(spec), sink, offset)
        return f"/pipeline/{quote(name)}", f"sink {sink} will skip offset {offset} (when the pipeline runs)"

    def step(request: Request, form: dict[str, str]) -> tuple[str, str]:
        name, sink = request.path_params["name"], request.path_params["sink"]
        spec = _spec_of(name)
        console._steps = [p for p in console._steps if getattr(p, "poll", lambda: 0)() is None]
        console._steps.append(console.step(spec, sink))
        return (
            f"/pipeline/{quote(name)}",
            f"sink {sink}: one step started (Spark starts first; refresh to see it)",
        )

    def _spec_of(name: str) -> str:
        spec = pipeline_specs(console.workspace).get(name)
        if spec is None:
            raise ValueError(f"no pipeline named {name!r}")
        return spec

    def retry_feed(request: Request, form: dict[str, str]) -> tuple[str, str]:
        name = request.path_params["name"]
        watch = console.watched("feeds", name)
        if watch is None:
            raise ValueError(f"no feed named {name!r}")
        partition = form.get("partition") or None
        item = int(form["item"]) if form.get("item") else None
        with Feed(watch.dsn, prefix=watch.prefix, migrate=False) as client:
            n = client.retry(partition, item)
        scope = f" of partition {partition}" if partition else ""
        return f"/feed/{quote(name)}", f"{n} failed item(s){scope} made available again"

    routes = [
        Route("/", guarded(overview)),
        Route("/api/status", guarded(api_status)),
        Route("/outbox/{name}", guarded(outbox)),
        Route("/journal/{name}", guarded(journal)),
        Route("/pipeline/{name}", guarded(pipeline)),
        Route("/feed/{name}", guarded(feed)),
        Route("/outbox/{name}/dead/{id:int}/retry", action(retry_dead), methods=["POST"]),
        Route("/outbox/{name}/dead/{id:int}/resolve", action(resolve_dead), methods=["POST"]),
        Route("/pipeline/{name}/sinks/{sink}/skip", action(skip), methods=["POST"]),
        Route("/pipeline/{name}/sinks/{sink}/step", action(step), methods=["POST"]),
        Route("/feed/{name}/retry", action(retry_feed), methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.console = console
    return app
