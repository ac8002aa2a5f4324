"""Holds: the prompts a gateway sent to this server (a comfyfleet used as a backend) run
only while that gateway keeps saying it wants them.

A gateway that loses a backend moves its prompts elsewhere. A ComfyUI backend forgets
them when it dies, but a comfyfleet has a durable queue of its own: started again, it
would run them a second time, and one that was paused (SIGSTOP) would go on with them
when it resumes. So a prompt sent with `extra_data.comfyfleet_hold = S` (seconds) is
held here: it may start, and go on running, only until S seconds after the gateway
last said it wants it (at its submit, then by `POST /comfyfleet/holds` every few
seconds). Past that, a running one is given back to this server's queue and a queued
one waits; the gateway keeps it again when it returns, or deletes it once it has run
it elsewhere. After this server restarts, every such prompt waits until a gateway
keeps it. One no gateway keeps for HOLD_GRACE leaves the queue.

Each keep's answer also says how long this process has run without a stop (`awake`,
seconds): a gateway takes a backend that answers yet sends no frame for a prompt for
hung, and a process resumed after a SIGSTOP answers the keep it was sent meanwhile
before its next frame goes out. Its hold checks, every HOLD_CHECK, tell: a check that
comes STALL late means the process (or its loop) was stopped until then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from comfyfleet.domain.jobs import hold_seconds
from comfyfleet.scheduler.attempts import AttemptState, Running

log = logging.getLogger(__name__)

#: How long a held prompt no gateway keeps stays queued (s).
HOLD_GRACE = 600.0
#: How often the scheduler looks for lapsed holds (s).
HOLD_CHECK = 0.5
#: How much later than due a check may come before the process counts as stopped (s).
STALL = 1.0


class Holds:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}  # prompt id -> until when it may run
        self._checked_at = self._awake_since = clock()

    def checked(self) -> None:
        """The scheduler's hold check ran (every HOLD_CHECK)."""
        now = self._clock()
        if now - self._checked_at > HOLD_CHECK + STALL:
            self._awake_since = now  # it was stopped until now
        self._checked_at = now

    def awake_for(self) -> float:
        """How long this process has run without a stop, as far as its checks tell."""
        now = self._clock()
        if now - self._checked_at > HOLD_CHECK + STALL:
            return 0.0  # stopped until just now: no check has run since
        return now - self._awake_since

    def submitted(self, prompt_id: str, extra_data: Mapping[str, Any]) -> None:
        seconds = hold_seconds(extra_data)
        if seconds is not None:
            self._until[prompt_id] = self._clock() + seconds

    def recovered(self, prompt_ids: Iterable[str]) -> None:
        """Held prompts found in the store at start: they wait for their gateway."""
        now = self._clock()
        for prompt_id in prompt_ids:
            self._until[prompt_id] = now

    def keep(self, prompt_ids: Iterable[str], seconds: float) -> list[str]:
        """The gateway still wants these: they may run `seconds` more. Returns those held
        here (the others are unknown, or not held)."""
        until = self._clock() + seconds
        kept = [p for p in dict.fromkeys(prompt_ids) if p in self._until]
        for prompt_id in kept:
            self._until[prompt_id] = until
        return kept

    def release(self, prompt_ids: Iterable[str]) -> list[str]:
        """Their gateway let go of them: none may run from now on until kept again.
        Returns those held here."""
        now = self._clock()
        released = [p for p in dict.fromkeys(prompt_ids) if p in self._until]
        for prompt_id in released:
            self._until[prompt_id] = now  # lapsed: given back, then kept or forgotten
        return released

    def allows(self, prompt_id: str, extra_data: Mapping[str, Any]) -> bool:
        """Whether the job may start now (always, when it is not held)."""
        if hold_seconds(extra_data) is None:
            return True
        return self._until.get(prompt_id, 0.0) > self._clock()

    def lapsed(self, running: Iterable[Running]) -> list[Running]:
        """Held attempts running here whose gateway stopped keeping them: given back."""
        lapsed = []
        for entry in running:
            job = entry.job
            if not entry.lane.in_process or entry.ended:
                continue  # one it follows on a backend of its own, or one that has ended
            lapses = not self.allows(job.prompt_id, job.extra_data)
            if lapses and entry.to(AttemptState.GIVING_BACK):
                entry.handle.interrupt()
                lapsed.append(entry)
        return lapsed

    def unclaimed(self, running: Mapping[str, Running]) -> list[str]:
        """Prompts no gateway has kept for HOLD_GRACE (forgotten here from now on)."""
        old = self._clock() - HOLD_GRACE
        gone = [p for p, until in self._until.items() if until < old and p not in running]
        for prompt_id in gone:
            del self._until[prompt_id]
        return gone
