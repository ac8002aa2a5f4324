"""The prompt event log of the PostgreSQL store (see `base.PromptEventLog`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from comfyfleet.domain.prompt_events import NewPromptEvent, PromptEvent
from comfyfleet.store.event_wakeups import EventsWake
from comfyfleet.store.postgres_parts import event_log_sql as event_log
from comfyfleet.store.postgres_parts.access import PostgresAccess
from comfyfleet.store.postgres_parts.listener import Listener

log = logging.getLogger(__name__)

#: Where event log appends are announced (see event_log_sql.parse_wakeup).
EVENTS_CHANNEL = "comfyfleet_events"


class PostgresEventLog(PostgresAccess):
    """Every prompt's events, in order, for clients that reconnect, announced to
    every gateway."""

    _listener: Listener
    _event_wakes: list[EventsWake]

    async def append_prompt_events(self, events: Sequence[NewPromptEvent]) -> list[PromptEvent]:
        """Commit these events in one statement (one transaction)."""
        if not events:
            return []
        now = self._clock()
        return await self._run(lambda db: event_log.append(db, events, now, self._instance))

    async def watch_events(self, wake: EventsWake) -> None:
        """LISTEN (on the connection that listens for work) for every gateway's appends."""
        self._event_wakes.append(wake)
        self._db()
        with self._wrapped("cannot listen for events"):
            await self._listener.listen(EVENTS_CHANNEL, self._events_notified)

    def _events_notified(self, payload: str) -> None:
        woken = event_log.parse_wakeup(payload, self._instance)
        if woken is None:
            log.warning("ignored a malformed wake-up on %s", EVENTS_CHANNEL)
            return
        for wake in self._event_wakes:
            wake(woken)

    async def prompt_events(
        self, prompt_id: str, after: int = 0, limit: int = 500
    ) -> list[PromptEvent]:
        return await self._run(lambda db: event_log.after(db, prompt_id, after, max(0, limit)))

    async def prune_prompt_events(self, ended_before: float) -> int:
        return await self._run(lambda db: event_log.prune(db, ended_before))
