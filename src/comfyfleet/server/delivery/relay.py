"""The frames of prompts other gateways run, for this gateway's clients.

Several gateways share one PostgreSQL store: a prompt runs on one of them, and its
client's WebSocket may be on any. The gateway that runs a prompt sends its frames to
the sockets it holds (client_events.ClientRouter); another gateway that holds a socket
of the prompt's client relays them from the event log, the source of truth:

- A wake-up from the store (another process committed events of a prompt) that names
  the digest of a client connected here starts a relay, once the job confirms the
  client: it follows the prompt's log from its first event and hands each frame (JSON,
  and binary: previews and progress text, as the log keeps them, see log_frames.py) to
  the router, in the log's order, each once, until the done signal. Before the done
  signal the queue is counted again from the store and announced (`status`), as the
  gateway that ran the prompt does.
- A client that connects (or reconnects) gets, after this gateway's own catch-up, the
  latest `executing` and `progress_state` of its prompts running elsewhere, read from
  the log, then their frames from there on. A relay keeps running while its client is
  away (until its prompt's done signal), so the router's catch-up covers it then.
- A prompt this gateway starts is its own from then on: its router sends the frames,
  and a relay of it stops. One that goes back to the queue from here is relayed again,
  once another gateway runs it, after the last event this gateway logged for it.

"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable

from comfyfleet.domain.jobs import Job, JobStatus
from comfyfleet.domain.prompt_events import EventsAppended
from comfyfleet.engine.events import Message
from comfyfleet.scheduler.observers import JobObserver
from comfyfleet.server.delivery import log_frames
from comfyfleet.server.delivery.client_events import ClientRouter, client_key
from comfyfleet.server.delivery.event_log import PAGE, EventLog
from comfyfleet.store.base import JobStore, StoreError
from comfyfleet.store.event_wakeups import client_digest

log = logging.getLogger(__name__)

#: Prompts remembered as this gateway's own, or as relayed to their end.
REMEMBERED = 50_000
#: Running jobs of one client looked at when it connects.
MAX_RUNNING = 1_000


class _Recent:
    """A bounded set that forgets its oldest members."""

    def __init__(self, size: int = REMEMBERED) -> None:
        self._items: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def add(self, item: str) -> None:
        self._items[item] = None
        self._items.move_to_end(item)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def discard(self, item: str) -> None:
        self._items.pop(item, None)

    def __contains__(self, item: str) -> bool:
        return item in self._items


class ClientRelay(JobObserver):
    """Relays other gateways' prompts to this gateway's clients (see the module's doc).

    `recount` reads the queue's size from the store and announces it (the scheduler's
    recount, then the router's status frame)."""

    def __init__(
        self,
        store: JobStore,
        events: EventLog,
        router: ClientRouter,
        recount: Callable[[], Awaitable[None]],
    ) -> None:
        self.store = store
        self.events = events
        self.router = router
        self._recount = recount
        self._clients: dict[str, dict[str, int]] = defaultdict(dict)  # digest: key: sockets
        self._relays: dict[str, asyncio.Task[None]] = {}
        self._local = _Recent()  # prompts this gateway ran: its router sent their frames
        self._ended = _Recent()  # prompts relayed to their done signal
        self._handed_back: dict[str, asyncio.Task[int]] = {}  # its last logged id here
        self._closed = False

    async def start(self) -> None:
        await self.store.watch_events(self._appended)

    async def close(self) -> None:
        self._closed = True
        tasks = [*self._relays.values(), *self._handed_back.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- this gateway's clients ----------------------------------------------------------

    async def connected(self, tenant: str, client_id: str) -> None:
        """A socket of this client connected: relay its prompts running elsewhere, from
        their current state."""
        key = client_key(tenant, client_id)
        sockets = self._clients[client_digest(tenant, client_id)]
        sockets[key] = sockets.get(key, 0) + 1
        try:
            running, _ = await self.store.jobs(
                statuses=[JobStatus.RUNNING], tenant=tenant, limit=MAX_RUNNING
            )
        except StoreError as exc:
            log.warning("cannot look up the prompts of a client that connected: %s", exc)
            return
        for job in reversed(running):  # oldest first
            if job.client_id == client_id and self._relayable(job.prompt_id):
                self._start(job, catch_up=True)

    def disconnected(self, tenant: str, client_id: str) -> None:
        digest = client_digest(tenant, client_id)
        sockets = self._clients.get(digest, {})
        key = client_key(tenant, client_id)
        if sockets.get(key, 0) > 1:
            sockets[key] -= 1
            return
        sockets.pop(key, None)
        if not sockets:
            self._clients.pop(digest, None)

    # -- what this gateway runs ----------------------------------------------------------

    def job_started(self, job: Job) -> None:
        self._local.add(job.prompt_id)
        self._ended.discard(job.prompt_id)
        handed_back = self._handed_back.pop(job.prompt_id, None)
        if handed_back is not None:
            handed_back.cancel()
        relay = self._relays.pop(job.prompt_id, None)
        if relay is not None:
            relay.cancel()  # what it still had to send, this gateway's router sends

    def job_stopped(self, job: Job) -> None:
        """Back in the queue: another gateway may run it next, after what was logged here."""
        if job.client_id and not self._closed and len(self._handed_back) < REMEMBERED:
            self._handed_back[job.prompt_id] = asyncio.create_task(
                self._last_logged(job.prompt_id), name=f"relay-handed-back-{job.prompt_id[:40]}"
            )

    async def _last_logged(self, prompt_id: str) -> int:
        await self.events.flush()
        last = 0
        while page := await self.store.prompt_events(prompt_id, last, PAGE):
            last = page[-1].id
        return last

    # -- other gateways' appends ---------------------------------------------------------

    def _appended(self, woken: EventsAppended) -> None:
        if woken.ours or woken.client is None or woken.prompt_id is None or self._closed:
            return
        keys = self._clients.get(woken.client)
        if keys and self._relayable(woken.prompt_id):
            self._relays[woken.prompt_id] = asyncio.create_task(
                self._confirm(woken.prompt_id, set(keys)), name="relay-confirm"
            )

    def _relayable(self, prompt_id: str) -> bool:
        if prompt_id in self._relays or prompt_id in self._ended:
            return False
        return prompt_id not in self._local or prompt_id in self._handed_back

    async def _confirm(self, prompt_id: str, keys: set[str]) -> None:
        """The digest matched a client here: relay once the job says it is that client's."""
        try:
            job = await self.store.get(prompt_id)
        except StoreError as exc:
            log.warning("cannot read job %s to relay its frames: %s", prompt_id, exc)
            job = None
        if self._relays.get(prompt_id) is asyncio.current_task():
            del self._relays[prompt_id]
        if job is None or not job.client_id or client_key(job.tenant, job.client_id) not in keys:
            return  # another client with the same digest: a later wake-up may ask again
        if self._relayable(prompt_id):
            self._start(job, catch_up=False)

    def _start(self, job: Job, *, catch_up: bool) -> None:
        self._relays[job.prompt_id] = asyncio.create_task(
            self._relay(job, catch_up), name=f"relay-{job.prompt_id[:40]}"
        )

    async def _relay(self, job: Job, catch_up: bool) -> None:
        prompt_id = job.prompt_id
        try:
            handed_back = self._handed_back.pop(prompt_id, None)
            after = 0 if handed_back is None else await handed_back
            if catch_up:
                after = await self._current_state(job, after)
            async for event in self.events.follow(prompt_id, after):
                if event.done:
                    self._ended.add(prompt_id)
                    await self._recount()  # the count, then the done signal, as its runner
                binary = log_frames.from_log(event)
                if binary is not None:
                    self.router.relayed(job, binary)
                elif event.frame is None:
                    self.router.relayed(job, Message(event.type, event.data))
        except StoreError as exc:
            log.warning("stopped relaying %s: %s", prompt_id, exc)
        finally:
            if self._relays.get(prompt_id) is asyncio.current_task():
                del self._relays[prompt_id]

    async def _current_state(self, job: Job, after: int) -> int:
        """Send the latest `executing` and `progress_state` logged after `after` (what the
        router's catch-up gives for its own prompts); the last id read. Not when the
        log has the done signal already: the prompt is over, and its end is read next."""
        progress = await self.events.progress_until(job.prompt_id, after)
        executing: dict[str, object] | None = None
        progressed = False
        last = after
        while page := await self.store.prompt_events(job.prompt_id, last, PAGE):
            for event in page:
                if event.done:
                    return after
                if progress.apply(event):
                    progressed = True
                elif event.frame is None and event.type == "executing":
                    executing = event.data
            last = page[-1].id
        if executing is not None:
            self.router.relayed(job, Message("executing", executing))
        if progressed:
            self.router.relayed(job, Message("progress_state", progress.state.frame()))
        return last
