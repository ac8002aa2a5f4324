"""A job set aside for a busy backend goes to that backend before its start is recorded:
no commit of the gateway's store runs while the backend takes the submit (a scripted
backend on loopback notes what the store holds as it answers each submit)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from comfyfleet.domain.jobs import JobStatus
from comfyfleet.store.base import JobStore
from tests.integration.fleet.scripted import ScriptedBackend
from tests.integration.gateway.wire import poll, save_prompt, serve


@dataclass
class SlowBackend(ScriptedBackend):
    """Each prompt takes `seconds`; each submit is answered after `answer_after`, and
    notes the job as the store has it then."""

    seconds: float = 0.4
    answer_after: float = 0.1
    store: JobStore | None = None
    at_submit: dict[str, tuple[JobStatus, str | None]] = field(default_factory=dict)

    async def _submit(self, request: web.Request) -> web.Response:
        prompt_id = (await request.json())["prompt_id"]
        await asyncio.sleep(self.answer_after)  # time enough for a commit under way
        if self.store is not None:
            job = await self.store.get(prompt_id)
            assert job is not None
            self.at_submit[prompt_id] = (job.status, job.lane)
        return await super()._submit(request)

    async def _run(self, prompt_id: str) -> None:
        await asyncio.sleep(self.seconds)
        await super()._run(prompt_id)


async def test_a_reserved_job_reaches_its_backend_before_its_start_is_recorded(
    tmp_path: Path,
) -> None:
    backend = SlowBackend()
    await backend.start()
    try:
        async with serve(
            tmp_path / "gateway", local_slots=0, backends=({"url": backend.url, "name": "s0"},)
        ) as served:

            async def up() -> bool:
                listed = (await served.get("/api/fleet/backends"))["backends"]
                return [b["state"] for b in listed] == ["up"]

            await poll(up, what="the backend up")
            backend.store = served.gateway.store
            ids = [await served.submit(save_prompt(color, "r")) for color in range(3)]

            async def done() -> bool:
                jobs = [await served.gateway.store.get(p) for p in ids]
                return all(j is not None and j.status is JobStatus.SUCCESS for j in jobs)

            await poll(done, what="every job done")
            # The first was claimed (recorded running, then sent); the others were set
            # aside while the one before ran, and still pending, reserved for s0, when
            # the backend answered their submit.
            assert backend.at_submit[ids[0]][0] is JobStatus.RUNNING
            for prompt_id in ids[1:]:
                assert backend.at_submit[prompt_id] == (JobStatus.PENDING, "backend:s0")
            for prompt_id in ids:
                job = await served.gateway.store.get(prompt_id)
                assert job is not None and (job.attempt, job.lane) == (1, "backend:s0")
    finally:
        await backend.close()
