"""Each broker's mapping of a record, both ways, and the settings that select a target."""

from __future__ import annotations

import pytest

from sluiceway.brokers import Message
from sluiceway.brokers.nats import from_nats, to_nats
from sluiceway.brokers.rabbitmq import amqp_headers
from sluiceway.brokers.redis import entry_offset, from_fields, offset_entry, xadd_args
from sluiceway.errors import ConfigError
from sluiceway.harvest import HarvestConfig
from sluiceway.harvest.brokers import msg_id_prefix, to_message
from sluiceway.outbox.record import MarkedRecord

RECORD = Message(
    "orders.created", "o-1", b'{"total": 12}', (("app", "shop"), ("trace", "a"), ("trace", "b")), "p:7"
)


def test_nats_subject_payload_and_headers_round_trip() -> None:
    subject, payload, headers = to_nats(RECORD, "ORDERS")
    assert (subject, payload) == ("orders.created", b'{"total": 12}')
    assert headers["Nats-Msg-Id"] == "p:7" and headers["Nats-Expected-Stream"] == "ORDERS"
    key, value, user = from_nats(headers, payload)
    assert (key, value) == ("o-1", b'{"total": 12}')
    assert user == [("app", "shop"), ("trace", "b")]  # one value per name in nats-py: the last


def test_nats_tombstone_is_not_an_empty_value() -> None:
    tomb = Message("t", "k", None, (), "p:1")
    empty = Message("t", "k", b"", (), "p:2")
    assert from_nats(to_nats(tomb, None)[2], b"")[1] is None
    assert from_nats(to_nats(empty, None)[2], b"")[1] == b""


def test_rabbitmq_headers_keep_repeated_names_as_lists() -> None:
    table = amqp_headers(RECORD)
    assert table == {"app": "shop", "trace": ["a", "b"], "Sluice-Key": "o-1"}
    assert amqp_headers(Message("t", "k", None))["Sluice-Tombstone"] is True


def test_redis_fields_round_trip_with_repeated_headers() -> None:
    args = xadd_args(RECORD, 1000)
    assert args[:6] == ["XADD", "orders.created", "MAXLEN", "~", 1000, "*"]
    fields = [a.encode() if isinstance(a, str) else a for a in args[6:]]
    assert from_fields(fields) == ("o-1", b'{"total": 12}', [("app", "shop"), ("trace", "a"), ("trace", "b")])
    tomb = [a.encode() if isinstance(a, str) else a for a in xadd_args(Message("t", "k", None), 0)[3:]]
    assert from_fields(tomb)[1] is None


@pytest.mark.parametrize("entry", ["0-0", "1-0", "1795682848908-0", "1795682848908-1048575"])
def test_redis_entry_ids_map_to_ordered_offsets(entry: str) -> None:
    assert offset_entry(entry_offset(entry)) == entry
    assert (
        entry_offset("1795682848908-1") > entry_offset("1795682848908-0") > entry_offset("1795682848907-99")
    )
    with pytest.raises(ValueError):
        entry_offset("5-1048576")


def config(**harvest: object) -> HarvestConfig:
    return HarvestConfig.from_dict({"harvest": {"dataSource": "sqlite:///app.db", **harvest}})


def test_a_target_selects_the_database_lease_and_names_itself_without_passwords() -> None:
    cfg = config(target={"type": "rabbitmq", "url": "amqp://app:s3cret@mq:5672/", "exchange": "orders"})
    assert cfg.harvest.election_kind == "database"
    assert cfg.harvest.destination == "rabbitmq"
    assert cfg.harvest.describe_destination() == "rabbitmq amqp://app:***@mq:5672/ exchange orders"
    nats = config(target={"type": "nats", "servers": ["nats://127.0.0.1:4222"], "stream": "ORDERS"})
    assert nats.harvest.describe_destination() == "nats nats://127.0.0.1:4222 stream ORDERS"


@pytest.mark.parametrize(
    ("harvest", "problem"),
    [
        ({"target": {"type": "redis"}, "journal": {"path": "./j"}}, "two destinations"),
        ({"target": {"type": "mqtt"}}, "type"),
        ({"target": {"type": "nats", "stream": "bad name"}}, "stream name"),
        ({"target": {"type": "redis", "ackTimeout": "-1s"}}, "ack"),
    ],
)
def test_target_mistakes_are_named(harvest: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        config(**harvest)


def test_message_ids_are_stable_per_outbox_and_differ_between_outboxes() -> None:
    cfg = config(target={"type": "nats", "stream": "ORDERS"})
    target = cfg.harvest.target
    assert target is not None
    a = msg_id_prefix(target, "postgresql://app:one@db/app", "outbox")
    assert a == msg_id_prefix(target, "postgresql://app:two@db/app", "outbox")  # password rotated
    assert a != msg_id_prefix(target, "postgresql://app:one@db/other", "outbox")
    assert a != msg_id_prefix(target, "postgresql://app:one@db/app", "outbox2")
    record = MarkedRecord(42, None, "t", "k", b"v", (), "leader")
    assert to_message(record, a).msg_id == f"{a}42"


@pytest.mark.parametrize("text", ["8--37002603700206037002030", "-5-1", "+5-1", " 5-1", "5_0-1", "5-", "x"])
def test_only_digits_make_a_redis_entry_id(text: str) -> None:
    # Found by fuzzing (fuzz/redis_record.py): int() took a negative sequence, and the offset
    # built from it overflowed the record batch.
    with pytest.raises(ValueError, match="is not a stream entry id"):
        entry_offset(text)
