"""comfyfleet's companion pack for ComfyUI backends (a custom node pack).

Installed into a ComfyUI's `custom_nodes/` (`comfyfleet install-comfyui-pack DIR`),
it adds two routes a comfyfleet gateway uses:

- `GET /comfyfleet/pack`: `{"pack": "comfyfleet", "version": N}`, how a gateway
  knows the backend has it;
- `POST /comfyfleet/validate`: the body of `POST /prompt`, validated exactly as
  `POST /prompt` does (its on-prompt handlers, then ComfyUI's own validation, every
  node's `VALIDATE_INPUTS` included), and nothing queued. It answers what `POST
  /prompt` would: 200 `{"prompt_id", "outputs", "node_errors"}` (`outputs`: the
  output nodes that would run) or 400 `{"error", "node_errors"}`.

The routes import only ComfyUI's own modules and the standard library. When
comfyfleet itself is installed in ComfyUI's environment (`pip install` of comfyfleet
into ComfyUI's venv), the pack also adds comfyfleet's fan-out nodes (provider nodes,
their Concurrent Submit twins, the collectors: see `comfyfleet.in_comfyui`); without
it, the routes work alone.
"""

from __future__ import annotations

import importlib
import json
import logging
import uuid
from typing import Any

VERSION = 2
NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}

log = logging.getLogger(__name__)


def _bad_request(type_: str, message: str, details: str = "") -> tuple[int, dict[str, Any]]:
    error = {"type": type_, "message": message, "details": details, "extra_info": {}}
    return 400, {"error": error, "node_errors": {}}


async def validate(server: Any, execution: Any, body: Any) -> tuple[int, dict[str, Any]]:
    """(status, answer) of `POST /prompt` for `body`, queueing nothing."""
    if not isinstance(body, dict):
        return _bad_request("invalid_prompt", "The request body must be a JSON object")
    body = server.trigger_on_prompt(body)
    if "prompt" not in body:
        return _bad_request("no_prompt", "No prompt provided", "No prompt provided")
    prompt_id = str(body.get("prompt_id", uuid.uuid4()))
    targets = body.get("partial_execution_targets")
    valid = await execution.validate_prompt(prompt_id, body["prompt"], targets)
    if valid[0]:
        return 200, {"prompt_id": prompt_id, "outputs": list(valid[2]), "node_errors": valid[3]}
    return 400, {"error": valid[1], "node_errors": valid[3]}


def _register() -> None:
    try:
        server_module = importlib.import_module("server")
        execution = importlib.import_module("execution")
        web = importlib.import_module("aiohttp.web")
    except ImportError:  # imported outside ComfyUI (a test, a linter): nothing to add
        return
    server = getattr(server_module.PromptServer, "instance", None)
    if server is None:
        return
    routes = server.routes

    async def pack_info(request: Any) -> Any:
        return web.json_response({"pack": "comfyfleet", "version": VERSION})

    async def validate_only(request: Any) -> Any:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            status, answer = _bad_request("invalid_prompt", "The body is not valid JSON")
        else:
            status, answer = await validate(server, execution, body)
        return web.json_response(answer, status=status, dumps=json.dumps)

    routes.get("/comfyfleet/pack")(pack_info)
    routes.post("/comfyfleet/validate")(validate_only)
    log.info("comfyfleet pack %d: /comfyfleet/validate ready", VERSION)
    _add_fanout_nodes(server)


def _add_fanout_nodes(server: Any) -> None:
    try:
        in_comfyui = importlib.import_module("comfyfleet.in_comfyui")
    except ImportError as exc:
        log.info(
            "comfyfleet pack: no fan-out nodes (%s); pip install comfyfleet into "
            "this ComfyUI's environment to add them",
            exc,
        )
        return
    try:
        classes, names = in_comfyui.install(server)
    except Exception:  # the routes stay; the nodes are missing, and the log says why
        log.exception("comfyfleet pack: the fan-out nodes could not be added")
        return
    NODE_CLASS_MAPPINGS.update(classes)
    NODE_DISPLAY_NAME_MAPPINGS.update(names)


# Inside ComfyUI this folder is a custom node package (`custom_nodes.<folder>`); as
# part of comfyfleet (the installer reading VERSION) it must not touch anything.
if __name__ != "comfyfleet.comfyui_pack":
    _register()
