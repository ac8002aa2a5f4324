"""When a job goes back to the queue, and when it has failed for good.

- A lane failure (backend lost, hung, unknown after a restart) re-queues the
  job, up to `max_attempts` attempts in all (a prompt taken back from a
  backend's queue for a free slot elsewhere did not fail: that attempt does not
  count).
- A node error is the prompt's own (its node raised it): it ends the job at
  once, as on ComfyUI. The exceptions are errors of a lane that may be at fault
  (a ComfyUI backend): running out of memory, or naming an output file the
  gateway refuses. Those are retried once on another lane; the same error there
  ends the job.
- Anything else is the job's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from comfyfleet.domain.jobs import Job, JobResult, JobStatus
from comfyfleet.lanes.base import Lane
from comfyfleet.protocol import events
from comfyfleet.store.base import JobStore


@dataclass(frozen=True)
class Decision:
    requeue: bool
    reason: dict[str, Any] | None = None
    result: JobResult | None = None


#: Exception types that say the lane failed (it ran out of memory, or its backend named
#: an output file the gateway refuses), not that the prompt is wrong.
LANE_FAULT_TYPES = frozenset(
    {
        "torch.OutOfMemoryError",
        "torch.cuda.OutOfMemoryError",
        "MemoryError",
        "comfyfleet.UnsafeOutput",
    }
)


#: Attempt notes of attempts that ended without failing.
NOT_FAILED = frozenset({"taken_back", "adopted"})


def lane_fault(error: dict[str, Any] | None) -> bool:
    """Whether a node error is the lane's fault (worth another lane)."""
    return str((error or {}).get("exception_type")) in LANE_FAULT_TYPES


def error_signature(error: dict[str, Any] | None) -> list[Any]:
    """What makes two node errors "the same": node, class, exception type and message."""
    error = error or {}
    return [
        error.get("node_id"),
        error.get("node_type"),
        error.get("exception_type"),
        error.get("exception_message"),
    ]


class RetryPolicy:
    def __init__(self, store: JobStore, max_attempts: int) -> None:
        self.store = store
        self.max_attempts = max_attempts

    async def decide(
        self, job: Job, lane: Lane, result: JobResult | None, failure: dict[str, Any] | None
    ) -> Decision:
        if result is not None and not (
            result.status == JobStatus.ERROR and lane.retry_node_errors and lane_fault(result.error)
        ):
            return Decision(False, result=result)
        notes = await self.store.attempt_notes(job.prompt_id)
        # Taken back for a free slot, or adopted from a gateway that died: not failures.
        failed = job.attempt - sum(note.get("kind") in NOT_FAILED for _, note in notes)
        if result is None:
            if failed < self.max_attempts:
                return Decision(True, {"kind": "lane", **(failure or {"lane": lane.name})})
            return Decision(False, result=lane_failure(job, failed, failure))
        signature = error_signature(result.error)
        seen_elsewhere = any(
            note.get("kind") == "node_error"
            and note.get("signature") == signature
            and note.get("lane") != lane.name
            for _, note in notes
        )
        if seen_elsewhere or failed >= self.max_attempts:
            return Decision(False, result=result)
        return Decision(True, {"kind": "node_error", "lane": lane.name, "signature": signature})


def lane_failure(job: Job, failed: int, failure: dict[str, Any] | None) -> JobResult:
    """The end of a job whose lanes failed on every attempt."""
    detail = (failure or {}).get("error", "lane failure")
    message = f"the job failed on its lane {failed} times; last: {detail}\n"
    return JobResult.failed(
        events.execution_error(job.prompt_id, message, "comfyfleet.LaneFailure")
    )
