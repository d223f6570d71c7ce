"""The console's one-step runs: a step is started only for a sink the spec names, and the
processes that have finished are reaped at the next start (fake processes, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sluiceway.errors import SluicewayError
from sluiceway.overview import Workspace
from sluiceway.overview.actions import Steps, retry_dead, retry_feed
from sluiceway.overview.workspace import NotWatchedError


class FakeProcess:
    def __init__(self) -> None:
        self.returncode: int | None = None
        self.polled = 0

    def poll(self) -> int | None:
        self.polled += 1
        return self.returncode


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    spec = tmp_path / "orders.yaml"
    pipeline = {
        "name": "orders",
        "source": {"type": "journal", "path": str(tmp_path / "journal")},
        "sinks": [{"name": "db", "type": "console"}],
        "checkpoint": str(tmp_path / "checkpoints"),
    }
    spec.write_text(yaml.safe_dump({"pipeline": pipeline}))
    return Workspace(pipelines=[str(spec)])


def test_a_step_starts_for_a_named_sink_and_finished_ones_are_reaped(workspace: Workspace) -> None:
    started: list[tuple[str, str, FakeProcess]] = []

    def launch(spec: str, sink: str, cwd: str | None) -> FakeProcess:
        assert cwd is None, "a workspace made in code reads its paths from the current directory"
        started.append((spec, sink, FakeProcess()))
        return started[-1][2]

    steps = Steps(launch)  # type: ignore[arg-type]  # FakeProcess has the poll() of a Popen
    message = steps.start(workspace, "orders", "db")
    assert message == "sink db: one step started (Spark starts first; refresh to see it)"
    assert [(spec, sink) for spec, sink, _ in started] == [(workspace.pipelines[0], "db")]
    first = started[0][2]
    steps.start(workspace, "orders", "db")
    assert first.polled == 1 and len(steps._running) == 2, "still running: kept"
    first.returncode = 0
    steps.start(workspace, "orders", "db")
    assert first.polled == 2 and first not in steps._running and len(steps._running) == 2

    with pytest.raises(SluicewayError, match="no sink named 'nope'"):
        steps.start(workspace, "orders", "nope")
    with pytest.raises(NotWatchedError, match="no pipeline named 'elsewhere'"):
        steps.start(workspace, "elsewhere", "db")
    assert len(started) == 3, "nothing launched for a sink or pipeline that is not there"


def test_an_action_on_a_name_not_watched_touches_nothing() -> None:
    with pytest.raises(NotWatchedError, match="no outbox named 'shop'"):
        retry_dead(Workspace(), "shop", 1)
    with pytest.raises(NotWatchedError, match="no feed named 'work'"):
        retry_feed(Workspace(), "work", None, None)
