"""ComfyUI's queue routes: /prompt, /queue, /history, /interrupt."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from aiohttp import web

from comfyfleet import comfyui_pack
from comfyfleet.children.graph import (
    PARENT_KEY,
    ChildGraph,
    ChildGraphError,
    ChildGraphTooLarge,
    needs_split,
    probe_child,
    result_node,
    split_parent,
)
from comfyfleet.domain.idempotency import IdempotencyKeyTaken, IdempotentRequest
from comfyfleet.domain.jobs import (
    HOLD_KEY,
    HOLDS_FEATURE,
    HOLDS_ROUTE,
    MAX_HOLD,
    Job,
    NewJob,
    hold_seconds,
)
from comfyfleet.engine.validation import ValidationResult
from comfyfleet.errors import ClientError
from comfyfleet.fanout.secrets import scrub_new_job
from comfyfleet.protocol.errors import error, prompt_error_body
from comfyfleet.protocol.json_text import dumps
from comfyfleet.protocol.prompt import LARGE_PROMPT_NODES, is_large, is_link
from comfyfleet.scheduler.admission import QueueFull
from comfyfleet.server.access.auth import scope, tenant_name, visible
from comfyfleet.server.comfyui_api.costs import budget_refusal, cost_answer
from comfyfleet.server.comfyui_api.idempotency import (
    REPLAYED_HEADER,
    body_digest,
    idempotency_key,
    reused_key,
)
from comfyfleet.server.comfyui_api.waits import WAITS, wait_seconds
from comfyfleet.server.gateway import GATEWAY, Gateway
from comfyfleet.server.jobs_api.cancels import interrupt_anywhere
from comfyfleet.server.plumbing.client_json import read_json
from comfyfleet.server.plumbing.middleware import STORE_RETRY_AFTER
from comfyfleet.server.plumbing.routing import Route, empty_ok, json_reply
from comfyfleet.spend.holds import PAID_ROUTE, paid_answer
from comfyfleet.store.base import DuplicateJob, StoreError
from comfyfleet.webhooks.addresses import NotAllowed
from comfyfleet.webhooks.submit import check_prompt_webhook

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Prompt ids one word of a gateway about its held prompts may name.
MAX_KEPT = 10_000
#: The largest integer SQLite stores; larger counts and offsets are clamped to it.
SQL_INT_MAX = 2**63 - 1
#: ComfyUI's own cap for GET /history without max_items.
HISTORY_DEFAULT_MAX = 10_000
#: extra_data keys that carry credentials: used while running, never stored.
SENSITIVE_EXTRA_DATA_KEYS = ("auth_token_comfy_org", "api_key_comfy_org")


def bad_request(type_: str, message: str, details: str = "") -> web.Response:
    return web.json_response(prompt_error_body(error(type_, message, details)), status=400)


async def post_prompt(request: web.Request) -> web.Response:
    """Queue a prompt. With `Idempotency-Key`, a repeat of a request gets its first answer
    (see idempotency.py); with `?wait=SECONDS`, the answer is the history entry once the
    prompt ends, or a 202 with the usual answer when the wait runs out (see waits.py)."""
    gw = request.app[GATEWAY]
    try:
        wait = wait_seconds(request)
        key = idempotency_key(request)
    except ClientError as exc:
        return bad_request(exc.type, exc.message, exc.details)
    body = await read_json(request, gw.config.max_prompt_bytes)
    if not isinstance(body, dict):
        return bad_request("invalid_prompt", "The request body must be a JSON object")
    keyed = None
    if key is not None:
        keyed = (key, await body_digest(request, body))
        first = await gw.store.idempotent_request(tenant_name(request), key)
        if first is not None:
            return await _repeated(request, first, keyed[1], wait)
    try:
        answer = await submit_prompt(request, gw, body, keyed)
    except IdempotencyKeyTaken as taken:  # a request with this key queued meanwhile
        assert keyed is not None
        return await _repeated(request, taken.first, keyed[1], wait)
    if isinstance(answer, web.Response):
        return answer
    return await _answered(request, answer, wait)


async def submit_prompt(
    request: web.Request, gw: Gateway, body: dict[str, Any], keyed: tuple[str, str] | None
) -> dict[str, Any] | web.Response:
    """Validate and queue the prompt of `body` (a `POST /prompt` body) for the request's
    tenant: see `submit_as`. The Comfy API v2 submits through here too."""
    return await submit_as(tenant_name(request), gw, body, keyed)


async def submit_as(
    tenant: str,
    gw: Gateway,
    body: dict[str, Any],
    keyed: tuple[str, str] | None,
    parent: dict[str, Any] | None = None,
) -> dict[str, Any] | web.Response:
    """Validate and queue the prompt of `body` (a `POST /prompt` body) as `tenant`'s:
    ComfyUI's answer, or the error response. With `keyed` (key, body digest), the key is
    stored with the job (IdempotencyKeyTaken when the tenant used it meanwhile). With
    `parent`, the job is a child prompt of the parent it names (children.graph)."""
    try:
        # A keyed request's answer (with its number) is stored as the job is queued: its
        # number is taken first. Any other is numbered by the store as it queues it.
        number, front = await _queue_number(gw, body, counted_now=keyed is not None)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float's range
        return bad_request(
            "invalid_prompt", "number must be a number", _short_repr(body.get("number"))
        )
    accepted = await _accepted(tenant, gw, body, number, front)
    if isinstance(accepted, web.Response):
        if number is None:
            await _count_refused(gw)
        return accepted
    new, node_errors = accepted
    if parent is not None:
        new = replace(new, extra_data={**new.extra_data, PARENT_KEY: parent})
    return await _queued(gw, new, node_errors, keyed)


async def _count_refused(gw: Gateway) -> None:
    """Advance the counter for a counted request refused before the store saw it, as
    ComfyUI does for every request refused."""
    try:
        await gw.store.next_number()
    except StoreError as exc:
        log.warning("the counter did not advance for a refused prompt: %s", exc)


async def _accepted(
    tenant: str, gw: Gateway, body: dict[str, Any], number: float | None, front: bool
) -> tuple[NewJob, dict[str, Any]] | web.Response:
    """The job to queue and its node errors, once checked (valid, its webhook allowed, its
    budget not spent); else the error response."""
    checked = await _validated(tenant, gw, body)
    if isinstance(checked, web.Response):
        return checked
    new = _new_job(body, checked.prompt, checked.outputs, checked.node_errors, number, front)
    if isinstance(new, web.Response):
        return new
    try:
        await check_prompt_webhook(new.extra_data, gw.webhooks.settings)
    except NotAllowed as exc:
        return bad_request("invalid_webhook", str(exc))
    refused = await budget_refusal(gw, checked, new.extra_data, tenant)
    if refused is not None:
        return refused
    return replace(new, tenant=tenant), checked.node_errors


async def _queued(
    gw: Gateway, new: NewJob, node_errors: dict[str, Any], keyed: tuple[str, str] | None
) -> dict[str, Any] | web.Response:
    """ComfyUI's answer once `new` is queued, or the error response."""
    answer = {"prompt_id": new.prompt_id, "number": new.number, "node_errors": node_errors}
    keyed_request = None if keyed is None else IdempotentRequest(*keyed, answer)
    keyed_job = replace(new, idempotency=keyed_request)
    # Typed keys stay out of storage.
    new = await _walking(new.prompt, lambda: scrub_new_job(gw.engine, keyed_job))
    try:
        queued = await gw.scheduler.submit(new)
    except DuplicateJob:
        return bad_request(
            "duplicate_prompt_id", "A prompt with this prompt_id already exists", new.prompt_id
        )
    except QueueFull as full:  # the whole queue's limit, or the tenant's cap (no one else's data)
        body = prompt_error_body(error("queue_full", full.message, str(full)))
        return web.json_response(
            body, status=429, headers={"Retry-After": str(max(1, round(full.retry_after)))}
        )
    except StoreError as exc:  # e.g. the data dir's disk is full: nothing was queued
        log.warning("refusing a prompt: the store cannot take it: %s", exc)
        err = error("store_unavailable", "The server cannot store new prompts right now", str(exc))
        return web.json_response(
            prompt_error_body(err), status=503, headers={"Retry-After": str(STORE_RETRY_AFTER)}
        )
    answer["number"] = queued.number  # a counted job's, from the store
    return answer


async def _repeated(
    request: web.Request, first: IdempotentRequest, digest: str, wait: float | None
) -> web.Response:
    """The answer to a request whose key was used before: the first answer again, or a
    409 when the body differs."""
    if first.request_hash != digest:
        return reused_key()
    return await _answered(request, first.answer, wait, {REPLAYED_HEADER: "true"})


async def _answered(
    request: web.Request,
    answer: dict[str, Any],
    wait: float | None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """`answer`, or with `wait` the history entry once the prompt ends (202 and `answer`
    when it has not ended in time)."""
    if wait is None:
        return web.json_response(answer, headers=headers)

    def connected() -> bool:
        transport = request.transport
        return transport is not None and not transport.is_closing()

    entry = await request.app[WAITS].wait(answer["prompt_id"], wait, connected)
    if entry is None:
        return web.json_response(answer, status=202, headers=headers)
    return web.json_response(entry, headers=headers)


async def _validated(
    tenant: str, gw: Gateway, body: dict[str, Any]
) -> ValidationResult | web.Response:
    """The prompt of a `POST /prompt` body validated for `tenant`, or the 400 that ComfyUI
    would answer, or `no_lane_can_run`."""
    if "prompt" not in body:
        return bad_request("no_prompt", "No prompt provided", "No prompt provided")
    limit = gw.config.max_prompt_nodes
    if isinstance(body["prompt"], dict) and len(body["prompt"]) > limit:
        return bad_request(
            "prompt_too_large",
            "The prompt has too many nodes",
            f"{len(body['prompt'])} nodes; at most {limit} (max_prompt_nodes)",
        )
    targets = body.get("partial_execution_targets")
    if targets is not None and not (
        isinstance(targets, list) and all(isinstance(t, str) for t in targets)
    ):
        return bad_request("invalid_prompt", "partial_execution_targets must be a list of node ids")
    prompt = body["prompt"]
    if needs_split(prompt):  # what fleet nodes' children run is theirs to check and run
        try:
            prompt, graphs = await _walking(prompt, lambda: split_parent(prompt, limit))
        except ChildGraphTooLarge:  # each fleet node keeps its children's graph
            details = f"with the graphs its fleet nodes keep, at most {limit} (max_prompt_nodes)"
            return bad_request("prompt_too_large", "The prompt has too many nodes", details)
        except ChildGraphError as exc:
            return bad_request("invalid_prompt", str(exc))
        for node_id, graph in graphs.items():
            refused = await _child_refused(tenant, gw, node_id, graph)
            if refused is not None:
                return refused
    checked = await gw.validate(prompt, targets, tenant)
    if not checked.ok:
        return web.json_response(
            prompt_error_body(checked.error or {}, checked.node_errors), status=400
        )
    return await _no_lane(gw, checked) or checked


async def _no_lane(
    gw: Gateway, checked: ValidationResult, *, child: bool = False
) -> web.Response | None:
    """The 400 when no lane can run what the validated outputs need."""
    needed = checked.prompt
    lacking = await _walking(
        needed,
        lambda: gw.fleet.unrunnable({k: needed[k] for k in _needed(checked)}, child=child),
    )
    if lacking is None:
        return None
    details = "; ".join(f"{lane}: {', '.join(why)}" for lane, why in lacking.items())
    err = error("no_lane_can_run", "No lane can run this prompt", details, lanes=lacking)
    return web.json_response(prompt_error_body(err), status=400)


async def _child_refused(
    tenant: str, gw: Gateway, node_id: str, graph: ChildGraph
) -> web.Response | None:
    """The 400 when the children of fleet node `node_id` could not be queued: their
    nodes' errors under their ids in the parent, the child's output named as the node."""
    checked = await gw.validate(probe_child(graph, node_id), None, tenant)
    if checked.ok:
        return await _no_lane(gw, checked, child=True)
    result = result_node(node_id)
    for entry in checked.node_errors.values():
        outputs = entry.get("dependent_outputs") or []
        entry["dependent_outputs"] = [node_id if o == result else o for o in outputs]
    checked.node_errors.pop(result, None)
    return web.json_response(
        prompt_error_body(checked.error or {}, checked.node_errors), status=400
    )


async def validate_only(request: web.Request) -> web.Response:
    """`POST /comfyfleet/validate`: what `POST /prompt` would answer, nothing queued (the
    route the companion pack adds to a ComfyUI, so a gateway in front of this server
    validates exactly)."""
    gw = request.app[GATEWAY]
    body = await read_json(request, gw.config.max_prompt_bytes)
    if not isinstance(body, dict):
        return bad_request("invalid_prompt", "The request body must be a JSON object")
    checked = await _validated(tenant_name(request), gw, body)
    if isinstance(checked, web.Response):
        return checked
    prompt_id = body.get("prompt_id")
    return web.json_response(
        {
            "prompt_id": prompt_id if isinstance(prompt_id, str) else str(uuid.uuid4()),
            "outputs": checked.outputs,
            "node_errors": checked.node_errors,
        }
    )


async def post_cost(request: web.Request) -> web.Response:
    """`POST /comfyfleet/cost`, the body of `POST /prompt`: the cost dry run (see
    costs.py); nothing is queued or sent."""
    gw = request.app[GATEWAY]
    body = await read_json(request, gw.config.max_prompt_bytes)
    if not isinstance(body, dict):
        return bad_request("invalid_prompt", "The request body must be a JSON object")
    extra = body.get("extra_data", {})
    if not isinstance(extra, dict):
        return bad_request("invalid_prompt", "extra_data must be a JSON object")
    checked = await _validated(tenant_name(request), gw, body)
    if isinstance(checked, web.Response):
        return checked
    answer = await cost_answer(gw, checked, extra, tenant_name(request))
    return answer if isinstance(answer, web.Response) else web.json_response(answer)


async def get_paid(request: web.Request) -> web.Response:
    """`GET /comfyfleet/paid/{prompt_id}`: what the prompt's paid jobs here may have cost
    (as the companion pack answers it); a gateway that sent the prompt settles its budget
    hold by it. Another tenant's prompt is as unknown."""
    gw = request.app[GATEWAY]
    prompt_id = request.match_info["prompt_id"]
    job = await gw.store.get(prompt_id)
    if job is None or not visible(request, job.tenant):
        return web.json_response(
            {"error": {"type": "not_found", "message": "No such prompt"}}, status=404
        )
    used = await gw.store.prompt_paid_usage(prompt_id)
    return web.json_response(paid_answer(prompt_id, used))


async def pack_info(request: web.Request) -> web.Response:
    """`GET /comfyfleet/pack`: this server validates as the companion pack does, and
    holds a gateway's prompts across its own restarts (`holds`)."""
    return web.json_response(
        {"pack": "comfyfleet", "version": comfyui_pack.VERSION, HOLDS_FEATURE: True}
    )


async def keep_holds(request: web.Request) -> web.Response:
    """`POST /comfyfleet/holds {"keep": [prompt ids], "seconds": S}`: the gateway that
    sent these prompts (with `extra_data.comfyfleet_hold`) still wants them; each may
    run S more seconds (see scheduler/holds.py). Answers those held here, and how long
    this process has run without a stop.

    `{"release": [prompt ids]}`: let go of them now (a worker whose gateway is out of
    reach, and will run them elsewhere): running ones are given back to the queue at
    once, where they wait for a keep. Answers those released."""
    gw = request.app[GATEWAY]
    body = await read_json(request)
    releasing = isinstance(body, dict) and "release" in body
    ids = body.get("release" if releasing else "keep") if isinstance(body, dict) else None
    seconds = hold_seconds({HOLD_KEY: body.get("seconds")}) if isinstance(body, dict) else None
    if (
        not isinstance(ids, list)
        or len(ids) > MAX_KEPT
        or not all(isinstance(i, str) for i in ids)
        or (seconds is None and not releasing)
    ):
        return bad_request(
            "invalid_request",
            f"keep (or release) must be a list of at most {MAX_KEPT} prompt ids, and "
            f"seconds (with keep) a number of seconds up to {MAX_HOLD:g}",
        )
    if scope(request) is not None:  # only the caller's own
        jobs = [await gw.store.get(p) for p in ids]
        ids = [j.prompt_id for j in jobs if j is not None and visible(request, j.tenant)]
    if releasing:
        return web.json_response({"released": gw.scheduler.release_holds(ids)})
    assert seconds is not None
    kept = gw.scheduler.keep_holds(ids, seconds)
    return web.json_response({"kept": kept, "awake": round(gw.scheduler.awake_for(), 3)})


async def _walking(prompt: Any, walk: Callable[[], T]) -> T:
    """`walk()`, which walks the whole prompt: in a worker thread when it is large."""
    return await asyncio.to_thread(walk) if is_large(prompt) else walk()


def _needed(checked: Any) -> list[str]:
    """The nodes the validated outputs depend on (what a lane must be able to run)."""
    prompt = checked.prompt
    seen: set[str] = set()
    stack = list(checked.outputs)
    while stack:
        node_id = stack.pop()
        if node_id in seen or node_id not in prompt:
            continue
        seen.add(node_id)
        stack.extend(v[0] for v in (prompt[node_id].get("inputs") or {}).values() if is_link(v))
    return [n for n in prompt if n in seen]


def _short_repr(value: Any) -> str:
    """`repr` for error details, cut short (a huge number or string must not fill the reply)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**100 else "a huge integer"
    return text if len(text) <= 200 else text[:200] + "..."


async def _queue_number(
    gw: Gateway, body: dict[str, Any], *, counted_now: bool
) -> tuple[float | None, bool]:
    """ComfyUI's numbering: an explicit number as a float, else the counter (negated for
    front): taken now with `counted_now`, else None (the store takes it as it queues the
    job, `submit_prompt` if the request is refused).

    The counter advances on every request without a number, accepted or not.
    """
    if "number" in body:
        value = body["number"]
        if isinstance(value, bool):
            raise TypeError("number")
        number = float(value)
        if not math.isfinite(number):  # NaN and Infinity are not JSON: replies would break
            raise ValueError("number")
        return number, False
    front = bool(body.get("front"))
    if not counted_now:
        return None, front
    counter = await gw.store.next_number()
    return (-counter if front else counter), front


def _new_job(
    body: dict[str, Any],
    prompt: dict[str, Any],
    outputs: list[str],
    node_errors: dict[str, Any],
    number: float | None,
    front: bool,
) -> NewJob | web.Response:
    extra = body.get("extra_data", {})
    if not isinstance(extra, dict):
        return bad_request("invalid_prompt", "extra_data must be a JSON object")
    client_id = body.get("client_id")
    if client_id is not None and not (isinstance(client_id, str) and len(client_id) <= 200):
        return bad_request("invalid_prompt", "client_id must be a string of at most 200 characters")
    # Only the gateway names a prompt's parent (a child prompt never runs on its engine).
    extra = {
        k: v for k, v in extra.items() if k not in SENSITIVE_EXTRA_DATA_KEYS and k != PARENT_KEY
    }
    if client_id:
        extra["client_id"] = client_id
    prompt_id = body.get("prompt_id") or str(uuid.uuid4())
    if not isinstance(prompt_id, str) or len(prompt_id) > 200:
        return bad_request("invalid_prompt", "prompt_id must be a string of at most 200 characters")
    return NewJob(prompt_id, number, front, prompt, extra, outputs, client_id or None, node_errors)


async def get_prompt(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    tenant = scope(request)
    if not gw.scheduler.lease_guard.held:  # the count here may be stale: say so
        raise StoreError("this gateway cannot prove its lease: its queue count may be stale")
    if tenant is None:
        remaining = gw.scheduler.queue_remaining
    else:
        remaining = await gw.store.active_count(tenant)
    return web.json_response({"exec_info": {"queue_remaining": remaining}})


async def get_queue(request: web.Request) -> web.Response:
    running, pending = await request.app[GATEWAY].store.queue(tenant=scope(request))
    nodes = sum(len(job.prompt) for job in (*running, *pending))
    if nodes <= LARGE_PROMPT_NODES:
        text = _queue_text(running, pending)
    else:  # megabytes of JSON: off the event loop, and a prompt at a time (see below)
        text = await asyncio.to_thread(_queue_text, running, pending)
    return web.Response(text=text, content_type="application/json")


def _queue_text(running: list[Job], pending: list[Job]) -> str:
    """`GET /queue`'s body, each queue item encoded on its own: a worker thread gives the
    interpreter back between them, so the event loop never waits for the whole queue."""

    def items(jobs: list[Job]) -> str:
        return "[" + ",".join(dumps(job.queue_item()) for job in jobs) + "]"

    return f'{{"queue_running":{items(running)},"queue_pending":{items(pending)}}}'


def _id_list(body: Any, key: str) -> list[str]:
    values = body.get(key) if isinstance(body, dict) else None
    return [v for v in values if isinstance(v, str)] if isinstance(values, list) else []


async def own_ids(request: web.Request, ids: list[str]) -> list[str]:
    """The ids among `ids` whose jobs the request's tenant owns (all of them, auth off)."""
    tenant = scope(request)
    if tenant is None or not ids:
        return ids
    return await request.app[GATEWAY].store.owned(ids, tenant)


async def post_queue(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    body = await read_json(request)
    if isinstance(body, dict) and body.get("clear"):
        tenant = scope(request)
        if tenant is None:
            await gw.scheduler.clear_pending()
        else:
            _, pending = await gw.store.queue(tenant=tenant)
            await gw.scheduler.delete_pending([job.prompt_id for job in pending])
    ids = await own_ids(request, _id_list(body, "delete"))
    if ids:
        await gw.scheduler.delete_pending(ids)
    return empty_ok()


def _int_param(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be an integer") from None
    return clamp_to_sql(value)


def clamp_to_sql(value: int) -> int:
    """`value` within SQLite's 64-bit integers: any bigger count means "all" anyway."""
    return max(-SQL_INT_MAX - 1, min(value, SQL_INT_MAX))


async def get_history(request: web.Request) -> web.Response:
    max_items = _int_param(request, "max_items")
    offset = _int_param(request, "offset")
    if max_items is None and (offset is None or offset < 0):
        max_items = HISTORY_DEFAULT_MAX
    entries = await request.app[GATEWAY].store.history(max_items, offset, tenant=scope(request))
    nodes = sum(len(e.job.prompt) for e in entries)
    large = nodes > LARGE_PROMPT_NODES
    return await json_reply({e.job.prompt_id: e.comfy() for e in entries}, large=large)


async def get_history_entry(request: web.Request) -> web.Response:
    prompt_id = request.match_info["prompt_id"]
    entry = await request.app[GATEWAY].store.history_entry(prompt_id)
    if entry is None or not visible(request, entry.job.tenant):
        return web.json_response({})
    return await json_reply({prompt_id: entry.comfy()}, large=is_large(entry.job.prompt))


async def post_history(request: web.Request) -> web.Response:
    store = request.app[GATEWAY].store
    body = await read_json(request)
    if isinstance(body, dict) and body.get("clear"):
        await store.clear_history(tenant=scope(request))
    ids = await own_ids(request, _id_list(body, "delete"))
    if ids:
        await store.delete_history(ids)
    return empty_ok()


async def post_interrupt(request: web.Request) -> web.Response:
    """With `prompt_id`: that prompt only (if running, here or on another gateway of the
    store). Without: every prompt running here (with authentication on, of the caller's
    tenant)."""
    gw = request.app[GATEWAY]
    body = await read_json(request)
    prompt_id = body.get("prompt_id") if isinstance(body, dict) else None
    prompt_id = prompt_id if isinstance(prompt_id, str) else None
    tenant = scope(request)
    for job in gw.scheduler.running_jobs():
        if (tenant is None or job.tenant == tenant) and prompt_id in (None, job.prompt_id):
            gw.scheduler.interrupt(job.prompt_id)
            if prompt_id is not None:
                return empty_ok()
    if prompt_id is not None:  # not running here: on another gateway, perhaps
        found = await gw.store.get(prompt_id)
        if found is not None and visible(request, found.tenant):
            await interrupt_anywhere(gw, prompt_id)
    return empty_ok()


def prompt_routes() -> list[Route]:
    return [
        Route("POST", "/prompt", post_prompt),
        Route("GET", "/prompt", get_prompt),
        Route("GET", "/queue", get_queue),
        Route("POST", "/queue", post_queue),
        Route("GET", "/history", get_history),
        Route("GET", "/history/{prompt_id}", get_history_entry),
        Route("POST", "/history", post_history),
        Route("POST", "/interrupt", post_interrupt),
        Route("GET", "/comfyfleet/pack", pack_info, api_alias=False),
        Route("POST", "/comfyfleet/validate", validate_only, api_alias=False),
        Route("POST", "/comfyfleet/cost", post_cost, api_alias=False),
        Route("POST", HOLDS_ROUTE, keep_holds, api_alias=False),
        Route("GET", PAID_ROUTE, get_paid, api_alias=False),
    ]
