from __future__ import annotations

import pytest

from sluiceway.feed import FeedError, Item, ProcessorResult
from sluiceway.feed.model import encode_data


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"raw", b"raw"),
        (bytearray(b"ba"), b"ba"),
        (memoryview(b"mv"), b"mv"),
        ("tëxt", "tëxt".encode()),
        ({"a": [1, 2]}, b'{"a":[1,2]}'),
        ([1, "x"], b'[1,"x"]'),
    ],
)
def test_item_data_encodings(value: object, expected: bytes) -> None:
    assert encode_data(value) == expected


@pytest.mark.parametrize("value", [1, 2.5, None, object(), {"a": object()}])
def test_unsupported_item_data(value: object) -> None:
    with pytest.raises(FeedError):
        encode_data(value)


def test_result_coercion() -> None:
    assert ProcessorResult.coerce({"done": True}) == ProcessorResult(done=True)
    assert ProcessorResult.coerce({"gate": 3, "done": False, "data": "t"}) == ProcessorResult(3, False, b"t")
    r = ProcessorResult(1, False, b"x")
    assert ProcessorResult.coerce(r) is r


def test_item_json_helper() -> None:
    assert Item(id=1, partition="p", gate=0, data=b'{"k": 1}', attempt=1).json() == {"k": 1}


def test_public_api_is_exported() -> None:
    import sluiceway.feed as feed

    assert {"Feed", "FeedWorker", "Item", "ProcessorResult"} <= set(feed.__all__)
    for name in feed.__all__:
        assert getattr(feed, name) is not None
