"""The lane interface the scheduler dispatches to."""

from __future__ import annotations

from typing import Protocol

from comfyfleet.engine.events import EventSink
from comfyfleet.engine.run import RunHandle
from comfyfleet.store.records import Job, JobResult


class Lane(Protocol):
    """Somewhere prompts run, with a number of slots.

    `run` executes one job to its end and reports how it ended; events go to
    `sink` (the scheduler routes them to the job's own client). Interrupts come
    through `handle`. Raising means the lane itself failed (not the prompt):
    the scheduler puts the job back in the queue.
    """

    name: str
    slots: int

    def can_run(self, job: Job) -> bool: ...

    async def run(self, job: Job, sink: EventSink, handle: RunHandle) -> JobResult: ...

    async def close(self) -> None: ...
