"""A prompt's client stream as the event log keeps it: each event gets an id that only
grows, which followers resume after (the SSE `id:`).

A JSON frame is kept as its type and data. A binary frame (a preview image, progress
text) is kept with its bytes in `frame` and a small JSON header in `data` (see
server/log_frames.py); `frame` is None for every JSON frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from comfyfleet.protocol import json_text

#: ComfyUI's done signal is `executing` with node None: the last event of a stream.
DONE_TYPE = "executing"
#: A logged `progress_state` whose data holds only the entries that changed (the log
#: keeps changes, not ComfyUI's whole frames: see server/event_log.py).
PROGRESS_CHANGES = "changes"
#: A page read from the log ends after the event whose frame brings the page's frame
#: bytes to this many or more (a page of previews stays a few MiB, whatever its limit).
PAGE_FRAME_BYTES = 8 << 20


def is_done(event_type: str, data: dict[str, Any]) -> bool:
    return event_type == DONE_TYPE and data.get("node") is None


@dataclass(frozen=True)
class NewPromptEvent:
    """An event of `prompt_id`'s stream, about to be appended."""

    prompt_id: str
    type: str
    data: dict[str, Any]
    frame: bytes | None = None

    @cached_property
    def json(self) -> str:
        """`data` as compact JSON, encoded once: the log counts its size, the store
        writes it."""
        return json_text.dumps(self.data)

    @property
    def size(self) -> int:
        """Roughly the bytes it takes in the log."""
        return len(self.json) + (0 if self.frame is None else len(self.frame))


@dataclass(frozen=True)
class PromptEvent:
    """An appended event: `id` grows with every append, store-wide; `at` is when it was
    appended (Unix seconds)."""

    id: int
    prompt_id: str
    type: str
    data: dict[str, Any]
    at: float
    frame: bytes | None = None

    @property
    def done(self) -> bool:
        return self.frame is None and is_done(self.type, self.data)


def frame_bytes(events: Sequence[PromptEvent]) -> int:
    return sum(len(e.frame) for e in events if e.frame is not None)


def more_after(page: Sequence[PromptEvent], limit: int) -> bool:
    """Whether a page read with `limit` may have stopped short of the log's end (it is
    full, or its frames reached PAGE_FRAME_BYTES)."""
    return bool(page) and (len(page) >= limit or frame_bytes(page) >= PAGE_FRAME_BYTES)


@dataclass(frozen=True)
class EventsAppended:
    """A wake-up from the store: events of a prompt were committed to the log.

    `prompt_id` None means "any prompt": events may have been appended that no wake-up
    named (a listener that lost its connection), so every follower reads the log again.
    `client` is the `client_digest` of the prompt's client (None: it has none, or the
    job is unknown). `ours`: this process appended them (its followers already have them).
    """

    prompt_id: str | None
    client: str | None
    ours: bool
