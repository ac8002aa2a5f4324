"""A task handle: what a Concurrent Submit node outputs (IMAGE_FUTURE / VIDEO_FUTURE).

The job itself runs in a pool owned by the fan-out service, not by the prompt:
the handle is how a collector waits for it, and what the status report reads.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class TaskState(StrEnum):
    QUEUED = "queued"  # admitted to the pool, waiting for a running slot
    RUNNING = "running"
    SUCCESS = "success"
    SKIPPED_ERROR = "skipped_error"  # failed, and the node's skip_error gave a fallback
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL = frozenset(
    {TaskState.SUCCESS, TaskState.SKIPPED_ERROR, TaskState.FAILED, TaskState.CANCELLED}
)
#: A task in one of these states is never reused: asking again runs the job again.
UNUSABLE = frozenset({TaskState.FAILED, TaskState.CANCELLED})


@dataclass
class TaskInfo:
    """What the status report says about a task (messages are redacted when set)."""

    provider: str
    node_id: str | None = None
    prompt_id: str | None = None
    endpoint: str | None = None  # scheme://host/path only
    journal_id: str | None = None
    remote_id: str | None = None
    attempts: int = 0
    state: TaskState = TaskState.QUEUED
    error_class: str | None = None
    error: str | None = None
    http_status: int | None = None
    reused: bool = False  # the result came from the journal, no new job was sent
    queued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    finished_at: float | None = None

    def seconds(self) -> tuple[float, float]:
        """(queued, running) seconds so far."""
        now = time.monotonic()
        start = self.started_at if self.started_at is not None else self.finished_at or now
        end = self.finished_at if self.finished_at is not None else now
        queued = max(0.0, start - self.queued_at)
        running = 0.0 if self.started_at is None else max(0.0, end - self.started_at)
        return queued, running


class Task:
    """One job's handle. `kind` is "image" or "video"; `value` is set once it succeeds."""

    def __init__(self, kind: str, info: TaskInfo, request_hash: str | None = None) -> None:
        self.kind = kind
        self.info = info
        self.request_hash = request_hash
        self.value: Any = None
        self.error: BaseException | None = None
        # Prompts that wait for this task: it is cancelled only when none is left.
        self.owners: set[str] = set()
        self.runner: asyncio.Task[None] | None = None
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def __repr__(self) -> str:
        remote = f" {self.info.remote_id}" if self.info.remote_id else ""
        return f"<{self.kind} task {self.info.provider}{remote} {self.info.state}>"

    @property
    def done(self) -> bool:
        return self.finished.done()

    @property
    def state(self) -> TaskState:
        return self.info.state

    def start(self) -> None:
        self.info.state = TaskState.RUNNING
        self.info.started_at = time.monotonic()

    def settle(
        self, state: TaskState, value: Any = None, error: BaseException | None = None
    ) -> None:
        """End the task once; later calls are ignored."""
        if self.finished.done():
            return
        self.info.state = state
        self.info.finished_at = time.monotonic()
        self.value = value
        self.error = error
        self.finished.set_result(None)
