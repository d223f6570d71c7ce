"""Processor loading and the HTTP protocol, against httpx's in-memory transport."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import httpx
import pytest

from sluiceway.errors import ConfigError
from sluiceway.feed import HttpProcessor, Item, ProcessorError, ProcessorResult, load_processor

ITEM = Item(
    id=9, partition="folder", gate=1, data=b"\xff\x00hi", attempt=2, partition_id=4, attributes={"k": "v"}
)


def http(handler: Callable[[httpx.Request], httpx.Response], **kwargs: object) -> HttpProcessor:
    return HttpProcessor("http://svc/item", transport=httpx.MockTransport(handler), **kwargs)  # type: ignore[arg-type]


def test_load_callable_module_function_and_url() -> None:
    fn = lambda item: {"done": True}  # noqa: E731
    assert load_processor(fn) is fn
    assert load_processor("json:dumps") is json.dumps
    assert load_processor("os.path:join") is not None
    proc = load_processor("http://127.0.0.1:1/x")
    assert isinstance(proc, HttpProcessor)
    proc.close()


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("nosuchmodule_zz:f", "cannot import"),
        ("json:nope", "no attribute"),
        ("json", "neither"),
        ("json:__doc__", "not callable"),
        ("", "a processor is"),
    ],
)
def test_bad_processor_specs(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_processor(spec)


def test_request_body_and_base64_round_trip() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(
            200, json={"gate": 3, "done": False, "data": base64.b64encode(b"\xffout").decode()}
        )

    with http(handler) as proc:
        assert proc(ITEM) == ProcessorResult(gate=3, done=False, data=b"\xffout")
    assert seen == [
        {
            "id": 9,
            "partition": "folder",
            "gate": 1,
            "attempt": 2,
            "attributes": {"k": "v"},
            "encoding": "base64",
            "data": base64.b64encode(b"\xff\x00hi").decode(),
        }
    ]


def test_retry_in_answers() -> None:
    with http(lambda request: httpx.Response(200, json={"retry_in": "30s"})) as proc:
        assert proc(ITEM) == ProcessorResult(retry_in=30.0)
    with (
        http(lambda request: httpx.Response(200, json={"retry_in": "later"})) as proc,
        pytest.raises(ProcessorError, match="'retry_in': expected a duration"),
    ):
        proc(ITEM)


def test_text_encoding_and_json_data() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["data"] == "plain" and body["encoding"] == "text"
        return httpx.Response(200, json={"done": True, "data": {"words": 1}})

    with http(handler, encoding="text") as proc:
        item = Item(id=1, partition="p", gate=0, data=b"plain", attempt=1)
        assert proc(item) == ProcessorResult(done=True, data=b'{"words":1}')
        with pytest.raises(ProcessorError, match="not UTF-8") as info:
            proc(ITEM)
        assert info.value.retryable is False


@pytest.mark.parametrize(
    ("response", "fragment"),
    [
        (httpx.Response(500, text="kaput"), "answered 500 Internal Server Error: 'kaput'"),
        (httpx.Response(404), "answered 404"),
        (httpx.Response(200, text="<html>"), "not JSON"),
        (httpx.Response(200, json=[1, 2]), "expected an object"),
        (httpx.Response(200, json={"gate": "x", "done": False}), "'gate' must be an integer"),
        (httpx.Response(200, json={"done": False}), "must give 'gate'"),
        (httpx.Response(200, json={"done": True, "data": "%%%"}), "not valid base64"),
        (httpx.Response(200, json={"done": True, "data": 12}), "'data' of type int"),
        (httpx.Response(200, content=b'{"done": true, "data": "' + b"A" * 2000 + b'"}'), "exceeds"),
    ],
)
def test_bad_responses_are_clear_errors(response: httpx.Response, fragment: str) -> None:
    with (
        http(lambda request: response, max_response_bytes=1000) as proc,
        pytest.raises(ProcessorError) as info,
    ):
        proc(ITEM)
    assert fragment in str(info.value)
    assert "http://svc/item" in str(info.value)


def test_transport_errors_are_processor_errors() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with http(handler) as proc, pytest.raises(ProcessorError, match="ConnectError"):
        proc(ITEM)


def test_timeouts_are_processor_errors() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with http(handler, timeout=0.5) as proc, pytest.raises(ProcessorError, match=r"timed out after 0\.5s"):
        proc(ITEM)


def test_configuration_is_checked() -> None:
    with pytest.raises(ConfigError):
        HttpProcessor("http://x", encoding="hex")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        HttpProcessor("http://x", timeout=0)


# Found with fuzz/feed_http_reply.py's seeds: each reply once escaped the processor as another
# exception (RecursionError, UnicodeEncodeError), which the worker does not expect from it.
@pytest.mark.parametrize(
    ("encoding", "body", "fragment"),
    [
        ("base64", b"[" * 2000 + b"]" * 2000, "nested too deeply"),
        ("base64", b'{"done": true, "data": ' + b"[" * 1500 + b"]" * 1500 + b"}", "nested too deeply"),
        ("text", b'{"done": true, "data": "\\ud800"}', "'data' that is not text: surrogates not allowed"),
    ],
    ids=["deep body", "deep data", "lone surrogate"],
)
def test_fuzz_findings_are_processor_errors(encoding: str, body: bytes, fragment: str) -> None:
    with (
        http(lambda request: httpx.Response(200, content=body), encoding=encoding) as proc,
        pytest.raises(ProcessorError, match=fragment),
    ):
        proc(Item(id=1, partition="p", gate=0, data=b"text", attempt=1))
