"""A webhook receiver on loopback that verifies every request with the Standard Webhooks
specification's own verifier (the `standardwebhooks` package) and keeps each one."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from standardwebhooks import Webhook, WebhookVerificationError

from tests.servers import free_port


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


@dataclass(frozen=True)
class Received:
    id: str
    body: dict[str, Any]
    at: float  # time.monotonic() when it arrived

    @property
    def prompt_id(self) -> str:
        return str(self.body["data"]["prompt_id"])


class Receiver:
    """`mode`: "ok" answers 204, "fail" 500, "hang" never answers (until `close`)."""

    def __init__(self, secret: str, mode: str = "ok") -> None:
        self.verifier = Webhook(secret)
        self.mode = mode
        self.received: list[Received] = []
        self.unverified = 0
        self._arrived = asyncio.Event()
        self._released = asyncio.Event()
        self.server = TestServer(self._app(), host="127.0.0.1", port=free_port())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/hook"

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = self.verifier.verify(raw, dict(request.headers))
        except WebhookVerificationError:
            self.unverified += 1
            return web.Response(status=401)
        self.received.append(Received(request.headers["webhook-id"], body, time.monotonic()))
        self._arrived.set()
        if self.mode == "hang":
            await self._released.wait()
        if self.mode == "fail":
            return web.Response(status=500, text="receiver says no")
        return web.Response(status=204)

    async def __aenter__(self) -> Receiver:
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._released.set()
        await self.server.close()

    def unique(self) -> dict[str, Received]:
        """The first request of each webhook-id (what a receiver that drops repeats keeps)."""
        first: dict[str, Received] = {}
        for item in self.received:
            first.setdefault(item.id, item)
        return first

    async def wait_for(self, count: int, timeout: float = 30.0) -> dict[str, Received]:
        """Until `count` distinct webhook-ids arrived; those."""
        deadline = time.monotonic() + timeout
        while len(self.unique()) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                got = json.dumps([r.body for r in self.received])[:2000]
                raise AssertionError(f"{len(self.unique())} of {count} webhooks arrived: {got}")
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                continue
        return self.unique()
