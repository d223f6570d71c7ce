"""``sluice capture`` refuses what it cannot run with one line and exit 1, before it campaigns:
a server without logical decoding, a configuration key it does not know, a database or broker
still out of reach after ``startupTimeout``, a topic template that names what a change does not
have."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import sluice

pytestmark = pytest.mark.timeout(120)


def run(tmp_path: Path, section: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "capture.yaml"
    spec.write_text(yaml.safe_dump({"capture": section}))
    return sluice("capture", "-f", str(spec), cwd=tmp_path, timeout=60)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def base(dsn: str = "postgresql://postgres@127.0.0.1:1/none", **more: Any) -> dict[str, Any]:
    return {"dsn": dsn, "tables": ["public.items"], "slot": "s", "publication": "p",
            "journal": {"path": "./j"}, "startupTimeout": "1s", **more}  # fmt: skip


def test_a_server_without_logical_decoding_is_one_line(postgres_dsn: str, tmp_path: Path) -> None:
    # The shared server runs wal_level = replica.
    line = one_line(run(tmp_path, base(postgres_dsn)))
    assert line.startswith("error: cannot start:") and "wal_level is 'replica'" in line


def test_an_unknown_key_and_a_bad_template_are_named(tmp_path: Path) -> None:
    line = one_line(run(tmp_path, base(tombstone=True)))
    assert "tombstone" in line and "capture" in line
    line = one_line(run(tmp_path, base(topic="cdc.{schema}.{tabel}")))
    assert "tabel" in line


def test_two_destinations_or_none_are_refused(tmp_path: Path) -> None:
    line = one_line(run(tmp_path, base(kafka={"bootstrap.servers": "127.0.0.1:1"})))
    assert "exactly one destination" in line and "kafka, journal" in line


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    line = one_line(run(tmp_path, base()))
    assert line.startswith("error: cannot start: PostgreSQL at 127.0.0.1:1 unreachable for 1 s ("), line
    assert line.endswith("; set startupTimeout to wait longer"), line


def test_an_unreachable_broker_is_one_line(cdc_dsn: str, tmp_path: Path) -> None:
    import psycopg

    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS items (id int PRIMARY KEY)")
    section = base(cdc_dsn)
    del section["journal"]
    section["target"] = {"type": "nats", "servers": ["nats://127.0.0.1:1"], "stream": "S",
                         "connectTimeout": "500ms"}  # fmt: skip
    line = one_line(run(tmp_path, section))
    assert line.startswith("error: cannot start: nats nats://127.0.0.1:1 stream S unreachable for 1 s ("), (
        line
    )
