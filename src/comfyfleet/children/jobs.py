"""What the "Run on the Fleet" node asks of the queue it sends child prompts to.

The gateway's engine gets an implementation that queues children in-process, as the
parent's tenant (server/comfyui_api/children.py). Node code reaches it by CHILD_JOBS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from comfyfleet.engine.services import ServiceKey
from comfyfleet.errors import ComfyfleetError


@dataclass(frozen=True)
class ChildRequest:
    """One child prompt of `parent` (a prompt id), made for its node `node_id`, the
    `index`-th of its batch."""

    parent: str
    node_id: str
    index: int
    prompt: dict[str, Any]

    @property
    def key(self) -> str:
        """Its idempotency key: the same child queued twice (the parent run again after a
        restart) is the same job, never a second one."""
        return f"fleet-child:{self.parent}:{self.node_id}:{self.index}"


class ChildFailed(ComfyfleetError, RuntimeError):
    """A child prompt was refused, or ended other than in success; the message says why."""


class ChildJobs(Protocol):
    async def queue(self, child: ChildRequest) -> str:
        """Queue `child` (or find it queued before): its prompt id. ChildFailed if refused."""
        ...

    async def outcome(self, prompt_id: str) -> dict[str, Any]:
        """Once the child ends: its history entry (ChildFailed unless it succeeded)."""
        ...

    async def file(self, prompt_id: str, ref: dict[str, Any]) -> bytes:
        """A file the child made (`filename`, `subfolder`, `type` as its history lists
        it), read whole; ChildFailed if it is gone or too large."""
        ...

    async def put_input(self, parent: str, name: str, data: bytes) -> str:
        """Keep `data` as file `name` of the input folder of `parent`'s tenant, for its
        children to load: the name to load it by."""
        ...

    async def drop_inputs(self, parent: str, names: list[str]) -> None:
        """Remove files `put_input` kept (their children have ended)."""
        ...

    async def cancel(self, prompt_ids: list[str]) -> None:
        """Cancel these children wherever they are (queued or running)."""
        ...


CHILD_JOBS: ServiceKey[ChildJobs] = ServiceKey("child_jobs")
#: The gateway's route that removes a tile a ComfyUI put there (DELETE .../{name}).
TILES_ROUTE = "/comfyfleet/tiles"
