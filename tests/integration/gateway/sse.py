"""A Server-Sent Events reader for tests: events as they arrive, comments counted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import aiohttp


@dataclass(frozen=True)
class SseEvent:
    id: int
    event: str
    data: Any

    @property
    def done(self) -> bool:
        return self.event == "executing" and self.data.get("node") is None


@dataclass
class SseReader:
    """Reads one `text/event-stream` response; `comments` counts keep-alive lines."""

    response: aiohttp.ClientResponse
    comments: int = 0
    _fields: dict[str, str] = field(default_factory=dict)

    async def events(self) -> AsyncIterator[SseEvent]:
        async for raw in self.response.content:
            line = raw.decode("utf-8").rstrip("\r\n")
            if line.startswith(":"):
                self.comments += 1
            elif line:
                name, _, value = line.partition(":")
                self._fields[name] = value.removeprefix(" ")
            elif self._fields:
                fields, self._fields = self._fields, {}
                yield SseEvent(int(fields["id"]), fields["event"], json.loads(fields["data"]))

    async def until_done(self) -> list[SseEvent]:
        """Every event up to the done signal (the stream ends there)."""
        found = []
        async for event in self.events():
            found.append(event)
        assert found and found[-1].done, [e.event for e in found][-5:]
        return found


def assert_strictly_increasing(events: list[SseEvent]) -> None:
    ids = [e.id for e in events]
    assert all(a < b for a, b in pairwise(ids)), ids
