"""The prompt event log: every prompt's client stream, for followers to read back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from comfyfleet.domain.prompt_events import EventsAppended, NewPromptEvent, PromptEvent


class PromptEventLog(Protocol):
    """Each prompt's client stream, kept for followers that arrive late or come back.

    Ids grow with every append, store-wide, and are never reused. One appender at a time
    per prompt (the process running it), so a prompt's events are read back in the order
    they were appended and a reader resuming after an id misses none of them.
    """

    async def append_prompt_events(self, events: Sequence[NewPromptEvent]) -> list[PromptEvent]:
        """Commit these events in one transaction, in the order given; returns them with
        their ids (growing in that order) and the time they were appended."""

    async def prompt_events(
        self, prompt_id: str, after: int = 0, limit: int = 500
    ) -> list[PromptEvent]:
        """At most `limit` events of one prompt with an id above `after`, oldest first,
        binary frames included: a page ends early after the event whose frame brings its
        frame bytes to PAGE_FRAME_BYTES (prompt_events.more_after tells a full page)."""

    async def prune_prompt_events(self, ended_before: float) -> int:
        """Delete every event of each prompt whose newest event was appended before this
        time and whose job is not pending or running (gone jobs included); returns how
        many events went."""

    async def watch_events(self, wake: Callable[[EventsAppended], None]) -> None:
        """Call `wake` on the event loop once for each prompt of every committed append,
        by any process sharing the store: in-process with SQLite (after the commit), by
        LISTEN/NOTIFY with PostgreSQL (notified in the appending transaction). A listener
        that lost its connection reconnects, then wakes each prompt appended to since a
        little before the loss (and `EventsAppended(None, ...)` when there are too many):
        nothing committed goes unannounced."""
