"""Which webhook hosts count as public: IPv4 addresses inside IPv6 ones are judged as
themselves, and a host is read as a resolver reads it (a trailing dot, `127.1`)."""

from __future__ import annotations

import ipaddress

import pytest

from comfyfleet.webhooks.addresses import NotAllowed, check_literal, is_public, literal_address


@pytest.mark.parametrize(
    "text",
    [
        "127.0.0.1",
        "::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::127.0.0.1",  # IPv4-compatible
        "::ffff:0:7f00:1",  # IPv4-translated (SIIT)
        "64:ff9b::7f00:1",  # NAT64
        "64:ff9b::a00:1",
        "64:ff9b:1::808:808",  # local-use NAT64: never global
        "2002:7f00:1::",  # 6to4
        "2002:a9fe:a9fe::1",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "fe80::1%eth0",
        "ff02::1",
    ],
)
def test_non_public(text: str) -> None:
    assert not is_public(ipaddress.ip_address(text))


@pytest.mark.parametrize(
    "text",
    ["8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::"],
)
def test_public(text: str) -> None:
    assert is_public(ipaddress.ip_address(text))


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1.", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("::1", "::1"),
        ("example.com", None),
        ("example.com.", None),
    ],
)
def test_hosts_are_read_as_a_resolver_reads_them(host: str, address: str | None) -> None:
    expected = None if address is None else ipaddress.ip_address(address)
    assert literal_address(host) == expected


@pytest.mark.parametrize("host", ["127.0.0.1.", "127.1", "::127.0.0.1", "2002:7f00:1::"])
def test_check_literal_refuses_them(host: str) -> None:
    with pytest.raises(NotAllowed, match="non-public"):
        check_literal(host)
