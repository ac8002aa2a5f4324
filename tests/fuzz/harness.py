"""A real in-process server on its own event-loop thread, driven from synchronous tests.

Hypothesis runs each example synchronously; the server and an aiohttp ClientSession live
on a private loop in a background thread, so examples share one server (which must keep
serving) and pytest-asyncio's per-test loops are never involved. Every request has a
deadline: a hang fails the example instead of the suite.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import threading
from collections.abc import Coroutine, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from hypothesis import HealthCheck, settings

from tests.fuzz.strategies import to_json
from tests.servers import start_in_process

T = TypeVar("T")

#: `COMFYFLEET_FUZZ_LONG=1`: 20 times the examples and no per-example deadline.
LONG = os.environ.get("COMFYFLEET_FUZZ_LONG") == "1"
REQUEST_TIMEOUT = 30.0 if LONG else 15.0


def fuzz_settings(examples: int) -> settings:
    """Short by default (the directory runs in well under a minute), 20x with LONG."""
    return settings(
        max_examples=examples * 20 if LONG else examples,
        deadline=None,  # a real server: timing varies, hangs are caught by REQUEST_TIMEOUT
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=not LONG,  # the short run is reproducible; the long one explores
        database=None,
        print_blob=True,
    )


#: What `LiveServer.websocket` reports for a connection that ended without a close code.
WS_LOST = -1

#: pytest-timeout for a fuzz test: none in the long run.
TIMEOUT_MARK_SECONDS = 0 if LONG else 120


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes

    @property
    def ok(self) -> bool:
        return self.status == 200

    def json(self) -> Any:
        """The body as strict JSON: NaN and Infinity are not JSON, browsers refuse them."""
        return json.loads(self.body, parse_constant=_not_json)


def _not_json(name: str) -> Any:
    raise AssertionError(f"the reply holds {name}, which is not JSON")


class ErrorLog(logging.Handler):
    """What is logged at ERROR or above: a traceback a request caused, for one."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        """The messages logged since the last call."""
        messages = [f"{r.name}: {r.getMessage()}" for r in self.records]
        self.records.clear()
        return messages


class LiveServer:
    """`start_in_process` on a private loop; `request` blocks until the reply or a timeout."""

    def __init__(self, data_dir: Path, **settings: Any) -> None:
        self.errors = ErrorLog()
        logging.getLogger().addHandler(self.errors)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="fuzz-server", daemon=True
        )
        self.thread.start()
        self.server, self.gateway = self.run(start_in_process(data_dir, **settings), 30)
        self.session = self.run(self._session(), 5)

    @staticmethod
    async def _session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT))

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise AssertionError(f"no answer within {timeout} s: the server hangs") from None

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> Reply:
        if isinstance(data, bytes) and len(data) > 1 << 20:
            data = io.BytesIO(data)  # aiohttp warns about large raw bytes bodies

        async def send() -> Reply:
            async with self.session.request(
                method, self.url(path), params=params, data=data, headers=headers
            ) as response:
                body = await response.read()
                return Reply(response.status, response.content_type, body)

        try:
            return self.run(send(), timeout + 5)
        except TimeoutError:  # aiohttp's own total timeout
            raise AssertionError(f"{method} {path}: no answer within {timeout} s") from None

    def websocket(self, message: str | bytes, *, text: bool = True) -> int | None:
        """Send `message` as the first message of a `/ws` connection (`text`: as a text frame,
        its bytes as given), then a ping: None when the pong comes back (the socket is still
        open), else the code the server closed it with, or WS_LOST when the connection went
        without one (e.g. closed while a message past the cap was still being sent)."""

        async def exchange() -> int | None:
            async with self.session.ws_connect(self.url("/ws"), autoping=False) as ws:
                data = (
                    message.encode("utf-8", "surrogatepass")
                    if isinstance(message, str)
                    else message
                )
                try:
                    await ws.send_frame(
                        data, aiohttp.WSMsgType.TEXT if text else aiohttp.WSMsgType.BINARY
                    )
                    await ws.ping()
                except ConnectionError:
                    return ws.close_code or WS_LOST
                while (reply := await ws.receive()).type != aiohttp.WSMsgType.PONG:
                    if reply.type == aiohttp.WSMsgType.CLOSE:
                        return int(reply.data)
                    if reply.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                        return ws.close_code or WS_LOST
                return None

        return self.run(exchange(), REQUEST_TIMEOUT)

    def post_json(self, path: str, body: Any, timeout: float = REQUEST_TIMEOUT) -> Reply:
        raw = to_json(body).encode()
        return self.request(
            "POST", path, data=raw, headers={"Content-Type": "application/json"}, timeout=timeout
        )

    def assert_serving(self) -> None:
        reply = self.request("GET", "/prompt")
        assert reply.status == 200, reply
        assert "queue_remaining" in reply.json()["exec_info"]

    def quiesce(self) -> None:
        """Drop whatever the examples queued, and stop what runs."""
        self.post_json("/queue", {"clear": True})
        self.post_json("/interrupt", {})

    def close(self) -> None:
        async def stop() -> None:
            await self.session.close()
            await self.server.close()

        try:
            self.run(stop(), 60)
        finally:
            logging.getLogger().removeHandler(self.errors)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
            self.loop.close()


def is_server_error(reply: Reply) -> bool:
    return reply.status >= 500


def assert_comfy_error_shape(body: Any) -> None:
    """ComfyUI's 400 body: `{error: {type, message, details, extra_info}, node_errors: {}}`."""
    assert isinstance(body, dict), body
    err = body.get("error")
    assert isinstance(err, dict), body
    assert isinstance(err.get("type"), str), body
    assert isinstance(err.get("message"), str), body
    assert isinstance(err.get("details"), str), body
    assert isinstance(err.get("extra_info"), dict), body
    assert isinstance(body.get("node_errors"), dict), body
