"""A change the destination refuses for good, on real brokers: ``sluice capture`` stops on it with one
line, ``inspect`` shows it, ``skip`` passes over exactly that change (and refuses any other
position), and with ``deadLetter:`` it goes there with its refusal while the stream goes on.

Two refusals a user meets: a 5 MB row into NATS, whose payload limit is 1 MB; a change published
``mandatory`` to a RabbitMQ exchange where no queue is bound for its routing key."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from sluiceway.capture import Capture, UndeliverableChange
from sluiceway.capture.refusals import RefusalLog
from sluiceway.cdc.pgoutput import format_lsn
from sluiceway.cdc.state import SourceState
from sluiceway.overview import Workspace, collect
from sluiceway.testing import wait_until
from tests.support.brokers import AMQP_URL, make_place
from tests.support.capture import config, parse
from tests.support.cdc import journal_records, slot_confirmed
from tests.support.cli import sluice

pytestmark = pytest.mark.timeout(180)

BIG = 5 * 1024 * 1024


@pytest.fixture
def tables(cdc_dsn: str) -> Iterator[str]:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS items, orphans")
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, version bigint NOT NULL, note text)")
        conn.execute("CREATE TABLE orphans (id int PRIMARY KEY, version bigint NOT NULL, note text)")
        conn.execute("INSERT INTO items SELECT g, 0, 'seed' FROM generate_series(1, 10) g")
    yield cdc_dsn


def write(dsn: str, *statements: str) -> None:
    """``statements`` in one transaction."""
    with psycopg.connect(dsn) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def wal_now(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").fetchone()
        assert row is not None
        return int(row[0])


def spec(tmp_path: Path, cfg: dict[str, Any]) -> Path:
    path = tmp_path / "capture.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_row_too_large_for_nats_stops_the_capture_until_it_is_skipped(tables: str, tmp_path: Path) -> None:
    place = make_place("nats")
    try:
        cfg = config(tables, "refuse_nats", tmp_path / "state", target=place.target())
        cfg["capture"]["topic"] = f"{place.prefix}.{{table}}"
        file = spec(tmp_path, cfg)
        capture = Capture(file)
        with capture:
            wait_until(lambda: slot_confirmed(tables, "refuse_nats") > 0, timeout=60, message="the slot")
            # One transaction: a small change, the 5 MB one, another small one.
            write(
                tables,
                "UPDATE items SET version = 1 WHERE id = 1",
                f"UPDATE items SET version = 1, note = repeat('x', {BIG}) WHERE id = 2",
                "UPDATE items SET version = 1 WHERE id = 3",
            )
            with pytest.raises(UndeliverableChange, match="sluice capture skip --lsn"):
                capture.wait(timeout=60)
        stuck = RefusalLog(tmp_path / "state").read().stuck
        assert stuck is not None and (stuck.table, stuck.key, stuck.index) == ("public.items", "2", 1)
        assert stuck.size > BIG and "payload" in stuck.refusal.lower()
        lsn = format_lsn(stuck.lsn)

        shown = sluice("capture", "inspect", "-f", str(file), cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        for expected in ("public.items", "key      2", lsn, f"{stuck.size:,} bytes", "skip -f"):
            assert expected in shown.stdout, shown.stdout
        as_json = json.loads(
            sluice("capture", "inspect", "-f", str(file), "--format", "json", cwd=tmp_path).stdout
        )
        assert as_json["stuck"]["lsn"] == lsn and as_json["skipped"] == 0
        workspace = tmp_path / "sluice.yaml"
        workspace.write_text(yaml.safe_dump({"captures": [str(file)]}))
        entry = collect(Workspace.from_file(workspace)).to_json()["captures"][0]
        assert entry["refusals"]["stuck"]["key"] == "2" and "refuses" in entry["problems"][0]

        wrong = sluice("capture", "skip", "-f", str(file), "--lsn", "0/1", cwd=tmp_path)
        assert wrong.returncode == 1 and wrong.stdout == ""
        assert wrong.stderr.strip().splitlines() == [
            f"error: the stuck change is at {lsn} (public.items key '2'), not 0/1: nothing skipped "
            "(sluice capture inspect shows it)"
        ]
        bad = sluice("capture", "skip", "-f", str(file), "--lsn", "nonsense", cwd=tmp_path)
        assert bad.returncode == 1 and "is not a position" in bad.stderr and len(bad.stderr.splitlines()) == 1
        skipped = sluice("capture", "skip", "-f", str(file), "--lsn", lsn, cwd=tmp_path)
        assert skipped.returncode == 0 and "skipped public.items key '2'" in skipped.stdout
        again = sluice("capture", "skip", "-f", str(file), "--lsn", lsn, cwd=tmp_path)
        assert again.returncode == 1 and "no change is stuck" in again.stderr

        with Capture(file) as capture:
            write(tables, "UPDATE items SET version = 2 WHERE id = 2")
            end = wal_now(tables)
            wait_until(
                lambda: slot_confirmed(tables, "refuse_nats") >= end, timeout=60, message="the capture"
            )
            assert capture.meter.skips == 1
        changes = [parse(k, v, h) for k, v, h in place.read()]
        synced = [(c.key, c.version) for c in changes if c.op == "update"]
        # Exactly the refused change is missing: its neighbours and the key's next change arrived.
        assert synced == [("1", 1), ("3", 1), ("2", 2)]
        refusals = RefusalLog(tmp_path / "state").read()
        assert refusals.stuck is None and refusals.skipped == 1 and refusals.skips == []
        entry = collect(Workspace.from_file(workspace)).to_json()["captures"][0]
        assert entry["refusals"]["skipped"] == 1 and not any("refuses" in p for p in entry["problems"])
    finally:
        place.cleanup()


def test_a_dead_letter_journal_takes_the_row_nats_refuses_and_the_stream_goes_on(
    tables: str, tmp_path: Path
) -> None:
    place = make_place("nats")
    letters = tmp_path / "dead"
    try:
        cfg = config(tables, "dead_nats", tmp_path / "state", target=place.target())
        cfg["capture"].update(
            topic=f"{place.prefix}.{{table}}", deadLetter={"journal": {"path": str(letters)}}
        )
        with Capture(cfg) as capture:
            wait_until(lambda: slot_confirmed(tables, "dead_nats") > 0, timeout=60, message="the slot")
            write(tables, f"UPDATE items SET version = 1, note = repeat('y', {BIG}) WHERE id = 4")
            write(tables, "UPDATE items SET version = 2 WHERE id = 4")
            end = wal_now(tables)
            wait_until(lambda: slot_confirmed(tables, "dead_nats") >= end, timeout=60, message="the capture")
            assert capture.meter.dead_letters == 1
        dead = journal_records(letters)
        assert len(dead) == 1
        headers = dict(dead[0]["headers"])
        assert dead[0]["key"] == "4" and len(dead[0]["value"]) > BIG
        assert (
            "payload" in headers["sluice.refusal"].lower()
            and headers["sluice.topic"] == f"{place.prefix}.items"
        )
        assert json.loads(dead[0]["value"])["after"]["version"] == 1
        synced = [
            (c.key, c.version) for c in (parse(k, v, h) for k, v, h in place.read()) if c.op == "update"
        ]
        assert synced == [("4", 2)]
        refusals = RefusalLog(tmp_path / "state").read()
        assert refusals.dead_lettered == 1 and refusals.stuck is None
        assert refusals.last_dead_letter is not None and refusals.last_dead_letter.key == "4"
    finally:
        place.cleanup()


def _rabbit(action: Any) -> Any:
    async def run() -> Any:
        import aio_pika

        conn = await aio_pika.connect(AMQP_URL)
        try:
            return await action(await conn.channel())
        finally:
            await conn.close()

    return asyncio.run(run())


@pytest.mark.parametrize("dead_letter", [False, True], ids=["stop", "dead-letter"])
def test_a_change_rabbitmq_cannot_route_stops_the_capture_or_goes_to_a_dead_letter_routing_key(
    tables: str, tmp_path: Path, dead_letter: bool
) -> None:
    place = make_place("rabbitmq")
    exchange, prefix = place.extra["exchange"], place.prefix
    dead_queue = f"{prefix}.dead.q"

    async def bind_only_items_and_dead(ch: Any) -> None:
        # The place's queue takes every routing key: made to take only items (and a dead letter queue).
        queue = await ch.get_queue(place.extra["queue"], ensure=False)
        await queue.unbind(exchange, routing_key="#")
        await queue.bind(exchange, routing_key=f"{prefix}.items")
        dead = await ch.declare_queue(dead_queue, durable=True)
        await dead.bind(exchange, routing_key=f"{prefix}.dead")

    _rabbit(bind_only_items_and_dead)
    slot = f"route_{'dead' if dead_letter else 'stop'}"
    try:
        cfg = config(tables, slot, tmp_path / "state", target=place.target(mandatory=True))
        cfg["capture"].update(tables=["public.items", "public.orphans"], topic=f"{prefix}.{{table}}")
        if dead_letter:
            cfg["capture"]["deadLetter"] = {"topic": f"{prefix}.dead"}
        capture = Capture(cfg)
        with capture:
            # The copy done first: a row written during it is copied too, a change of its own.
            copied = lambda: SourceState(tmp_path / "state").load().done_at is not None  # noqa: E731
            wait_until(copied, timeout=60, message="the copy")
            write(
                tables,
                "INSERT INTO orphans VALUES (1, 1, 'nowhere to go')",
                "UPDATE items SET version = 5 WHERE id = 5",
            )
            write(tables, "UPDATE items SET version = 6 WHERE id = 5")
            if not dead_letter:
                with pytest.raises(UndeliverableChange, match="unroutable"):
                    capture.wait(timeout=60)
            else:
                end = wal_now(tables)
                wait_until(lambda: slot_confirmed(tables, slot) >= end, timeout=60, message="the capture")
        refusals = RefusalLog(tmp_path / "state").read()
        items = [parse(k, v, h) for k, v, h in place.read()]
        if not dead_letter:
            assert refusals.stuck is not None and (refusals.stuck.table, refusals.stuck.key) == (
                "public.orphans",
                "1",
            )
            assert "unroutable" in refusals.stuck.refusal
            return
        assert refusals.dead_lettered == 1 and refusals.stuck is None
        assert [(c.key, c.version) for c in items if c.op == "update"] == [
            ("5", 5),
            ("5", 6),
        ]

        async def dead_letters(ch: Any) -> list[Any]:
            queue = await ch.get_queue(dead_queue, ensure=False)
            out = []
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                out.append(message)
            await queue.delete(if_unused=False, if_empty=False)
            return out

        (letter,) = _rabbit(dead_letters)
        assert json.loads(letter.body)["after"] == {"id": 1, "version": 1, "note": "nowhere to go"}
        assert (
            letter.headers["sluice.topic"] == f"{prefix}.orphans"
            and "unroutable" in letter.headers["sluice.refusal"]
        )
    finally:
        _rabbit(lambda ch: ch.queue_delete(dead_queue))
        place.cleanup()
