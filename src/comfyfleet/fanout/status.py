"""The `status` report of a collector: one entry per slot, every text redacted."""

from __future__ import annotations

import json
from typing import Any

from comfyfleet.fanout.task import Task
from comfyfleet.providers.redact import Redactor

NOT_CONNECTED = "not_connected"


def slot_entry(slot: int, task: Task | None, redactor: Redactor) -> dict[str, Any]:
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
    }


def _text(redactor: Redactor, value: str | None) -> str | None:
    return None if value is None else redactor.text(value)


def report(collector: str | None, mode: str, entries: list[dict[str, Any]]) -> str:
    """The JSON text of the report; `counts` sums the slots per state."""
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry["state"]] = counts.get(entry["state"], 0) + 1
    body = {"collector": collector, "failure_mode": mode, "counts": counts, "slots": entries}
    return json.dumps(body, separators=(",", ":"))
