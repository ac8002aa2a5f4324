"""The streams of one tunnel: binary WebSocket messages of a 5-byte header (kind, stream
id) and up to CHUNK bytes of payload.

OPEN asks the worker's end for a stream (only the gateway's end sends it), DATA carries
bytes either way, CLOSE ends a stream (either way; a stream is closed whole, which is
all HTTP and WebSocket connections need). What arrives is untrusted: an unknown kind, a
payload past CHUNK, a stream past MAX_STREAMS or an OPEN the gateway sent to itself
ends the tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable

from comfyfleet.errors import ComfyfleetError

log = logging.getLogger(__name__)

OPEN, DATA, CLOSE = 1, 2, 3
HEADER = struct.Struct("!BI")
CHUNK = 64 * 1024  # bytes read from a socket, and sent, at a time
#: The WebSocket's message limit: above the largest message (aiohttp refuses a message
#: as long as its limit, not only a longer one).
MAX_MESSAGE = HEADER.size + CHUNK + 1
MAX_STREAMS = 256  # open at once on one tunnel


class TunnelBroken(ComfyfleetError):
    """The other end sent what this protocol does not allow."""


def frame(kind: int, stream: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, stream) + payload


Send = Callable[[bytes], Awaitable[None]]
Opener = Callable[[int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None]]


class Mux:
    """Both ends' streams. `send` writes one message to the WebSocket; `opener` (the
    worker's end only) connects a stream the gateway asks for, or returns None."""

    def __init__(self, send: Send, opener: Opener | None = None) -> None:
        self._send = send
        self._opener = opener
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._pumps: dict[int, asyncio.Task[None]] = {}
        self._next = 1
        self.closed = False

    @property
    def open_streams(self) -> int:
        return len(self._writers)

    async def open(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A local connection (the gateway's end) becomes a new stream."""
        if self.closed or len(self._writers) >= MAX_STREAMS:
            writer.close()
            return
        stream, self._next = self._next, self._next + 1
        self._attach(stream, reader, writer)
        await self._send(frame(OPEN, stream))

    def _attach(
        self, stream: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._writers[stream] = writer
        self._pumps[stream] = asyncio.create_task(
            self._pump(stream, reader), name=f"tunnel-{stream}"
        )

    async def _pump(self, stream: int, reader: asyncio.StreamReader) -> None:
        """Local bytes out through the tunnel until the local side closes."""
        try:
            while chunk := await reader.read(CHUNK):
                await self._send(frame(DATA, stream, chunk))
        except (ConnectionError, OSError):
            pass
        finally:
            self._pumps.pop(stream, None)
            writer = self._writers.pop(stream, None)
            if writer is not None:  # ended here, not by the other end's CLOSE
                writer.close()
                with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                    await self._send(frame(CLOSE, stream))

    async def feed(self, message: bytes) -> None:
        """One message from the other end."""
        if len(message) < HEADER.size or len(message) > HEADER.size + CHUNK:
            raise TunnelBroken(f"a message of {len(message)} bytes")
        kind, stream = HEADER.unpack_from(message)
        payload = message[HEADER.size :]
        if kind == OPEN:
            await self._opened(stream)
        elif kind == DATA:
            writer = self._writers.get(stream)
            if writer is None:
                return  # closed here meanwhile: the other end's CLOSE is on its way
            try:
                writer.write(payload)
                # Loopback sockets drain at once; a slow one holds the tunnel back
                # rather than growing a buffer without bound.
                await writer.drain()
            except (ConnectionError, OSError):
                self._close(stream)
        elif kind == CLOSE:
            self._close(stream)
        else:
            raise TunnelBroken(f"unknown message kind {kind}")

    async def _opened(self, stream: int) -> None:
        if self._opener is None:
            raise TunnelBroken("the worker's end may not open streams")
        if stream in self._writers or len(self._writers) >= MAX_STREAMS:
            raise TunnelBroken(f"stream {stream} is open, or too many are")
        connected = await self._opener(stream)
        if connected is None:
            await self._send(frame(CLOSE, stream))
            return
        self._attach(stream, *connected)

    def _close(self, stream: int) -> None:
        writer = self._writers.pop(stream, None)
        if writer is not None:
            writer.close()
        pump = self._pumps.pop(stream, None)
        if pump is not None:
            pump.cancel()

    async def close(self) -> None:
        """Every stream ends (its local connection is closed): the tunnel is gone."""
        self.closed = True
        for stream in list(self._writers):
            self._close(stream)
        pumps = list(self._pumps.values())
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
