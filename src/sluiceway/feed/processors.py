"""Processors: what a worker calls for each item.

* a Python callable ``fn(item) -> ProcessorResult | {gate, done, data}``, given as an object or
  as ``"package.module:function"``;
* an HTTP endpoint (``"http://host/path"``): the item is POSTed as JSON and the response body
  is the result.

HTTP protocol (version 1). Request, ``POST <url>`` with ``Content-Type: application/json``::

    {"id": 42, "partition": "folder-7", "gate": 0, "attempt": 1,
     "attributes": {...}, "encoding": "base64", "data": "aGVsbG8="}

``encoding`` is ``"base64"`` (default: any bytes) or ``"text"`` (the data is sent as a UTF-8
string; items that are not valid UTF-8 fail without retries). Response, status 2xx::

    {"gate": 1, "done": false, "data": "…"}

``data`` may be omitted or null (keep the item's data), a string in the request's encoding, or
a JSON object/array (stored as compact JSON). Or, to see the item again later without counting a failure
(an external job still running, a rate limit upstream)::

    {"retry_in": "30s"}

``retry_in`` is a number of seconds or a duration (``500ms``, ``5m``, ``1h``); the item stays at its
gate, its ``attempts`` unchanged, and is claimed again once the delay has passed (``data`` may
come with it; ``gate`` and ``done`` may not). Anything else — a non-2xx status, a body that
is not a JSON object, fields of the wrong type, a body over ``max_response_bytes``, a timeout —
is a :class:`ProcessorError`, and the item is retried with backoff up to ``max_attempts``.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import httpx

from sluiceway.errors import ConfigError
from sluiceway.feed.errors import ProcessorError
from sluiceway.feed.model import Item, ProcessorResult, encode_data
from sluiceway.tracing import trace_headers

Processor = Callable[[Item], object]
Encoding = Literal["base64", "text"]

#: Default cap on an HTTP processor's response body.
MAX_RESPONSE_BYTES = 1 << 20


def load_processor(
    spec: str | Processor,
    *,
    timeout: float = 10.0,
    encoding: Encoding = "base64",
    max_response_bytes: int = MAX_RESPONSE_BYTES,
    concurrency: int = 1,
) -> Processor:
    """Resolve ``spec``: a callable as is, an ``http(s)://`` URL, or ``"module:function"``.

    >>> load_processor("json:dumps") is json.dumps
    True
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(
            "a processor is a callable, 'module:function' or an http(s):// URL", path="processor"
        )
    text = spec.strip()
    if text.lower().startswith(("http://", "https://")):
        return HttpProcessor(
            text,
            timeout=timeout,
            encoding=encoding,
            max_response_bytes=max_response_bytes,
            concurrency=concurrency,
        )
    module_name, sep, attr = text.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"processor {text!r} is neither 'package.module:function' nor an http(s):// URL", path="processor"
        )
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"cannot import processor module {module_name!r}: {exc}{_import_hint(module_name, exc)}",
            path="processor",
        ) from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}", path="processor") from None
    if not callable(target):
        raise ConfigError(f"processor {text!r} is not callable", path="processor")
    fn: Processor = target
    return fn


def _import_hint(module_name: str, exc: ImportError) -> str:
    """How to make ``module_name`` importable, when it is the module itself (or its package) that
    was not found, not something it imports.

    >>> _import_hint("myapp.ocr", ModuleNotFoundError("No module named 'myapp'", name="myapp"))
    ' (run from the directory that holds it, or add that directory to PYTHONPATH)'
    >>> _import_hint("myapp.ocr", ModuleNotFoundError("No module named 'numpy'", name="numpy"))
    ''
    """
    missing = exc.name or ""
    if isinstance(exc, ModuleNotFoundError) and (module_name + ".").startswith(missing + "."):
        return " (run from the directory that holds it, or add that directory to PYTHONPATH)"
    return ""


class HttpProcessor:
    """POST each item to ``url`` as JSON; the JSON response is the :class:`ProcessorResult`.

    Thread-safe (one pooled ``httpx.Client``). ``timeout`` bounds the whole exchange, not just
    each network phase. ``transport`` lets tests inject ``httpx.MockTransport``.

    >>> proc = HttpProcessor("http://127.0.0.1:8080/ocr", timeout=5)   # doctest: +SKIP
    >>> proc(item)                                                       # doctest: +SKIP
    ProcessorResult(gate=1, done=False, data=b'...')
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        encoding: Encoding = "base64",
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        headers: Mapping[str, str] | None = None,
        concurrency: int = 1,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if encoding not in ("base64", "text"):
            raise ConfigError(
                f"HTTP processor encoding must be 'base64' or 'text', not {encoding!r}", path="encoding"
            )
        if timeout <= 0:
            raise ConfigError("HTTP processor timeout must be positive", path="timeout")
        if max_response_bytes < 1:
            raise ConfigError("max_response_bytes must be positive", path="max_response_bytes")
        self.url = url
        self.timeout = float(timeout)
        self.encoding = encoding
        self.max_response_bytes = int(max_response_bytes)
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.timeout),
            headers={"User-Agent": "sluiceway-feed/1", **dict(headers or {})},
            limits=httpx.Limits(
                max_connections=max(1, concurrency), max_keepalive_connections=max(1, concurrency)
            ),
            follow_redirects=False,
            transport=transport,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpProcessor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- request ------------------------------------------------------------------------------
    def _encode(self, data: bytes) -> str:
        if self.encoding == "base64":
            return base64.b64encode(data).decode("ascii")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            # Retrying cannot make these bytes text: fail the item at once.
            raise ProcessorError(
                f"item data is not UTF-8 text ({exc.reason} at byte {exc.start}); use encoding 'base64'",
                retryable=False,
            ) from exc

    def _decode(self, value: object) -> bytes | None:
        if value is None:
            return None
        if isinstance(value, Mapping | list):
            return encode_data(value)
        if not isinstance(value, str):
            raise ProcessorError(
                f"HTTP processor {self.url} returned 'data' of type {type(value).__name__}; "
                f"expected a {self.encoding} string, an object, an array or null"
            )
        if self.encoding == "text":
            try:
                return value.encode("utf-8")
            except UnicodeEncodeError as exc:  # JSON's "\ud800": a lone surrogate is no text
                raise ProcessorError(
                    f"HTTP processor {self.url} returned 'data' that is not text: {exc.reason} "
                    f"at character {exc.start}"
                ) from None
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ProcessorError(
                f"HTTP processor {self.url} returned 'data' that is not valid base64"
            ) from exc

    def __call__(self, item: Item) -> ProcessorResult:
        body = {
            "id": item.id,
            "partition": item.partition,
            "gate": item.gate,
            "attempt": item.attempt,
            "attributes": dict(item.attributes),
            "encoding": self.encoding,
            "data": self._encode(item.data),
        }
        raw = self._post(body)
        try:
            payload = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProcessorError(
                f"HTTP processor {self.url} returned a body that is not JSON: {_snippet(raw)!r}"
            ) from exc
        except RecursionError:
            # json's decoder recurses per level: about a thousand nested arrays exhaust the stack.
            raise ProcessorError(f"HTTP processor {self.url} returned JSON nested too deeply") from None
        if not isinstance(payload, dict):
            raise ProcessorError(
                f"HTTP processor {self.url} returned JSON {type(payload).__name__}; expected an object "
                '{"gate": int, "done": bool, "data": ...}'
            )
        fields = dict(payload)
        fields["data"] = self._decode(payload.get("data"))
        try:
            return ProcessorResult.coerce(fields)
        except ProcessorError as exc:
            raise ProcessorError(f"HTTP processor {self.url}: {exc}") from None

    def _post(self, body: Mapping[str, Any]) -> bytes:
        deadline = time.monotonic() + self.timeout
        try:
            # Inside a worker's span (tracing on): the service continues the item's trace.
            trace = trace_headers()
            with self._client.stream("POST", self.url, json=body, headers=trace or None) as response:
                if not 200 <= response.status_code < 300:
                    head = _read_limited(response, 512, deadline, self.url, truncate=True)
                    raise ProcessorError(
                        f"HTTP processor {self.url} answered {response.status_code} "
                        f"{response.reason_phrase}: {_snippet(head)!r}"
                    )
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > self.max_response_bytes:
                    raise ProcessorError(
                        f"HTTP processor {self.url} response of {declared} bytes exceeds the "
                        f"{self.max_response_bytes}-byte limit"
                    )
                return _read_limited(response, self.max_response_bytes, deadline, self.url)
        except httpx.TimeoutException as exc:
            raise ProcessorError(
                f"HTTP processor {self.url} timed out after {self.timeout:g}s ({type(exc).__name__})"
            ) from exc
        except httpx.HTTPError as exc:
            raise ProcessorError(f"HTTP processor {self.url} failed: {type(exc).__name__}: {exc}") from exc


def _read_limited(
    response: httpx.Response, limit: int, deadline: float, url: str, *, truncate: bool = False
) -> bytes:
    """Read at most ``limit`` bytes before ``deadline``; over the limit is an error unless truncating."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            if truncate:
                break
            raise ProcessorError(f"HTTP processor {url} response exceeds the {limit}-byte limit")
        if time.monotonic() > deadline:
            # httpx's timeouts are per read; a server dripping bytes could otherwise hold us forever.
            raise httpx.ReadTimeout("response not complete within the processor timeout")
    return b"".join(chunks)[: limit if truncate else None]


def _snippet(raw: bytes, n: int = 200) -> str:
    text = raw[:n].decode("utf-8", errors="replace")
    return text + ("…" if len(raw) > n else "")
