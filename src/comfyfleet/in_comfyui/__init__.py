"""comfyfleet's fan-out nodes inside a real ComfyUI (loaded by the companion pack).

The companion pack (`comfyfleet.comfyui_pack`, copied into ComfyUI's custom nodes)
calls `install` when comfyfleet is importable in ComfyUI's environment (`pip
install` of comfyfleet into ComfyUI's venv). It adds comfyfleet's provider nodes,
their Concurrent Submit twins and the collectors, sharing comfyfleet's code: the
same pools (one set for the whole ComfyUI process), failure modes, status report
and redaction, with the journal in a SQLite file in ComfyUI's user directory, so
neither a re-queue nor a restart of that ComfyUI pays for a job twice.

Keys come from ComfyUI's environment (`env:NAME`) or a secrets file
(`COMFYFLEET_SECRETS_FILE`, `secret:NAME`); a key typed into a workflow is swapped
for a marker before ComfyUI queues (and stores) the prompt.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from comfyfleet.children.remote import RemoteChildJobs
from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.fanout import SecretVault
from comfyfleet.in_comfyui.comfyui import ComfyUI, from_running_comfyui
from comfyfleet.in_comfyui.host import FanoutHost
from comfyfleet.in_comfyui.wrap import Bridge, exposed, wrap
from comfyfleet.nodes import build_registry
from comfyfleet.spend.holds import PAID_ROUTE, paid_answer

log = logging.getLogger(__name__)

Mappings = tuple[dict[str, type], dict[str, str]]
#: Set to 0 in ComfyUI's environment to leave its garbage collector as it is.
GC_FREEZE_ENV = "COMFYFLEET_PACK_GC_FREEZE"


def install(server: Any) -> Mappings:
    """Start the fan-out loop in this ComfyUI and return the node mappings to register;
    typed keys are scrubbed from every prompt `server` (its PromptServer) receives."""
    comfy = from_running_comfyui(server)
    registry = build_registry()
    mappings, bridge = node_mappings(comfy, registry)
    server.add_on_prompt_handler(key_scrubber(bridge.service.vault, registry))
    server.add_on_prompt_handler(bridge.host.allowances.note)
    server.routes.get(PAID_ROUTE)(paid_route(bridge.host))
    log.info("comfyfleet fan-out nodes: %d, journal %s", len(mappings[0]), bridge.host.journal_file)
    frozen = freeze_startup_objects(os.environ)
    if frozen:
        log.info(
            "comfyfleet: %d objects of ComfyUI's start-up left out of garbage collection", frozen
        )
    return mappings


def freeze_startup_objects(environ: Mapping[str, str]) -> int:
    """ComfyUI collects garbage after a prompt once 10 s have passed since it last did,
    and the next prompt waits for it: a full collection walks every object of the
    process (half a million once torch is loaded, about a quarter of a second). What
    exists when the nodes are loaded (modules, classes, torch's own) lives as long as
    the process: frozen, the collector no longer walks it, while a prompt's garbage is
    collected as before. The objects frozen (0 with COMFYFLEET_PACK_GC_FREEZE=0)."""
    if environ.get(GC_FREEZE_ENV, "1") == "0":
        return 0
    gc.collect()  # what is garbage already is not kept
    gc.freeze()
    return gc.get_freeze_count()


def node_mappings(comfy: ComfyUI, registry: NodeRegistry) -> tuple[Mappings, Bridge]:
    """The ComfyUI classes of comfyfleet's nodes, on a fan-out loop started for them."""
    host = FanoutHost(comfy.user_dir)
    bridge = Bridge(host, host.start(), comfy, RemoteChildJobs.from_environment())
    classes: dict[str, type] = {}
    names: dict[str, str] = {}
    for node in exposed(registry, comfy.own_nodes):
        classes[node.name] = wrap(node, bridge)
        names[node.name] = node.display_name or node.name
    return (classes, names), bridge


def paid_route(host: FanoutHost) -> Callable[[Any], Awaitable[Any]]:
    """`GET /comfyfleet/paid/{prompt_id}`: what the prompt's paid jobs here may have
    cost, as the journal counts them; its gateway settles its budget hold by it."""
    web = importlib.import_module("aiohttp.web")

    async def paid(request: Any) -> Any:
        prompt_id = request.match_info["prompt_id"]
        work = asyncio.run_coroutine_threadsafe(host.paid_by(prompt_id), host.loop)
        used = await asyncio.wrap_future(work)
        return web.json_response(paid_answer(prompt_id, used))

    return paid


def key_scrubber(
    vault: SecretVault, registry: NodeRegistry
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """An on-prompt handler: the request with every typed key replaced by its marker, in
    the prompt and its extra data (the workflow saved into images), before ComfyUI
    validates, queues or stores it."""

    def scrub(body: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), dict):
            return body  # ComfyUI refuses it itself
        extra = body.get("extra_data")
        prompt, scrubbed_extra = vault.scrub(
            body["prompt"], extra if isinstance(extra, dict) else {}, registry
        )
        if prompt is body["prompt"]:
            return body
        changed = {**body, "prompt": prompt}
        if isinstance(extra, dict):
            changed["extra_data"] = scrubbed_extra
        return changed

    return scrub
