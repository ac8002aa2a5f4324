"""The prompt event log of the SQLite store (see `base.PromptEventLog`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from comfyfleet.domain.prompt_events import NewPromptEvent, PromptEvent
from comfyfleet.store import event_wakeups
from comfyfleet.store.event_wakeups import EventsWake
from comfyfleet.store.sqlite_parts import event_log_sql as event_log
from comfyfleet.store.sqlite_parts.access import SQLiteAccess


class SQLiteEventLog(SQLiteAccess):
    """Every prompt's events, in order, for clients that reconnect."""

    _event_wakes: list[EventsWake]

    async def append_prompt_events(self, events: Sequence[NewPromptEvent]) -> list[PromptEvent]:
        """Commit these events in one transaction (with whatever else the writer holds)."""
        if not events:
            return []
        now = self._clock()
        op = functools.partial(event_log.append, rows=event_log.encode(events), now=now)
        ids, prompts = await self._write(op)
        if self._event_wakes:
            for woken in event_wakeups.appended(prompts):
                for wake in self._event_wakes:
                    wake(woken)
        return [
            PromptEvent(i, e.prompt_id, e.type, e.data, now, e.frame) for i, e in zip(ids, events)
        ]

    async def watch_events(self, wake: EventsWake) -> None:
        """In-process: one SQLite file has one gateway, so every append is this one's."""
        self._event_wakes.append(wake)

    async def prompt_events(
        self, prompt_id: str, after: int = 0, limit: int = 500
    ) -> list[PromptEvent]:
        op = functools.partial(
            event_log.after, prompt_id=prompt_id, after_id=after, limit=max(0, limit)
        )
        return await self._read(op)

    async def prune_prompt_events(self, ended_before: float) -> int:
        return await self._write(functools.partial(event_log.prune, before=ended_before))
