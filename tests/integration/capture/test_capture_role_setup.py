"""docs/cdc.md's role set-up works exactly as written: its SQL block (read from the page, so the
two cannot drift; only the role's name is made unique) is run on a server with logical
decoding, then `sluice capture` runs as that role and a change arrives in its journal. Without
the lease's schema, the same role gets one line naming the grant and exit 1, at once — not the
retry every 0.5 s, for ever, that a role set up by the page's old text met (issue 37)."""

from __future__ import annotations

import re
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sluiceway.testing import wait_until
from tests.support import ROOT
from tests.support.cdc import journal_records
from tests.support.cli import sluice
from tests.support.metrics import sluice_process

pytestmark = pytest.mark.timeout(180)

PAGE = ROOT / "docs" / "cdc.md"
THIS = "tests/integration/capture/test_capture_role_setup.py"
TABLES = """
CREATE TABLE orders (id int PRIMARY KEY, total numeric(10, 2));
CREATE TABLE customers (id int PRIMARY KEY, name text);
INSERT INTO orders VALUES (1, 12.50);
"""


def role_setup() -> str:
    """The SQL block of docs/cdc.md whose not-run note names this test, as written."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("<!--") and THIS in line and lines[i + 1].strip() == "```sql":
            body = []
            for text in lines[i + 2 :]:
                if text.startswith("```"):
                    return "\n".join(body) + "\n"
                body.append(text)
    raise AssertionError(f"docs/cdc.md has no SQL block whose note names {THIS}")


def named(sql: str, pattern: str) -> str:
    found = re.search(pattern, sql)
    assert found, f"the set-up has no {pattern!r}"
    return found.group(1)


@pytest.fixture
def role(cdc_dsn: str) -> Any:
    """A unique name for the page's role (roles are the whole cluster's); dropped afterwards."""
    name = f"cdc_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(cdc_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        wait_until(
            lambda: (
                not admin.execute(
                    "SELECT 1 FROM pg_replication_slots WHERE active AND slot_name LIKE 'role_setup_%'"
                ).fetchall()
            ),
            timeout=15,
            message="the capture's walsender to go",
        )
        for (slot,) in admin.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'role_setup_%'"
        ).fetchall():
            admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        admin.execute(f'DROP OWNED BY "{name}" CASCADE')
        admin.execute(f'DROP ROLE "{name}"')


def set_up(cdc_dsn: str, role: str) -> str:
    """Tables as their owner, then the page's SQL as written (the role renamed); the page's SQL."""
    sql = re.sub(r"\bcdc\b", role, role_setup())
    with psycopg.connect(cdc_dsn, autocommit=True) as admin:
        admin.execute("DROP PUBLICATION IF EXISTS shop_cdc")
        admin.execute("DROP SCHEMA IF EXISTS sluice CASCADE")
        admin.execute("DROP TABLE IF EXISTS orders, customers")
        admin.execute(TABLES)
        admin.execute(sql)  # type: ignore[call-overload]
    return sql


def capture_yaml(tmp_path: Path, cdc_dsn: str, role: str, sql: str, **election: Any) -> Path:
    slot = f"role_setup_{uuid.uuid4().hex[:8]}"
    params = conninfo_to_dict(cdc_dsn)
    params["user"] = role
    section = {
        "name": slot,
        "dsn": make_conninfo(**params),  # type: ignore[arg-type]
        "tables": ["public.orders", "public.customers"],
        "slot": slot,
        "publication": named(sql, r"CREATE PUBLICATION (\w+)"),
        "stateDir": str(tmp_path / "state"),
        "journal": {"path": str(tmp_path / "journal"), "fsync": False},
        "election": {"leaseTimeout": "2s", **election},
        "startupTimeout": "5s",
    }
    path = tmp_path / "capture.yaml"
    path.write_text(yaml.safe_dump({"capture": section}))
    return path


def test_the_role_set_up_in_docs_cdc_md_captures_as_written(cdc_dsn: str, role: str, tmp_path: Path) -> None:
    sql = set_up(cdc_dsn, role)
    schema = named(sql, r"CREATE SCHEMA (\w+) AUTHORIZATION")
    # capture.yaml names the lease's schema, as the page's comment says.
    config = capture_yaml(tmp_path, cdc_dsn, role, sql, schema=schema)
    log = tmp_path / "capture.log"
    with sluice_process(["capture", "-f", str(config)], log) as proc:
        wait_until(
            lambda: proc.poll() is not None or "leading: slot" in log.read_text(),
            timeout=60,
            message="the capture to lead",
        )
        assert proc.poll() is None, log.read_text()
        with psycopg.connect(cdc_dsn, autocommit=True) as admin:
            admin.execute("INSERT INTO orders VALUES (2, 3.25)")

        def arrived() -> bool:
            keys = {(r["namespace"], r["key"]) for r in journal_records(tmp_path / "journal")}
            return {
                ("cdc.public.orders", "1"),
                ("cdc.public.orders", "2"),
            } <= keys  # topic: cdc.{schema}.{table}

        wait_until(arrived, timeout=60, message="the copy and the change in the journal")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text
    with psycopg.connect(cdc_dsn, autocommit=True) as admin:
        lease = admin.execute(f"SELECT holder FROM {schema}.sluiceway_leases").fetchall()
    assert len(lease) == 1, "the lease lives in the schema the page makes"


def test_without_the_lease_schema_the_role_gets_one_line_and_exit_1_at_once(
    cdc_dsn: str, role: str, tmp_path: Path
) -> None:
    sql = set_up(cdc_dsn, role)
    config = capture_yaml(tmp_path, cdc_dsn, role, sql)  # election.schema left out: public
    started = time.monotonic()
    result = sluice("capture", "-f", str(config), cwd=tmp_path, timeout=60)
    took = time.monotonic() - started
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stderr
    assert lines == [
        f"error: cannot start: the role '{role}' may not create the lease table sluiceway_leases in "
        f"schema public: permission denied for schema public — GRANT CREATE ON SCHEMA public TO {role}, "
        "or set election.schema to a schema it may write"
    ], result.stderr
    assert took < 20, f"{took:.1f}s: a refusal is said at once, not waited on"
    with psycopg.connect(cdc_dsn, autocommit=True) as admin:
        slots = admin.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'role_setup_%'")
        assert slots.fetchone() == (0,), "nothing created before the check refused"


def test_a_role_that_may_not_make_the_publication_is_told_who_can(
    cdc_dsn: str, role: str, tmp_path: Path
) -> None:
    sql = set_up(cdc_dsn, role)
    with psycopg.connect(cdc_dsn, autocommit=True) as admin:
        admin.execute("DROP PUBLICATION shop_cdc")
    schema = named(sql, r"CREATE SCHEMA (\w+) AUTHORIZATION")
    result = sluice("capture", "-f", str(capture_yaml(tmp_path, cdc_dsn, role, sql, schema=schema)),
                    cwd=tmp_path, timeout=60)  # fmt: skip
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0] == (
        f"error: cannot start: publication shop_cdc does not exist, and the role '{role}' may not create "
        "it (it does not own public.customers, public.orders) — as the tables' owner, run: CREATE "
        'PUBLICATION shop_cdc FOR TABLE "public"."orders", "public"."customers" WITH '
        "(publish_via_partition_root = true)"
    )
    with psycopg.connect(cdc_dsn, autocommit=True) as admin:
        tables = admin.execute(f"SELECT count(*) FROM pg_tables WHERE schemaname = '{schema}'").fetchone()
    assert tables == (0,), "the lease table is made only once every other check has passed"
