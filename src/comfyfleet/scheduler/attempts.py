"""One attempt of a job on a lane: what the scheduler intends for its end, and the gate
that holds its events back until the slot's previous prompt has sent its done signal.

An attempt runs until its lane reports an end; meanwhile the scheduler may decide
how that end is recorded. `AttemptState` says which, with the changes allowed:

    RUNNING ──> TAKING_BACK ──> RUNNING       (it had started there after all)
       │             │
       ├─────────────┴──> GIVING_BACK         (back to the queue: shutdown, a lapsed hold,
       │                                       taken over while fenced)
       └──────────────────────┴──> CANCELLING (cancelled: wins over all the others)

A cancel always wins; nothing leaves CANCELLING.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from comfyfleet.domain.jobs import Job
from comfyfleet.lanes.base import Lane, LaneRun
from comfyfleet.store.base import JobStore

#: Events of one fenced attempt kept at most (a node's progress, mostly).
MAX_FENCED_EVENTS = 10_000


class AttemptState(enum.Enum):
    RUNNING = "running"  # its end is recorded as the lane reports it (or retried)
    TAKING_BACK = "taking_back"  # being taken out of its backend's queue for a free slot
    GIVING_BACK = "giving_back"  # it goes back to the queue (or is fenced out), not a failure
    CANCELLING = "cancelling"  # cancelled: it ends as cancelled, whatever the lane reports


_ALLOWED: dict[AttemptState, frozenset[AttemptState]] = {
    AttemptState.RUNNING: frozenset(
        {AttemptState.TAKING_BACK, AttemptState.GIVING_BACK, AttemptState.CANCELLING}
    ),
    AttemptState.TAKING_BACK: frozenset(
        {AttemptState.RUNNING, AttemptState.GIVING_BACK, AttemptState.CANCELLING}
    ),
    AttemptState.GIVING_BACK: frozenset({AttemptState.CANCELLING}),
    AttemptState.CANCELLING: frozenset(),
}


class EventGate:
    """Holds a job's events until the job before it on the same slot has sent its done
    signal, so a slot's clients see one prompt's end before the next one's first event
    (as from ComfyUI) while the next prompt already runs."""

    def __init__(self, after: asyncio.Future[Any] | None) -> None:
        self._held: list[Callable[[], None]] | None = None
        self.opened = asyncio.Event()
        if after is None or after.done():
            self.opened.set()
        else:
            self._held = []
            after.add_done_callback(lambda _f: self._open())

    def pass_on(self, deliver: Callable[[], None]) -> None:
        if self._held is None:
            deliver()
        else:
            self._held.append(deliver)

    def _open(self) -> None:
        held, self._held = self._held or [], None
        for deliver in held:
            deliver()
        self.opened.set()


@dataclass
class Running:
    job: Job
    lane: Lane
    gate: EventGate
    handle: LaneRun = field(default_factory=LaneRun)
    state: AttemptState = AttemptState.RUNNING
    # A reserved job (as reserved) started before its start was recorded, and that
    # record, under way once the backend has the prompt (see Runner.start).
    reserved: Job | None = None
    starting: asyncio.Future[Job | None] | None = None
    ended = False  # the lane reported its end (being recorded: not to be given back)
    began: float = field(default_factory=time.monotonic)  # when it took its slot
    # Events of an in-process run while the lease could not be proven (fencing.py): sent
    # if the attempt turns out to be this gateway's still, else never.
    fenced_events: list[Callable[[], None]] = field(default_factory=list)

    def hold_fenced(self, deliver: Callable[[], None]) -> None:
        if len(self.fenced_events) < MAX_FENCED_EVENTS:
            self.fenced_events.append(deliver)

    def release_fenced(self) -> None:
        held, self.fenced_events = self.fenced_events, []
        for deliver in held:
            deliver()

    def to(self, state: AttemptState) -> bool:
        """Move to `state` if the change is allowed (see the module's diagram); False, and
        nothing changed, when it is not (a cancelled attempt stays cancelled)."""
        if state not in _ALLOWED[self.state]:
            return False
        self.state = state
        return True

    def record_start(self, store: JobStore) -> None:
        assert self.reserved is not None
        self.starting = asyncio.ensure_future(store.start_reserved(self.reserved, self.lane.name))
