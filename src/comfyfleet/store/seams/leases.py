"""Gateways sharing one store: leases, take-over of the jobs of lapsed ones, wake-ups."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from comfyfleet.domain.gateways import GatewayRecord
from comfyfleet.domain.jobs import DispatchKey, Job

#: Told that work became claimable: by which gateway, and where in the queue (see
#: `watch_work`).
WorkWake = Callable[[str, DispatchKey | None], None]


class GatewayLeases(Protocol):
    """Several gateways on one store: each claims as `owner`, and its lease (renewed by
    heartbeat) covers every job it runs. Once a lease has run out, the jobs it covered
    are orphaned: another gateway re-queues or adopts them, fenced by attempt."""

    #: The gateway this store claims for: claims, hand-offs and starts record it.
    owner: str

    async def join(
        self, gateway: GatewayRecord, lease: float, *, replace: str | None = None
    ) -> None:
        """Register `gateway` (its id is `owner`) with a lease of `lease` seconds.
        GatewayIdInUse when another instance with that id still holds a lease, unless
        that instance is `replace` (known to be dead: its process is gone)."""

    async def heartbeat(self, lease: float) -> bool:
        """Renew the lease; False when this instance is no longer registered (another
        instance took the id over after the lease ran out)."""

    async def leave(self) -> None:
        """Unregister (a clean stop: its jobs were finished or re-queued)."""

    async def gateways(self) -> list[GatewayRecord]:
        """Every gateway whose lease holds, with the number of jobs each runs, by id."""

    async def fleet_key(self, name: str, candidate: bytes) -> bytes:
        """The secret stored under `name` that every gateway on this store shares:
        `candidate` is stored when there is none yet (the first caller's wins)."""

    async def reserve_file_counter(self, key: str, floor: int, count: int) -> int:
        """Reserve `count` output name counters for `key` (a folder and file name prefix,
        the same on every gateway); returns the first, never below `floor` (one past the
        highest this gateway's folder holds), never one handed out before."""

    async def orphaned(self) -> list[Job]:
        """Jobs whose owner's lease has run out (or that have no owner): running ones, in
        start order, and pending ones set aside for a lane (a reservation, which
        `unreserve` gives back). None of them is another live gateway's."""

    async def requeue_orphaned(self, job: Job) -> bool:
        """Put an orphaned job back to pending (its run died with its gateway), fenced:
        False when it is no longer running at `job.attempt` or no longer orphaned."""

    async def adopt(self, job: Job) -> Job | None:
        """Make an orphaned job this gateway's to follow where it runs (a backend): owner,
        and attempt + 1 so the old owner's writes are refused. None when it is no longer
        orphaned at `job.attempt`. The attempt note says it was adopted, not failed."""

    async def watch_work(self, wake: WorkWake) -> None:
        """Call `wake(owner, key)` on the event loop whenever a job becomes claimable in
        the store (queued, re-queued, given back), `owner` being the gateway that did it
        and `key` the job's `dispatch_key` when the store tells it (None: one or more
        jobs, place unknown): in-process with SQLite, by LISTEN/NOTIFY with PostgreSQL."""
