"""The console's guard and its pipeline actions, over ASGI without a server or a browser:
read-only by default, a token for every page beyond loopback, skip and step for a sink."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from sluiceway.overview import Workspace
from sluiceway.pipeline.state import StateStore
from sluiceway.ui import Console, create_app
from tests.support.overview import Built, build


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("api")
    return build(root / "ws", f"sqlite:///{root / 'ws' / 'shop.db'}")


class Web:
    """A synchronous client of the app in this process, keeping cookies as a browser would."""

    def __init__(self, app: Any) -> None:
        self.transport = httpx.ASGITransport(app=app)
        self.cookies = httpx.Cookies()

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            async with httpx.AsyncClient(
                transport=self.transport, base_url="http://127.0.0.1:8080", cookies=self.cookies
            ) as web:
                response = await web.request(method, url, **kwargs)
                self.cookies.update(web.cookies)
                return response

        return asyncio.run(send())

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)


def client(built: Built, **settings: Any) -> Web:
    return Web(create_app(Console(Workspace.from_file(built.config), **settings)))


def test_read_only_by_default(built: Built) -> None:
    web = client(built)
    assert web.get("/").status_code == 200
    page = web.get("/outbox/shop").text
    assert "retry" not in page, "no action is offered"
    refused = web.post("/outbox/shop/dead/1/retry", headers={"Authorization": "Bearer anything"})
    assert refused.status_code == 403 and "--allow-actions" in refused.text


def test_beyond_loopback_every_page_needs_the_token(built: Built) -> None:
    web = client(built, token="s3cret", token_for_reads=True)
    assert web.get("/").status_code == 401
    assert web.get("/api/status").status_code == 401
    assert web.get("/api/status", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    login = web.get("/?token=s3cret")
    assert login.status_code == 303 and login.headers["location"] == "/"
    assert (
        "httponly" in login.headers["set-cookie"].lower()
        and "samesite=strict" in login.headers["set-cookie"].lower()
    )
    assert web.get("/").status_code == 200, "the cookie carries the token from then on"
    assert client(built, token="s3cret", token_for_reads=True).get("/?token=wrong").status_code == 401


def test_skip_and_step_a_sink(built: Built) -> None:
    launched: list[tuple[str, str]] = []

    def step(spec: str, sink: str, cwd: str | None) -> None:
        assert cwd == str(built.config.parent), "run where the workspace's relative paths are read from"
        launched.append((spec, sink))

    web = client(built, allow_actions=True, token="t", step=step)
    auth = {"Authorization": "Bearer t"}
    assert web.post("/pipeline/orders/sinks/db/skip", data={"offset": "42"}).status_code == 403
    done = web.post(
        "/pipeline/orders/sinks/db/skip", data={"offset": "42"}, headers=auth, follow_redirects=False
    )
    assert done.status_code == 303 and "skip+offset+42" in done.headers["location"]
    assert StateStore(built.spec.parent / "checkpoints" / "db").load().skip == [42]
    stepped = web.post("/pipeline/orders/sinks/db/step", headers=auth)
    assert stepped.status_code == 303 and launched == [(str(built.spec), "db")]
    bad = web.post("/pipeline/orders/sinks/nope/skip", data={"offset": "1"}, headers=auth)
    assert bad.status_code == 400 and "no sink named &#39;nope&#39;" in bad.text
    assert web.post("/pipeline/elsewhere/sinks/db/step", headers=auth).status_code == 400
    unnamed = web.post("/pipeline/orders/sinks/nope/step", headers=auth)
    assert unnamed.status_code == 400 and "no sink named &#39;nope&#39;" in unnamed.text
    assert launched == [(str(built.spec), "db")], "no step is started for a sink the spec does not name"


def test_a_name_the_workspace_does_not_watch_is_a_404_page(built: Built) -> None:
    web = client(built)
    for path, said in (
        ("/outbox/shop2", "no outbox named &#39;shop2&#39; in the workspace"),
        ("/journal/<b>bus", "no journal named &#39;&lt;b&gt;bus&#39; in the workspace"),
        ("/pipeline/nope", "no pipeline named &#39;nope&#39; in the workspace"),
        ("/feed/work2", "no feed named &#39;work2&#39; in the workspace"),
    ):
        missing = web.get(path)
        assert missing.status_code == 404 and said in missing.text, path
        assert "<b>" not in missing.text.split("<main", 1)[1], "the name is text, never markup"


def test_the_feed_page_shows_scheduled_work_and_rate_limits(tmp_path: Any) -> None:
    from datetime import timedelta

    from sluiceway.feed import Feed

    built = build(tmp_path / "ws", f"sqlite:///{tmp_path / 'ws' / 'shop.db'}")
    web = client(built)
    page = web.get("/feed/work").text
    assert 'id="rate_limits"' not in page  # no limit set: no table
    assert 'data-field="scheduled_partitions">0<' in page
    with Feed(built.feed_dsn) as feed:
        feed.add("later", [b"x", b"y"], not_before=timedelta(hours=1))
        feed.set_rate(5, attribute="tenant", value="acme", burst=3)
    page = web.get("/feed/work").text
    assert 'data-field="scheduled_partitions">1<' in page and 'data-field="scheduled_items">2<' in page
    assert 'data-field="next_due">20' in page  # an ISO 8601 time, not a dash
    assert 'id="rate_limits"' in page and "tenant=acme" in page and 'data-field="max_rate">5.0<' in page
    (entry,) = web.get("/api/status").json()["feeds"]
    assert entry["scheduled"]["partitions"] == 1 and entry["scheduled"]["items"] == 2
    assert entry["rate_limits"][0]["value"] == "acme"
