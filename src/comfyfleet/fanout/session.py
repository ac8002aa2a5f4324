"""One HTTP client session for every job running at the moment, closed when none is.

Engines and the gateway stop without an async close hook for their services, so
the session lives exactly as long as there is a job using it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiohttp


class SessionLease:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._users = 0

    @property
    def open(self) -> bool:
        return self._session is not None

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[aiohttp.ClientSession]:
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
                self._session = None
                await session.close()
