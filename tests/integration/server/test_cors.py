"""The CORS option: named browser origins may call the API; everyone else is still guarded."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.servers import start_in_process

APP = "http://app.example"


async def fetch(url: str, method: str, origin: str) -> tuple[int, dict[str, str]]:
    async with aiohttp.ClientSession() as session:
        headers = {"Origin": origin, "Access-Control-Request-Method": "POST"}
        async with session.request(method, url, headers=headers) as response:
            await response.read()
            return response.status, dict(response.headers)


async def test_allowed_origin_gets_cors_headers_and_others_stay_refused(tmp_path: Path) -> None:
    server, _ = await start_in_process(tmp_path, local_slots=1, cors_origins=(APP,))
    url = f"http://127.0.0.1:{server.port}"
    try:
        status, headers = await fetch(url + "/prompt", "GET", APP)
        assert status == 200
        assert headers["Access-Control-Allow-Origin"] == APP
        status, headers = await fetch(url + "/api/prompt", "OPTIONS", APP)
        assert status == 200 and "POST" in headers["Access-Control-Allow-Methods"]
        status, headers = await fetch(url + "/prompt", "GET", "http://evil.example")
        assert status == 403 and "Access-Control-Allow-Origin" not in headers
    finally:
        await server.close()


async def test_without_the_option_a_cross_site_origin_is_refused(tmp_path: Path) -> None:
    server, _ = await start_in_process(tmp_path, local_slots=1)
    try:
        status, headers = await fetch(f"http://127.0.0.1:{server.port}/prompt", "GET", APP)
        assert status == 403 and "Access-Control-Allow-Origin" not in headers
    finally:
        await server.close()
