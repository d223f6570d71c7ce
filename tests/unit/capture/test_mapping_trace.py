"""``to_columns`` with a ``trace_column``: the row's traceparent becomes a header of its message
(the old row's for a delete), and nothing changes without one."""

from __future__ import annotations

import json

from sluiceway.capture.mapping import TopicMap, to_columns
from tests.unit.capture.test_target import batch

PARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"


def test_the_trace_column_becomes_a_traceparent_header() -> None:
    rows = [
        ("insert", "1", json.dumps({"id": 1, "trace": PARENT})),
        ("insert", "2", json.dumps({"id": 2, "trace": None})),
        ("insert", "3", json.dumps({"id": 3})),
    ]
    plain = to_columns(batch(100, rows), TopicMap("t"))
    traced = to_columns(batch(100, rows), TopicMap("t"), trace_column="trace")
    assert [dict(h).get("traceparent") for h in traced.headers] == [PARENT, None, None]
    assert all("traceparent" not in dict(h) for h in plain.headers)
    # Otherwise the same messages, the sequence id still last.
    assert traced.values == plain.values and traced.ids == plain.ids
    assert [h[-1][0] for h in traced.headers] == ["sluice-id"] * 3
    assert [h for h in traced.headers[0] if h[0] != "traceparent"] == plain.headers[0]
