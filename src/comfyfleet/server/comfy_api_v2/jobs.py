"""Comfy API v2's jobs: submit, get, list, cancel and the job's workflow.

A v2 job is a prompt of the gateway's one queue: it is submitted the way `POST /prompt`
submits (the same validation, admission and store), so it shows in `/api/jobs`,
`/queue` and `/history`, and a prompt queued there shows here.

`Idempotency-Key` is single-use as v2 defines it: a second submit with a key the tenant
used in the last 24 hours (whatever its body) queues nothing and is refused with 422
`idempotency_key_reuse`, its `details.job_id` naming the job the first one queued. The
key is recorded with that job in the same commit (the store's idempotency keys, in a
namespace of their own: a v2 key never matches a `POST /prompt` key).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
import uuid
from typing import Any

from aiohttp import web

from comfyfleet.domain.budgets import PROMPT_BUDGET_KEY
from comfyfleet.domain.idempotency import IdempotencyKeyTaken, IdempotentRequest
from comfyfleet.domain.jobs import TERMINAL as JOB_TERMINAL
from comfyfleet.domain.jobs import Job, JobStatus
from comfyfleet.folders import Folders
from comfyfleet.protocol.prompt import is_large
from comfyfleet.server.access.auth import scope, tenant_name, visible
from comfyfleet.server.comfy_api_v2 import live, shapes
from comfyfleet.server.comfy_api_v2.assets import resolve_references
from comfyfleet.server.comfy_api_v2.errors import PREFIX, V2Error, invalid_request, not_found
from comfyfleet.server.comfyui_api.idempotency import body_digest
from comfyfleet.server.comfyui_api.prompts import clamp_to_sql, submit_prompt
from comfyfleet.server.gateway import GATEWAY
from comfyfleet.server.jobs_api.cancels import cancel_anywhere, cancelling
from comfyfleet.server.plumbing.client_json import OFF_LOOP_BYTES, RefusedJson, loads
from comfyfleet.server.plumbing.routing import Route, json_reply
from comfyfleet.spend.budget import BadBudget, prompt_budget

HEADER = "Idempotency-Key"
#: v2 keys: 1 to 255 printable ASCII characters (what the SDK sends).
_KEY = re.compile(r"[\x20-\x7e]{1,255}")
#: Stored v2 keys start with this (a space: no `POST /prompt` key holds one).
KEY_NAMESPACE = "v2 "
#: Labels on a job: at most this many pairs, keys and values at most this long.
MAX_LABELS = 16
MAX_LABEL_KEY = 64
MAX_LABEL_VALUE = 256
DEFAULT_LIMIT = 50
MAX_LIMIT = 100
#: The longest job id looked up (as POST /prompt takes them).
MAX_JOB_ID = 200
#: The extra_data fields v2 takes: a partner API key (used while running, never stored)
#: and the prompt's own paid-job budget (kept with the job: the run-time guard reads it).
EXTRA_DATA_FIELDS = frozenset({"api_key_comfy_org", PROMPT_BUDGET_KEY})


def base_url(request: web.Request) -> str:
    """The origin the client called (a trusted proxy's forwarded one, if any)."""
    return f"{request.scheme}://{request.host}"


def folders_of(request: web.Request) -> Folders:
    return request.app[GATEWAY].tenants.of(tenant_name(request))


async def own_job(request: web.Request) -> Job:
    """The job the path names, if the caller may see it; else the v2 404."""
    job_id = request.match_info["job_id"]
    if len(job_id) > MAX_JOB_ID:
        raise not_found()
    job = await request.app[GATEWAY].store.get(job_id)
    if job is None or not visible(request, job.tenant):  # another tenant's: as if unknown
        raise not_found()
    return job


async def job_reply(request: web.Request, job: Job, *, canceling: bool = False) -> dict[str, Any]:
    """The v2 Job object of `job`: `canceling` while a cancelled job is stopping (here,
    or on the gateway that runs it, asked from here)."""
    gw = request.app[GATEWAY]
    canceling = canceling or cancelling(gw, job.prompt_id)
    max_age = gw.config.history_max_age
    entry = await gw.store.history_entry(job.prompt_id) if job.status in JOB_TERMINAL else None
    outputs = await shapes.job_outputs(folders_of(request), base_url(request), entry, max_age)
    return shapes.job_body(
        job,
        outputs,
        max_age=max_age,
        canceling=canceling,
        queue_position=await live.queue_position(gw, job),
        progress=await request.app[live.PROGRESS_READS].snapshot(gw, job),
    )


# -- submit ---------------------------------------------------------------------------------


def _key(request: web.Request) -> str | None:
    values = request.headers.getall(HEADER, [])
    if not values:
        return None
    if len(values) > 1 or not _KEY.fullmatch(values[0]):
        raise invalid_request(f"{HEADER} must be one header of 1 to 255 printable ASCII characters")
    return values[0]


async def _body(request: web.Request) -> dict[str, Any]:
    limit = request.app[GATEWAY].config.max_prompt_bytes
    if (request.content_length or 0) > limit:
        raise V2Error(413, "too_large", f"The request body is larger than {limit} bytes")
    raw = await request.read()
    if len(raw) > limit:
        raise V2Error(413, "too_large", f"The request body is larger than {limit} bytes")
    try:
        if len(raw) > OFF_LOOP_BYTES:  # a large workflow is parsed off the loop
            body = await asyncio.to_thread(loads, raw)
        else:
            body = loads(raw) if raw.strip() else None
    except RefusedJson as refused:
        raise invalid_request(f"The body is not usable JSON: {refused.message}") from None
    if not isinstance(body, dict):
        raise invalid_request("The body must be a JSON object")
    return body


def _labels(body: dict[str, Any]) -> dict[str, str]:
    given = body.get("metadata")
    if given is None:
        return {}
    problem = None
    if not isinstance(given, dict):
        problem = "metadata must be an object of string labels"
    elif len(given) > MAX_LABELS:
        problem = f"metadata holds {len(given)} pairs; at most {MAX_LABELS}"
    else:
        for key, value in given.items():
            if not 0 < len(key) <= MAX_LABEL_KEY:
                problem = f"metadata key {key[:MAX_LABEL_KEY]!r}: 1 to {MAX_LABEL_KEY} characters"
            elif not isinstance(value, str) or len(value) > MAX_LABEL_VALUE:
                problem = f"metadata[{key!r}]: a string of at most {MAX_LABEL_VALUE} characters"
            if problem:
                break
    if problem:
        raise V2Error(422, "metadata_invalid", problem)
    assert isinstance(given, dict)
    return dict(given)


def _extra_data(body: dict[str, Any]) -> dict[str, Any]:
    extra = body.get("extra_data")
    if extra is None:
        return {}
    if not isinstance(extra, dict) or set(extra) - EXTRA_DATA_FIELDS:
        raise invalid_request(f"extra_data takes only api_key_comfy_org and {PROMPT_BUDGET_KEY}")
    if not isinstance(extra.get("api_key_comfy_org", ""), str):
        raise invalid_request("extra_data.api_key_comfy_org must be a string")
    try:  # checked here: a bad budget is a bad request in v2, not a refused workflow
        prompt_budget(extra)
    except BadBudget as exc:
        raise invalid_request(str(exc)) from None
    return dict(extra)


def _asset_refs(value: Any) -> list[Any]:
    """The `core/ASSET` references anywhere in a workflow."""
    stack, found = [value], []
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("__type") == "core/ASSET":
                found.append(item)
            else:
                stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _workflow(body: dict[str, Any]) -> dict[str, Any]:
    workflow = body.get("workflow")
    if not isinstance(workflow, dict) or not workflow:
        raise V2Error(422, "invalid_workflow", "workflow must be an API-format graph (an object)")
    if isinstance(workflow.get("nodes"), list) and "links" in workflow:
        raise V2Error(
            422, "workflow_format_ui", "This is a UI export: submit the API-format graph instead"
        )
    return workflow


def _no_references_left(workflow: dict[str, Any]) -> None:
    """422 for a `core/ASSET` reference where no node input takes one (deeper inside)."""
    refs = _asset_refs(workflow)
    if refs:
        ids = [str((r.get("info") or {}).get("id"))[:100] for r in refs if isinstance(r, dict)]
        raise V2Error(
            422,
            "missing_asset",
            "core/ASSET references are taken as a node's input, nowhere else",
            {"missing_ids": ids[:100]},
        )


def _refusal(answer: web.Response) -> V2Error:
    """`POST /prompt`'s refusal (ComfyUI's error shape) in v2's."""
    try:
        body = json.loads(answer.body) if isinstance(answer.body, bytes) else {}
    except ValueError:
        body = {}
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    kind = str(err.get("type") or "invalid_workflow")
    message = str(err.get("message") or "The workflow was refused")
    retry = answer.headers.get("Retry-After")
    headers = {"Retry-After": retry} if retry else None
    if answer.status == 429:
        return V2Error(429, "queue_full", message, headers=headers)
    if answer.status == 503:
        return V2Error(503, kind, message, headers=headers)
    details = {"type": kind, "details": err.get("details"), "node_errors": body.get("node_errors")}
    return V2Error(422, "invalid_workflow", message, details)


def _reused(first: IdempotentRequest, request: web.Request) -> V2Error:
    job_id = first.answer.get("prompt_id")
    return V2Error(
        422,
        "idempotency_key_reuse",
        f"This {HEADER} was used in the last 24 hours; keys are single-use: "
        "get or list the job the first request queued instead",
        {"job_id": job_id},
    )


async def submit_job(request: web.Request) -> web.Response:
    """`POST /api/v2/jobs {workflow, extra_data?, metadata?}`: 201 and the queued Job."""
    gw = request.app[GATEWAY]
    key = _key(request)
    body = await _body(request)
    large = len(await request.read()) > OFF_LOOP_BYTES  # a large workflow is walked off the loop
    workflow = await asyncio.to_thread(_workflow, body) if large else _workflow(body)
    workflow = await resolve_references(request, workflow)
    if large:
        await asyncio.to_thread(_no_references_left, workflow)
    else:
        _no_references_left(workflow)
    extra = _extra_data(body)
    found = _labels(body)
    if found:
        extra[shapes.METADATA_KEY] = found
    prompt_body = {"prompt": workflow, "prompt_id": str(uuid.uuid4()), "extra_data": extra}
    keyed = None
    if key is not None:
        keyed = (KEY_NAMESPACE + key, await body_digest(request, body))
        first = await gw.store.idempotent_request(tenant_name(request), keyed[0])
        if first is not None:
            raise _reused(first, request)
    try:
        answer = await submit_prompt(request, gw, prompt_body, keyed)
    except IdempotencyKeyTaken as taken:  # a request with this key queued meanwhile
        raise _reused(taken.first, request) from None
    if isinstance(answer, web.Response):
        raise _refusal(answer)
    job = await gw.store.get(answer["prompt_id"])
    if job is None:  # pruned or deleted at once: say what was queued
        raise not_found()
    return web.json_response(await job_reply(request, job), status=201)


# -- get, cancel, workflow ------------------------------------------------------------------


async def get_job(request: web.Request) -> web.Response:
    return web.json_response(await job_reply(request, await own_job(request)))


async def cancel_job(request: web.Request) -> web.Response:
    """Idempotent: a queued job leaves the queue (canceled), a running one is interrupted
    (`canceling` until it has stopped, then canceled); a finished one stays as it ended."""
    gw = request.app[GATEWAY]
    job = await own_job(request)
    if job.status in JOB_TERMINAL:
        return web.json_response(await job_reply(request, job))
    await cancel_anywhere(gw, [job.prompt_id])
    now = await gw.store.get(job.prompt_id) or job
    return web.json_response(await job_reply(request, now))


async def job_workflow(request: web.Request) -> web.Response:
    """The API-format graph the job ran (as validated: what `/history` shows)."""
    job = await own_job(request)
    return await json_reply({"workflow": job.prompt, "format": "api"}, large=is_large(job.prompt))


# -- list -----------------------------------------------------------------------------------


def _cursor(text: str | None) -> tuple[int, int | None]:
    """(offset, total when the listing started) of a cursor this server handed out."""
    if not text:  # none, or empty: the first page
        return 0, None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)) if len(text) <= 200 else b""
        value = json.loads(raw.decode())
        offset, total = value["o"], value["t"]
        if isinstance(offset, int) and isinstance(total, int) and offset >= 0 and total >= 0:
            return clamp_to_sql(offset), clamp_to_sql(total)
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError):
        pass
    raise V2Error(400, "invalid_cursor", "cursor is not one this server handed out")


def _next_cursor(offset: int, total: int) -> str:
    raw = json.dumps({"o": offset, "t": total}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_FILTER = re.compile(r"metadata\[(.{1,64})\]", re.DOTALL)


def _list_params(request: web.Request) -> tuple[int, list[JobStatus] | None, dict[str, str]]:
    query = request.query
    try:
        limit = int(query.get("limit", DEFAULT_LIMIT))
    except ValueError:
        raise invalid_request("limit must be an integer") from None
    if limit < 1:
        raise invalid_request(f"limit must be 1 to {MAX_LIMIT}")
    statuses = None
    if "status" in query:
        names = query["status"].split(",")
        unknown = [n for n in names if n not in shapes.FROM_V2]
        if unknown:
            raise invalid_request(
                f"unknown status {unknown[0][:40]!r}; use {', '.join(shapes.FROM_V2)}"
            )
        statuses = [s for n in names for s in shapes.FROM_V2[n]]
    wanted: dict[str, str] = {}
    for name, value in query.items():
        if name.startswith("metadata"):
            match = _FILTER.fullmatch(name)
            if match is None or len(wanted) >= MAX_LABELS:
                raise V2Error(
                    400,
                    "invalid_metadata_filter",
                    f"filter as metadata[KEY]=VALUE: at most {MAX_LABELS} keys, "
                    "each of 1 to 64 characters",
                )
            wanted[match.group(1)] = value
    return min(limit, MAX_LIMIT), statuses, wanted


async def list_jobs(request: web.Request) -> web.Response:
    """Newest first, a page at a time: `next_cursor` leads to the next page (absent on
    the last). Jobs created after the first page do not shift the pages that follow."""
    limit, statuses, wanted = _list_params(request)
    offset, first_total = _cursor(request.query.get("cursor"))
    store = request.app[GATEWAY].store
    page_args: dict[str, Any] = {
        "statuses": statuses,
        "newest_first": True,
        "tenant": scope(request),
    }
    if statuses == []:  # only statuses no job of this gateway has
        return web.json_response({"jobs": []})
    jobs, total = await store.jobs(limit=limit, offset=offset, **page_args)
    if first_total is not None and total > first_total:  # newer jobs came in front
        offset = clamp_to_sql(offset + total - first_total)
        jobs, total = await store.jobs(limit=limit, offset=offset, **page_args)
    shown = [
        shapes.job_summary(job)
        for job in jobs
        if all(shapes.labels(job).get(k) == v for k, v in wanted.items())
    ]
    reply: dict[str, Any] = {"jobs": shown}
    if jobs and offset + len(jobs) < total:
        reply["next_cursor"] = _next_cursor(offset + len(jobs), total)
    return web.json_response(reply)


def v2_job_routes() -> list[Route]:
    return [
        Route("POST", f"{PREFIX}/jobs", submit_job),
        Route("GET", f"{PREFIX}/jobs", list_jobs),
        Route("GET", f"{PREFIX}/jobs/{{job_id}}", get_job),
        Route("POST", f"{PREFIX}/jobs/{{job_id}}/cancel", cancel_job),
        Route("GET", f"{PREFIX}/jobs/{{job_id}}/workflow", job_workflow),
    ]
