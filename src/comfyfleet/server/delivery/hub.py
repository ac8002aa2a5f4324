"""The WebSocket hub: sockets by client id, each with its own bounded send queue.

Events are addressed to a client id, never to a server-wide "current client".
A slow socket never slows the others: each has its own queue and writer task,
and one that falls too far behind is closed.

A prompt makes a dozen small frames in quick succession, so each writer
sends what has queued up as one batch of complete frames in a single write to
the connection (compression is off for these sockets), instead of one system
call per frame. Writes are paced by a token bucket: a quiet socket writes at
once (a prompt's done signal is never held back), a busy one at most
WRITE_RATE times a second, its frames gathered into fewer, larger writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from aiohttp import web

from comfyfleet.engine.events import PreviewImage, ProgressText
from comfyfleet.protocol import frames, json_text, wsframe
from comfyfleet.server.delivery.pacing import TokenBucket

log = logging.getLogger(__name__)

MAX_BACKLOG = 10_000
#: Bytes waiting in the connection's buffer before the writer pauses.
HIGH_WATER = 1 << 20
#: Writes per second a busy socket settles to (each write costs a system call) ...
WRITE_RATE = 200.0
#: ... after a burst of this many immediate writes.
WRITE_BURST = 4.0


class ClientSocket:
    def __init__(
        self, sid: str, ws: web.WebSocketResponse, transport: asyncio.Transport | None
    ) -> None:
        self.sid = sid
        self.ws = ws
        self._transport = transport
        self.supports_preview_metadata = False
        # Prompts this socket subscribed to: their frames come from the event log.
        self.following: set[str] = set()
        self._queue: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._dropped = False
        self._writer = asyncio.create_task(self._write(), name=f"ws-writer-{sid}")

    @property
    def backlog(self) -> int:
        """Frames queued and not written yet."""
        return self._queue.qsize()

    @property
    def dropped(self) -> bool:
        """Given up on for falling behind (see `drop`)."""
        return self._dropped

    def send(self, payload: str | bytes) -> None:
        if self._dropped:
            return
        if self._queue.qsize() >= MAX_BACKLOG:
            log.warning("dropping a websocket that fell behind", extra={"sid": self.sid})
            self.drop()
            return
        self._queue.put_nowait(payload)

    def drop(self) -> None:
        """Give up on a peer that stopped reading: a graceful close would wait behind the
        frames it never reads (and keep them in memory), so abort the connection and free
        the backlog. The reader side then ends and detaches the socket."""
        self._dropped = True
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(None)
        if self._transport is not None:
            self._transport.abort()

    def send_json(self, event: str, data: Any) -> None:
        self.send(json_text.dumps({"type": event, "data": data}))

    def close(self) -> None:
        self._queue.put_nowait(None)

    async def _write(self) -> None:
        bucket = TokenBucket(WRITE_RATE, WRITE_BURST)
        try:
            while (batch := await self._next_batch(bucket.wait)) is not None:
                transport = self._transport
                if transport is None or transport.is_closing():
                    break
                transport.write(b"".join(wsframe.encode(p) for p in batch))
                bucket.take()
                while transport.get_write_buffer_size() > HIGH_WATER:
                    if transport.is_closing():
                        return
                    await asyncio.sleep(0.01)
        except (ConnectionError, RuntimeError):
            pass  # the peer went away; the reader side cleans up
        finally:
            if not self.ws.closed:
                await self.ws.close()

    async def _next_batch(self, hold: Callable[[], float]) -> list[str | bytes] | None:
        """Everything queued so far (at least one payload), waiting `hold()` seconds first
        while the socket is out of write tokens; None once closed."""
        first = await self._queue.get()
        if first is None:
            return None
        if (wait := hold()) > 0:
            await asyncio.sleep(wait)  # let the frames of this busy moment join one write
        batch = [first]
        while not self._queue.empty():
            payload = self._queue.get_nowait()
            if payload is None:
                self._queue.put_nowait(None)  # send this batch, then stop
                break
            batch.append(payload)
        return batch

    async def drain_and_stop(self) -> None:
        self.close()
        await asyncio.gather(self._writer, return_exceptions=True)


class Hub:
    def __init__(self) -> None:
        self._clients: dict[str, set[ClientSocket]] = defaultdict(set)
        #: Sockets dropped for falling behind, since start (read by metrics).
        self.dropped = 0

    def attach(self, sock: ClientSocket) -> None:
        self._clients[sock.sid].add(sock)

    def detach(self, sock: ClientSocket) -> None:
        if sock.dropped:
            self.dropped += 1
        sockets = self._clients.get(sock.sid)
        if sockets is not None:
            sockets.discard(sock)
            if not sockets:
                del self._clients[sock.sid]

    def connected(self, client_id: str) -> bool:
        return client_id in self._clients

    def count(self) -> int:
        return sum(len(s) for s in self._clients.values())

    def send_json(
        self, client_id: str, event: str, data: Any, *, prompt_id: str | None = None
    ) -> None:
        """To the client's sockets; a frame of `prompt_id` skips those that subscribed to
        it (they get it from the event log)."""
        sockets = self._clients.get(client_id)
        if sockets:
            message = json_text.dumps({"type": event, "data": data})
            for sock in sockets:
                if prompt_id is None or prompt_id not in sock.following:
                    sock.send(message)

    def broadcast_json(self, event: str, data: Any) -> None:
        message = json_text.dumps({"type": event, "data": data})
        for sockets in self._clients.values():
            for sock in sockets:
                sock.send(message)

    def send_preview(
        self, client_id: str, preview: PreviewImage, *, metadata: bool, prompt_id: str
    ) -> None:
        """Code 4 to the client's sockets that announced `supports_preview_metadata`
        (`metadata=True`), or code 1 to its other sockets (`metadata=False`); not to
        those that subscribed to `prompt_id` (they get it from the event log)."""
        frame = None
        for sock in self._clients.get(client_id, ()):
            if sock.supports_preview_metadata != metadata or prompt_id in sock.following:
                continue
            if frame is None:
                frame = (
                    frames.preview_with_metadata(preview.metadata(), preview.data)
                    if metadata
                    else frames.preview_image(preview.format, preview.data)
                )
            sock.send(frame)

    def send_text(self, client_id: str, text: ProgressText, *, prompt_id: str) -> None:
        sockets = self._clients.get(client_id)
        if sockets:
            frame = frames.text(text.node_id, text.text)
            for sock in sockets:
                if prompt_id not in sock.following:
                    sock.send(frame)

    async def close_all(self) -> None:
        sockets = [s for group in self._clients.values() for s in group]
        await asyncio.gather(*(s.drain_and_stop() for s in sockets), return_exceptions=True)
