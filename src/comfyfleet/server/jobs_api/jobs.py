"""The jobs API: one view of every job, pending to finished, with cancel."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sized
from typing import Any

from aiohttp import web

from comfyfleet.children.graph import PARENT_KEY
from comfyfleet.domain.jobs import HistoryEntry, Job, JobStatus
from comfyfleet.server.access.auth import scope, visible
from comfyfleet.server.comfyui_api.prompts import clamp_to_sql, own_ids
from comfyfleet.server.gateway import GATEWAY
from comfyfleet.server.jobs_api.cancels import cancel_anywhere
from comfyfleet.server.jobs_api.previews import NONE, OutputsSummary, summarize
from comfyfleet.server.plumbing.client_json import read_json
from comfyfleet.server.plumbing.routing import Route

#: Job states as the jobs API names them.
API_STATUS = {
    JobStatus.PENDING: "pending",
    JobStatus.RUNNING: "in_progress",
    JobStatus.SUCCESS: "completed",
    JobStatus.ERROR: "failed",
    JobStatus.INTERRUPTED: "interrupted",
    JobStatus.CANCELLED: "cancelled",
}
FROM_API = {name: status for status, name in API_STATUS.items()}
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


def _workflow_id(extra_data: dict[str, Any]) -> str | None:
    """The editor's id of the workflow the prompt came from, as ComfyUI reports it."""
    workflow = (extra_data.get("extra_pnginfo") or {}).get("workflow")
    found = workflow.get("id") if isinstance(workflow, dict) else None
    return found if isinstance(found, str) else None


def listed_error(error: dict[str, Any] | None) -> dict[str, Any] | None:
    """A failure's `execution_error` as the jobs API lists it: its node fields strings.

    ComfyUI fails a prompt only inside a node, so its jobs API always names one, and the
    newer editor (1.58) parses `node_id` and `node_type` as strings: one null drops the
    whole page of jobs from its queue and assets panels. A job failed outside any node
    (its lanes lost, say) has none: "" here, which that editor reads as no node at fault
    (as it reads a null `node_id` in the `execution_error` frame). Done here, not where
    the error is made: the frame and `/history` keep null, which both editors accept,
    and jobs stored before are listed too.
    """
    if error is None:
        return None
    node_id, node_type = error.get("node_id"), error.get("node_type")
    return {
        **error,
        "node_id": "" if node_id is None else str(node_id),
        "node_type": "" if node_type is None else str(node_type),
    }


def job_summary(job: Job, outputs: OutputsSummary = NONE) -> dict[str, Any]:
    extra = job.extra_data if isinstance(job.extra_data, dict) else {}
    return {
        "id": job.prompt_id,
        "status": API_STATUS[job.status],
        "number": job.number,
        "front": job.front,
        "client_id": job.client_id,
        "attempt": job.attempt,
        "lane": None if job.status == JobStatus.PENDING else job.lane,  # not a reservation
        # The gateway that ran (or runs) its last attempt, among several sharing the store.
        "gateway": None if job.status == JobStatus.PENDING else job.owner,
        "create_time": _ms(job.created_at),
        "execution_start_time": _ms(job.started_at),
        "execution_end_time": _ms(job.finished_at),
        "outputs_to_execute": job.outputs,
        # Only a failure's: an interrupted job's payload is no error, and the editor drops
        # the whole list when one is given here (ComfyUI gives none either).
        "execution_error": listed_error(job.error) if job.status == JobStatus.ERROR else None,
        # ComfyUI's fields, which the editor's queue and assets panels require.
        "priority": job.number,
        "workflow_id": _workflow_id(extra),
        # A child prompt of "Run on the Fleet" / "Tiles on the Fleet": its parent's id.
        "parent": parent_of(extra),
        **outputs.fields(),
    }


def parent_of(extra_data: Any) -> str | None:
    """The parent a child prompt's extra_data names, else None."""
    if not isinstance(extra_data, dict):
        return None
    named = extra_data.get(PARENT_KEY)
    return str(named["prompt_id"]) if isinstance(named, dict) and "prompt_id" in named else None


def job_detail(job: Job, entry: HistoryEntry | None) -> dict[str, Any]:
    detail = job_summary(job, summarize(entry.result.outputs) if entry else NONE)
    detail["prompt"] = job.prompt
    detail["extra_data"] = job.extra_data
    detail["outputs"] = entry.result.outputs if entry else {}
    detail["meta"] = entry.result.meta if entry else {}
    detail["messages"] = entry.result.messages if entry else []
    return detail


def page(offset: int, limit: int, shown: Sized, total: int) -> dict[str, Any]:
    """The `pagination` object of a page of `shown` items out of `total`."""
    return {
        "offset": offset,
        "limit": limit,
        "total": total,
        "has_more": offset + len(shown) < total,
    }


def _query_error(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        # json.dumps: the message quotes client text, which may hold quotes or controls.
        text=json.dumps({"error": {"type": "invalid_query", "message": message}}),
        content_type="application/json",
    )


def _page_params(request: web.Request) -> tuple[list[JobStatus] | None, bool, int, int]:
    query = request.query
    statuses = None
    if query.get("status"):
        names = [s.strip() for s in query["status"].split(",") if s.strip()]
        unknown = [n for n in names if n not in FROM_API]
        if unknown:
            raise _query_error(f"unknown status {unknown[0]}; use {', '.join(FROM_API)}")
        statuses = [FROM_API[n] for n in names]
    order = query.get("sort_order", "desc")
    if query.get("sort_by", "created_at") != "created_at" or order not in ("asc", "desc"):
        raise _query_error("sort_by must be created_at and sort_order asc or desc")
    try:
        limit = int(query.get("limit", DEFAULT_LIMIT))
        offset = int(query.get("offset", 0))
    except ValueError:
        raise _query_error("limit and offset must be integers") from None
    if limit < 1 or offset < 0:
        raise _query_error("limit must be >= 1 and offset >= 0")
    return statuses, order == "desc", min(limit, MAX_LIMIT), clamp_to_sql(offset)


async def list_jobs(request: web.Request) -> web.Response:
    statuses, newest_first, limit, offset = _page_params(request)
    jobs, total = await request.app[GATEWAY].store.jobs(
        statuses=statuses,
        newest_first=newest_first,
        limit=limit,
        offset=offset,
        tenant=scope(request),
    )
    summaries = await asyncio.gather(*(_outputs_of(request, job) for job in jobs))
    return web.json_response(
        {
            "jobs": [job_summary(job, out) for job, out in zip(jobs, summaries, strict=True)],
            "pagination": page(offset, limit, jobs, total),
        }
    )


async def _outputs_of(request: web.Request, job: Job) -> OutputsSummary:
    if job.status in (JobStatus.PENDING, JobStatus.RUNNING):
        return NONE  # no history entry yet
    entry = await request.app[GATEWAY].store.history_entry(job.prompt_id)
    return summarize(entry.result.outputs) if entry else NONE


def _no_such_job() -> web.HTTPNotFound:
    return web.HTTPNotFound(
        text='{"error": {"type": "not_found", "message": "No such job"}}',
        content_type="application/json",
    )


async def get_job(request: web.Request) -> web.Response:
    store = request.app[GATEWAY].store
    job = await store.get(request.match_info["job_id"])
    if job is None or not visible(request, job.tenant):  # another tenant's: as if unknown
        raise _no_such_job()
    return web.json_response(job_detail(job, await store.history_entry(job.prompt_id)))


async def cancel_job(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    job_id = request.match_info["job_id"]
    job = await gw.store.get(job_id)
    if job is None or not visible(request, job.tenant):
        raise _no_such_job()
    cancelled = await cancel_anywhere(gw, [job_id])
    return web.json_response({"cancelled": cancelled})


async def cancel_jobs(request: web.Request) -> web.Response:
    body = await read_json(request)
    ids = body.get("job_ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise _query_error("job_ids must be a list of job ids")
    cancelled = await cancel_anywhere(request.app[GATEWAY], await own_ids(request, ids))
    return web.json_response({"cancelled": cancelled})


def job_routes() -> list[Route]:
    return [
        Route("GET", "/api/jobs", list_jobs),
        Route("POST", "/api/jobs/cancel", cancel_jobs),
        Route("GET", "/api/jobs/{job_id}", get_job),
        Route("POST", "/api/jobs/{job_id}/cancel", cancel_job),
    ]
