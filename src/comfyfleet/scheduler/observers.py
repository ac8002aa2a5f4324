"""What the scheduler tells the rest of the process about its jobs (the observer seam).

The WebSocket router, the dashboard, metrics and the event log each subscribe with
`Scheduler.observers.add`. An observer overrides the calls it cares about; they
run on the event loop, in the order things happened to a job, and must not block.
One observer's failure is logged and never reaches the scheduler or the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from comfyfleet.domain.jobs import Job, JobResult
from comfyfleet.engine.events import EngineEvent

log = logging.getLogger(__name__)


class JobObserver:
    """Every call a no-op: subclasses override what they need."""

    def job_submitted(self, job: Job) -> None:
        """The job was durably queued (pending, or handed straight to a lane)."""

    def job_started(self, job: Job) -> None:
        """An attempt began on `job.lane` (`job.attempt` counts them; a job followed on a
        backend after a restart starts again with the same attempt)."""

    def job_event(self, job: Job, event: EngineEvent) -> None:
        """An event of the job's stream, as its client sees it (one `execution_start`,
        one end event whatever the attempts)."""

    def job_requeued(self, job: Job, reason: dict[str, Any] | None) -> None:
        """The attempt went back to the queue (`reason` as kept in the attempt notes; None
        at shutdown)."""

    def job_finished(self, job: Job, result: JobResult) -> None:
        """The job's end is durably recorded (its end event was sent before)."""

    def job_stopped(self, job: Job) -> None:
        """The job stopped running without an end recorded: it went back to the queue (or
        its end could not be written); nothing of it is current any more."""

    def queue_changed(self, remaining: int) -> None:
        """Pending plus running jobs changed."""


class Observers(JobObserver):
    """Passes each call on to every observer added that overrides it, in the order they
    were added (a dozen events a prompt: the no-ops are left out once, not per call)."""

    def __init__(self, *observers: JobObserver) -> None:
        self._all: tuple[JobObserver, ...] = ()
        self._calls: dict[str, tuple[Callable[..., None], ...]] = {}
        for observer in observers:
            self.add(observer)

    def add(self, observer: JobObserver) -> None:
        self._set((*self._all, observer))

    def remove(self, observer: JobObserver) -> None:
        self._set(tuple(o for o in self._all if o is not observer))

    def _set(self, observers: tuple[JobObserver, ...]) -> None:
        self._all = observers
        self._calls = {
            name: tuple(
                getattr(o, name)
                for o in observers
                if getattr(type(o), name, None) is not getattr(JobObserver, name)
            )
            for name in _CALLS
        }

    def _each(self, call: str, *args: Any) -> None:
        for method in self._calls[call]:
            try:
                method(*args)
            except Exception:
                log.exception("observer %s failed", getattr(method, "__qualname__", call))

    def job_submitted(self, job: Job) -> None:
        self._each("job_submitted", job)

    def job_started(self, job: Job) -> None:
        self._each("job_started", job)

    def job_event(self, job: Job, event: EngineEvent) -> None:
        self._each("job_event", job, event)

    def job_requeued(self, job: Job, reason: dict[str, Any] | None) -> None:
        self._each("job_requeued", job, reason)

    def job_finished(self, job: Job, result: JobResult) -> None:
        self._each("job_finished", job, result)

    def job_stopped(self, job: Job) -> None:
        self._each("job_stopped", job)

    def queue_changed(self, remaining: int) -> None:
        self._each("queue_changed", remaining)


_CALLS = [name for name in vars(JobObserver) if name.startswith(("job_", "queue_"))]
