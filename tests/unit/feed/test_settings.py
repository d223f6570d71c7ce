"""A feed worker's settings: one model for the API and ``sluice feed worker``."""

from __future__ import annotations

import inspect

import pytest
from typer.testing import CliRunner

from sluiceway.cli.feed import app, worker
from sluiceway.feed import FeedError, FeedSettingsError, FeedWorker, FeedWorkerSettings

DSN = "sqlite:///never-opened.db"  # a worker opens its database when it runs, not when built


def done(item: object) -> dict[str, bool]:
    return {"done": True}


def test_keyword_options_and_a_settings_model_build_the_same_worker() -> None:
    by_options = FeedWorker(DSN, done, lease=60, batch_size=7, poll_interval=0.2)
    by_model = FeedWorker(DSN, done, FeedWorkerSettings(lease=60, batch_size=7, poll_interval=0.2))
    assert by_options.settings == by_model.settings
    assert (by_model.lease, by_model.renew_interval, by_model.batch_size) == (60.0, 20.0, 7)
    # Both given: the options win over the model's fields, the rest stays.
    both = FeedWorker(DSN, done, FeedWorkerSettings(lease=60, batch_size=7), batch_size=9)
    assert (both.settings.lease, both.settings.batch_size) == (60.0, 9)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"lease": 0.1}, "lease"),
        ({"concurrency": 0}, "concurrency"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"http_encoding": "hex"}, "http_encoding"),
        ({"leese": 20}, "leese"),
    ],
)
def test_a_bad_setting_is_named_in_one_line(options: dict[str, object], field: str) -> None:
    with pytest.raises(FeedSettingsError) as caught:
        FeedWorker(DSN, done, **options)
    assert caught.value.field == field
    assert isinstance(caught.value, FeedError)
    assert str(caught.value).startswith(f"feed worker: {field}: ") and "\n" not in str(caught.value)


def test_the_commands_options_default_to_the_models_fields() -> None:
    defaults = FeedWorkerSettings()
    params = inspect.signature(worker).parameters
    shared = [name for name in FeedWorkerSettings.model_fields if name in params]
    assert len(shared) >= 11, shared
    for name in shared:
        assert params[name].default == getattr(defaults, name), name


@pytest.mark.parametrize(
    ("flag", "value"), [("--lease", "0.1"), ("--concurrency", "0"), ("--http-encoding", "hex")]
)
def test_the_command_names_a_bad_option_as_a_usage_error(flag: str, value: str) -> None:
    result = CliRunner().invoke(app, ["worker", "--dsn", DSN, "--processor", "json:loads", flag, value])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}: "), result.output
