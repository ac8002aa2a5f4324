"""The lane interface the scheduler dispatches to."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

from comfyfleet.domain.jobs import Job, JobResult
from comfyfleet.engine.events import EventSink
from comfyfleet.engine.run import RunHandle


class LaneRun(RunHandle):
    """The scheduler's handle on one run: it interrupts the run (a RunHandle), and the
    lane calls `release` once its slot can take the next job while this run has only
    bookkeeping left (a backend that reported the prompt's end, its history not read
    yet). A lane that never calls it frees the slot when `run` returns."""

    def __init__(self) -> None:
        super().__init__()
        self.released = asyncio.Event()
        self.accepted = False
        self._on_accept: list[Callable[[], None]] = []
        # A run queued on a backend behind another prompt can be taken back from there
        # (for a free slot elsewhere): the lane offers how, and says whether it waits.
        self.take_back: Callable[[], Awaitable[bool]] | None = None
        self.queued_there: Callable[[], bool] = lambda: False
        self.withdrawn = False  # the run ended because its prompt left the backend's queue

    def release(self) -> None:
        self.released.set()

    def accept(self) -> None:
        """The prompt is on its way (a backend queued it): the slot stays busy a while,
        so the scheduler may set the slot's next job aside now."""
        if not self.accepted:
            self.accepted = True
            for listener in self._on_accept:
                listener()

    def on_accept(self, listener: Callable[[], None]) -> None:
        if self.accepted:
            listener()
        else:
            self._on_accept.append(listener)

    def offer_back(
        self, take_back: Callable[[], Awaitable[bool]], queued_there: Callable[[], bool]
    ) -> None:
        """`take_back()` removes the prompt from the backend's queue if it has not started
        there (True: the run then ends, leaving the job to the scheduler)."""
        self.take_back = take_back
        self.queued_there = queued_there


#: Of the prompts a lane finds on its backend as it (re)connects (those it submitted),
#: the ones to stay there: followed as the jobs' current attempts. The lane takes the
#: others out of the backend's queue (or interrupts them): the jobs went elsewhere.
Adopt = Callable[[Sequence[str]], Awaitable[set[str]]]


async def adopt_none(found: Sequence[str]) -> set[str]:
    return set()


@runtime_checkable
class DiscardsOutputs(Protocol):
    """A lane whose attempts write files where this gateway serves them (in-process)."""

    async def discard_outputs(self, job: Job, result: JobResult) -> None:
        """Remove the files of an attempt whose end was not recorded (given back, or
        fenced out by a newer attempt): they are no one's, and must never be served."""


class Lane(Protocol):
    """Somewhere prompts run, with a number of slots.

    `run` executes one job to its end and reports how it ended; events go to
    `sink` (the scheduler routes them to the job's own client). Interrupts come
    through `handle`. Raising means the lane itself failed (not the prompt):
    the scheduler puts the job back in the queue.
    """

    name: str
    slots: int
    #: Of `slots`, how many run at once; a job taken beyond them waits in the lane's own
    #: queue (a backend's prefetch).
    runs_at_once: int
    #: In-process lanes lose their running jobs with the process: re-queue them at
    #: start-up. Remote lanes may still be running them: ask (`resume`).
    in_process: bool
    #: Running out of memory there may be the machine's fault, not the prompt's: try
    #: another lane once before calling it the prompt's fault.
    retry_node_errors: bool
    #: Only this tenant's jobs run here (a worker brought for one tenant); None: any.
    only_tenant: str | None

    def can_run(self, job: Job) -> bool:
        """Cheap and thread-safe: the store's writer thread calls it while claiming."""

    async def wait_ready(self) -> None:
        """Return when the lane can take work (at once for the local lane)."""

    async def start(self, adopt: Adopt = adopt_none) -> None: ...

    async def run(self, job: Job, sink: EventSink, handle: LaneRun) -> JobResult: ...

    async def resume(self, job: Job, sink: EventSink, handle: LaneRun) -> JobResult | None:
        """Follow a job recorded as running here before a restart: its result once it
        ends, or None when the lane has never heard of it (it is then re-queued)."""

    async def close(self) -> None: ...
