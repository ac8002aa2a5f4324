"""origin_check (ComfyUI's cross-site guard) and json_errors (JSON 500s)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from aiohttp import web

from comfyfleet.server.plumbing.routing import Route
from tests.integration.server.fileserver import serve


async def _boom(request: web.Request) -> web.StreamResponse:
    raise RuntimeError("secret /home/user/path")


async def _conflict(request: web.Request) -> web.StreamResponse:
    raise web.HTTPConflict(text="conflict")


EXTRA = [Route("GET", "/boom", _boom), Route("GET", "/conflict", _conflict)]


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        (None, 200),
        ("http://evil.example", 403),
        ("http://127.0.0.1:{port}", 200),
        ("http://127.0.0.1", 200),  # no port on one side: only host names are compared
        ("HTTP://127.0.0.1:{port}", 200),
        ("http://127.0.0.1:1", 403),
        ("http://localhost:{port}", 403),  # a different name for the same host
        ("http://127.0.0.1:notaport", 403),
        ("null", 200),  # sandboxed pages: nothing to compare, as in ComfyUI
    ],
)
async def test_origin_against_loopback_host(
    tmp_path: Path, origin: str | None, status: int
) -> None:
    async with serve(tmp_path) as served:
        headers = {} if origin is None else {"Origin": origin.format(port=served.port)}
        response = await served.client.get("/features", headers=headers)
        assert response.status == status
        if status == 403:
            assert await response.read() == b""
            assert response.headers.get("Content-Type") is None


@pytest.mark.parametrize(
    ("host", "origin", "status"),
    [
        ("localhost:8188", "http://evil.example", 403),
        ("[::1]:8188", "http://evil.example", 403),
        ("[::1]:8188", "http://[::1]:8188", 200),
        ("127.0.0.2", "http://evil.example", 403),
        ("comfy.invalid", "http://evil.example", 200),  # not loopback: not checked
        ("192.0.2.10:8188", "http://evil.example", 200),
    ],
)
async def test_origin_only_checked_for_loopback_hosts(
    tmp_path: Path, host: str, origin: str, status: int
) -> None:
    async with serve(tmp_path) as served:
        response = await served.client.get("/features", headers={"Host": host, "Origin": origin})
        assert response.status == status


async def test_origin_check_blocks_uploads(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        response = await served.client.post(
            "/upload/image", data=b"x", headers={"Origin": "http://evil.example"}
        )
        assert response.status == 403


async def test_options_is_an_empty_200(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        response = await served.client.options("/anything")
        assert (response.status, await response.read()) == (200, b"")


async def test_unexpected_errors_become_json_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve(tmp_path, extra=EXTRA) as served:
        with caplog.at_level(logging.ERROR, logger="comfyfleet.server.plumbing.middleware"):
            response = await served.client.get("/api/boom")
        assert response.status == 500
        assert response.headers["Content-Type"] == "application/json; charset=utf-8"
        body = await response.json()
        assert body == {
            "error": {
                "type": "server_error",
                "message": "Internal server error",
                "details": "",
                "extra_info": {},
            },
            "node_errors": {},
        }
        assert "secret" not in await response.text()
    [record] = [r for r in caplog.records if r.name == "comfyfleet.server.plumbing.middleware"]
    assert record.exc_info is not None and "secret" in str(record.exc_info[1])


async def test_http_exceptions_pass_through(tmp_path: Path) -> None:
    async with serve(tmp_path, extra=EXTRA) as served:
        conflict = await served.client.get("/conflict")
        assert (conflict.status, await conflict.text()) == (409, "conflict")
        missing = await served.client.get("/no/such/route")
        assert missing.status == 404
        assert missing.headers["Content-Type"].startswith("text/plain")
