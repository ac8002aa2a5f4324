"""Which listening addresses count as private to this machine (no warning)."""

from __future__ import annotations

import pytest

from comfyfleet.cli.serve import _is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host: str) -> None:
    assert _is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "example.com"])
def test_other_hosts_warn(host: str) -> None:
    assert not _is_loopback(host)
