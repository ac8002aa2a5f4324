"""The streams of one tunnel: binary WebSocket messages of a 5-byte header (kind, stream
id) and up to CHUNK bytes of payload.

OPEN asks the worker's end for a stream (only the gateway's end sends it), DATA carries
bytes either way, CLOSE ends a stream (either way; a stream is closed whole, which is
all HTTP and WebSocket connections need), CREDIT (a 4-byte count) lets the other end
send that many more bytes on a stream.

Each end may have at most WINDOW bytes of a stream on their way or waiting to be
written at the other end: a reader that does not read (a client taking a large output
slowly) stops its own stream only, never the tunnel, and each stream's buffer is
bounded. What arrives is untrusted: an unknown kind, a payload past CHUNK, bytes past
a stream's window, credit past it, a stream past MAX_STREAMS or an OPEN the gateway
sent to itself ends the tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from comfyfleet.errors import ComfyfleetError

log = logging.getLogger(__name__)

OPEN, DATA, CLOSE, CREDIT = 1, 2, 3, 4
HEADER = struct.Struct("!BI")
COUNT = struct.Struct("!I")
CHUNK = 64 * 1024  # bytes read from a socket, and sent, at a time
#: The WebSocket's message limit: above the largest message (aiohttp refuses a message
#: as long as its limit, not only a longer one).
MAX_MESSAGE = HEADER.size + CHUNK + 1
MAX_STREAMS = 256  # open at once on one tunnel
#: Bytes of one stream in flight or unwritten at the other end: 1 MiB keeps a stream at
#: about 10 MB/s over a 100 ms round trip, and a tunnel's buffers under 256 MiB.
WINDOW = 1024 * 1024
#: Received bytes are credited back once this many are written out: fewer messages,
#: and a sender that used its whole window always gets credit back.
CREDIT_AT = WINDOW // 4


class TunnelBroken(ComfyfleetError):
    """The other end sent what this protocol does not allow."""


def frame(kind: int, stream: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, stream) + payload


Send = Callable[[bytes], Awaitable[None]]
Opener = Callable[[int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None]]


@dataclass
class _Stream:
    writer: asyncio.StreamWriter
    window: int = WINDOW  # bytes this end may still send
    can_send: asyncio.Event = field(default_factory=asyncio.Event)
    unacked: int = 0  # bytes received and not yet credited back
    pump: asyncio.Task[None] | None = None
    crediting: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.can_send.set()


class Mux:
    """Both ends' streams. `send` writes one message to the WebSocket; `opener` (the
    worker's end only) connects a stream the gateway asks for, or returns None."""

    def __init__(self, send: Send, opener: Opener | None = None) -> None:
        self._send = send
        self._opener = opener
        self._streams: dict[int, _Stream] = {}
        self._next = 1
        self.closed = False

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def unwritten(self) -> int:
        """Bytes received for local readers that have yet to take them (at most WINDOW a
        stream, with the socket's own buffer)."""
        return sum(s.writer.transport.get_write_buffer_size() for s in self._streams.values())

    async def open(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A local connection (the gateway's end) becomes a new stream."""
        if self.closed or len(self._streams) >= MAX_STREAMS:
            writer.close()
            return
        stream, self._next = self._next, self._next + 1
        self._attach(stream, reader, writer)
        await self._send(frame(OPEN, stream))

    def _attach(
        self, stream: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        state = self._streams[stream] = _Stream(writer)
        state.pump = asyncio.create_task(self._pump(stream, state, reader), name=f"tunnel-{stream}")

    async def _pump(self, stream: int, state: _Stream, reader: asyncio.StreamReader) -> None:
        """Local bytes out through the tunnel, as far as the other end's credit goes,
        until the local side closes."""
        try:
            while True:
                await state.can_send.wait()
                chunk = await reader.read(min(CHUNK, state.window))
                if not chunk:
                    break
                state.window -= len(chunk)
                if state.window == 0:
                    state.can_send.clear()
                await self._send(frame(DATA, stream, chunk))
        except (ConnectionError, OSError):
            pass
        finally:
            if self._streams.get(stream) is state:  # ended here, not by the other's CLOSE
                self._drop(stream)
                with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                    await self._send(frame(CLOSE, stream))

    async def feed(self, message: bytes) -> None:
        """One message from the other end. It never waits on one stream's reader."""
        if len(message) < HEADER.size or len(message) > HEADER.size + CHUNK:
            raise TunnelBroken(f"a message of {len(message)} bytes")
        kind, stream = HEADER.unpack_from(message)
        payload = message[HEADER.size :]
        if kind == OPEN:
            await self._opened(stream)
            return
        state = self._streams.get(stream)
        if kind == DATA:
            if state is not None:  # else closed here meanwhile: its CLOSE is on its way
                self._write(stream, state, payload)
        elif kind == CREDIT:
            if len(payload) != COUNT.size:
                raise TunnelBroken("a credit that is not 4 bytes")
            if state is not None:
                state.window += COUNT.unpack(payload)[0]
                if state.window > WINDOW:
                    raise TunnelBroken(f"credit past the window on stream {stream}")
                state.can_send.set()
        elif kind == CLOSE:
            self._close(stream)
        else:
            raise TunnelBroken(f"unknown message kind {kind}")

    def _write(self, stream: int, state: _Stream, payload: bytes) -> None:
        state.unacked += len(payload)
        if state.unacked > WINDOW:
            raise TunnelBroken(f"bytes past the window on stream {stream}")
        try:
            state.writer.write(payload)
        except (ConnectionError, OSError, RuntimeError):
            self._close(stream)
            return
        if state.unacked >= CREDIT_AT and state.crediting is None:
            state.crediting = asyncio.create_task(self._credit(stream, state))

    async def _credit(self, stream: int, state: _Stream) -> None:
        """Once what was written has gone out to the local socket, the other end may
        send as much again."""
        try:
            await state.writer.drain()
        except (ConnectionError, OSError, RuntimeError):
            state.crediting = None  # ended: not to be cancelled by the close below
            self._close(stream)
            return
        state.crediting = None
        count, state.unacked = state.unacked, 0
        if self._streams.get(stream) is state and count:
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                await self._send(frame(CREDIT, stream, COUNT.pack(count)))

    async def _opened(self, stream: int) -> None:
        if self._opener is None:
            raise TunnelBroken("the worker's end may not open streams")
        if stream in self._streams or len(self._streams) >= MAX_STREAMS:
            raise TunnelBroken(f"stream {stream} is open, or too many are")
        connected = await self._opener(stream)
        if connected is None:
            await self._send(frame(CLOSE, stream))
            return
        self._attach(stream, *connected)

    def _drop(self, stream: int) -> _Stream | None:
        state = self._streams.pop(stream, None)
        if state is not None:
            state.writer.close()
            if state.crediting is not None:
                state.crediting.cancel()
        return state

    def _close(self, stream: int) -> None:
        state = self._drop(stream)
        if state is not None and state.pump is not None:
            state.pump.cancel()

    async def close(self) -> None:
        """Every stream ends (its local connection is closed): the tunnel is gone."""
        self.closed = True
        tasks = [t for s in self._streams.values() for t in (s.pump, s.crediting) if t]
        for stream in list(self._streams):
            self._close(stream)
        await asyncio.gather(*tasks, return_exceptions=True)
