"""What several targets share: a scratch directory for inputs that must be files."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path


@functools.cache
def scratch() -> Path:
    """A private directory for this process; in memory where /dev/shm exists (a target may
    write a file per input, millions of times).

    libFuzzer ends the process without running ``atexit`` handlers, so each process also
    removes the directories of earlier ones that are gone.
    """
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() else Path(tempfile.gettempdir())
    for stale in base.glob(f"{_PREFIX}*"):
        pid = stale.name.removeprefix(_PREFIX)
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    path = base / f"{_PREFIX}{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    atexit.register(shutil.rmtree, path, ignore_errors=True)  # when the process does end normally
    return path


_PREFIX = "sluice-fuzz-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def as_file(data: bytes, name: str = "input.yaml") -> Path:
    """``data`` written to ``name`` in the scratch directory (the same path every time)."""
    path = scratch() / name
    path.write_bytes(data)
    return path


#: Files that were findings of the config targets (tests/unit/test_config.py), kept as seeds so
#: every run tries them again.
YAML_FINDINGS = {
    "not-utf8": b"harvest:\n  name: caf\xe9\n",
    "deep": b"harvest: " + b"[" * 100 + b"]" * 100,
    "self-alias": b"harvest: &a [*a]\n",
    "alias-bomb": b"a: &a [x,x,x,x,x,x,x,x,x]\n"
    + b"".join(
        b"%c: &%c [%s]\n" % (b, b, b", ".join([b"*" + bytes([a])] * 9))
        for a, b in zip(b"abcdefg", b"bcdefgh", strict=True)
    ),
    "bad-date": b"harvest: {election: {name: 2024-13-45}}\n",
    "long-duration": b"checks: {outbox_oldest_age: 1" + b"0" * 400 + b"}\n",
}
