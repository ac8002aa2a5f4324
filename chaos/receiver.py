"""The webhook receiver: a loopback aiohttp server in the harness's process that checks
each request's Standard Webhooks signature (HMAC-SHA256 over id, timestamp and body) and
keeps every one it accepts. Delivery is at least once, so the checker counts ends by
`webhook-id`: one delivery sent twice is one end."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from cluster import free_port


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


@dataclass(frozen=True)
class Delivery:
    id: str  # webhook-id: the same on every attempt of one delivery
    type: str  # job.succeeded, job.failed, ...
    prompt_id: str
    attempt: int | None
    at: float


class Receiver:
    def __init__(self, secret: str) -> None:
        self.key = base64.b64decode(secret.removeprefix("whsec_"))
        self.port = free_port()
        self.received: list[Delivery] = []
        self.refused = 0  # requests whose signature did not verify
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def verified(self, headers: Any, body: bytes) -> bool:
        signed = f"{headers.get('webhook-id')}.{headers.get('webhook-timestamp')}.".encode()
        digest = hmac.new(self.key, signed + body, hashlib.sha256).digest()
        expected = "v1," + base64.b64encode(digest).decode()
        offered = str(headers.get("webhook-signature", "")).split()
        return any(hmac.compare_digest(expected, one) for one in offered)

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if not self.verified(request.headers, body):
            self.refused += 1
            return web.Response(status=401)
        event = json.loads(body)
        data = event.get("data") or {}
        self.received.append(
            Delivery(
                request.headers["webhook-id"],
                str(event.get("type")),
                str(data.get("prompt_id")),
                data.get("attempt"),
                time.time(),
            )
        )
        return web.Response(status=204)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def ends(self) -> dict[str, set[str]]:
        """Each prompt's distinct deliveries (by webhook-id)."""
        found: dict[str, set[str]] = {}
        for delivery in self.received:
            found.setdefault(delivery.prompt_id, set()).add(delivery.id)
        return found
