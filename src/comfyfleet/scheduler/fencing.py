"""What runs in this process while the gateway cannot prove its lease (lease.py).

A store outage or freeze takes the lease from every gateway at once, and no one can
take a job over until the store is back and the taker has renewed its own lease for a
whole lease (the sweep rule). So a fenced gateway does not give its attempts back,
which would run their finished nodes again elsewhere: it holds them back (see
engine/run.py RunHandle). A held-back attempt starts no node, and a node that looks
whether it should stop is told to: it runs again from its start if the attempt goes
on. The async calls of a node still under way at `STOP_AT` of the lease are cancelled
the same way, before another gateway could have taken the job. When the lease holds
again, each paused attempt the store still has as this gateway's goes on where it
stopped; one taken over meanwhile (this gateway was paused or cut off alone) is
interrupted, and its fenced end discards its outputs.
"""

from __future__ import annotations

import asyncio
import logging

from comfyfleet.domain.jobs import JobStatus
from comfyfleet.scheduler.attempts import AttemptState, Running
from comfyfleet.scheduler.state import SchedulerState
from comfyfleet.store.base import StoreError

log = logging.getLogger(__name__)

#: The part of the lease by which a node under way at the fence must have ended.
STOP_AT = 0.9
#: Wait between tries to read the store when the lease holds again (s).
RETRY = 0.5


class InProcessFence:
    def __init__(self, state: SchedulerState) -> None:
        self._state = state
        self._stop: asyncio.TimerHandle | None = None
        self._resuming: asyncio.Task[None] | None = None

    def _paused(self) -> list[Running]:
        return [
            entry
            for entry in self._state.running.values()
            if entry.lane.in_process and entry.handle.paused and not entry.ended
        ]

    def fenced(self) -> None:
        """The lease cannot be proven: hold back what runs here."""
        guard = self._state.lease
        for entry in self._state.running.values():
            if entry.lane.in_process and not entry.ended and entry.state is AttemptState.RUNNING:
                entry.handle.pause()
        self._cancel_stop()
        delay = max(0.0, guard.seconds_until(STOP_AT))
        self._stop = asyncio.get_running_loop().call_later(delay, self._stop_busy)

    def _stop_busy(self) -> None:
        self._stop = None
        if self._state.lease.held:
            return
        for entry in self._paused():
            if not entry.handle.quiet:
                entry.handle.stop()

    def held(self) -> None:
        """The lease holds again: go on with what is still this gateway's."""
        self._cancel_stop()
        if self._resuming is None or self._resuming.done():
            self._resuming = asyncio.create_task(self._resume(), name="resume-fenced")

    async def _resume(self) -> None:
        state = self._state
        while state.lease.held and (paused := self._paused()):
            try:
                for entry in paused:
                    await self._resume_one(entry)
            except StoreError as exc:
                log.warning("cannot read the store to resume paused prompts: %s", exc)
                await asyncio.sleep(RETRY)

    async def _resume_one(self, entry: Running) -> None:
        state = self._state
        if entry.starting is not None:
            await asyncio.wait([entry.starting])  # a reserved job's start, being recorded
        job = await state.store.get(entry.job.prompt_id)
        if not state.lease.held:
            return  # fenced again meanwhile: decided at the next renewal
        ours = (
            job is not None
            and job.status == JobStatus.RUNNING
            and job.attempt == entry.job.attempt
            and job.owner == state.store.owner
        )
        if ours and entry.state is AttemptState.RUNNING:
            entry.release_fenced()
        else:  # taken over meanwhile, or cancelled (which stays so)
            if entry.to(AttemptState.GIVING_BACK):
                log.warning(
                    "dropped %s: taken over while this gateway was fenced", entry.job.prompt_id
                )
            entry.handle.interrupt()
        entry.handle.resume()  # an interrupted run ends at once

    def _cancel_stop(self) -> None:
        if self._stop is not None:
            self._stop.cancel()
            self._stop = None

    async def close(self) -> None:
        self._cancel_stop()
        if self._resuming is not None:
            self._resuming.cancel()
            await asyncio.gather(self._resuming, return_exceptions=True)
