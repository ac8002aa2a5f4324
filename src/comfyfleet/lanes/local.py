"""The local lane: prompts run in the built-in engine, in this process."""

from __future__ import annotations

import asyncio
import logging
import os

from comfyfleet.children.graph import PARENT_KEY
from comfyfleet.domain.jobs import Job, JobResult, JobStatus, OutputFile
from comfyfleet.engine.events import EventSink
from comfyfleet.engine.executor import Engine
from comfyfleet.engine.run import ExecutionRequest, ExecutionResult, RunHandle
from comfyfleet.folders import Folders, UnsafePath
from comfyfleet.lanes.base import Adopt, adopt_none
from comfyfleet.lanes.outputs import output_files
from comfyfleet.lanes.uploads import FetchInputs, UploadInputs
from comfyfleet.tenants import TenantFolders

log = logging.getLogger(__name__)

STATUS = {
    "success": JobStatus.SUCCESS,
    "error": JobStatus.ERROR,
    "interrupted": JobStatus.INTERRUPTED,
}


class LocalLane:
    in_process = True
    retry_node_errors = False  # the engine is deterministic: a node error is the prompt's
    only_tenant: str | None = None

    def __init__(
        self,
        engine: Engine,
        slots: int,
        name: str = "local",
        tenants: TenantFolders | None = None,
        fetch_inputs: FetchInputs | None = None,
    ) -> None:
        self.engine = engine
        self.slots = self.runs_at_once = slots
        self.name = name
        self.tenants = tenants  # each job runs on its tenant's folders (else the engine's)
        self.fetch_inputs = fetch_inputs  # files another gateway holds, brought here first
        self._uploads = UploadInputs()

    async def wait_ready(self) -> None:
        return None

    async def start(self, adopt: Adopt = adopt_none) -> None:
        return None

    async def resume(self, job: Job, sink: EventSink, handle: RunHandle) -> JobResult | None:
        return None  # in-process work does not outlive the process

    def can_run(self, job: Job) -> bool:
        # A child prompt never runs here: its parent waits here, holding a slot.
        if PARENT_KEY in job.extra_data:
            return False
        registry = self.engine.registry
        return all(node.get("class_type") in registry for node in job.prompt.values())

    async def run(self, job: Job, sink: EventSink, handle: RunHandle) -> JobResult:
        request = ExecutionRequest(job.prompt_id, job.prompt, job.outputs, job.extra_data)
        folders = None if self.tenants is None else await self.tenants.ready(job.tenant)
        if self.fetch_inputs is not None:
            values = await self._uploads.values(self.engine.registry, job.prompt)
            if values:
                await self.fetch_inputs(values, folders or self.engine.folders, job.tenant)
        result = await self.engine.execute(request, sink, handle, folders)
        return job_result(result)

    async def discard_outputs(self, job: Job, result: JobResult) -> None:
        folders = self.engine.folders if self.tenants is None else self.tenants.of(job.tenant)
        removed = await asyncio.to_thread(remove_files, folders, result.files)
        if removed:
            log.warning(
                "removed %d files of attempt %d of %s: its end was not recorded",
                removed,
                job.attempt,
                job.prompt_id,
            )

    async def close(self) -> None:
        self.engine.close()


def remove_files(folders: Folders, files: list[OutputFile]) -> int:
    """Remove `files`: the entry itself (a link, not what it points to), and only when
    its folder, links resolved, lies in `folders`. Returns how many were removed."""
    removed = 0
    for item in files:
        try:
            relative = os.path.join(item.subfolder, item.filename)
            folders.resolve_inside(item.type, relative, follow_last=False).unlink()
        except UnsafePath as exc:
            log.warning("left a file alone: %s", exc)
            continue
        except OSError:
            continue
        removed += 1
    return removed


def job_result(result: ExecutionResult) -> JobResult:
    return JobResult(
        status=STATUS[result.status],
        outputs=result.outputs,
        meta=result.meta,
        messages=result.messages,
        error=result.error,
        files=output_files(result.outputs),
    )
