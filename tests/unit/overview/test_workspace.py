"""The workspace file, validated at the edge, and looking up what it watches by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluiceway.config import validate
from sluiceway.errors import ConfigError, SluicewayError
from sluiceway.overview import Workspace
from sluiceway.overview.status import collect_one, pipeline_spec
from sluiceway.overview.workspace import NotWatchedError


def test_the_workspace_file_is_validated_at_the_edge() -> None:
    ws = validate(
        Workspace,
        {"outboxes": [{"name": "shop", "dsn": "sqlite:///app.db"}], "checks": {"outbox_oldest_age": "90s"}},
    )
    (shop,) = ws.outboxes
    assert (shop.table, shop.election, shop.lease_table) == ("outbox", "sluiceway", "sluiceway_leases")
    assert ws.checks.outbox_oldest_age == 90.0 and ws.checks.pipeline_lag == 10_000
    for bad, where in (
        ({"outboxes": [{"name": "shop", "dsn": "oracle://x"}]}, "outboxes.0.dsn"),
        ({"outboxes": [{"name": "a/b", "dsn": "sqlite:///a.db"}]}, "outboxes.0.name"),
        ({"journals": [{"name": "j", "path": "x"}, {"name": "j", "path": "y"}]}, "used twice"),
        ({"feeds": [{"name": "f", "dsn": "sqlite:///f.db", "extra": 1}]}, "feeds.0.extra"),
        ({"checks": {"pipeline_lag": -1}}, "checks.pipeline_lag"),
        ({"captures": ["./capture.yaml", "./capture.yaml"]}, "a capture file is listed twice"),
    ):
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            validate(Workspace, bad)


def test_the_demo_names_what_it_made_in_a_workspace_file(tmp_path: Path) -> None:
    from sluiceway.demo.run import write_workspace

    path = write_workspace(
        tmp_path, f"sqlite:///{tmp_path / 'shop.db'}", tmp_path / "journal", tmp_path / "p.yaml"
    )
    ws = Workspace.from_file(path)
    assert [o.election for o in ws.outboxes] == ["demo"] and ws.pipelines == [str(tmp_path / "p.yaml")]
    assert [j.path for j in ws.journals] == [str(tmp_path / "journal")] and ws.feeds[0].name == "fulfilment"


def test_a_name_is_looked_up_or_refused_with_its_kind() -> None:
    ws = validate(
        Workspace,
        {
            "outboxes": [{"name": "shop", "dsn": "sqlite:///app.db"}],
            "journals": [{"name": "bus", "path": "./bus"}],
            "feeds": [{"name": "work", "dsn": "sqlite:///work.db", "prefix": "w_"}],
        },
    )
    assert (ws.outbox("shop").dsn, ws.journal("bus").path, ws.feed("work").prefix) == (
        "sqlite:///app.db",
        "./bus",
        "w_",
    )
    for look_up, kind, text in (
        (lambda: ws.outbox("bus"), "outboxes", "no outbox named 'bus' in the workspace"),
        (lambda: ws.journal("shop"), "journals", "no journal named 'shop' in the workspace"),
        (lambda: ws.feed("[bold]x"), "feeds", "no feed named '[bold]x' in the workspace"),
        (lambda: pipeline_spec(ws, "orders"), "pipelines", "no pipeline named 'orders' in the workspace"),
        (lambda: collect_one(ws, "feeds", "shop"), "feeds", "no feed named 'shop' in the workspace"),
        (lambda: collect_one(ws, "captures", "cdc"), "captures", "no capture named 'cdc' in the workspace"),
    ):
        with pytest.raises(NotWatchedError) as raised:
            look_up()
        assert (raised.value.kind, str(raised.value)) == (kind, text)
        assert isinstance(raised.value, SluicewayError)


def test_captures_are_named_by_their_files(tmp_path: Path) -> None:
    from sluiceway.overview.status import capture_files

    good = tmp_path / "capture.yaml"
    good.write_text(
        "capture: {name: shop-cdc, dsn: 'postgresql://localhost/app', tables: [public.t], slot: s,\n"
        "  publication: p, journal: {path: ./j}}\n"
    )
    ws = validate(Workspace, {"captures": [str(good), str(tmp_path / "gone.yaml")]})
    assert capture_files(ws) == {"shop-cdc": str(good)}, "a file that cannot be read has no name"
