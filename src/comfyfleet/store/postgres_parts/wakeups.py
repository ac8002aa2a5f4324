"""Wake-ups shared by the gateways of one database: LISTEN/NOTIFY on a connection of
its own, and a catch-up read after that connection was lost."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import asyncpg

from comfyfleet.domain.jobs import DispatchKey
from comfyfleet.domain.prompt_events import EventsAppended
from comfyfleet.store.base import StoreError, WorkWake
from comfyfleet.store.event_wakeups import EventsWake
from comfyfleet.store.postgres_parts import event_log_sql as event_log
from comfyfleet.store.postgres_parts.access import PostgresAccess, quoted
from comfyfleet.store.postgres_parts.listener import Listener
from comfyfleet.store.postgres_text import from_db

log = logging.getLogger(__name__)

#: Where wake-ups go (LISTEN/NOTIFY); the payload is the gateway that made the work,
#: then the job's place in the queue when one job became claimable (see parse_work).
WORK_CHANNEL = "comfyfleet_work"

#: How the listening connection names itself (pg_stat_activity.application_name).
LISTENER_NAME = "comfyfleet-listener"
#: Prompts woken one by one after the listener lost its connection; with more, every
#: follower reads the log again.
CATCH_UP_MAX = 10_000


class PostgresWakeups(PostgresAccess):
    """Work and event wake-ups, fanned out to this gateway's watchers."""

    _schema: str | None
    _connect_timeout: float
    _listener: Listener
    _wakes: list[WorkWake]
    _event_wakes: list[EventsWake]

    async def watch_work(self, wake: WorkWake) -> None:
        """LISTEN on a connection of its own (outside the pool); every gateway's wake-ups
        come through it, this one's own included."""
        self._wakes.append(wake)
        self._db()
        with self._wrapped("cannot listen for work"):
            await self._listener.listen(WORK_CHANNEL, self._work_notified)

    def _work_notified(self, payload: str) -> None:
        owner, key = parse_work(payload)
        for wake in self._wakes:
            wake(owner, key)

    async def _listening_connection(self) -> Any:
        # Named with its gateway, so an operator can tell whose it is.
        settings = {"application_name": f"{LISTENER_NAME} {self.owner}"[:63]}
        if self._schema is not None:
            settings["search_path"] = quoted(self._schema)
        return await asyncpg.connect(
            self._url, timeout=self._connect_timeout, server_settings=settings
        )

    async def _catch_up(self, since: float) -> None:
        """After the listener lost its connection: wake-ups for what may have been missed."""
        if self._wakes:
            self._work_notified("")  # no gateway's own: idle slots look at the queue
        if not self._event_wakes:
            return
        try:
            found = await self._run(lambda db: event_log.appended_since(db, since, CATCH_UP_MAX))
        except StoreError as exc:
            log.warning("cannot read what was appended while not listening: %s", exc)
            found = None
        if found is None or len(found) >= CATCH_UP_MAX:
            found = [EventsAppended(None, None, ours=False)]
        for woken in found:
            for wake in self._event_wakes:
                wake(woken)


def parse_work(payload: str) -> tuple[str, DispatchKey | None]:
    """A work wake-up's payload (made by comfyfleet_work_payload, migration 11): `OWNER`
    (a gateway id has no space), or `OWNER FRONT ORDER_KEY SEQ` naming one job's
    `dispatch_key` (FRONT 0 for a front job, else 1). A place that does not parse is
    unknown: the wake-up still counts."""
    owner, _, place = payload.partition(" ")
    parts = place.split(" ")
    key: DispatchKey | None = None
    if len(parts) == 3:
        with contextlib.suppress(ValueError):
            key = (int(parts[0]), float(parts[1]), int(parts[2]))
    return from_db(owner), key
