"""The engine: validates and runs many prompts at once in one process."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from comfyfleet.engine.cache import OutputCache
from comfyfleet.engine.events import EventSink, discard
from comfyfleet.engine.file_counters import FILE_COUNTERS, FileCounters
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.engine.run import ExecutionRequest, ExecutionResult, PromptRun, RunHandle
from comfyfleet.engine.services import Services, using_services
from comfyfleet.engine.validation import ValidationResult, validate_prompt
from comfyfleet.folders import Folders, using_folders


class Engine:
    """Validation and execution over one node registry, output cache and thread pool.

    Every `execute` call is independent: its own events sink, its own
    interrupt handle, its own progress. Node functions that are not `async`
    run in the engine's worker threads, never on the event loop.
    """

    def __init__(
        self,
        registry: NodeRegistry,
        folders: Folders,
        *,
        cache_entries: int = 1024,
        worker_threads: int = 16,
        services: Services | None = None,
    ) -> None:
        self.registry = registry
        # What node code can reach besides its inputs (see engine.services).
        self.services = Services()
        self.services.add(FILE_COUNTERS, FileCounters())
        if services is not None:
            self.services.update(services)
        self.folders = folders
        self._folders_ready = False
        self.cache = OutputCache(cache_entries)
        self._executor = ThreadPoolExecutor(worker_threads, thread_name_prefix="comfyfleet-node")

    async def validate(
        self, prompt: Any, partial_targets: list[str] | None = None
    ) -> ValidationResult:
        with using_folders(self.folders), using_services(self.services):
            return await validate_prompt(self.registry, prompt, partial_targets)

    async def execute(
        self,
        request: ExecutionRequest,
        sink: EventSink = discard,
        handle: RunHandle | None = None,
        folders: Folders | None = None,
    ) -> ExecutionResult:
        """Run a validated prompt. `folders`: where its files are (a tenant's), when not
        the engine's own; cached outputs name files, so they are kept apart per folders."""
        cache = self.cache
        if folders is None or folders == self.folders:
            folders = self.folders
            if not self._folders_ready:  # created on first run: validating writes nothing
                self.folders.ensure()
                self._folders_ready = True
        else:
            cache = self.cache.scoped(str(folders.output))
        with using_folders(folders), using_services(self.services):
            run = PromptRun(
                self.registry, cache, self._executor, request, sink, handle or RunHandle()
            )
            return await run.run()

    async def run_prompt(
        self,
        prompt: Any,
        *,
        prompt_id: str | None = None,
        partial_targets: list[str] | None = None,
        extra_data: dict[str, Any] | None = None,
        sink: EventSink = discard,
        handle: RunHandle | None = None,
    ) -> tuple[ValidationResult, ExecutionResult | None]:
        """Validate, then run the outputs that validated (None when nothing did)."""
        checked = await self.validate(prompt, partial_targets)
        if not checked.ok:
            return checked, None
        request = ExecutionRequest(
            prompt_id or str(uuid.uuid4()), checked.prompt, checked.outputs, extra_data or {}
        )
        return checked, await self.execute(request, sink, handle)

    def object_info(
        self, class_type: str | None = None, folders: Folders | None = None
    ) -> dict[str, Any]:
        """ComfyUI's `/object_info` (all nodes) or `/object_info/{class}` ({} when unknown),
        listing the files of `folders` (default: the engine's own)."""
        with using_folders(folders or self.folders):
            return self.registry.object_info(class_type)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
