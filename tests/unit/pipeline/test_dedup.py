"""The Kafka source's ``dedup: true``, without Spark: the per-key rule and the spec flag."""

from __future__ import annotations

from sluiceway.pipeline import PipelineSpec
from sluiceway.pipeline.dedup import keep_above


def hs(sid: int | None) -> list[dict[str, str]]:
    return [] if sid is None else [{"key": "app", "value": "x"}, {"key": "sluice-id", "value": str(sid)}]


def test_keeps_only_ids_above_the_last_passed_in_offset_order() -> None:
    offsets = [13, 10, 11, 12, 14, 15]
    sids = [4, 1, 2, 3, 2, None]  # offset order: 1, 2, 3, 4, 2 (a re-sent suffix), no header
    kept, last = keep_above(offsets, [hs(s) for s in sids], None)
    assert [offsets[i] for i in kept] == [10, 11, 12, 13, 15] and last == 4
    # The next micro-batch starts from the state: 4 again is a re-send, 5 is new.
    kept, last = keep_above([16, 17], [hs(4), hs(5)], last)
    assert kept == [1] and last == 5


def test_the_spec_flag() -> None:
    spec = PipelineSpec.from_dict(
        {
            "pipeline": {
                "name": "p",
                "source": {
                    "type": "kafka",
                    "topic": "t",
                    "config": {"bootstrap.servers": "b:9092"},
                    "dedup": True,
                },
                "sinks": [{"name": "out", "type": "console"}],
                "checkpoint": "/tmp/cp",
            }
        }
    )
    assert spec.source.dedup is True  # type: ignore[union-attr]
