"""Following one prompt on a ComfyUI backend: its frames relayed to the job's sink, a
hung or lost backend noticed, the prompt withdrawn or interrupted when asked, and its
result read from the backend's history (its output files copied here)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from comfyfleet.domain.jobs import Job, JobResult, JobStatus
from comfyfleet.engine.events import EngineEvent, EventSink, Message
from comfyfleet.lanes.backend import (
    BackendClient,
    BackendError,
    BackendLost,
    PromptWatch,
    Withdrawn,
)
from comfyfleet.lanes.base import LaneRun
from comfyfleet.lanes.endings import succeeded, unsafe_output_result
from comfyfleet.lanes.outputs import OutputCopier, OutputReferencer, UnsafeOutput, output_files
from comfyfleet.lanes.settings import HOLD_MARGIN, QUIET_ASK, LaneSettings
from comfyfleet.lanes.submits import Submits
from comfyfleet.protocol import events


class BackendHung(BackendError):
    """No frame for a running prompt within the hang timeout."""


@dataclass
class BackendState:
    """What the lane has learned of its backend that following a prompt depends on."""

    holds: bool = False  # a comfyfleet: it runs this gateway's prompts only while told
    refused: bool = False  # the last connection attempt was refused: no process there
    # Gone for good, having stopped what it ran (a worker that drained, then left).
    gone: bool = False
    # By when (time.monotonic()) a worker whose connection broke has stopped what it
    # ran unless it came back (comfyfleet.workers.agent); inf while it is connected.
    released_by: float = math.inf
    suspect_until: float = 0.0  # a hung prompt there: no new work until then
    # Since when, by its last keep's answer, its process has run without a stop (a
    # comfyfleet says; -inf: one that does not).
    awake_since: float = -math.inf


Outputs = Callable[[Job], OutputCopier | OutputReferencer]


class PromptFollower:
    """Follows the prompts one lane sends to its backend (one follower per lane)."""

    def __init__(
        self,
        client: BackendClient,
        settings: LaneSettings,
        state: BackendState,
        submits: Submits,
        outputs: Outputs,
    ) -> None:
        self.client = client
        self.settings = settings
        self.state = state
        self.submits = submits
        self.outputs = outputs  # a job's output copier (or referencer)

    async def rejoin(
        self,
        job: Job,
        watch: PromptWatch,
        sink: EventSink,
        handle: LaneRun,
        *,
        successes_only: bool = False,
    ) -> JobResult | None:
        """The result of a prompt the backend already knows: collected from its history
        (its files and `executed` frames re-sent: the client missed them), or followed
        if it is queued or running there; None if it has never heard of it (or, with
        `successes_only`, holds no success for it)."""
        entry = await self.client.history(job.prompt_id)
        if entry is None:
            running, pending = await self.client.queue_ids()
            if job.prompt_id in running | pending:
                watch.started = job.prompt_id in running
                handle.accept()
                handle.on_interrupt(lambda: self.interrupt_soon(watch))
                return await self.follow(job, watch, sink, handle)
            entry = await self.client.history(job.prompt_id)  # it may have just ended
        if entry is None or (successes_only and not succeeded(entry)):
            return None
        result = await self.result(job, entry, self.outputs(job))
        for node_id, output in result.outputs.items():
            sink(Message("executed", events.executed(job.prompt_id, node_id, output)))
        return result

    async def _still_there(self, watch: PromptWatch) -> bool:
        """Whether the backend, reached again, holds the prompt (queued, running or
        ended); True while it cannot say: it is asked again at the next tick."""
        try:
            return not await self._gone(watch.prompt_id)
        except BackendError:
            return True

    def _given_up(self, watch: PromptWatch, now: float) -> bool:
        """Whether a prompt of a backend this gateway cannot reach is lost: at once for a
        ComfyUI (it forgets its queue when it dies) and for a process that is gone (its
        port refuses: started again, a comfyfleet holds the prompt until told); else
        once the backend's hold on it has surely run out (a paused or cut-off comfyfleet
        has stopped it by then), or a worker has let go of it, not before, so it never
        runs in two places."""
        if not self.state.holds or self.state.refused or self.state.gone:
            return True
        return now > min(watch.kept_at + self.settings.hold + HOLD_MARGIN, self.state.released_by)

    def interrupt_soon(self, watch: PromptWatch) -> None:
        """Out of the backend's queue if it has not started there, else interrupted."""

        async def interrupt() -> None:
            if not await self.withdraw(watch):
                with contextlib.suppress(BackendError):
                    await self.client.interrupt(watch.prompt_id)

        asyncio.get_running_loop().create_task(interrupt())

    async def withdraw(self, watch: PromptWatch) -> bool:
        """Take a prompt that has not started out of the backend's queue: its run ends
        here, as no frame of it will come. False if it runs (or ran) there."""
        if watch.started:
            return False
        try:
            await self.client.delete_pending(watch.prompt_id)
            if watch.started or not await self._gone(watch.prompt_id):
                return False  # it started meanwhile: it runs there
        except BackendError:
            return False
        watch.queue.put_nowait(Withdrawn(watch.prompt_id))
        return True

    async def _gone(self, prompt_id: str) -> bool:
        """Neither queued, running nor finished on the backend."""
        running, pending = await self.client.queue_ids()
        if prompt_id in running | pending:
            return False
        return await self.client.history(prompt_id) is None

    async def follow(
        self, job: Job, watch: PromptWatch, sink: EventSink, handle: LaneRun
    ) -> JobResult:
        """Relay the prompt's frames until its done signal, then read its history.

        The backend's end event comes just before its done signal (which waits for its
        history write): the watch releases the slot there, so the next prompt is on its
        way while this one's outputs are copied and its history written and read."""
        copier = self.outputs(job)
        copied: dict[str, Any] = {}  # node -> its output, as relayed
        watch.start_ticks(1.0)
        while True:
            event = await self._next(job, watch)
            if isinstance(event, Message):
                if event.type == "executing" and event.data.get("node") is None:
                    break
                if event.type == "executed":
                    node = event.data.get("node")
                    try:
                        output = await copier.localize(event.data.get("output"))
                    except UnsafeOutput as exc:
                        self.interrupt_soon(watch)  # the prompt has failed: stop it there
                        name = self.client.spec.name
                        return unsafe_output_result(job, node, name, exc, copied)
                    copied[str(node)] = output
                    event = Message("executed", {**event.data, "output": output})
            sink(event)
        entry = await self.history_after_done(job.prompt_id)
        return await self.result(job, entry, copier)

    async def _next(self, job: Job, watch: PromptWatch) -> EngineEvent:
        asked = time.monotonic()
        while True:
            event = await watch.queue.get()
            if event is None:  # the watch's tick: check the clock and the connection
                now = time.monotonic()
                idle = now - watch.last_frame
                if watch.started and idle > self.settings.hang_timeout and not watch.abandoned:
                    # Hung: it answers, yet sends nothing for the prompt. A comfyfleet
                    # that answers nothing either is paused or cut off: its hold stops
                    # the prompt there, and it may go on in time; given up only once that
                    # hold has surely run out.
                    answering = not self.state.holds or self._awake_without_frames(watch)
                    if answering or self._given_up(watch, now):
                        self.state.suspect_until = time.monotonic() + self.settings.suspect_for
                        self.interrupt_soon(watch)
                        watch.abandoned = True  # kept no more: a comfyfleet stops it in time
                if watch.abandoned and self._given_up(watch, now):
                    raise BackendHung(f"no frame from {self.client.spec.name} for {idle:.0f} s")
                if not self.client.connected.is_set():
                    if self._given_up(watch, now):
                        raise BackendLost(f"backend {self.client.spec.name} went away")
                    continue
                if watch.lost and await self._still_there(watch):
                    watch.lost = False
                elif watch.lost:
                    raise BackendLost(f"backend {self.client.spec.name} came back without it")
                if idle >= QUIET_ASK and now - asked >= QUIET_ASK and not watch.abandoned:
                    asked = now
                    if await self._ended_quietly(job):
                        # Its frames go elsewhere (submitted by a gateway that died, then
                        # adopted here), or its done signal was lost: it ended there.
                        return Message("executing", events.executing(job.prompt_id, None))
                continue
            if isinstance(event, BackendLost) and not self._given_up(watch, time.monotonic()):
                watch.lost = True  # it may still run it there: the ticks look again
                continue
            if isinstance(event, BackendError):  # lost, or withdrawn from its queue
                raise event
            if watch.abandoned:
                continue  # given up on there (hung): it runs again elsewhere, whatever comes
            return event

    def _awake_without_frames(self, watch: PromptWatch) -> bool:
        """Whether a comfyfleet backend has said (in a keep's answer) that it ran on for
        the hang timeout since the prompt's last frame without sending one. Time it
        spent stopped does not count: resumed (SIGCONT), it answers the keep it was sent
        meanwhile before the prompt's next frame comes."""
        since = max(watch.last_frame, self.state.awake_since)
        return watch.kept_at - since >= self.settings.hang_timeout

    async def _ended_quietly(self, job: Job) -> bool:
        try:
            return await self.client.history(job.prompt_id) is not None
        except BackendError:
            return False  # asked again later; a lost backend is noticed on its own

    async def history_after_done(self, prompt_id: str) -> dict[str, Any]:
        await self.submits.let_pass()
        for delay in (0.0, 0.05, 0.2, 0.5, 1.0):
            await asyncio.sleep(delay)
            entry = await self.client.history(prompt_id)
            if entry is not None:
                return entry
        raise BackendError(f"backend {self.client.spec.name} has no history for {prompt_id}")

    async def result(
        self,
        job: Job,
        entry: dict[str, Any],
        copier: OutputCopier | OutputReferencer,
    ) -> JobResult:
        status = entry.get("status") or {}
        messages = status.get("messages") or []
        outputs: dict[str, Any] = {}
        for node, ui in (entry.get("outputs") or {}).items():
            try:
                outputs[node] = await copier.localize(ui)
            except UnsafeOutput as exc:
                return unsafe_output_result(job, node, self.client.spec.name, exc, outputs)
        last_event, last_data = messages[-1] if messages else ("", {})
        error: dict[str, Any] | None = last_data if isinstance(last_data, dict) else None
        if status.get("completed") or status.get("status_str") == "success":
            state, error = JobStatus.SUCCESS, None
        elif last_event == "execution_interrupted":
            state = JobStatus.INTERRUPTED
        else:
            state = JobStatus.ERROR
        return JobResult(
            state, outputs, entry.get("meta") or {}, messages, error, output_files(outputs)
        )
