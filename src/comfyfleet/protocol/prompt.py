"""The ComfyUI API prompt format: `{node_id: {"class_type", "inputs", "_meta"?}}`."""

from __future__ import annotations

from typing import Any

Prompt = dict[str, dict[str, Any]]

#: A prompt of more nodes than this is large: what walks all of it (validation, the
#: run's layout, encoding, affinity) runs in a worker thread, off the event loop.
LARGE_PROMPT_NODES = 100


def is_large(prompt: Any) -> bool:
    return isinstance(prompt, dict) and len(prompt) > LARGE_PROMPT_NODES


def is_link(value: Any) -> bool:
    """A link is `[node_id, output_index]`: a string id and a numeric index."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int | float)
        and not isinstance(value[1], bool)
    )


def unwrap_value(value: Any) -> Any:
    """`{"__value__": v}` carries a list constant that would otherwise read as a link."""
    if isinstance(value, dict) and "__value__" in value:
        return value["__value__"]
    return value


def node_inputs(prompt: Prompt, node_id: str) -> dict[str, Any]:
    inputs = prompt[node_id].get("inputs", {})
    return inputs if isinstance(inputs, dict) else {}


def queue_item_ids(items: Any, client_id: str | None = None) -> list[str]:
    """The prompt ids of `GET /queue` items (`[number, prompt_id, prompt, extra_data,
    ...]`), in order; with `client_id`, only those submitted under it. Anything out of
    that shape is passed over (the answer comes from another process)."""
    found = []
    for item in items if isinstance(items, list) else []:
        if not (isinstance(item, list) and len(item) > 1 and isinstance(item[1], str)):
            continue
        extra = item[3] if len(item) > 3 and isinstance(item[3], dict) else {}
        if client_id is None or extra.get("client_id") == client_id:
            found.append(item[1])
    return found
