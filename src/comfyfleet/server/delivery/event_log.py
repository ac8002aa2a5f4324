"""The durable log of every prompt's client stream, and the followers that read it.

An observer of the scheduler: each event a prompt's client gets (from `execution_start`
to its end event, then the done signal `executing {node: null}`) is appended to the
store, binary frames (previews, progress text) among them, thinned as log_frames.py
says. Appends are batched: one commit per FLUSH_INTERVAL at most, never one per event, and
only one at a time, so a prompt's ids grow in the order of its events.

A follower (a WebSocket subscription, an SSE stream) gets only committed events, each
with its id: first what the store holds after the id it starts from, then each batch
as it commits. It registers before it reads the store, so what commits meanwhile
comes both ways and is told apart by id: no gap, no duplicate. What a follower saw
survives a crash, and an id is never handed out twice.

A stream always ends with the done signal. When a prompt's job is over (or gone) but
its log has no done signal and no gateway will write one (the gateway died between
recording the end and writing the log, or the job was cancelled while queued), the
first follower to notice (SETTLE_AFTER seconds after the end at the earliest) appends
what is missing: the end event kept in the history, then the done signal.

The log grows by what happened, not by ComfyUI's frames: of `progress_state` it keeps
the entries that changed, and a follower gets the whole frames back (log_progress.py).

A prompt's log is capped (`max_prompt_bytes`, counting JSON and binary frames): past
it, what only shows progress is left out (`progress` frames, previews, progress text,
a running node's value updates); its results and ends, each node's start and finish
and the done signal are always kept, so its followers still see every result and its
progress_state stays whole, only coarser.

Followers are woken by this process's own commits, and by the store's wake-up for
the appends of other gateways (several gateways on one PostgreSQL: LISTEN/NOTIFY): a
woken follower reads the store after the last id it has. The store is never polled;
a quiet follower only asks, every CHECK_EVERY seconds, whether its job is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable

from comfyfleet.domain.jobs import TERMINAL, Job, JobResult
from comfyfleet.domain.prompt_events import (
    EventsAppended,
    NewPromptEvent,
    PromptEvent,
    more_after,
)
from comfyfleet.engine.events import EngineEvent, Message, NodeProgress, Restated
from comfyfleet.protocol import events
from comfyfleet.protocol.progress import ProgressState
from comfyfleet.scheduler.observers import JobObserver
from comfyfleet.server.delivery import log_frames
from comfyfleet.server.delivery.log_progress import PROGRESS, Attempt, ProgressFrames
from comfyfleet.store.base import JobStore, StoreError

log = logging.getLogger(__name__)

#: Seconds events wait to be written together: at most this many commits a second.
FLUSH_INTERVAL = 0.01
#: Events held while the store refuses them; beyond this, new ones are dropped (logged).
MAX_BUFFERED = 100_000
#: Bytes of events held while the store refuses them (the same).
MAX_BUFFERED_BYTES = 256 << 20
#: Events written in one commit at most (the rest in the next): what a commit costs
#: the loop (encoding its statement, handing its events on) stays bounded.
MAX_BATCH = 1_000
#: Events a follower reads from the store at once.
PAGE = 500
#: Committed events (and bytes of binary frames) queued for a follower that has not
#: taken them; beyond either, it reads them back from the store instead.
MAX_QUEUED = 1_000
MAX_QUEUED_BYTES = 16 << 20
#: Seconds a follower waits on a quiet prompt before asking whether its job is over
#: (not for its events: a wake-up brings those).
CHECK_EVERY = 2.0
#: Seconds after a job's end before a follower writes what its stream lacks: until
#: then, the gateway that ran it (this one or another) may still be writing its end.
SETTLE_AFTER = 5.0
#: Longest wait between writes while the store refuses them.
RETRY_MAX = 2.0
#: Bytes one prompt's log may take before what only shows progress is left out.
MAX_PROMPT_BYTES = 64 << 20


class _Listener:
    """The committed events of one prompt, for one follower."""

    def __init__(self) -> None:
        self.queue: deque[PromptEvent] = deque()
        self.queued_bytes = 0
        self.lagged = True  # read the store first (and again after an overflow)
        self.arrived = asyncio.Event()

    def wake(self) -> None:
        """Committed elsewhere: read the store."""
        self.lagged = True
        self.arrived.set()

    def put(self, event: PromptEvent) -> None:
        size = 0 if event.frame is None else len(event.frame)
        if len(self.queue) >= MAX_QUEUED or self.queued_bytes + size > MAX_QUEUED_BYTES:
            self.queue.clear()
            self.queued_bytes = 0
            self.lagged = True
        elif not self.lagged:
            self.queue.append(event)
            self.queued_bytes += size
        self.arrived.set()

    def take(self) -> PromptEvent:
        event = self.queue.popleft()
        self.queued_bytes -= 0 if event.frame is None else len(event.frame)
        return event


class EventLog(JobObserver):
    """Appends every prompt's client stream to the store; serves it to followers.

    `retention` is how long (seconds) a prompt's events are kept after its last one.
    """

    def __init__(
        self,
        store: JobStore,
        retention: float,
        *,
        max_prompt_bytes: int = MAX_PROMPT_BYTES,
        flush_interval: float = FLUSH_INTERVAL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.retention = retention
        self.max_prompt_bytes = max_prompt_bytes
        self._interval = flush_interval
        self._clock = clock
        self._buffer: list[NewPromptEvent] = []
        self._buffered_bytes = 0
        self._thinning = log_frames.PreviewThinning(self._append_all)
        self._flusher: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()  # one append at a time: a prompt's ids stay in order
        self._settling = asyncio.Lock()
        self._listeners: dict[str, set[_Listener]] = {}
        self._open: set[str] = set()  # prompts whose end this process may still write
        self._attempts: dict[str, Attempt] = {}  # by prompt id: those running here
        self._dropped = 0
        self._closed = False

    async def start(self) -> None:
        """Follow the appends of other gateways (the store's wake-ups)."""
        await self.store.watch_events(self._appended)

    def _appended(self, woken: EventsAppended) -> None:
        if woken.ours or self._closed:
            return  # this process's commits reach its followers as they commit
        if woken.prompt_id is None:  # any prompt may have been appended to
            for listeners in self._listeners.values():
                for listener in listeners:
                    listener.wake()
        else:
            for listener in self._listeners.get(woken.prompt_id, ()):
                listener.wake()

    # -- the scheduler's side ------------------------------------------------------------

    def job_started(self, job: Job) -> None:
        self._open.add(job.prompt_id)

    def job_event(self, job: Job, event: EngineEvent) -> None:
        if isinstance(event, Restated):
            return  # logged once already, before a restart
        self._open.add(job.prompt_id)
        attempt = self._attempts.get(job.prompt_id)
        if attempt is None:
            attempt = self._attempts[job.prompt_id] = Attempt(ProgressState(job.prompt_id))
        full = attempt.size > self.max_prompt_bytes
        logged: NewPromptEvent | None
        if isinstance(event, NodeProgress):
            if full and not attempt.shows_state(event):
                attempt.progress.change(event.node_id, event.entry)
                return
            logged = attempt.progress_event(event.node_id, event.entry)
        elif isinstance(event, Message):
            if full and event.type == "progress":
                return
            if event.type == PROGRESS:
                logged = attempt.whole_frame(event.data)
            else:
                logged = NewPromptEvent(job.prompt_id, event.type, event.data)
        else:
            node = job.prompt.get(event.node_id) if event.node_id else None
            kind = node.get("class_type") if isinstance(node, dict) else None
            output = kind in log_frames.OUTPUT_FRAME_NODES
            if full and not output:
                return
            logged = log_frames.to_log(job.prompt_id, event, output=output)
        if logged is not None:
            self._append_all(self._thinning.add(logged))

    def job_finished(self, job: Job, result: JobResult) -> None:
        self._append_all(self._thinning.end(job.prompt_id))
        # The done signal, as the WebSocket router sends it once the end is recorded.
        self._append(
            NewPromptEvent(job.prompt_id, "executing", events.executing(job.prompt_id, None))
        )
        self._open.discard(job.prompt_id)
        self._attempts.pop(job.prompt_id, None)

    def job_stopped(self, job: Job) -> None:
        self._append_all(self._thinning.end(job.prompt_id))
        self._open.discard(job.prompt_id)  # back in the queue: its next start opens it
        self._attempts.pop(job.prompt_id, None)

    def _append_all(self, logged: list[NewPromptEvent]) -> None:
        for event in logged:
            self._append(event)

    def _append(self, event: NewPromptEvent) -> None:
        if self._closed:
            return
        size = event.size
        attempt = self._attempts.get(event.prompt_id)
        if attempt is not None:
            attempt.size += size
        if len(self._buffer) >= MAX_BUFFERED or self._buffered_bytes + size > MAX_BUFFERED_BYTES:
            self._dropped += 1
            if self._dropped == 1:
                log.warning("the event log is full (the store refuses writes): dropping events")
            return
        self._buffer.append(event)
        self._buffered_bytes += size
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_soon(), name="event-log-flush")

    async def _flush_soon(self) -> None:
        delay = self._interval
        while self._buffer and not self._closed:
            await asyncio.sleep(delay)
            delay = self._interval if await self._write() else min(RETRY_MAX, delay * 2)

    async def _write(self) -> bool:
        """Append what is buffered (MAX_BATCH events at most) in one commit, then hand it
        to the followers; False (the events kept, in order) when the store refused."""
        async with self._writing:
            batch, self._buffer = self._buffer[:MAX_BATCH], self._buffer[MAX_BATCH:]
            if not batch:
                return True
            size = sum(event.size for event in batch)
            self._buffered_bytes -= size
            try:
                committed = await self.store.append_prompt_events(batch)
            except StoreError as exc:
                log.warning("could not write %d events (%s); retrying", len(batch), exc)
                self._buffer[:0] = batch
                self._buffered_bytes += size
                return False
            if self._dropped:
                log.warning("the event log dropped %d events", self._dropped)
                self._dropped = 0
        for event in committed:
            for listener in self._listeners.get(event.prompt_id, ()):
                listener.put(event)
        return True

    async def flush(self) -> None:
        """Commit everything appended so far (once the store takes it)."""
        while self._buffer:
            if not await self._write():
                await asyncio.sleep(self._interval)

    async def close(self) -> None:
        """Write what is buffered, then end every follower (they resume elsewhere, or
        after a restart, from the last id they got)."""
        self._append_all(self._thinning.end_all())
        try:
            await asyncio.wait_for(self.flush(), timeout=10)
        except TimeoutError:
            log.warning("%d events were not written at shutdown", len(self._buffer))
        self._closed = True
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        for listeners in self._listeners.values():
            for listener in listeners:
                listener.arrived.set()

    async def prune(self) -> int:
        """Delete the events of prompts that ended more than `retention` seconds ago."""
        return await self.store.prune_prompt_events(self._clock() - self.retention)

    # -- the followers' side -------------------------------------------------------------

    async def follow(self, prompt_id: str, after: int = 0) -> AsyncGenerator[PromptEvent, None]:
        """The prompt's committed events with an id above `after`, in order, as they
        commit; ends after the done signal (or at once when it came before `after`), or
        when the log closes. The caller checks the prompt is the follower's to see."""
        listener = _Listener()
        self._listeners.setdefault(prompt_id, set()).add(listener)
        try:
            progress = await self.progress_until(prompt_id, after)
            last = after
            check_at = 0.0  # ask at once whether the job is over, then when quiet
            while not self._closed:
                if listener.lagged:
                    listener.lagged = False
                    page = await self.store.prompt_events(prompt_id, last, PAGE)
                    listener.lagged = more_after(page, PAGE)
                elif listener.queue:
                    page = [listener.take()]
                else:
                    page = []
                for event in page:
                    if event.id > last:
                        yield progress.as_sent(event)
                        last = event.id
                        if event.done:
                            return
                if page or listener.lagged:
                    continue
                if time.monotonic() >= check_at:
                    check_at = time.monotonic() + CHECK_EVERY
                    done_id = await self._settle_if_over(prompt_id)
                    if done_id is not None and done_id <= last:
                        return  # the done signal came at or before `after`
                    if done_id is not None:
                        listener.lagged = True  # its end is in the log: read it
                if listener.lagged or listener.queue:
                    continue  # woken while asking
                listener.arrived.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CHECK_EVERY):  # never swallows a cancel
                        await listener.arrived.wait()
        finally:
            listeners = self._listeners.get(prompt_id)
            if listeners is not None:
                listeners.discard(listener)
                if not listeners:
                    del self._listeners[prompt_id]

    async def progress_until(self, prompt_id: str, last: int) -> ProgressFrames:
        """The prompt's progress as its log stands at event id `last` (a follower that
        resumes after `last` gets the next progress changes as whole frames)."""
        progress = ProgressFrames(prompt_id)
        after = 0
        while after < last:
            page = await self.store.prompt_events(prompt_id, after, PAGE)
            for event in page:
                if event.id > last:
                    return progress
                progress.apply(event)
            if not more_after(page, PAGE):
                break
            after = page[-1].id
        return progress

    async def ended_before(self, prompt_id: str, after: int) -> bool:
        """Whether the prompt's stream ended (its done signal) at or before id `after`."""
        done_id = await self._settle_if_over(prompt_id)
        return done_id is not None and done_id <= after

    async def _settle_if_over(self, prompt_id: str) -> int | None:
        """The id of the prompt's done signal once its job is over (appending what its
        stream lacks, see the module's doc); None while the job may still send events."""
        if prompt_id in self._open:
            return None
        job = await self.store.get(prompt_id)
        if job is not None and job.status not in TERMINAL:
            return None
        async with self._settling:
            await self.flush()
            logged = await self._all(prompt_id)
            done = next((e for e in logged if e.done), None)
            if done is not None:
                return done.id
            if prompt_id in self._open:  # cannot happen to a job that is over; cheap to ask
                return None
            if job is not None and (job.finished_at or 0) > self._clock() - SETTLE_AFTER:
                return None  # just ended: the gateway that ran it may still write its end
            missing = [] if job is None else await self._missing_end(prompt_id, logged)
            missing.append(
                NewPromptEvent(prompt_id, "executing", events.executing(prompt_id, None))
            )
            self._buffer.extend(missing)
            await self.flush()
            logged = await self._all(prompt_id)
            return next((e.id for e in logged if e.done), None)

    async def _missing_end(self, prompt_id: str, logged: list[PromptEvent]) -> list[NewPromptEvent]:
        """The end event kept in the history, when the log lacks one."""
        if any(e.type in events.END_EVENTS for e in logged):
            return []
        entry = await self.store.history_entry(prompt_id)
        for kind, data in reversed(entry.result.messages if entry else []):
            if kind in events.END_EVENTS and isinstance(data, dict):
                return [NewPromptEvent(prompt_id, str(kind), data)]
        return []

    async def _all(self, prompt_id: str) -> list[PromptEvent]:
        found: list[PromptEvent] = []
        while True:
            page = await self.store.prompt_events(prompt_id, found[-1].id if found else 0, PAGE)
            found += page
            if not more_after(page, PAGE):
                return found
