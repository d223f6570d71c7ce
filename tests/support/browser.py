"""A real browser for the console's tests: Playwright driving Debian's Chromium, headless; and a
reader of its screenshots (:func:`read_png`), to check what is on them.

Playwright's own browser download is not reachable here, so it launches the ``chromium`` on the
PATH (``make test`` installs it when missing: scripts/services.sh). As root Chromium needs
``--no-sandbox``; the other flags keep it from reaching out to the network. Playwright gives
every launch a fresh, temporary profile (``--user-data-dir``) of its own, so runs stay
independent.
"""

from __future__ import annotations

import shutil
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Debian's chromium is not installed: run `make test` (scripts/services.sh installs it)")
    return path


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright ``Browser``) for the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass(frozen=True)
class Png:
    """A decoded screenshot: its size and its pixels (RGB), to check what is on it."""

    width: int
    height: int
    rows: list[bytes] = field(repr=False)
    channels: int = 3

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        at = x * self.channels
        red, green, blue = self.rows[y][at : at + 3]
        return red, green, blue


def read_png(data: bytes, rows: int | None = None) -> Png:
    """Decode an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium's screenshots are) with the
    standard library; anything else, or a file that is not a whole PNG, fails the test. Only the
    first ``rows`` rows are unfiltered (pure Python is slow; a check needs the top of the page)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks: dict[bytes, bytes] = {}
    at = 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"PNG chunk {kind!r}: bad CRC"
        chunks[kind] = chunks.get(kind, b"") + body
        at += 12 + length
    assert b"IEND" in chunks, "PNG cut short"
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    channels = 3 if colour == 2 else 4
    stride = width * channels
    raw = zlib.decompress(chunks[b"IDAT"])
    assert len(raw) == height * (stride + 1), "PNG data does not match its size"
    decoded: list[bytes] = []
    previous = bytes(stride)
    for y in range(height if rows is None else min(rows, height)):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            up_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                guess = left + up - up_left  # Paeth: the neighbour nearest the guess, in this order
                to_left, to_up, to_up_left = abs(guess - left), abs(guess - up), abs(guess - up_left)
                if to_left <= to_up and to_left <= to_up_left:
                    nearest = left
                else:
                    nearest = up if to_up <= to_up_left else up_left
                line[i] = (line[i] + nearest) & 0xFF
        decoded.append(bytes(line))
        previous = decoded[-1]
    return Png(width, height, decoded, channels)
