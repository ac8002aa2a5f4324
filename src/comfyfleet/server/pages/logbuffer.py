"""The server's recent log lines, for the editor's terminal panel (`/internal/logs`).

A logging handler keeps the last lines as ComfyUI does (`{"t": ISO time, "m": line}`) and
sends new ones as `logs` frames to the clients that subscribed, on the event loop: records
come from any thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from datetime import datetime

from comfyfleet.server.delivery.hub import Hub

#: Lines kept (ComfyUI keeps 300).
CAPACITY = 300

#: Clients subscribed at once.
MAX_SUBSCRIBERS = 256

Entry = dict[str, str]


class LogBuffer(logging.Handler):
    def __init__(self, capacity: int = CAPACITY) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self._entries: deque[Entry] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fresh: list[Entry] = []
        self.on_entries: Callable[[list[Entry]], None] | None = None

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries)

    def attach(self, logger: logging.Logger | None = None) -> None:
        """Start keeping the records of `logger` (the root logger by default)."""
        self._loop = asyncio.get_running_loop()
        (logger or logging.getLogger()).addHandler(self)

    def detach(self, logger: logging.Logger | None = None) -> None:
        (logger or logging.getLogger()).removeHandler(self)
        self._loop = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        entry = {"t": datetime.fromtimestamp(record.created).isoformat(), "m": line}
        loop = self._loop if self.on_entries is not None else None
        with self._lock:
            self._entries.append(entry)
            if loop is None:
                return
            first = not self._fresh
            self._fresh.append(entry)
            del self._fresh[:-CAPACITY]  # a flood between two deliveries: the newest
        if first:
            try:  # one delivery for the lines of one busy moment
                loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the loop has closed
                with self._lock:
                    self._fresh.clear()

    def _deliver(self) -> None:
        with self._lock:
            fresh, self._fresh = self._fresh, []
        if fresh and self.on_entries is not None:
            self.on_entries(fresh)


class LogFeed:
    """Which clients get `logs` frames (by hub address), and sending them. A client whose
    sockets have all gone is dropped at the next lines."""

    def __init__(self, buffer: LogBuffer, hub: Hub) -> None:
        self._hub = hub
        self._size: Callable[[], dict[str, int]] = lambda: {"cols": 80, "rows": 24}
        self.subscribers: set[str] = set()
        buffer.on_entries = self._on_entries

    def sized_by(self, size: Callable[[], dict[str, int]]) -> None:
        self._size = size

    def subscribe(self, key: str, enabled: bool) -> None:
        if enabled and len(self.subscribers) < MAX_SUBSCRIBERS:
            self.subscribers.add(key)
        else:
            self.subscribers.discard(key)

    def _on_entries(self, entries: list[Entry]) -> None:
        if not self.subscribers:
            return
        data = {"entries": entries, "size": self._size()}
        for key in list(self.subscribers):
            if self._hub.connected(key):
                self._hub.send_json(key, "logs", data)
            else:
                self.subscribers.discard(key)
