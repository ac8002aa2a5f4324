"""What a v2 job shows before it is over: its place in the queue and its progress.

`queue_position` (pending jobs only) is 1 for the job that goes next, as the reference
proxy counts ComfyUI's pending list. It is the job's place in the order the fleet takes
jobs: ComfyUI's (front first, then number). With fair share on (the default), tenants'
jobs interleave by their shares of the slots, which no fixed number can foretell, so
the place is counted among the job's own tenant's waiting jobs: those surely go before
it, and other tenants' queues are not disclosed. With `[fair_share] enabled = false`
there is one order for everyone, and every waiting job ahead counts. Either way the job
may also wait for a lane that can run it. The store counts (a walk of the dispatch
index up to MAX_QUEUE_POSITION, the most it reports).

`progress` (running jobs only) is the snapshot the SSE stream would push now, built
from the job's events in the event log (null when the log is off). Snapshots are kept
between reads (MAX_KEPT jobs), so a client polling a running job costs a read of the
events since its last poll; one read takes at most MAX_PAGES pages of the log, and a
long log is caught up over the next reads.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from comfyfleet.domain.jobs import Job, JobStatus
from comfyfleet.domain.prompt_events import more_after
from comfyfleet.server.gateway import Gateway

#: Jobs whose progress is kept between reads; the least recently read go first.
MAX_KEPT = 1024
#: Pages (of the event log's PAGE events) one read of a job's progress takes at most.
MAX_PAGES = 8
PAGE = 500


class Progress:
    """The whole-snapshot progress of one job, from its ComfyUI events."""

    def __init__(self, job: Job) -> None:
        self.total = max(1, len(job.prompt))
        self.kinds = {k: v.get("class_type") for k, v in job.prompt.items() if isinstance(v, dict)}
        self.restart()

    def restart(self) -> None:
        self.done: set[str] = set()
        self.node: str | None = None
        self.step: int | None = None
        self.steps: int | None = None

    def apply(self, kind: str, data: dict[str, Any]) -> bool:
        """Take one event; whether the snapshot changed."""
        if kind == "execution_start":  # a new attempt runs the graph again
            self.restart()
        elif kind == "executing":
            if self.node is not None:
                self.done.add(self.node)
            node = data.get("node")
            self.node = None if node is None else str(node)
            self.step = self.steps = None
        elif kind == "execution_cached":
            self.done.update(str(n) for n in data.get("nodes") or [] if isinstance(n, str | int))
        elif kind == "executed":
            self.done.add(str(data.get("node")))
        elif kind == "progress":
            value, most = data.get("value"), data.get("max")
            if not isinstance(value, int | float) or not isinstance(most, int | float):
                return False
            self.step, self.steps = int(value), int(most)
        else:
            return False
        return True

    def snapshot(self) -> dict[str, Any]:
        done = len(self.done)
        part = self.step / self.steps if self.step is not None and self.steps else 0.0
        value = min(1.0, max(0.0, (done + (part if self.node else 0.0)) / self.total))
        kind = self.kinds.get(self.node) if self.node else None
        message = None
        if kind and self.steps:
            message = f"{kind} {self.step}/{self.steps}"
        return {
            "value": value,
            "nodes_done": done,
            "nodes_total": self.total,
            "current_node": self.node,
            "current_node_class": kind if isinstance(kind, str) else None,
            "step": self.step,
            "steps": self.steps,
            "message": message,
        }


@dataclass
class _Kept:
    progress: Progress
    last: int  # the id of the last event it took


class ProgressReads:
    """Running jobs' progress as their logs stand, kept between reads."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, _Kept] = OrderedDict()

    async def snapshot(self, gw: Gateway, job: Job) -> dict[str, Any] | None:
        """The progress snapshot of a running job; None for any other, or with no log."""
        if job.status != JobStatus.RUNNING or gw.events is None:
            self._kept.pop(job.prompt_id, None)
            return None
        # Taken out while read: a read of the same job meanwhile starts afresh rather
        # than sharing (and mixing up) this one's state.
        kept = self._kept.pop(job.prompt_id, None) or _Kept(Progress(job), 0)
        for _ in range(MAX_PAGES):
            page = await gw.store.prompt_events(job.prompt_id, kept.last, PAGE)
            for event in page:
                if event.frame is None:  # binary frames (previews) carry no progress
                    kept.progress.apply(event.type, event.data)
                kept.last = event.id
            if not more_after(page, PAGE):
                break
        other = self._kept.get(job.prompt_id)
        if other is None or other.last < kept.last:
            self._kept[job.prompt_id] = kept
        self._kept.move_to_end(job.prompt_id)
        while len(self._kept) > MAX_KEPT:
            self._kept.popitem(last=False)
        return kept.progress.snapshot()


PROGRESS_READS = web.AppKey("comfy_api_v2_progress", ProgressReads)


async def queue_position(gw: Gateway, job: Job) -> int | None:
    """The place of a pending job in the queue (see the module's doc); None otherwise."""
    if job.status != JobStatus.PENDING:
        return None
    return await gw.store.queue_position(job.prompt_id, own_tenant=gw.config.shares.enabled)
