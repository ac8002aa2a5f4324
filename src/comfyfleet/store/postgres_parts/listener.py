"""One PostgreSQL connection that LISTENs for the store's wake-ups, and keeps doing so.

Outside the pool, as LISTEN wants a connection of its own for as long as it listens.
A connection that drops (the server restarted, the backend was terminated, the network
failed: a ping every PING_EVERY seconds notices what the socket does not) is replaced,
retrying with a growing delay; notifications sent meanwhile are lost, so once it
listens again `catch_up(since)` is called with the time it was last known to listen
(less CATCH_UP_MARGIN), for the store to announce what was committed since.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

#: Seconds between checks that the connection still answers.
PING_EVERY = 5.0
#: Seconds a check may take before the connection counts as lost.
PING_TIMEOUT = 5.0
#: Longest wait between attempts to connect again.
RETRY_MAX = 2.0
#: Seconds before the last sign of life from which to catch up (commit delays, and the
#: clocks of other gateways, which time the events they append).
CATCH_UP_MARGIN = 10.0


class Listener:
    """LISTEN on channels through one connection made by `connect`, which raises one of
    `errors` (TimeoutError among them) when it cannot connect or answer. Callbacks run
    on the event loop."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Any]],
        catch_up: Callable[[float], Awaitable[None]],
        errors: tuple[type[BaseException], ...],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._connect_once = connect
        self._catch_up = catch_up
        self._errors = errors
        self._clock = clock
        self._channels: dict[str, Callable[[str], None]] = {}
        self._conn: Any = None
        self._lost = asyncio.Event()
        self._alive_at = 0.0
        self._keeper: asyncio.Task[None] | None = None
        #: Connections made again after one was lost (read by tests and metrics).
        self.reconnects = 0

    async def listen(self, channel: str, on_payload: Callable[[str], None]) -> None:
        """Call `on_payload` with each notification's payload on `channel`; the first
        call connects (raising what `connect` raised when it cannot)."""
        new = channel not in self._channels
        self._channels[channel] = on_payload
        if self._keeper is None:
            self._conn = await self._connect()
            self._keeper = asyncio.create_task(self._keep(), name="store-listener")
        elif new and self._conn is not None:
            await self._conn.add_listener(channel, self._notified)

    async def close(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(*self._errors):
                await conn.close(timeout=5)

    async def _connect(self) -> Any:
        conn = await self._connect_once()
        try:
            conn.add_termination_listener(self._terminated)
            for channel in self._channels:
                await conn.add_listener(channel, self._notified)
        except BaseException:
            conn.terminate()
            raise
        self._alive_at = self._clock()
        return conn

    def _terminated(self, conn: Any) -> None:
        if conn is self._conn:  # not one given up on already
            self._lost.set()

    def _notified(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        on_payload = self._channels.get(channel)
        if on_payload is not None:
            on_payload(payload)

    async def _keep(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PING_EVERY):  # never swallows a cancel
                    await self._lost.wait()
            if not self._lost.is_set() and await self._answers():
                continue
            await self._replace()

    async def _answers(self) -> bool:
        try:
            async with asyncio.timeout(PING_TIMEOUT):
                await self._conn.execute("SELECT 1")
        except self._errors:  # a timeout among them
            return False
        self._alive_at = self._clock()
        return True

    async def _replace(self) -> None:
        since = self._alive_at - CATCH_UP_MARGIN
        old, self._conn = self._conn, None
        if old is not None:
            old.terminate()
        log.warning("lost the connection that listens for wake-ups; connecting again")
        delay = 0.05
        while True:
            self._lost.clear()
            try:
                self._conn = await self._connect()
                break
            except Exception as exc:  # whatever it is, trying again is all there is to do
                log.warning("cannot listen for wake-ups yet: %s", type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(RETRY_MAX, delay * 2)
        self.reconnects += 1
        log.info("listening for wake-ups again; catching up")
        try:
            await self._catch_up(since)
        except Exception:
            log.exception("could not catch up after listening again")
