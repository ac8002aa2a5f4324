"""Each prompt's events as its client sees them: one stream, whatever its attempts.

A prompt may run more than once (its backend died, hung or ran out of memory),
but a client expects what ComfyUI sends: one `execution_start`, the prompt's
progress, and exactly one of `execution_success`, `execution_error` or
`execution_interrupted` before the done signal. So the attempts' own end events
never reach the client; the end recorded in the store is sent instead, once.
"""

from __future__ import annotations

from comfyfleet.domain.jobs import Job, JobResult, JobStatus
from comfyfleet.engine.events import EngineEvent, Message, Restated
from comfyfleet.protocol import events
from comfyfleet.scheduler.observers import JobObserver


class PromptStreams:
    """Shapes the events of every attempt into one stream per prompt."""

    def __init__(self, observer: JobObserver) -> None:
        self.observer = observer
        self._begun: set[str] = set()  # prompts whose client has had `execution_start`
        self._restate: set[str] = set()  # resumed here: their start goes to clients again

    def event(self, job: Job, event: EngineEvent) -> None:
        """An event of a running attempt."""
        self._restated(job)
        if isinstance(event, Message):
            if event.type in events.END_EVENTS:
                return  # the recorded end is sent by `end`
            if event.type == "execution_start":
                if job.prompt_id not in self._begun:
                    self._begun.add(job.prompt_id)
                    self.observer.job_event(job, event)
                return  # a later attempt: the client's stream is under way
        self._begin(job)
        self.observer.job_event(job, event)

    def end(self, job: Job, result: JobResult) -> None:
        """The job's end is recorded: its end event, if it has one (the done signal
        follows). A job cancelled before it ever started ends silently, like a deleted
        queue item."""
        self._restated(job)
        end = _end_message(result)
        if end is not None and (
            job.prompt_id in self._begun or result.status != JobStatus.CANCELLED
        ):
            self._begin(job)
            self.observer.job_event(job, end)
        self._begun.discard(job.prompt_id)

    def resumed(self, job: Job) -> None:
        """A job followed where it ran before this process (a restart, or a gateway that
        is gone): its stream began then and goes on without a second start, but the
        clients connected now (a new socket) get that start again (Restated: not logged)."""
        if job.prompt_id not in self._begun:  # else this process sent it: nothing to restate
            self._begun.add(job.prompt_id)
            self._restate.add(job.prompt_id)

    def _restated(self, job: Job) -> None:
        if job.prompt_id in self._restate:
            self._restate.discard(job.prompt_id)
            data = events.execution_start(job.prompt_id)
            self.observer.job_event(job, Restated("execution_start", data))

    def forget(self, prompt_id: str) -> None:
        """The job left the queue without running again (deleted, cancelled)."""
        self._begun.discard(prompt_id)
        self._restate.discard(prompt_id)

    def _begin(self, job: Job) -> None:
        if job.prompt_id not in self._begun:
            self._begun.add(job.prompt_id)
            self.observer.job_event(
                job, Message("execution_start", events.execution_start(job.prompt_id))
            )


def _end_message(result: JobResult) -> Message | None:
    """The end event among the result's recorded messages, if there is one."""
    for kind, data in reversed(result.messages):
        if kind in events.END_EVENTS and isinstance(data, dict):
            return Message(str(kind), data)
    return None
