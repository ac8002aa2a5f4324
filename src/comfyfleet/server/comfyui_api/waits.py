"""`POST /prompt?wait=SECONDS`: answer with the history entry once the prompt ends.

A waiting request costs a future, woken by the scheduler's `job_finished` (the end is
durably recorded by then). Another gateway sharing the store may record the end instead,
so the store is also read now and then. The wait ends early, for a 202, when the client
has gone or the server stops.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from aiohttp import web

from comfyfleet.domain.jobs import TERMINAL, Job, JobResult
from comfyfleet.errors import ClientError
from comfyfleet.scheduler.observers import JobObserver
from comfyfleet.store.base import JobStore

#: The longest wait a request may ask for, in seconds.
MAX_WAIT = 600.0
#: Seconds between reads of the store while waiting (the end may be recorded elsewhere).
STORE_POLL = 3.0
#: Seconds between looks at whether the client is still connected.
CLIENT_CHECK = 1.0


class BadWait(ClientError):
    """`wait` is not a number of seconds from 0 to MAX_WAIT."""

    type = "invalid_wait"


def wait_seconds(request: web.Request) -> float | None:
    """The request's `wait` (None without one); BadWait if it is not usable."""
    raw = request.query.get("wait")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_WAIT:  # NaN fails too
        raise BadWait(f"wait must be a number of seconds from 0 to {MAX_WAIT:.0f}", raw[:100])
    return seconds


class PromptWaits(JobObserver):
    """The requests waiting for their prompt to end."""

    def __init__(self, store: JobStore, *, poll: float = STORE_POLL) -> None:
        self._store = store
        self._poll = poll
        self._waiting: dict[str, set[asyncio.Future[bool]]] = {}
        self._closed = False

    @property
    def waiting(self) -> int:
        """Requests waiting right now."""
        return sum(len(futures) for futures in self._waiting.values())

    def job_finished(self, job: Job, result: JobResult) -> None:
        for ended in self._waiting.get(job.prompt_id, ()):
            if not ended.done():
                ended.set_result(True)

    def close(self) -> None:
        """The server is stopping: every wait ends now (its request gets a 202)."""
        self._closed = True
        for futures in self._waiting.values():
            for ended in futures:
                if not ended.done():
                    ended.set_result(False)

    async def wait(
        self, prompt_id: str, seconds: float, connected: Callable[[], bool]
    ) -> dict[str, Any] | None:
        """`/history/{prompt_id}`'s answer once the prompt ends within `seconds` (`{}` for
        one cancelled before it ran), else None: time is up, `connected()` turned false,
        or the server is stopping."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[bool] = loop.create_future()
        futures = self._waiting.setdefault(prompt_id, set())
        futures.add(ended)
        try:
            deadline = loop.time() + seconds
            next_read = loop.time()  # at once: it may have ended already
            while not self._closed:
                if loop.time() >= next_read:
                    status = await self._status(prompt_id)
                    if status is None:  # unknown (pruned): nothing to wait for
                        return None
                    if status:
                        return await self._answer(prompt_id)
                    next_read = loop.time() + self._poll
                left = deadline - loop.time()
                if left <= 0 or not connected():
                    return None
                await asyncio.wait(
                    [ended], timeout=min(left, CLIENT_CHECK, next_read - loop.time())
                )
                if ended.done():
                    return await self._answer(prompt_id) if ended.result() else None
            return None
        finally:
            futures.discard(ended)
            if not futures and self._waiting.get(prompt_id) is futures:
                del self._waiting[prompt_id]

    async def _status(self, prompt_id: str) -> bool | None:
        """Whether the prompt has ended; None when the store does not know it."""
        job = await self._store.get(prompt_id)
        return None if job is None else job.status in TERMINAL

    async def _answer(self, prompt_id: str) -> dict[str, Any]:
        entry = await self._store.history_entry(prompt_id)
        return {} if entry is None else {prompt_id: entry.comfy()}


WAITS = web.AppKey("comfyfleet_waits", PromptWaits)
