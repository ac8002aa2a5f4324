"""A delivery's body: the job's end as JSON, shaped as Standard Webhooks suggests
(`type`, `timestamp`, `data`). Built from the store once, then kept with the delivery,
so every attempt sends the same bytes."""

from __future__ import annotations

import datetime
import json
from typing import Any
from urllib.parse import urlencode

from comfyfleet.domain.jobs import HistoryEntry, Job
from comfyfleet.domain.webhooks import STATUS_OF, WebhookDelivery

_dumps = json.JSONEncoder(separators=(",", ":")).encode  # ASCII: any text encodes


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 3)


def with_urls(outputs: dict[str, Any], view_base: str) -> dict[str, Any]:
    """ComfyUI's outputs (node id -> ui), each file given the `/view` URL that serves it."""

    def file(item: Any) -> Any:
        if not (isinstance(item, dict) and isinstance(item.get("filename"), str)):
            return item
        query = {
            "filename": item["filename"],
            "subfolder": str(item.get("subfolder") or ""),
            "type": str(item.get("type") or "output"),
        }
        return {**item, "url": f"{view_base}/view?{urlencode(query)}"}

    return {
        node: {
            key: [file(item) for item in value] if isinstance(value, list) else value
            for key, value in ui.items()
        }
        if isinstance(ui, dict)
        else ui
        for node, ui in outputs.items()
    }


def build(
    delivery: WebhookDelivery, job: Job | None, entry: HistoryEntry | None, view_base: str
) -> str:
    """The body of `delivery`; a job pruned before its first attempt leaves only what
    the delivery knows."""
    finished = job.finished_at if job and job.finished_at is not None else delivery.created_at
    data: dict[str, Any] = {
        "prompt_id": delivery.prompt_id,
        "status": STATUS_OF[delivery.event].value,
        "tenant": delivery.tenant,
    }
    if job is not None:
        data |= {
            "number": job.number,
            "client_id": job.client_id,
            "attempt": job.attempt,
            "lane": job.lane,
            "created_at": _iso(job.created_at),
            "started_at": _iso(job.started_at),
            "finished_at": _iso(job.finished_at),
            "queue_seconds": _span(job.created_at, job.started_at),
            "run_seconds": _span(job.started_at, job.finished_at),
            "error": job.error,
        }
    data["outputs"] = with_urls(entry.result.outputs, view_base) if entry else {}
    return _dumps({"type": delivery.event.value, "timestamp": _iso(finished), "data": data})
