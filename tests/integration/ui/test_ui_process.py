"""``sluice ui`` as a process: a busy port is one line and exit 1, before any announcement; SIGTERM
and Ctrl-C (SIGINT) stop it cleanly, exit 0.

It used to print ``sluice ui on http://…`` and then fail with uvicorn's log line, and to die by
SIGTERM (exit 143) after its graceful shutdown.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sluiceway.testing import free_port, wait_until
from tests.support import ROOT
from tests.support.cli import sluice

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "sluice.yaml"
    path.write_text("journals: [{name: bus, path: ./journal}]\n")
    return path


def test_a_busy_port_is_one_line_and_exit_1_with_nothing_announced(workspace: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = sluice("ui", "--config", str(workspace), "--addr", f"127.0.0.1:{port}", cwd=workspace.parent)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port}: address already in use"
    ]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_it_cleanly(workspace: Path, stop: signal.Signals) -> None:
    url = f"http://127.0.0.1:{free_port()}/"
    command = ["ui", "--config", str(workspace), "--addr", url.removeprefix("http://").rstrip("/")]
    with subprocess.Popen(
        [sys.executable, "-m", "sluiceway.cli.main", *command],
        cwd=workspace.parent,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.readline().startswith(f"sluice ui on {url} (read-only; workspace")

            def up() -> bool:
                try:
                    return httpx.get(url + "api/status", timeout=5).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(up, timeout=30)
            proc.send_signal(stop)
            code = proc.wait(timeout=30)
            errors = proc.stderr.read()
            assert code == 0, errors
            assert "Traceback" not in errors
        finally:
            if proc.poll() is None:
                proc.kill()
