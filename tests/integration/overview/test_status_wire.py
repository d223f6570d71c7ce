"""The JSON of ``sluice status --format json`` and of the console's ``/api/status`` is a public
interface (docs/operations.md): its keys, their order and the kind of every value are pinned here
against ``data/status_wire.txt``, for every part — read, stuck and unreadable — so a change to the
report's types that changes the wire fails this test.

To re-pin after a deliberate change of the interface: ``SLUICE_REPIN=1 pytest`` this module, and
say so in the CHANGELOG.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from sluiceway.overview import Workspace
from sluiceway.ui import Console, create_app
from tests.integration.overview.test_capture_status import capture_file
from tests.support.cli import sluice
from tests.support.overview import build

pytestmark = pytest.mark.timeout(120)

PINNED = Path(__file__).parent / "data" / "status_wire.txt"


def shape(value: Any, at: str = "") -> list[str]:
    """``value`` as one line per value, in order: its path and its JSON type (``int``, ``float``,
    ``str``, ``bool``, ``null``; ``{}`` and ``[]`` for an empty object or list).

    >>> shape({"a": [1, {"b": None}], "c": {}})
    ['a[0]: int', 'a[1].b: null', 'c: {}']
    """
    if isinstance(value, dict):
        if not value:
            return [f"{at}: {{}}"]
        return [line for key, item in value.items() for line in shape(item, f"{at}.{key}" if at else key)]
    if isinstance(value, list):
        if not value:
            return [f"{at}: []"]
        return [line for i, item in enumerate(value) for line in shape(item, f"{at}[{i}]")]
    kind = {type(None): "null", bool: "bool", int: "int", float: "float", str: "str"}[type(value)]
    return [f"{at}: {kind}"]


def api_status(config: Path) -> dict[str, Any]:
    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(Console(Workspace.from_file(config))))
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            return await client.get("/api/status")

    response = asyncio.run(get())
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def test_the_status_json_is_the_pinned_interface(cdc_dsn: str, tmp_path: Path) -> None:
    built = build(tmp_path / "ws", f"sqlite:///{tmp_path / 'app.db'}")
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS wire (id int PRIMARY KEY, note text)")
        conn.execute("SELECT pg_create_logical_replication_slot('wire', 'pgoutput')")
    try:
        (tmp_path / "c").mkdir()
        capture = capture_file(tmp_path / "c", cdc_dsn, slot="wire")
        section = yaml.safe_load(capture.read_text())
        section["capture"]["tables"] = ["public.wire"]
        capture.write_text(yaml.safe_dump(section))
        workspace = yaml.safe_load(built.config.read_text())
        workspace["journals"].append({"name": "none", "path": str(tmp_path / "nowhere")})
        workspace["outboxes"].append({"name": "gone", "dsn": f"sqlite:///{tmp_path / 'missing.db'}"})
        workspace["captures"] = [str(capture), str(tmp_path / "missing.yaml")]
        config = tmp_path / "sluice.yaml"
        config.write_text(yaml.safe_dump(workspace))

        result = sluice("status", "--config", str(config), "--format", "json", cwd=built.config.parent)
        assert result.returncode == 0, result.stderr
        cli = json.loads(result.stdout)
        api = api_status(config)
    finally:
        with psycopg.connect(cdc_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot('wire')")

    assert shape(api) == shape(cli)
    if os.environ.get("SLUICE_REPIN"):
        PINNED.write_text("\n".join(shape(cli)) + "\n")
    assert shape(cli) == PINNED.read_text().splitlines()
    # Beyond the shape, the values that do not move between runs are the same on both.
    steady = ("outboxes", "journals", "pipelines", "feeds")
    assert [[e["name"], e["health"], e["problems"]] for k in steady for e in cli[k]] == [
        [e["name"], e["health"], e["problems"]] for k in steady for e in api[k]
    ]
