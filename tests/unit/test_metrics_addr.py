"""``--metrics-addr``: one rule for every long-running command (loopback unless a host is given)."""

from __future__ import annotations

import pytest

from sluiceway.errors import ConfigError
from sluiceway.metrics import parse_metrics_addr


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        (":9464", ("127.0.0.1", 9464)),
        ("9464", ("127.0.0.1", 9464)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("0.0.0.0:9464", ("0.0.0.0", 9464)),
        ("[::1]:9464", ("::1", 9464)),
    ],
)
def test_a_bare_port_listens_on_loopback(addr: str, expected: tuple[str, int]) -> None:
    assert parse_metrics_addr(addr) == expected


@pytest.mark.parametrize("addr", ["", "host:", "host:port", ":70000"])
def test_a_bad_address_is_a_config_error(addr: str) -> None:
    with pytest.raises(ConfigError, match="metrics-addr"):
        parse_metrics_addr(addr)
