"""The local lane: prompts run in the built-in engine, in this process."""

from __future__ import annotations

from typing import Any

from comfyfleet.engine.events import EventSink
from comfyfleet.engine.executor import Engine
from comfyfleet.engine.run import ExecutionRequest, ExecutionResult, RunHandle
from comfyfleet.store.records import Job, JobResult, JobStatus, OutputFile

STATUS = {
    "success": JobStatus.SUCCESS,
    "error": JobStatus.ERROR,
    "interrupted": JobStatus.INTERRUPTED,
}


class LocalLane:
    def __init__(self, engine: Engine, slots: int, name: str = "local") -> None:
        self.engine = engine
        self.slots = slots
        self.name = name

    def can_run(self, job: Job) -> bool:
        registry = self.engine.registry
        return all(node.get("class_type") in registry for node in job.prompt.values())

    async def run(self, job: Job, sink: EventSink, handle: RunHandle) -> JobResult:
        request = ExecutionRequest(job.prompt_id, job.prompt, job.outputs, job.extra_data)
        result = await self.engine.execute(request, sink, handle)
        return job_result(result)

    async def close(self) -> None:
        self.engine.close()


def job_result(result: ExecutionResult) -> JobResult:
    return JobResult(
        status=STATUS[result.status],
        outputs=result.outputs,
        meta=result.meta,
        messages=result.messages,
        error=result.error,
        files=output_files(result.outputs),
    )


def output_files(outputs: dict[str, Any]) -> list[OutputFile]:
    """The files a prompt's UI outputs name (images, gifs, videos, ...)."""
    files = []
    for ui in outputs.values():
        if not isinstance(ui, dict):
            continue
        for items in ui.values():
            for item in items if isinstance(items, list) else ():
                if isinstance(item, dict) and isinstance(item.get("filename"), str):
                    files.append(
                        OutputFile(
                            item["filename"], item.get("subfolder", ""), item.get("type", "output")
                        )
                    )
    return files
