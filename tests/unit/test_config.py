from __future__ import annotations

from pathlib import Path

import pytest

from sluiceway.config import interpolate, parse_duration
from sluiceway.errors import ConfigError
from sluiceway.harvest import Harvest
from sluiceway.harvest.config import HarvestConfig
from tests.support.harvest import GOHARVEST_YAML


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "reaper.yaml"
    path.write_text(text)
    return path


def test_goharvest_reaper_yaml_loads_unchanged(tmp_path: Path) -> None:
    cfg = HarvestConfig.from_file(write(tmp_path, GOHARVEST_YAML))
    h = cfg.harvest
    assert h.kafka_config == {"bootstrap.servers": "localhost:9092"}
    assert h.producer_config["compression.type"] == "lz4"
    assert h.producer_config["enable.idempotence"] is True
    assert (h.topic_for_leader, h.group_id, h.outbox_table) == ("my-app-name", "my-app-name", "outbox")
    assert h.election_kind == "kafka"
    limits = cfg.limits
    assert limits.min_poll_interval == 1.0
    assert limits.send_concurrency == 4
    assert limits.max_poll_interval == 2.5  # heartbeatTimeout / 2
    assert cfg.logging.python_level == 10


def test_goharvests_sample_data_source_is_warned_about_when_the_harvester_loads_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Its "password= dbname=postgres" gives libpq no database name (harmless only because the user
    # is also called postgres). Constructing the harvester connects to nothing.
    Harvest(HarvestConfig.from_file(write(tmp_path, GOHARVEST_YAML)))
    (record,) = [r for r in caplog.records if r.name == "sluiceway.harvest" and r.levelname == "WARNING"]
    assert record.getMessage().startswith("dataSource: password= is empty but followed by a space")
    caplog.clear()
    fixed = GOHARVEST_YAML.replace("password= dbname", "password='' dbname")
    Harvest(HarvestConfig.from_file(write(tmp_path, fixed)))
    assert not [r for r in caplog.records if r.name == "sluiceway.harvest" and r.levelname == "WARNING"]


def test_goharvests_send_thread_limits_load_and_the_harvester_says_once_they_do_not_apply(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="sluiceway.harvest")
    Harvest(HarvestConfig.from_file(write(tmp_path, GOHARVEST_YAML)))
    said = [r.getMessage() for r in caplog.records if "send threads" in r.getMessage()]
    assert said == [
        "limits.sendConcurrency and limits.sendBuffer: not used for kafka localhost:9092, which is "
        "sent to without send threads; limits.maxInFlightRecords (1000) bounds the records in flight"
    ]
    caplog.clear()
    journal = {"dataSource": "sqlite:///app.db", "journal": {"path": str(tmp_path / "j")}}
    Harvest(HarvestConfig.from_dict({"harvest": {**journal, "limits": {"sendBuffer": 50}}}))
    assert [r.getMessage() for r in caplog.records if "send threads" in r.getMessage()] == [
        f"limits.sendBuffer: not used for journal {tmp_path / 'j'}, which is sent to without send "
        "threads; limits.maxInFlightRecords (1000) bounds the records in flight"
    ]
    caplog.clear()
    Harvest(HarvestConfig.from_dict({"harvest": journal}))  # unset: nothing to say
    assert not [r for r in caplog.records if "send threads" in r.getMessage()]


def test_goharvest_defaults() -> None:
    cfg = HarvestConfig.from_dict({"harvest": {"baseKafkaConfig": {"bootstrap.servers": "127.0.0.1:9092"}}})
    lim = cfg.limits
    assert (lim.io_error_backoff, lim.poll_duration, lim.min_poll_interval) == (0.5, 0.001, 0.1)
    assert (lim.heartbeat_timeout, lim.max_poll_interval, lim.queue_timeout) == (5.0, 2.5, 30.0)
    assert lim.drain_interval == 2.5  # min(maxPollInterval, queueTimeout)
    assert (lim.mark_backoff, lim.max_in_flight_records, lim.send_concurrency) == (0.01, 1000, 8)
    assert (lim.send_buffer, lim.mark_query_records, lim.min_metrics_interval) == (10, 100, 5.0)


def test_unknown_key_is_reported_with_its_path(tmp_path: Path) -> None:
    text = GOHARVEST_YAML.replace("    sendBuffer: 10", "    sendBufer: 10")
    with pytest.raises(ConfigError) as info:
        HarvestConfig.from_file(write(tmp_path, text))
    assert "harvest.limits.sendBufer" in str(info.value)
    assert "unknown key" in str(info.value)


def test_wrong_type_names_field_and_expectation(tmp_path: Path) -> None:
    text = GOHARVEST_YAML.replace("sendConcurrency: 4", "sendConcurrency: lots")
    with pytest.raises(ConfigError) as info:
        HarvestConfig.from_file(write(tmp_path, text))
    message = str(info.value)
    assert "harvest.limits.sendConcurrency" in message and "integer" in message
    assert str(tmp_path) in message


def test_bad_duration(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"harvest.limits.heartbeatTimeout.*duration"):
        HarvestConfig.from_file(
            write(tmp_path, GOHARVEST_YAML.replace("heartbeatTimeout: 5s", "heartbeatTimeout: soon"))
        )


def test_env_interpolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROKERS", "10.0.0.1:9092")
    text = GOHARVEST_YAML.replace("localhost:9092", "${BROKERS}").replace(
        "outboxTable: outbox", "outboxTable: ${T:-box}"
    )
    cfg = HarvestConfig.from_file(write(tmp_path, text))
    assert cfg.harvest.kafka_config["bootstrap.servers"] == "10.0.0.1:9092"
    assert cfg.harvest.outbox_table == "box"


def test_missing_env_var_named(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"NOPE_NOT_SET.*harvest.dataSource|harvest.dataSource.*NOPE_NOT_SET"
    ):
        HarvestConfig.from_file(write(tmp_path, GOHARVEST_YAML.replace("host=localhost", "${NOPE_NOT_SET}")))


def test_invalid_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        HarvestConfig.from_file(write(tmp_path, "harvest: [unclosed"))
    with pytest.raises(ConfigError, match="cannot read"):
        HarvestConfig.from_file(tmp_path / "absent.yaml")


def test_bad_table_name_and_dsn() -> None:
    base = {"baseKafkaConfig": {"bootstrap.servers": "x:1"}}
    with pytest.raises(ConfigError, match=r"harvest\.outboxTable"):
        HarvestConfig.from_dict({"harvest": {**base, "outboxTable": "drop table"}})
    with pytest.raises(ConfigError, match=r"harvest\.dataSource"):
        HarvestConfig.from_dict({"harvest": {**base, "dataSource": "oracle://x"}})


def test_destination_required() -> None:
    with pytest.raises(ConfigError, match="no destination"):
        HarvestConfig.from_dict({"harvest": {"dataSource": "sqlite:///x.db"}})


def test_journal_destination_defaults_to_database_election() -> None:
    cfg = HarvestConfig.from_dict({"harvest": {"dataSource": "sqlite:///x.db", "journal": {"path": "j"}}})
    assert cfg.harvest.election_kind == "database"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("1m30s", 90.0), ("2h", 7200.0), (3, 3.0), ("0", 0.0), ("1.5s", 1.5)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "5 s", "-1s", "1d", True, -2])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


def test_interpolate_nested() -> None:
    assert interpolate({"a": ["${X}", {"b": "${Y:-d}"}]}, {"X": "1"}) == {"a": ["1", {"b": "d"}]}


# -- sequence headers and per-key pipelining ------------------------------------------------
def test_sequence_headers_are_off_for_a_goharvest_file_and_on_for_new_configs(tmp_path: Path) -> None:
    goharvest = HarvestConfig.from_file(write(tmp_path, GOHARVEST_YAML)).harvest
    assert not goharvest.sequence_headers and not goharvest.uses_sluiceway_keys
    # Serving metrics (`sluice reap --metrics-addr`) dumps and reloads the file: still goharvest's.
    data = goharvest.model_dump(by_alias=True, exclude_none=True)
    data["metricsAddr"] = "127.0.0.1:9464"
    assert not HarvestConfig.from_dict({"harvest": data}).harvest.sequence_headers
    base = {"baseKafkaConfig": {"bootstrap.servers": "b:9092"}}
    for extra in ({"name": "orders"}, {"deadLetter": {"maxAttempts": 3}}, {"limits": {"perKeyInFlight": 1}}):
        assert HarvestConfig.from_dict({"harvest": {**base, **extra}}).harvest.sequence_headers
    journal = HarvestConfig.from_dict({"harvest": {"dataSource": "sqlite:///a.db", "journal": {"path": "j"}}})
    assert journal.harvest.sequence_headers
    explicit = HarvestConfig.from_file(
        write(
            tmp_path,
            GOHARVEST_YAML.replace("  outboxTable: outbox", "  outboxTable: outbox\n  sequenceHeaders: true"),
        )
    )
    assert explicit.harvest.sequence_headers


def test_per_key_pipelining_makes_the_producer_gapless() -> None:
    base = {"baseKafkaConfig": {"bootstrap.servers": "b:9092"}}
    one = HarvestConfig.from_dict({"harvest": base})
    assert one.limits.per_key_in_flight == 1
    assert "enable.gapless.guarantee" not in one.harvest.producer_config
    eight = HarvestConfig.from_dict({"harvest": {**base, "limits": {"perKeyInFlight": 8}}})
    assert eight.limits.per_key_in_flight == 8
    producer = eight.harvest.producer_config
    assert producer["enable.idempotence"] is True and producer["enable.gapless.guarantee"] is True
    assert producer["message.timeout.ms"] == 0


@pytest.mark.parametrize(
    ("harvest", "problem"),
    [
        ({"producerKafkaConfig": {"enable.idempotence": False}}, "enable.idempotence=true"),
        ({"producerKafkaConfig": {"delivery.timeout.ms": 10000}}, "message.timeout.ms=0"),
        ({"producerKafkaConfig": {"enable.gapless.guarantee": False}}, "enable.gapless.guarantee=true"),
        ({"sequenceHeaders": False}, "needs sequenceHeaders"),
    ],
)
def test_per_key_pipelining_refuses_settings_that_would_break_its_order(
    harvest: dict[str, object], problem: str
) -> None:
    data = {"baseKafkaConfig": {"bootstrap.servers": "b:9092"}, "limits": {"perKeyInFlight": 4}, **harvest}
    with pytest.raises(ConfigError, match=problem):
        HarvestConfig.from_dict({"harvest": data})


# Found with the config fuzz targets (fuzz/harvest_config.py, pipeline_spec.py, workspace_spec.py):
# each file once escaped the loaders as another exception (or, the alias bomb, took minutes and
# gigabytes); now each is one ConfigError naming the file. The pipeline's loader says the same
# through SpecError, a ConfigError.
_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefg", "bcdefgh", strict=True)
)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        # UnicodeDecodeError:
        (b"harvest:\n  name: caf\xe9\n", "not UTF-8 text: byte 0xe9 at line 2, column 12"),
        (b"harvest: " + b"[" * 1000 + b"]" * 1000, "not valid YAML: nested more than 64"),  # RecursionError
        (b"harvest: &a [*a]\n", "nested more than 64 levels deep"),  # interpolate: RecursionError
        (_BOMB.encode(), "more than 100000 values"),  # 9**8 copies: minutes, gigabytes
        (b"harvest: {limits: {sendBuffer: 1" + b"0" * 5000 + b"}}", "Exceeds the limit"),  # ValueError
        (b"harvest: {election: {name: 2024-13-45}}", "month must be in 1..12"),  # ValueError
        (b"harvest: {limits: {pollDuration: 1" + b"0" * 400 + b"}}", "at most 9223372036 seconds"),
    ],
)
def test_fuzz_findings_are_config_errors(tmp_path: Path, raw: bytes, fragment: str) -> None:
    from sluiceway.overview.workspace import Workspace
    from sluiceway.pipeline.errors import SpecError
    from sluiceway.pipeline.spec import PipelineSpec

    path = tmp_path / "reaper.yaml"
    path.write_bytes(raw)
    with pytest.raises(ConfigError, match=fragment) as caught:
        HarvestConfig.from_file(path)
    assert caught.value.source == str(path)
    if b"harvest: {" not in raw:  # a shape the other loaders meet before their own keys
        with pytest.raises(SpecError, match=fragment):
            PipelineSpec.from_yaml(path)
        with pytest.raises(ConfigError, match=fragment):
            Workspace.from_file(path)


@pytest.mark.parametrize(
    "value",
    [10**400, float("inf"), float("nan"), "1" + "0" * 400 + "h", 2**63],
    ids=["400 digits", "inf", "nan", "400-digit hours", "2**63"],
)
def test_a_duration_too_long_to_wait_for_is_refused(value: object) -> None:
    # 10**400 was an OverflowError (float()); the others were accepted, and would overflow later
    # in the sleeps and waits that use them.
    with pytest.raises(ConfigError, match="at most 9223372036 seconds"):
        parse_duration(value)
