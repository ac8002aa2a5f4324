"""The `status` report of a collector: one entry per slot, every text redacted."""

from __future__ import annotations

import json
from typing import Any

from comfyfleet.fanout.task import Task
from comfyfleet.provider_http.redact import Redactor

NOT_CONNECTED = "not_connected"


def slot_entry(
    slot: int, task: Task | None, redactor: Redactor, shared_by: list[int] | None = None
) -> dict[str, Any]:
    """One slot's entry; `shared_by` lists every slot waiting for this same job (equal
    submits share one job), None when this slot is the only one."""
    if task is None:
        return {"slot": slot, "state": NOT_CONNECTED}
    info = task.info
    queued, running = info.seconds()
    return {
        "slot": slot,
        "state": info.state.value,
        "provider": info.provider,
        "node": info.node_id,
        "endpoint": None if info.endpoint is None else redactor.url(info.endpoint),
        "remote_id": _text(redactor, info.remote_id),
        "error_class": info.error_class,
        "error": _text(redactor, info.error),
        "http_status": info.http_status,
        "attempts": info.attempts,
        "queued_seconds": round(queued, 3),
        "running_seconds": round(running, 3),
        "reused": info.reused,
        "shared_by_slots": shared_by,
    }


def sharing(slots: list[Task | None]) -> dict[int, list[int]]:
    """Slot -> every slot holding the same task, for the slots that share one."""
    by_task: dict[int, list[int]] = {}
    for slot, task in enumerate(slots, 1):
        if task is not None:
            by_task.setdefault(id(task), []).append(slot)
    return {slot: group for group in by_task.values() if len(group) > 1 for slot in group}


def _text(redactor: Redactor, value: str | None) -> str | None:
    return None if value is None else redactor.text(value)


def report(collector: str | None, mode: str, entries: list[dict[str, Any]]) -> str:
    """The JSON text of the report; `counts` sums the slots per state."""
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry["state"]] = counts.get(entry["state"], 0) + 1
    body = {"collector": collector, "failure_mode": mode, "counts": counts, "slots": entries}
    return json.dumps(body, separators=(",", ":"))
