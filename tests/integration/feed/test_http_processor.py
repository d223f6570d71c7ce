"""The HTTP processor against a real HTTP server on 127.0.0.1 (stdlib, in a thread)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sluiceway.feed import Feed, FeedWorker, HttpProcessor, Item, ProcessorError, ProcessorResult, Status

RELEASE = threading.Event()  # lets slow handlers finish at teardown instead of holding the server


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    requests: list[dict[str, object]] = []

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, payload: object, status: int = 200) -> None:
        self._send(status, json.dumps(payload).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.requests.append(body)
        data = body["data"]
        if self.path == "/steps":  # fan-out in steps: gate 0 -> 1 -> done, data grows at each step
            raw = base64.b64decode(data) + f"|g{body['gate']}".encode()
            out = base64.b64encode(raw).decode()
            if body["gate"] < 1:
                self._json({"gate": body["gate"] + 1, "done": False, "data": out})
            else:
                self._json({"done": True, "data": out})
        elif self.path == "/text":
            self._json({"done": True, "data": data.upper()})
        elif self.path == "/json-data":
            self._json({"done": True, "data": {"length": len(data)}})
        elif self.path == "/slow":
            RELEASE.wait(5)
            self._json({"done": True})
        elif self.path == "/drip":  # headers at once, then a byte at a time: no single read times out
            payload = json.dumps({"done": True, "pad": "x" * 40}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            for byte in payload:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                if RELEASE.wait(0.05):
                    break
        elif self.path == "/html":
            self._send(200, b"<html>oops</html>", "text/html")
        elif self.path == "/error":
            self._send(503, b"maintenance", "text/plain")
        elif self.path == "/big":
            self._json({"done": True, "data": "A" * 4096})
        elif self.path == "/shape":
            self._json({"gate": "one", "done": False})
        elif self.path == "/list":
            self._json([{"done": True}])
        else:
            self._send(404, b"no such path", "text/plain")


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # The client gave up (timeouts are the point of some tests): writing to it then fails.
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    RELEASE.clear()
    httpd = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        RELEASE.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


ITEM = Item(id=5, partition="folder", gate=0, data=b"hello", attempt=1, attributes={"owner": "ops"})


def test_round_trip_base64(server: str) -> None:
    with HttpProcessor(f"{server}/steps") as proc:
        assert proc(ITEM) == ProcessorResult(gate=1, done=False, data=b"hello|g0")
    sent = Handler.requests[-1]
    assert sent == {
        "id": 5,
        "partition": "folder",
        "gate": 0,
        "attempt": 1,
        "attributes": {"owner": "ops"},
        "encoding": "base64",
        "data": base64.b64encode(b"hello").decode(),
    }


def test_text_encoding_and_object_data(server: str) -> None:
    with HttpProcessor(f"{server}/text", encoding="text") as proc:
        assert proc(ITEM) == ProcessorResult(done=True, data=b"HELLO")
    with HttpProcessor(f"{server}/json-data") as proc:
        assert proc(ITEM).data == b'{"length":8}'


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("/slow", "timed out after 0.3s"),
        ("/drip", "timed out after 0.3s"),
        ("/html", "not JSON: '<html>oops</html>'"),
        ("/error", "answered 503 Service Unavailable: 'maintenance'"),
        ("/missing", "answered 404"),
        ("/big", "exceeds the 1000-byte limit"),
        ("/shape", "'gate' must be an integer"),
        ("/list", "expected an object"),
    ],
)
def test_failures_are_clear(server: str, path: str, fragment: str) -> None:
    proc = HttpProcessor(f"{server}{path}", timeout=0.3, max_response_bytes=1000)
    with proc, pytest.raises(ProcessorError) as info:
        proc(ITEM)
    assert fragment in str(info.value)


def test_connection_refused(server: str) -> None:
    from sluiceway.testing import free_port

    proc = HttpProcessor(f"http://127.0.0.1:{free_port()}/x", timeout=1)
    with proc, pytest.raises(ProcessorError, match="ConnectError"):
        proc(ITEM)


def test_worker_drives_items_through_an_http_service(server: str, sqlite_dsn: str) -> None:
    with Feed(sqlite_dsn) as feed:
        feed.add("docs", [b"a", b"b", b"c"])
        feed.add("broken", [b"z"])
        stats = FeedWorker(
            sqlite_dsn, f"{server}/steps", concurrency=4, lease=5, poll_interval=0.02
        ).run_until_idle(timeout=30)
        assert stats.completed == 4 and stats.moved == 4
        items = feed.items("docs").rows
        assert sorted(i.data for i in items) == [b"a|g0|g1", b"b|g0|g1", b"c|g0|g1"]
        assert feed.partition("docs").status is Status.COMPLETE  # type: ignore[union-attr]

        feed.add("down", [b"q"])
        FeedWorker(
            sqlite_dsn, f"{server}/error", max_attempts=2, backoff=0.01, lease=5, poll_interval=0.02
        ).run_until_idle(timeout=30)
        (item,) = feed.items("down").rows
        assert item.status is Status.FAILED and item.attempts == 2
        assert "answered 503" in (item.last_error or "")
