"""Fuzz target: the feed HTTP processor's reply parser (``HttpProcessor`` on a fake transport).

The input is a reply: byte 0 chooses the encoding (bit 0: ``text``, else ``base64``), whether a
``Content-Length`` is declared (bit 1) and whether the body arrives in pieces (bit 2); byte 1 the
status; the rest is the body. Contract (the module's protocol): a :class:`ProcessorResult`, or
:class:`~sluiceway.feed.errors.ProcessorError`, which the worker retries or fails the item with.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import httpx

from sluiceway.feed.errors import ProcessorError
from sluiceway.feed.model import Item, ProcessorResult
from sluiceway.feed.processors import HttpProcessor

MAX_LEN = 8192
#: Small enough that the fuzzer reaches the size limit too.
MAX_RESPONSE = 4096

_STATUSES = (200, 201, 204, 299, 100, 199, 300, 302, 400, 404, 429, 500, 503, 599)
#: UTF-8 data: with encoding "text" an item that is not is refused before any request is made.
_ITEM = Item(id=7, partition="p", gate=1, data="item é".encode(), attempt=1, attributes={"k": "v"})


class _Pieces(httpx.SyncByteStream):
    def __init__(self, body: bytes) -> None:
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        for start in range(0, len(self.body), 7):
            yield self.body[start : start + 7]


@functools.cache
def _processor(encoding: str) -> HttpProcessor:
    return HttpProcessor(
        "http://processor.invalid/item",
        encoding=encoding,  # type: ignore[arg-type]
        max_response_bytes=MAX_RESPONSE,
        transport=httpx.MockTransport(_reply),
    )


_current: list[bytes] = [b""]


def _reply(request: httpx.Request) -> httpx.Response:
    data = _current[0]
    flags = data[0] if data else 0
    status = _STATUSES[data[1] % len(_STATUSES)] if len(data) > 1 else 200
    body = data[2:]
    headers = {"content-length": str(len(body))} if flags & 2 else {}
    if flags & 4:
        return httpx.Response(status, headers=headers, stream=_Pieces(body))
    return httpx.Response(status, headers=headers, content=body)


def fuzz_one(data: bytes) -> None:
    _current[0] = data
    encoding = "text" if data and data[0] & 1 else "base64"
    try:
        result = _processor(encoding)(_ITEM)
    except ProcessorError:
        return
    assert isinstance(result, ProcessorResult)
    assert isinstance(result.done, bool)
    assert result.done or (isinstance(result.gate, int) and not isinstance(result.gate, bool))
    assert result.data is None or isinstance(result.data, bytes)


def seeds() -> dict[str, bytes]:
    ok, created, error = bytes([0]), bytes([1]), bytes([12])
    return {
        "done": b"\x00" + ok + b'{"done": true}',
        "gate-data": b"\x02" + ok + b'{"gate": 2, "done": false, "data": "aGVsbG8="}',
        "text": b"\x01" + created + b'{"gate": 3, "data": "plain \\u00e9 text"}',
        "json-data": b"\x04" + ok + b'{"done": true, "data": {"words": [1, 2.5, null, "x"]}}',
        "error": b"\x00" + error + b"upstream failed",
        "not-json": b"\x00" + ok + b"<html>oops</html>",
        "array": b"\x00" + ok + b"[1, 2]",
        # Once findings (tests/unit/feed/test_processors.py): plain fuzzing did not reach them.
        "deep": b"\x00" + ok + b"[" * 2000 + b"]" * 2000,
        "surrogate": b"\x01" + ok + b'{"done": true, "data": "\\ud800"}',
    }
