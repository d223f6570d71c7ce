"""The sink writers' shared lifecycle (``ClientSink``): the client opened by the first write and
kept, dropped (discarded, not released) after a failed write so the retry opens a fresh one, the
failure mapped before the client is dropped, and released on close."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sluiceway.pipeline.errors import DestinationUnreachable
from sluiceway.pipeline.sinks.base import ClientSink

TABLE = pa.table({"key": ["a"]})


class Client:
    def __init__(self, n: int) -> None:
        self.n = n
        self.ended: str | None = None


class Recording(ClientSink[Client]):
    def __init__(self) -> None:
        self.opened: list[Client] = []
        self.fail: BaseException | None = None
        self.seen_at_failure: Client | None = None

    def _open(self) -> Client:
        client = Client(len(self.opened) + 1)
        self.opened.append(client)
        return client

    def _write(self, client: Client, table: pa.Table, token: str) -> None:
        if self.fail is not None:
            raise self.fail

    def _release(self, client: Client) -> None:
        client.ended = "released"

    def _discard(self, client: Client) -> None:
        client.ended = "discarded"

    def _failure(self, exc: Exception) -> Exception | None:
        self.seen_at_failure = self._client
        return DestinationUnreachable("away") if isinstance(exc, ConnectionError) else None


def test_the_client_is_opened_by_the_first_write_and_kept() -> None:
    sink = Recording()
    assert sink.opened == []
    sink.write(TABLE, "t1")
    sink.write(TABLE, "t2")
    assert [c.n for c in sink.opened] == [1]
    sink.close()
    assert sink.opened[0].ended == "released"
    sink.close()  # twice is fine


def test_a_failed_write_discards_the_client_and_the_next_opens_a_fresh_one() -> None:
    sink = Recording()
    sink.write(TABLE, "t1")
    sink.fail = ValueError("a bad record")
    with pytest.raises(ValueError, match="a bad record"):
        sink.write(TABLE, "t2")
    assert sink.opened[0].ended == "discarded"
    assert sink.seen_at_failure is sink.opened[0]  # mapped while the client was still there
    sink.fail = None
    sink.write(TABLE, "t2")
    assert [c.n for c in sink.opened] == [1, 2] and sink.opened[1].ended is None


def test_a_mapped_failure_is_raised_from_the_original() -> None:
    sink = Recording()
    cause = ConnectionError("reset")
    sink.fail = cause
    with pytest.raises(DestinationUnreachable) as raised:
        sink.write(TABLE, "t1")
    assert raised.value.__cause__ is cause
    assert sink.opened[0].ended == "discarded"


def test_an_interrupt_drops_the_client_too() -> None:
    sink = Recording()
    sink.fail = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        sink.write(TABLE, "t1")
    assert sink.opened[0].ended == "discarded" and sink.seen_at_failure is None


def test_a_kept_kafka_producer_is_closed_once_idle_past_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shelf of producers the Kafka sink's tasks share (per worker process): taken again while
    fresh; closed by the sweeper once idle longer than KEEP_IDLE, never handed out after."""
    from sluiceway.pipeline.sinks import kafka
    from sluiceway.testing import wait_until

    monkeypatch.setattr(kafka, "KEEP_IDLE", 0.2)
    shelf, key = kafka._ProducerShelf(), (("bootstrap.servers", "127.0.0.1:9"),)
    flushed: list[float] = []

    class Producer:
        def flush(self, timeout: float) -> int:
            flushed.append(timeout)
            return 0

    kept = kafka._Kept()
    kept.producer = Producer()
    shelf.put(key, kept)
    assert shelf.take(key) is kept
    shelf.put(key, kept)
    wait_until(lambda: bool(flushed), timeout=5)
    assert shelf.take(key) is None
