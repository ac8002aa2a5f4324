"""Client input no later step can use: lone surrogates, deep nesting, oversize bodies and
WebSocket messages.

Each is refused where it comes in (ComfyUI's 400, a 413, a closed socket): never a 500,
never a traceback in the log, and the server keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from comfyfleet.server.comfyui_api.ws import MAX_WS_MESSAGE
from comfyfleet.server.config import AuthToken
from comfyfleet.server.plumbing.client_json import MAX_DEPTH
from tests.integration.gateway.test_limits import assert_comfyui_error, assert_still_serving
from tests.integration.gateway.wire import Served, save_prompt, serve

ADMIN = "admin-token-for-client-input"
#: A lone UTF-16 surrogate as JSON text: a valid escape, but not Unicode text.
LONE = '"\\ud800"'
PROMPT = json.dumps(save_prompt(1, "x"))
NODE = '{"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1}}'

SURROGATE_BODIES = [
    ("/prompt", f'{{"prompt": {PROMPT}, "prompt_id": {LONE}}}'),
    ("/prompt", f'{{"prompt": {PROMPT}, "client_id": {LONE}}}'),
    ("/prompt", f'{{"prompt": {PROMPT}, "extra_data": {{"note": {LONE}}}}}'),
    ("/prompt", f'{{"prompt": {{{LONE}: {NODE}}}}}'),
    ("/prompt", f'{{"prompt": {{"1": {{"class_type": {LONE}, "inputs": {{}}}}}}}}'),
    ("/api/jobs/cancel", f'{{"job_ids": [{LONE}]}}'),
    ("/queue", f'{{"delete": [{LONE}]}}'),
    ("/history", f'{{"delete": [{LONE}]}}'),
    ("/interrupt", f'{{"prompt_id": {LONE}}}'),
    ("/free", f'{{"free_memory": {LONE}}}'),
    ("/api/fleet/backends", f'{{"name": {LONE}, "url": "http://127.0.0.1:9"}}'),
]


def _auth(on: bool) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"} if on else {}


def _serve(tmp_path: Path, auth: bool, **settings: object) -> AbstractAsyncContextManager[Served]:
    if auth:
        settings["auth_tokens"] = (AuthToken(ADMIN, "default", admin=True),)
    return serve(tmp_path, **settings)


async def _post(served: Served, path: str, raw: bytes, auth: bool) -> tuple[int, object]:
    headers = {"Content-Type": "application/json", **_auth(auth)}
    reply = await served.request("POST", path, data=raw, headers=headers)
    return reply.status, (reply.json if reply.text else None)


def _no_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


@pytest.mark.parametrize("auth", [False, True], ids=["open", "auth"])
async def test_lone_surrogates_are_a_400_in_comfyuis_shape(
    tmp_path: Path, auth: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async with _serve(tmp_path, auth) as served:
        raw_bytes = f'{{"prompt": {PROMPT}, "prompt_id": "\xed\xa0\x80"}}'
        for path, body in [*SURROGATE_BODIES, ("/prompt", raw_bytes)]:
            # The last: a surrogate as raw bytes, which is not UTF-8 at all.
            raw = body.encode("latin-1") if "\xed" in body else body.encode()
            status, reply = await _post(served, path, raw, auth)
            assert status == 400, (path, body, status, reply)
            assert_comfyui_error(reply, "invalid_json")
        if not auth:
            await assert_still_serving(served)
    _no_errors_logged(caplog)


def _nested(depth: int) -> str:
    """`depth` levels of arrays and objects, the outermost an object."""
    return (
        '{"a": ' * (depth // 2)
        + "[" * (depth - depth // 2)
        + "]" * (depth - depth // 2)
        + ("}" * (depth // 2))
    )


@pytest.mark.parametrize("auth", [False, True], ids=["open", "auth"])
async def test_nesting_past_the_cap_is_a_400_in_comfyuis_shape(
    tmp_path: Path, auth: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async with _serve(tmp_path, auth) as served:
        for path in ("/free", "/prompt", "/queue", "/history", "/interrupt", "/api/jobs/cancel"):
            for depth in (MAX_DEPTH + 1, 1000, 100_000):
                status, reply = await _post(served, path, _nested(depth).encode(), auth)
                assert status == 400, (path, depth, status, reply)
                assert_comfyui_error(reply, "invalid_json")
        # At the cap, a body is read as usual.
        status, _ = await _post(served, "/queue", _nested(MAX_DEPTH).encode(), auth)
        assert status == 200
        body = f'{{"prompt": {PROMPT}, "extra_data": {{"x": {"[" * 97}{"]" * 97}}}}}'
        status, reply = await _post(served, "/prompt", body.encode(), auth)
        assert status == 200, reply
    _no_errors_logged(caplog)


async def test_ids_past_their_length_are_a_400(tmp_path: Path) -> None:
    """A client_id is stored with its prompt and echoed in its frames: a megabyte of it
    is refused like an overlong prompt_id."""
    async with _serve(tmp_path, False) as served:
        for key in ("client_id", "prompt_id"):
            body = json.dumps({"prompt": save_prompt(1, "x"), key: "c" * 201}).encode()
            status, reply = await _post(served, "/prompt", body, False)
            assert status == 400, (key, reply)
            assert_comfyui_error(reply, "invalid_prompt")
        body = json.dumps({"prompt": save_prompt(1, "x"), "client_id": "c" * 200}).encode()
        assert (await _post(served, "/prompt", body, False))[0] == 200


# -- bodies over the cap --------------------------------------------------------------


async def _answer_to_headers(served: Served, path: str, length: int) -> bytes:
    """The status line the server sends after the headers of a POST announcing `length`
    bytes and only the first few of them: the rest never comes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n{{".encode()
        )
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "path", ["/prompt", "/queue", "/history", "/interrupt", "/free", "/api/jobs/cancel"]
)
async def test_a_body_announced_past_the_cap_is_a_413_before_it_is_read(
    tmp_path: Path, path: str
) -> None:
    async with serve(tmp_path, max_upload_bytes=4096) as served:
        status_line = await _answer_to_headers(served, path, 4097)
        assert status_line.split()[1:2] == [b"413"], status_line
        await assert_still_serving(served)


# -- WebSocket messages -------------------------------------------------------------


async def _raw_socket(served: Served) -> aiohttp.ClientWebSocketResponse:
    ws = await served.session.ws_connect(f"{served.url}/ws?clientId=raw", autoping=False)
    greeting = await ws.receive_json(timeout=10)
    assert greeting["type"] == "status"
    return ws


async def _still_open(ws: aiohttp.ClientWebSocketResponse) -> None:
    """The server answers a ping: it read past what came before and kept the socket."""
    await ws.ping()
    message = await ws.receive(timeout=10)
    assert message.type == aiohttp.WSMsgType.PONG, message


async def _upgrade(served: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A `/ws` connection spoken by hand, to send a frame header without its payload."""
    reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        "GET /ws?clientId=raw HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    writer.write(request.encode())
    assert b" 101 " in await reader.readline()
    while await reader.readline() not in (b"\r\n", b""):
        pass
    return reader, writer


async def _close_code(reader: asyncio.StreamReader) -> int:
    """Read (unmasked) server frames up to its close frame; the code in it."""
    while True:
        opcode, length = await reader.readexactly(2)
        if length & 0x7F == 126:
            size = int.from_bytes(await reader.readexactly(2), "big")
        elif length & 0x7F == 127:
            size = int.from_bytes(await reader.readexactly(8), "big")
        else:
            size = length & 0x7F
        payload = await reader.readexactly(size)
        if opcode & 0x0F == 0x8:
            return int.from_bytes(payload[:2], "big")


async def test_a_websocket_message_past_the_cap_is_refused_from_its_header(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A frame announcing a 90 MB text message closes that socket (1009) before any of the
    message arrives; other clients go on as before."""
    async with serve(tmp_path) as served:
        other = await served.connect()
        reader, writer = await _upgrade(served)
        mask = os.urandom(4)
        header = bytes([0x81, 0x80 | 127]) + (90 * 1024 * 1024).to_bytes(8, "big") + mask
        writer.write(header + bytes(b ^ mask[i % 4] for i, b in enumerate(b'{"type": ')))
        code = await asyncio.wait_for(_close_code(reader), 10)
        assert code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        writer.close()
        prompt_id = await served.submit(save_prompt(2, "other"), other.client_id)
        await other.done(prompt_id)
    _no_errors_logged(caplog)


async def test_a_first_message_at_the_cap_is_read(tmp_path: Path) -> None:
    async with serve(tmp_path) as served:
        ws = await _raw_socket(served)
        flags: dict[str, Any] = {
            "type": "feature_flags",
            "data": {"supports_preview_metadata": True, "pad": ""},
        }
        flags["data"]["pad"] = "p" * (MAX_WS_MESSAGE - len(json.dumps(flags)))
        assert len(json.dumps(flags)) == MAX_WS_MESSAGE
        await ws.send_str(json.dumps(flags))
        reply = await ws.receive_json(timeout=10)
        assert reply["type"] == "feature_flags"
        await ws.close()


@pytest.mark.parametrize(
    "first",
    [
        "[" * 30_000 + "]" * 30_000,  # within the cap, past the parser's recursion
        json.dumps({"type": "feature_flags", "data": {"supports_preview_metadata": "\ud800"}}),
        "not json",
    ],
    ids=["deep", "surrogate", "not-json"],
)
async def test_a_first_message_that_is_not_usable_is_ignored(
    tmp_path: Path, first: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve(tmp_path) as served:
        ws = await _raw_socket(served)
        await ws.send_str(first)
        await _still_open(ws)
        await ws.close()
    _no_errors_logged(caplog)
