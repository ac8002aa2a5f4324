"""The parts of a running ComfyUI the fan-out nodes use, gathered in one object.

Only `from_running_comfyui` imports ComfyUI (and torch); everything else takes a
`ComfyUI`, so it runs the same against the real process or a stand-in.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comfyfleet.folders import Folders
from comfyfleet.in_comfyui.boundary import Boundary

INTERRUPTED, ENDED = "interrupted", "ended"


@dataclass(frozen=True)
class Executing:
    """ComfyUI's context of the node whose code runs."""

    prompt_id: str
    node_id: str
    list_index: int | None


@dataclass(frozen=True)
class ComfyUI:
    #: ComfyUI's interrupt flag (`POST /interrupt`), global to the process.
    interrupted: Callable[[], bool]
    #: The prompt ComfyUI's executor runs now (None between prompts).
    running_prompt: Callable[[], str | None]
    executing: Callable[[], Executing | None]
    #: How a prompt ended, from ComfyUI's history: INTERRUPTED, ENDED, or None (not yet,
    #: or no longer in the history).
    ended: Callable[[str], str | None]
    #: (prompt id, node id, text) and (prompt id, node id, value, total) to the prompt's
    #: client; called on the prompt's own event loop.
    send_text: Callable[[str, str, str], None]
    progress: Callable[[str, str, float, float], None]
    #: What a node raises so that ComfyUI reports `execution_interrupted`.
    interrupt_error: type[Exception]
    boundary: Boundary
    folders: Folders
    user_dir: Path
    #: ComfyUI's own node classes, which the pack never replaces.
    own_nodes: frozenset[str]


def from_running_comfyui(server: Any) -> ComfyUI:
    """The ComfyUI this module is loaded in (`server`: its PromptServer)."""
    torch = importlib.import_module("torch")
    management = importlib.import_module("comfy.model_management")
    graph = importlib.import_module("comfy_execution.graph")
    progress_module = importlib.import_module("comfy_execution.progress")
    utils = importlib.import_module("comfy_execution.utils")
    folder_paths = importlib.import_module("folder_paths")
    nodes = importlib.import_module("nodes")

    def running_prompt() -> str | None:
        return getattr(server, "last_prompt_id", None)

    def executing() -> Executing | None:
        found = utils.get_executing_context()
        if found is None:
            return None
        return Executing(str(found.prompt_id), str(found.node_id), found.list_index)

    def message_types(entry: Any) -> list[str]:
        messages = (entry.get("status") or {}).get("messages") or []
        return [message[0] for message in messages]

    def ended(prompt_id: str) -> str | None:
        found = server.prompt_queue.get_history(prompt_id=prompt_id, map_function=message_types)
        if prompt_id not in found:
            return None
        return INTERRUPTED if "execution_interrupted" in found[prompt_id] else ENDED

    def send_text(prompt_id: str, node_id: str, text: str) -> None:
        if running_prompt() == prompt_id:
            server.send_progress_text(text, node_id, server.client_id)

    def progress(prompt_id: str, node_id: str, value: float, total: float) -> None:
        if running_prompt() != prompt_id:
            return
        state = progress_module.get_progress_state()
        if getattr(state, "prompt_id", None) == prompt_id:
            state.update_progress(node_id, value, total, None)
        message = {"value": value, "max": total, "prompt_id": prompt_id, "node": node_id}
        server.send_sync("progress", message, server.client_id)

    try:  # ComfyUI's video values (0.3.3x on)
        video = importlib.import_module("comfy_api.input_impl").VideoFromFile
    except (ImportError, AttributeError):
        video = None
    folders = Folders(
        output=Path(folder_paths.get_output_directory()),
        input=Path(folder_paths.get_input_directory()),
        temp=Path(folder_paths.get_temp_directory()),
    )
    return ComfyUI(
        interrupted=management.processing_interrupted,
        running_prompt=running_prompt,
        executing=executing,
        ended=ended,
        send_text=send_text,
        progress=progress,
        interrupt_error=management.InterruptProcessingException,
        boundary=Boundary(torch, graph.ExecutionBlocker, video),
        folders=folders,
        user_dir=Path(folder_paths.get_user_directory()),
        own_nodes=frozenset(nodes.NODE_CLASS_MAPPINGS),
    )
