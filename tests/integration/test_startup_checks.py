"""Every daemon's start-up check (issue 37, item 2): `sluice reap`, `sluice capture` and `sluice feed
worker` end a permanent refusal — a database that does not exist, a role that does not exist —
with one line naming the fix and exit 1, at once; and `sluice reap` with its Kafka cluster out of
reach (a free port, nothing listening) gives up within its ``startupTimeout`` with one line
saying what was unreachable and for how long, where it used to wait for ever.

(The shared PostgreSQL trusts every login, so a wrong password cannot be tried there: a missing
role is the authentication failure it can give.)
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sluiceway.db import Database
from sluiceway.outbox import init_outbox
from sluiceway.testing import free_port
from tests.conftest import MYSQL_SERVER, PG_SERVER
from tests.support.cli import sluice

pytestmark = pytest.mark.timeout(120)

#: Each daemon's command for a data source, and the setting its fix names.
DAEMONS = ("reap", "capture", "feed worker")
SETTING = {"reap": "dataSource", "capture": "dsn", "feed worker": "--dsn"}


def run(daemon: str, dsn: str, tmp_path: Path, *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    if daemon == "feed worker":
        args = ["feed", "worker", "--dsn", dsn, "--processor", "json:dumps", "--startup-timeout", "3s"]
        return sluice(*args, cwd=tmp_path, timeout=timeout)
    section: dict[str, Any]
    if daemon == "reap":
        section = {"harvest": {"dataSource": dsn, "journal": {"path": "./j"}, "startupTimeout": "3s"}}
    else:
        section = {"capture": {"dsn": dsn, "tables": ["public.t"], "slot": "s", "publication": "p",
                               "journal": {"path": "./j"}, "startupTimeout": "3s"}}  # fmt: skip
    config = tmp_path / f"{daemon}.yaml"
    config.write_text(yaml.safe_dump(section))
    return sluice(daemon, "-f", str(config), cwd=tmp_path, timeout=timeout)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def pg(**change: str) -> str:
    params = conninfo_to_dict(PG_SERVER)
    params.update(change)
    return make_conninfo(**params)  # type: ignore[arg-type]


@pytest.mark.parametrize("daemon", DAEMONS)
def test_a_database_that_does_not_exist_is_one_line_naming_the_fix(daemon: str, tmp_path: Path) -> None:
    name = f"sluice_missing_{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    line = one_line(run(daemon, pg(dbname=name), tmp_path))
    assert time.monotonic() - started < 15, "a refusal is said at once, not waited on for startupTimeout"
    assert line.startswith("error: cannot start: "), line
    assert f'database "{name}" does not exist' in line, line
    assert line.endswith(f"— create the database, or correct its name in {SETTING[daemon]}"), line


@pytest.mark.parametrize("daemon", DAEMONS)
def test_a_role_that_does_not_exist_is_one_line_naming_the_fix(daemon: str, tmp_path: Path) -> None:
    user = f"sluice_nobody_{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    line = one_line(run(daemon, pg(user=user), tmp_path))
    assert time.monotonic() - started < 15, "a refusal is said at once, not waited on for startupTimeout"
    assert line.startswith("error: cannot start: "), line
    assert f'role "{user}" does not exist' in line, line
    assert line.endswith(
        f"— check the user and password in {SETTING[daemon]}, and that the role exists and may log in"
    ), line


def test_a_mariadb_database_that_does_not_exist_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    name = f"sluice_missing_{uuid.uuid4().hex[:8]}"
    dsn = f"{MYSQL_SERVER.rsplit('/', 1)[0]}/{name}"
    line = one_line(run("reap", dsn, tmp_path))
    assert f"Unknown database '{name}'" in line, line
    assert line.endswith("— create the database, or correct its name in dataSource"), line


def test_reap_with_kafka_out_of_reach_gives_up_within_its_startup_timeout(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'app.db'}"
    with Database(dsn) as db:
        init_outbox(db)
    port = free_port()  # nothing listens there
    config = tmp_path / "reaper.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "harvest": {
                    "dataSource": dsn,
                    "baseKafkaConfig": {"bootstrap.servers": f"127.0.0.1:{port}"},
                    "startupTimeout": "3s",
                }
            }
        )
    )
    started = time.monotonic()
    # Before: the NELI election and the producer retried for ever; this timed out.
    result = sluice("reap", "-f", str(config), cwd=tmp_path, timeout=40)
    took = time.monotonic() - started
    line = one_line(result)
    assert line.startswith(f"error: cannot start: Kafka at 127.0.0.1:{port} unreachable for 3 s ("), line
    assert "Connection refused" in line, line
    assert line.endswith("; set startupTimeout to wait longer"), line
    assert 3 <= took < 15, f"{took:.1f}s: the wait is bounded by startupTimeout (3 s)"


def test_reap_as_a_role_that_may_only_read_the_outbox_is_told_the_grant(
    postgres_dsn: str, tmp_path: Path
) -> None:
    role = f"sluice_reader_{uuid.uuid4().hex[:8]}"
    table = f"outbox_{uuid.uuid4().hex[:8]}"
    with Database(postgres_dsn) as db:
        init_outbox(db, table)
        db.execute(f"CREATE ROLE {role} LOGIN")
        db.execute(f"GRANT SELECT ON {table} TO {role}")
    try:
        params = conninfo_to_dict(postgres_dsn)
        params["user"] = role
        config = tmp_path / "reaper.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "harvest": {
                        "dataSource": make_conninfo(**params),  # type: ignore[arg-type]
                        "outboxTable": table,
                        "journal": {"path": "./j"},
                    }
                }
            )
        )
        # Before: it started, took the lease (or retried it for ever) and its first mark failed.
        line = one_line(sluice("reap", "-f", str(config), cwd=tmp_path, timeout=40))
        assert line == (
            f"error: cannot start: the role '{role}' may not update the outbox table {table}: "
            f"permission denied for table {table} — GRANT SELECT, UPDATE, DELETE ON {table} TO {role}"
        )
        assert not (tmp_path / "j").exists(), "nothing created before the check refused"
    finally:
        with Database(postgres_dsn) as db:
            db.execute(f"DROP OWNED BY {role}")
            db.execute(f"DROP ROLE {role}")
