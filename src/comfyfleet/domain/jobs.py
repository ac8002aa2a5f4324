"""Jobs as comfyfleet knows them: what was submitted, how each attempt ended, and the
history entry a finished job makes. Every part (server, scheduler, lanes, stores) speaks
in these; the stores keep them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from comfyfleet.domain.idempotency import IdempotentRequest
from comfyfleet.tenants import DEFAULT_TENANT


class JobStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCESS = "success"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"


TERMINAL = frozenset(
    {JobStatus.SUCCESS, JobStatus.ERROR, JobStatus.INTERRUPTED, JobStatus.CANCELLED}
)
#: In a prompt's `extra_data`: sent by a gateway, it runs only while that gateway keeps
#: saying it wants it, this many seconds at a time (see scheduler/holds.py).
HOLD_KEY = "comfyfleet_hold"
#: What a backend says it is (the companion pack, or comfyfleet): its features.
PACK_ROUTE = "/comfyfleet/pack"
#: Where a gateway says so, and the flag of `GET /comfyfleet/pack` saying it may.
HOLDS_ROUTE = "/comfyfleet/holds"
HOLDS_FEATURE = "holds"
#: The longest hold one word of the gateway gives (s).
MAX_HOLD = 3600.0


def pack_features(pack: Any) -> tuple[bool, bool]:
    """From a backend's answer to `GET /comfyfleet/pack`: whether it validates prompts
    for a gateway (the companion pack, or comfyfleet), and whether it holds a gateway's
    prompts (a comfyfleet: it runs them only while told)."""
    if not isinstance(pack, dict) or pack.get("pack") != "comfyfleet":
        return False, False
    return True, pack.get(HOLDS_FEATURE) is True


def hold_seconds(extra_data: Any) -> float | None:
    """The hold a prompt was sent with (HOLD_KEY), None when it has none: anything but a
    number of seconds in (0, MAX_HOLD] is no hold."""
    value = extra_data.get(HOLD_KEY) if isinstance(extra_data, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value <= MAX_HOLD else None


#: Terminal states that always produce a ComfyUI history entry; a cancelled job makes one
#: only if it began running (JobResult.historic).
HISTORIC = frozenset({JobStatus.SUCCESS, JobStatus.ERROR, JobStatus.INTERRUPTED})


@dataclass(frozen=True)
class NewJob:
    """A validated prompt to queue.

    Order: front jobs before all others (FIFO among them); the rest by
    `number`, then submission order.
    """

    prompt_id: str
    # As ComfyUI reports it (front jobs: the negated counter); None: counted, the store
    # takes the counter's next value as it queues the job (see `numbered`).
    number: float | None
    front: bool
    prompt: dict[str, Any]
    extra_data: dict[str, Any]
    outputs: list[str]  # outputs_to_execute
    client_id: str | None = None
    node_errors: dict[str, Any] = field(default_factory=dict)
    tenant: str = DEFAULT_TENANT  # who submitted it (see comfyfleet.tenants)
    # Submitted under an Idempotency-Key: the store records the key with the job.
    idempotency: IdempotentRequest | None = None

    def numbered(self, counter: int) -> NewJob:
        """A counted job with the counter's value `counter` (negated for front, as in
        ComfyUI)."""
        return replace(self, number=-counter if self.front else counter)

    def pending(self, seq: int, created_at: float) -> Job:
        """The job as queued (before the store assigns `seq` and the number of a counted
        job, 0 stands in)."""
        return Job(
            prompt_id=self.prompt_id,
            number=0 if self.number is None else self.number,
            front=self.front,
            seq=seq,
            prompt=self.prompt,
            extra_data=self.extra_data,
            outputs=self.outputs,
            client_id=self.client_id,
            status=JobStatus.PENDING,
            attempt=0,
            lane=None,
            created_at=created_at,
            tenant=self.tenant,
        )


#: A job's place in the queue (`Job.dispatch_key`): front first, then `order_key`, then
#: submission order (`seq`).
DispatchKey = tuple[int, float, int]


def order_key(front: bool, number: float) -> float:
    """A job's place in the queue after `front` and before submission order: 0 for front
    jobs (FIFO among themselves), else its number; a NaN number sorts last."""
    if front:
        return 0.0
    return math.inf if math.isnan(number) else float(number)


@dataclass(frozen=True)
class Job:
    prompt_id: str
    number: float
    front: bool
    seq: int  # submission order, assigned by the store
    prompt: dict[str, Any]
    extra_data: dict[str, Any]
    outputs: list[str]
    client_id: str | None
    status: JobStatus
    attempt: int  # 0 until first claimed; the fencing token of the running attempt
    lane: str | None
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    error: dict[str, Any] | None = None  # the final execution_error / interrupted payload
    tenant: str = DEFAULT_TENANT
    # The gateway whose lease covers the running attempt (None while pending); another
    # gateway takes the job over once that lease has run out.
    owner: str | None = None

    def started(self, lane: str, attempt: int, at: float, owner: str | None) -> Job:
        """This job as an attempt started on `lane` records it (running, that attempt)."""
        return replace(
            self, status=JobStatus.RUNNING, attempt=attempt, lane=lane, started_at=at, owner=owner
        )

    def dispatch_key(self) -> DispatchKey:
        """Where the job stands in the queue (the store's dispatch order): front jobs
        first, FIFO among themselves, then by number, then by submission."""
        return (0 if self.front else 1, order_key(self.front, self.number), self.seq)

    def queue_item(self) -> list[Any]:
        """ComfyUI's queue item: `[number, prompt_id, prompt, extra_data, outputs_to_execute]`."""
        return [self.number, self.prompt_id, self.prompt, self.extra_data, self.outputs]


@dataclass(frozen=True)
class OutputFile:
    """A file a job produced, relative to its tenant's folder of its `type`."""

    filename: str
    subfolder: str
    type: str  # "output" or "temp"
    tenant: str = DEFAULT_TENANT  # set where it matters: on the files retention deletes


@dataclass(frozen=True)
class JobResult:
    """How an attempt ended: the pieces of a ComfyUI history entry."""

    status: JobStatus  # SUCCESS, ERROR or INTERRUPTED
    outputs: dict[str, Any]  # node_id -> ui
    meta: dict[str, Any]
    messages: list[list[Any]]  # [[event, data], ...]
    error: dict[str, Any] | None = None
    files: list[OutputFile] = field(default_factory=list)

    @classmethod
    def failed(cls, error: dict[str, Any]) -> JobResult:
        """An attempt that ended with `error` (an `execution_error` payload), nothing else."""
        return cls(JobStatus.ERROR, {}, {}, [["execution_error", error]], error)

    @property
    def historic(self) -> bool:
        """Whether this end makes a ComfyUI history entry. A job cancelled after it began
        does: ComfyUI records a prompt stopped mid-run as interrupted (`status_str`
        error, `execution_interrupted` last), and clients polling `/history/{id}` (the
        v2 proxy among them) wait for that entry. One cancelled before it began does
        not, as a prompt deleted from ComfyUI's queue leaves none."""
        if self.status in HISTORIC:
            return True
        began = any(message[0] == "execution_start" for message in self.messages)
        return self.status is JobStatus.CANCELLED and began

    def status_record(self) -> dict[str, Any]:
        completed = self.status == JobStatus.SUCCESS
        return {
            "status_str": "success" if completed else "error",
            "completed": completed,
            "messages": self.messages,
        }


@dataclass(frozen=True)
class HistoryEntry:
    job: Job
    result: JobResult

    def comfy(self) -> dict[str, Any]:
        """The entry as ComfyUI's `/history` shows it."""
        return {
            "prompt": self.job.queue_item(),
            "outputs": self.result.outputs,
            "status": self.result.status_record(),
            "meta": self.result.meta,
        }
