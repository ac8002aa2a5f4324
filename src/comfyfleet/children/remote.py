"""`ChildJobs` over a gateway's HTTP API: how "Run on the Fleet" inside a real ComfyUI
(the companion pack) sends its children to the fleet.

The gateway is named by `COMFYFLEET_GATEWAY_URL` in ComfyUI's environment, with an
optional bearer token in `COMFYFLEET_GATEWAY_TOKEN` (the children are that token's
tenant's prompts). Each child is queued with its key as `Idempotency-Key`, so a parent
run again (a re-queue, a restart of that ComfyUI) finds the children it queued before.

Every call is safe to make twice (the key; a cancel of what is cancelled), so a gateway
out of reach for a while (restarting, a network blip, a 502/503/504 from a proxy in
front of it) is asked again until it answers, for up to OUTAGE_GRACE: its children are
durable and go on meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp

from comfyfleet.children.jobs import TILES_ROUTE, ChildFailed, ChildRequest
from comfyfleet.errors import ComfyfleetError

log = logging.getLogger(__name__)

URL_ENV, TOKEN_ENV = "COMFYFLEET_GATEWAY_URL", "COMFYFLEET_GATEWAY_TOKEN"
#: extra_data naming where a child comes from (informational: the gateway runs it anywhere).
ORIGIN_KEY = "comfyfleet_child_of"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
POLL_SECONDS = 0.25
#: Answers read whole (an image, a history entry) are refused past this.
MAX_BYTES = 256 * 1024 * 1024
TIMEOUT = aiohttp.ClientTimeout(total=120, sock_connect=10)
#: How long the gateway may be out of reach before what is asked of it fails.
OUTAGE_GRACE = 120.0
RETRY_EVERY = 0.5
#: Answers of a proxy (or a gateway shutting down) whose gateway may be back soon.
UNAVAILABLE = frozenset({502, 503, 504})

T = TypeVar("T")


class _Unavailable(ComfyfleetError):
    """An answer of UNAVAILABLE: ask again."""


class RemoteChildJobs:
    """Children queued on the gateway at `base` (ChildJobs); one session per loop."""

    def __init__(self, base: str | None, token: str | None = None) -> None:
        self._base = (base or "").rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_environment(cls) -> RemoteChildJobs:
        return cls(os.environ.get(URL_ENV), os.environ.get(TOKEN_ENV))

    async def queue(self, child: ChildRequest) -> str:
        origin = {"prompt_id": child.parent, "node_id": child.node_id, "index": child.index}
        body = {"prompt": child.prompt, "extra_data": {ORIGIN_KEY: origin}}
        status, answer = await self._json("POST", "/prompt", body, {"Idempotency-Key": child.key})
        if status != 200 or not isinstance(answer.get("prompt_id"), str):
            error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
            reason = f"{error.get('message')}: {error.get('details')}" if error else status
            raise ChildFailed(f"child {child.index + 1} refused by the gateway: {reason}")
        return str(answer["prompt_id"])

    async def outcome(self, prompt_id: str) -> dict[str, Any]:
        while True:
            status, job = await self._json("GET", f"/api/jobs/{prompt_id}")
            if status == 404:
                raise ChildFailed(f"child {prompt_id} is gone")
            if status == 200 and job.get("status") in TERMINAL:
                break
            await asyncio.sleep(POLL_SECONDS)
        _, history = await self._json("GET", f"/history/{prompt_id}")
        entry = history.get(prompt_id) if isinstance(history, dict) else None
        if not isinstance(entry, dict) or job["status"] != "completed":
            raise ChildFailed(f"child {prompt_id} ended {job['status']}")
        return entry

    async def file(self, prompt_id: str, ref: dict[str, Any]) -> bytes:
        query = {k: str(ref.get(k) or "") for k in ("filename", "subfolder", "type")}
        url = self._url("/view")

        async def read() -> bytes:
            async with self._open().get(url, params=query) as response:
                _raise_if_unavailable(response.status)
                if response.status != 200:
                    raise ChildFailed(f"child {prompt_id}: its file answered {response.status}")
                return await _read_capped(response)

        return await self._until_reached(read)

    async def put_input(self, parent: str, name: str, data: bytes) -> str:
        form = aiohttp.FormData()
        form.add_field("image", data, filename=name, content_type="image/png")
        form.add_field("overwrite", "true")
        async with self._open().post(self._url("/upload/image"), data=form) as response:
            if response.status != 200:
                raise ChildFailed(f"the gateway refused tile {name}: {response.status}")
            answer = await response.json()
        return str(answer["name"])

    async def drop_inputs(self, parent: str, names: list[str]) -> None:
        for name in names:
            try:
                await self._json("DELETE", f"{TILES_ROUTE}/{quote(name, safe='')}")
            except ChildFailed as exc:  # the result is made: a tile left behind is no failure
                log.warning("tile %s stays on the gateway: %s", name, exc)

    async def cancel(self, prompt_ids: list[str]) -> None:
        for prompt_id in prompt_ids:
            await self._json("POST", f"/api/jobs/{prompt_id}/cancel")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self, path: str) -> str:
        if not self._base:
            raise ChildFailed(f"set {URL_ENV} in ComfyUI's environment to the gateway's URL")
        return self._base + path

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=TIMEOUT)
        return self._session

    async def _json(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        url = self._url(path)

        async def ask() -> tuple[int, bytes]:
            async with self._open().request(method, url, json=body, headers=headers) as response:
                _raise_if_unavailable(response.status)
                return response.status, await _read_capped(response)

        status, data = await self._until_reached(ask)
        try:
            return status, json.loads(data) if data else {}
        except ValueError:
            return status, {}

    async def _until_reached(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call`, made again while the gateway is out of reach, for up to OUTAGE_GRACE."""
        since = None
        while True:
            try:
                return await call()
            except (aiohttp.ClientError, TimeoutError, _Unavailable) as exc:
                since = since if since is not None else time.monotonic()
                if time.monotonic() - since > OUTAGE_GRACE:
                    reason = str(exc) or type(exc).__name__
                    raise ChildFailed(
                        f"the gateway at {self._base} did not answer for "
                        f"{OUTAGE_GRACE:.0f} s: {reason}"
                    ) from None
            await asyncio.sleep(RETRY_EVERY)


def _raise_if_unavailable(status: int) -> None:
    if status in UNAVAILABLE:
        raise _Unavailable(f"HTTP {status}")


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    data = await response.content.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ChildFailed(f"an answer of the gateway is over {MAX_BYTES} bytes")
    return data
