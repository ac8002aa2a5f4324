"""One HTTP client session for the jobs of a fan-out service, kept open a while after
the last one ends.

Kept open, its connections (and, with a real provider, their TLS sessions) serve the
next prompt's jobs instead of being made again for every batch. It closes once idle
for `linger` seconds, and at once on `close()`; a process that stops without closing
the service loses only idle connections.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp

#: How long the session stays open after its last job ended.
LINGER = 30.0


class SessionLease:
    def __init__(self, linger: float = LINGER) -> None:
        self._linger = linger
        self._session: aiohttp.ClientSession | None = None
        self._users = 0
        self._closing: asyncio.TimerHandle | None = None
        self._closed_idle: asyncio.Task[None] | None = None  # an idle session's close

    @property
    def open(self) -> bool:
        return self._session is not None

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[aiohttp.ClientSession]:
        if self._closing is not None:
            self._closing.cancel()
            self._closing = None
        if self._session is None:
            # No total limit: the pools bound how many jobs talk at once.
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
            self._session = aiohttp.ClientSession(connector=connector)
        session = self._session
        self._users += 1
        try:
            yield session
        finally:
            self._users -= 1
            if self._users == 0 and self._session is session:
                loop = asyncio.get_running_loop()
                self._closing = loop.call_later(self._linger, self._close_idle)

    def _close_idle(self) -> None:
        self._closing = None
        if self._users == 0 and self._session is not None:
            session, self._session = self._session, None
            self._closed_idle = asyncio.ensure_future(session.close())

    async def close(self) -> None:
        """Close the session now (its users, if any, should have ended)."""
        if self._closing is not None:
            self._closing.cancel()
            self._closing = None
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        if self._closed_idle is not None:
            await self._closed_idle
