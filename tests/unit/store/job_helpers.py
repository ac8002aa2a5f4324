"""Jobs and results the contract suites submit and finish, through the public interface."""

from __future__ import annotations

from typing import Any

from comfyfleet.domain.jobs import Job, JobResult, JobStatus, NewJob, OutputFile
from comfyfleet.store.base import JobStore
from tests.unit.store.stores import claim_next


def new_job(prompt_id: str, number: float | None = 1, *, front: bool = False, **kw: Any) -> NewJob:
    prompt = kw.pop("prompt", {"1": {"class_type": "Noop", "inputs": {"tag": prompt_id}}})
    return NewJob(prompt_id, number, front, prompt, kw.pop("extra_data", {}), ["1"], **kw)


def result(
    status: JobStatus = JobStatus.SUCCESS, *, files: list[OutputFile] | None = None, **kw: Any
) -> JobResult:
    messages = kw.pop("messages", [["execution_start", {"prompt_id": "x", "timestamp": 1}]])
    return JobResult(
        status,
        kw.pop("outputs", {}),
        kw.pop("meta", {}),
        messages,
        kw.pop("error", None),
        files or [],
    )


async def run_one(store: JobStore, job_result: JobResult | None = None) -> Job:
    """Claim the next job and finish it."""
    job = await claim_next(store, "lane")
    assert job is not None
    assert await store.finish(job.prompt_id, job.attempt, job_result or result())
    return job


def assert_started(job: Job | None, lane: str, now: float) -> None:
    """A first attempt, running on `lane` since `now`."""
    assert job is not None
    assert (job.status, job.attempt, job.lane, job.started_at) == (JobStatus.RUNNING, 1, lane, now)


async def history_ids(store: JobStore, *args: int | None) -> list[str]:
    return [entry.job.prompt_id for entry in await store.history(*args)]


def output_files(prompt_id: str) -> list[OutputFile]:
    """The files a job of that id writes: one output, one temp."""
    return [
        OutputFile(f"{prompt_id}.png", "", "output"),
        OutputFile(f"{prompt_id}.tmp", "t", "temp"),
    ]
