"""Every kind of source has one adapter, and no caller chooses by ``source.type`` any more.

The adapters' Spark options are pinned here for each kind (what the runner used to build in one
``if``-chain), so a moved line that changed an option fails a unit test, not a Spark run.
"""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from sluiceway.pipeline.checkpoint import read_checkpoint
from sluiceway.pipeline.sources.adapters import (
    ADAPTERS,
    ReplicationSlot,
    adapter,
    cdc_log_dir,
)
from sluiceway.pipeline.spec import PipelineSpec, SourceSpec

SRC = Path(__file__).resolve().parents[3] / "src" / "sluiceway"

SOURCES: dict[str, dict[str, Any]] = {
    "journal": {"type": "journal", "path": "/data/j", "starting_offset": 5},
    "kafka": {
        "type": "kafka",
        "topic": ["a", "b"],
        "config": {"bootstrap.servers": "k:9092"},
        "starting_offsets": "latest",
        "dedup": True,
    },
    "outbox": {
        "type": "outbox",
        "dsn": "postgresql://db/app",
        "table": "box",
        "partitions": 3,
        "lease_ttl": 7,
    },
    "postgres-cdc": {
        "type": "postgres-cdc",
        "dsn": "postgresql://db/app",
        "tables": ["public.t"],
        "slot": "s1",
        "publication": "p1",
        "partitions": 2,
    },
    "mysql-cdc": {
        "type": "mysql-cdc",
        "dsn": "mysql://root@db:3306/shop",
        "tables": ["orders"],
        "server_id": 4201,
        "partitions": 3,
    },
    "nats": {
        "type": "nats",
        "servers": ["nats://n1:4222", "nats://n2:4222"],
        "stream": "S",
        "subject": "o.>",
    },
    "redis": {"type": "redis", "url": "redis://r:6379/0", "stream": "orders", "starting_offset": "latest"},
}


def spec_of(kind: str, **extra: Any) -> PipelineSpec:
    return PipelineSpec.from_dict(
        {
            "name": "p",
            "source": {**SOURCES[kind], **extra},
            "sinks": [{"name": "out", "type": "console"}],
            "checkpoint": "/cp",
        }
    )


def source_kinds() -> set[str]:
    """Every ``type`` the spec's source union admits."""
    union = typing.get_args(SourceSpec)[0]
    kinds: set[str] = set()
    for member in typing.get_args(union):
        kinds.update(typing.get_args(member.model_fields["type"].annotation))
    return kinds


def test_every_source_type_in_the_spec_has_an_adapter_for_its_spec_class() -> None:
    kinds = source_kinds()
    assert len(kinds) == 7
    assert set(ADAPTERS) == kinds
    union = typing.get_args(typing.get_args(SourceSpec)[0])
    for member in union:
        (kind,) = typing.get_args(member.model_fields["type"].annotation)
        assert ADAPTERS[kind].kind == kind
        assert ADAPTERS[kind].spec_type is member
    assert set(SOURCES) == kinds  # every kind is exercised below


@pytest.mark.parametrize(
    ("kind", "fmt", "options"),
    [
        ("journal", "sluice-journal", {"path": "/data/j", "startingOffset": "5", "consumer": "p.out"}),
        (
            "kafka",
            "sluice-kafka",
            {"topic": "a,b", "startingOffsets": "latest", "kafka.bootstrap.servers": "k:9092"},
        ),
        (
            "outbox",
            "sluice-outbox",
            {"dsn": "postgresql://db/app", "table": "box", "numPartitions": "3", "leaseTtl": "7.0"},
        ),
        (
            "postgres-cdc",
            "sluice-journal",
            {
                "path": "/cp/_cdc/log",
                "startingOffset": "0",
                "consumer": "p.out",
                "strict": "true",
                "headerOps": "true",
                "minPartitions": "2",
            },
        ),
        (
            "mysql-cdc",
            "sluice-journal",
            {
                "path": "/cp/_cdc/log",
                "startingOffset": "0",
                "consumer": "p.out",
                "strict": "true",
                "headerOps": "true",
                "minPartitions": "3",
            },
        ),
        (
            "nats",
            "sluice-nats",
            {
                "servers": "nats://n1:4222,nats://n2:4222",
                "stream": "S",
                "startingOffset": "earliest",
                "subject": "o.>",
            },
        ),
        (
            "redis",
            "sluice-redis",
            {"url": "redis://r:6379/0", "stream": "orders", "startingOffset": "latest"},
        ),
    ],
)
def test_each_kind_reads_through_its_own_spark_source(kind: str, fmt: str, options: dict[str, str]) -> None:
    spec = spec_of(kind)
    assert adapter(spec).spark_format(spec, "out") == (fmt, options)
    # The batch bound goes first; the spec's own options win over the kind's.
    bounded = spec_of(kind, max_records_per_batch=9, options={"startingOffset": "x", "extra": "y"})
    got_fmt, got = adapter(bounded).spark_format(bounded, "out", max_records=3)
    assert got_fmt == fmt
    assert got == {"maxRecordsPerBatch": "3", **options, "startingOffset": "x", "extra": "y"}
    assert adapter(bounded).spark_format(bounded, "out")[1]["maxRecordsPerBatch"] == "9"


def test_only_kafka_dedups_and_only_when_asked() -> None:
    assert [k for k in SOURCES if adapter(spec_of(k)).dedup(spec_of(k))] == ["kafka"]
    assert not adapter(spec_of("kafka")).dedup(spec_of("kafka", dedup=False))


def test_only_cdc_has_a_slot_a_capture_and_a_source_status() -> None:
    for kind in SOURCES:
        spec = spec_of(kind)
        source = adapter(spec)
        if kind == "postgres-cdc":
            assert source.slot(spec) == ReplicationSlot("postgresql://db/app", "s1")
            assert cdc_log_dir(spec) == Path("/cp/_cdc/log")
        elif kind == "mysql-cdc":  # a capture into the same journal, but a binlog holds no slot
            assert source.slot(spec) is None
            service = source.capture(spec)
            assert service is not None and service.options.server_id == 4201  # type: ignore[union-attr]
            assert service.log_dir == cdc_log_dir(spec) == Path("/cp/_cdc/log")
        else:
            assert source.slot(spec) is None
            assert source.capture(spec) is None
            assert source.status(spec) is None


def test_an_adapter_refuses_another_kinds_spec() -> None:
    with pytest.raises(TypeError, match="journal source adapter was given a kafka source"):
        ADAPTERS["journal"].spark_format(spec_of("kafka"), "out")


def test_journal_lag_counts_from_the_committed_offset_redis_gives_its_entry_id(
    tmp_path: Path,
) -> None:
    spec = spec_of("journal", path=str(tmp_path / "missing"))
    assert adapter(spec).lag(spec, {"offset": 4}) == (4, 0)  # a journal not yet written is empty
    assert adapter(spec).lag(spec, None) == (0, 0)
    redis = spec_of("redis")
    assert adapter(redis).lag(redis, {"after": "1-0"}) == ("1-0", None)
    assert adapter(redis).lag(redis, None) == (None, None)


def test_a_run_end_commits_nothing_for_an_outbox_sink_without_a_committed_batch(tmp_path: Path) -> None:
    # No checkpoint yet: the outbox is not even connected to (its DSN names no server).
    spec = spec_of("outbox", dsn="postgresql://nowhere.invalid/x")
    spec = spec.model_copy(update={"checkpoint": str(tmp_path)})
    assert read_checkpoint(spec.checkpoint_dir("out")).committed is None
    adapter(spec).commit(spec, "out")


# --- no caller chooses by kind ---------------------------------------------------------------------
CALLERS = [
    SRC / "pipeline" / "runner.py",
    SRC / "pipeline" / "operator.py",
    SRC / "pipeline" / "preflight.py",
    SRC / "cli" / "pipeline.py",
    *sorted((SRC / "overview").glob("*.py")),
]
KIND_TEST = re.compile(
    r"""(source|src)\.type\s*(==|!=|\bin\b|\bnot\s+in\b)|\.get\(\s*["']source["']\s*\)\s*(==|!=)"""
)
KIND_NAMES = re.compile(r"""["'](journal|kafka|outbox|postgres-cdc|nats|redis)["']""")


@pytest.mark.parametrize("path", CALLERS, ids=lambda p: p.name)
def test_no_caller_tests_the_source_kind(path: Path) -> None:
    assert path.exists()
    text = path.read_text(encoding="utf-8")
    assert not KIND_TEST.findall(text), f"{path}: choose by adapter(spec), not by source.type"


@pytest.mark.parametrize("path", [SRC / "pipeline" / "runner.py", SRC / "pipeline" / "operator.py"], ids=str)
def test_the_runner_and_the_operator_name_no_source_kind(path: Path) -> None:
    assert not KIND_NAMES.findall(path.read_text(encoding="utf-8"))


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_operator_and_the_adapters_never_import_the_runner() -> None:
    """The runner uses the operator tools; they (and the adapters both use) never use it back."""
    assert "sluiceway.pipeline.operator" in imported(SRC / "pipeline" / "runner.py")
    assert "sluiceway.pipeline.runner" not in imported(SRC / "pipeline" / "operator.py")
    adapters = imported(SRC / "pipeline" / "sources" / "adapters.py")
    assert not adapters & {"sluiceway.pipeline.runner", "sluiceway.pipeline.operator"}
