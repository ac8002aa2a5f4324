"""Behind a TLS-terminating proxy: the scheme and host the client used come from the
proxy's Forwarded / X-Forwarded-* headers, read only from a listed proxy. The session
cookie is then Secure, and the origin checks compare against the client's origin."""

from __future__ import annotations

import logging
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import pytest

from tests.integration.gateway.test_auth import ALICE, tenants
from tests.integration.gateway.wire import Served, serve

LOOPBACK = (ip_network("127.0.0.1"),)
ELSEWHERE = (ip_network("10.0.0.0/8"),)
HTTPS = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "fleet.example.com"}


async def _login_cookie(served: Served, headers: dict[str, str]) -> str:
    form = {"token": ALICE, "next": "/"}
    async with served.session.post(
        served.url + "/login", data=form, headers=headers, allow_redirects=False
    ) as answer:
        assert answer.status == 303, await answer.text()
        return answer.headers["Set-Cookie"]


async def _cookie_status(served: Served, headers: dict[str, str]) -> int:
    """POST /api/settings with the login cookie and `headers`."""
    headers = {**headers, "Cookie": f"comfyfleet_token={ALICE}"}
    async with served.session.post(
        served.url + "/api/settings/A", json=1, headers=headers
    ) as answer:
        return answer.status


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Forwarded-Proto": "https"},
        {"X-Forwarded-Proto": "HTTPS"},
        {"X-Forwarded-Proto": "http, https"},  # appended: the last is the nearest proxy's
        {"Forwarded": "for=198.51.100.7;proto=https;host=fleet.example.com"},
    ],
)
async def test_the_cookie_is_secure_when_a_listed_proxy_says_https(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    async with tenants(tmp_path, local_slots=0, trusted_proxies=LOOPBACK) as clients:
        served = clients.anonymous
        assert "Secure" in await _login_cookie(served, headers)
        assert "Secure" not in await _login_cookie(served, {})
        async with served.session.get(
            f"{served.url}/?token={ALICE}", headers=headers, allow_redirects=False
        ) as page:
            assert page.status == 302 and "Secure" in page.headers["Set-Cookie"]


@pytest.mark.parametrize("listed", [(), ELSEWHERE])
async def test_headers_from_a_peer_not_listed_are_ignored(tmp_path: Path, listed: Any) -> None:
    async with tenants(tmp_path, local_slots=0, trusted_proxies=listed) as clients:
        served = clients.anonymous
        assert "Secure" not in await _login_cookie(served, HTTPS)
        forged = {"Forwarded": "proto=https;host=fleet.example.com"}
        assert "Secure" not in await _login_cookie(served, forged)
        origin = {"Origin": "https://fleet.example.com"}
        # The loopback guard refuses first (403): the Host is still 127.0.0.1.
        assert await _cookie_status(served, {**HTTPS, **origin}) == 403
        assert await _cookie_status(served, {**forged, **origin}) == 403


async def test_the_origin_checks_use_the_forwarded_scheme_and_host(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=0, trusted_proxies=LOOPBACK) as clients:
        served = clients.anonymous
        own = f"http://127.0.0.1:{served.server.port}"
        for origin, status in [
            ("https://fleet.example.com", 200),
            ("https://fleet.example.com:443", 200),
            ("http://fleet.example.com", 401),  # an http page of the same host
            ("https://fleet.example.com:8443", 401),
            (own, 401),  # the address the proxy connects to is not the client's
        ]:
            assert await _cookie_status(served, {**HTTPS, "Origin": origin}) == status, origin
        port = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "fleet.example.com:8443"}
        origin_header = {"Origin": "https://fleet.example.com:8443"}
        assert await _cookie_status(served, {**port, **origin_header}) == 200
        # No forwarded host: the Host header (as the proxy passed it on) with the scheme.
        only_proto = {"X-Forwarded-Proto": "https", "Host": "fleet.example.com"}
        origin_header = {"Origin": "https://fleet.example.com"}
        assert await _cookie_status(served, {**only_proto, **origin_header}) == 200
    # Without authentication, ComfyUI's loopback guard sees the client's host too: a proxy
    # on this machine that connects to 127.0.0.1 no longer looks like a cross-site page.
    async with serve(tmp_path / "open", local_slots=0, trusted_proxies=LOOPBACK) as served:
        headers = {**HTTPS, "Origin": "https://fleet.example.com"}
        async with served.session.get(served.url + "/api/features", headers=headers) as answer:
            assert answer.status == 200
        async with served.session.get(
            served.url + "/api/features", headers={"Origin": "https://fleet.example.com"}
        ) as answer:
            assert answer.status == 403


@pytest.mark.parametrize(
    ("listed", "origin"),
    [
        # 127.0.0.2 (which appended the last element) is a listed proxy: the element
        # before it, the one the client-facing proxy appended, tells.
        ((ip_network("127.0.0.0/8"),), "https://fleet.example.com"),
        # It is not: its element tells, the one before it could be the client's own.
        (LOOPBACK, "http://inner.example"),
    ],
)
async def test_forwarded_is_read_back_to_the_first_proxy_not_listed(
    tmp_path: Path, listed: Any, origin: str
) -> None:
    chain = (
        "for=198.51.100.7;proto=https;host=fleet.example.com, "
        'for="127.0.0.2:40000";proto=http;host=inner.example'
    )
    async with tenants(tmp_path, local_slots=0, trusted_proxies=listed) as clients:
        served = clients.anonymous
        for candidate in ("https://fleet.example.com", "http://inner.example"):
            status = await _cookie_status(served, {"Forwarded": chain, "Origin": candidate})
            assert status == (200 if candidate == origin else 401), candidate
        secure = "Secure" in await _login_cookie(served, {"Forwarded": chain})
        assert secure == origin.startswith("https:")


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Forwarded-Proto": "javascript", "X-Forwarded-Host": "fleet.example.com/x"},
        {"X-Forwarded-Proto": "", "X-Forwarded-Host": "user@fleet.example.com"},
        {"Forwarded": 'proto=ftp;host="fleet.example.com:notaport"'},
    ],
)
async def test_unusable_forwarded_values_are_ignored(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    async with tenants(tmp_path, local_slots=0, trusted_proxies=LOOPBACK) as clients:
        served = clients.anonymous
        assert "Secure" not in await _login_cookie(served, headers)
        own = {"Origin": f"http://127.0.0.1:{served.server.port}"}
        assert await _cookie_status(served, {**headers, **own}) == 200


async def test_an_unlisted_tls_proxy_is_named_in_a_warning_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An https page of the server's own host whose requests arrive over http: what a
    TLS-terminating proxy missing from trusted_proxies looks like (once per server)."""
    async with tenants(tmp_path, local_slots=0) as clients:
        served = clients.anonymous
        with caplog.at_level(logging.WARNING, logger="comfyfleet.server.plumbing.middleware"):
            for origin in ("https://evil.example", "https://fleet.example.com") * 2:
                headers = {"Host": "fleet.example.com", "Origin": origin}
                assert await _cookie_status(served, headers) == 401
    hints = [r.getMessage() for r in caplog.records if "trusted_proxies" in r.getMessage()]
    assert len(hints) == 1 and "https://fleet.example.com" in hints[0]
