"""Which of a prompt's paid jobs the journal already holds, before the prompt runs.

A job's request is made from the prompt alone when every input of its node is a value
in the prompt or the output of a node that says its output without running
(`static_outputs`, e.g. API Settings). Its hash is then the one the run sends, and the
journal says whether that request's result is kept (the run reuses it) or its job is
live (the run waits on it): no new job either way. A request made only as it runs (an
image from upstream, a key typed into the workflow) is counted as a new job.
"""

from __future__ import annotations

import logging
from typing import Any

from comfyfleet.engine.registry import NodeRegistry
from comfyfleet.errors import ComfyfleetError
from comfyfleet.protocol.prompt import is_link

log = logging.getLogger(__name__)


class _Unknown(ComfyfleetError):
    """An input known only as the prompt runs."""


def request_hash(
    prompt: dict[str, Any], node_id: str, source: type, registry: NodeRegistry
) -> str | None:
    """The hash of the request `source` (the node's class, a twin's original) makes for
    the node, or None when the prompt alone does not make it."""
    build = getattr(source, "remote_request", None)
    if build is None:
        return None
    try:
        inputs = _values(prompt, node_id, registry)
        request = build(source(), **inputs)
    except _Unknown:
        return None
    except Exception:  # a node refusing these inputs fails when it runs, not here
        log.debug("no request for node %s before it runs", node_id, exc_info=True)
        return None
    digest = getattr(request, "request_hash", None)
    return digest if isinstance(digest, str) else None


def _values(prompt: dict[str, Any], node_id: str, registry: NodeRegistry) -> dict[str, Any]:
    values = {}
    for name, value in (prompt[node_id].get("inputs") or {}).items():
        values[name] = _linked(prompt, value, registry) if is_link(value) else value
    return values


def _linked(prompt: dict[str, Any], link: list[Any], registry: NodeRegistry) -> Any:
    source_id, slot = str(link[0]), int(link[1])
    entry = prompt.get(source_id) or {}
    node = registry.get(str(entry.get("class_type")))
    static = getattr(node.cls, "static_outputs", None) if node is not None else None
    inputs = entry.get("inputs") or {}
    if static is None or any(is_link(value) for value in inputs.values()):
        raise _Unknown(source_id)
    outputs = static(**inputs)
    if outputs is None or slot >= len(outputs):
        raise _Unknown(source_id)
    return outputs[slot]
