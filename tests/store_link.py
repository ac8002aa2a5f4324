"""A TCP link to the PostgreSQL server that a test can cut: every connection through it
is dropped and new ones are refused until it is mended. It stands for a store outage
or a network partition between gateways (processes of their own) and the store,
without touching the server other tests use.

It runs its own event loop in a thread, so blocking tests can hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit


class StoreLink:
    def __init__(self, server_url: str) -> None:
        parts = urlsplit(server_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._server_url = server_url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.url = ""

    def __enter__(self) -> StoreLink:
        self._thread.start()
        self._call(self._listen())
        return self

    def __exit__(self, *_exc: object) -> None:
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def cut(self) -> None:
        """Drop every connection and refuse new ones."""
        self._call(self._drop())

    def mend(self) -> None:
        self._cut = False

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        self.cut()
        try:
            yield
        finally:
            self.mend()

    def _call(self, coroutine: object) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        parts = urlsplit(self._server_url)
        netloc = f"{parts.username or 'postgres'}@127.0.0.1:{port}"
        self.url = urlunsplit(parts._replace(netloc=netloc, query="sslmode=disable"))

    async def _drop(self) -> None:
        self._cut = True
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _close(self) -> None:
        await self._drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
        self._writers.discard(writer)
