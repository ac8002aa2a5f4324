"""The gateway's jobs as Comfy API v2 shows them: status names, the job object, outputs.

A job's outputs are files in its tenant's folders. Each gets a stateless id that names
the job and the file (`output_id`): `GET /api/v2/assets/{id}/content` serves it from
the caller's own folders, after checking the job is the caller's, so an id gives no
more than `/view` does and needs no table.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import mimetypes
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from comfyfleet.domain.jobs import HistoryEntry, Job, JobStatus
from comfyfleet.folders import Folders, UnsafePath
from comfyfleet.lanes.outputs import split_reference
from comfyfleet.server.comfy_api_v2.errors import PREFIX

#: Job states as v2 names them. A job interrupted while running ends `canceled`.
V2_STATUS = {
    JobStatus.PENDING: "queued",
    JobStatus.RUNNING: "running",
    JobStatus.SUCCESS: "succeeded",
    JobStatus.ERROR: "failed",
    JobStatus.INTERRUPTED: "canceled",
    JobStatus.CANCELLED: "canceled",
}
#: The statuses a v2 list filter may name, and the gateway's statuses each covers.
FROM_V2: dict[str, tuple[JobStatus, ...]] = {
    "queued": (JobStatus.PENDING,),
    "running": (JobStatus.RUNNING,),
    "canceling": (),
    "succeeded": (JobStatus.SUCCESS,),
    "failed": (JobStatus.ERROR,),
    "canceled": (JobStatus.INTERRUPTED, JobStatus.CANCELLED),
    "expired": (),
}
TERMINAL = frozenset({"succeeded", "canceled", "failed", "expired"})
#: Where a v2 submit keeps its labels in the job's extra_data.
METADATA_KEY = "comfy_api_v2_metadata"
#: A job kept without a retention deadline (no history_max_age) says so with this date.
NO_DEADLINE = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
#: The longest output id taken back (a prompt_id of 200 characters and a long file name).
MAX_OUTPUT_ID = 4096

# ComfyUI's UI output keys -> v2's output kinds (others by the file's media type).
_KINDS = {
    "images": "image",
    "gifs": "video",
    "videos": "video",
    "video": "video",
    "audio": "audio",
    "text": "text",
    "latents": "latent",
}


def iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def expires_at(job: Job, max_age: float | None) -> datetime:
    if max_age is None:
        return NO_DEADLINE
    try:
        return datetime.fromtimestamp((job.finished_at or job.created_at) + max_age, UTC)
    except (OverflowError, ValueError, OSError):
        return NO_DEADLINE


def job_links(prompt_id: str) -> dict[str, str]:
    """Host-relative links (the SDK resolves them against the origin it called)."""
    own = f"{PREFIX}/jobs/{quote(prompt_id, safe='')}"
    return {"self": own, "events": f"{own}/events", "cancel": f"{own}/cancel"}


def labels(job: Job) -> dict[str, str]:
    found = job.extra_data.get(METADATA_KEY)
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}


def job_error(job: Job) -> dict[str, Any] | None:
    """v2's JobError of a failed job: the execution_error ComfyUI recorded."""
    if job.status != JobStatus.ERROR:
        return None
    err = job.error or {}
    trace = err.get("traceback")
    return {
        "code": "node_execution_error",
        "message": str(err.get("exception_message") or "The prompt failed"),
        "node_id": None if err.get("node_id") is None else str(err.get("node_id")),
        "class_type": None if err.get("node_type") is None else str(err.get("node_type")),
        "traceback": "".join(trace) if isinstance(trace, list) else None,
    }


def _ms(start: float | None, end: float | None) -> int | None:
    return None if start is None or end is None else max(0, int((end - start) * 1000))


def job_body(
    job: Job,
    outputs: list[dict[str, Any]],
    *,
    max_age: float | None,
    canceling: bool = False,
    queue_position: int | None = None,
    progress: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The v2 Job object; `queue_position` and `progress` as live.py reads them."""
    status = V2_STATUS[job.status]
    if canceling and status == "running":
        status = "canceling"
    return {
        "id": job.prompt_id,
        "status": status,
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "completed_at": iso(job.finished_at),
        "expires_at": expires_at(job, max_age).isoformat(),
        "queue_position": queue_position,
        "progress": progress,
        "outputs": outputs,
        "error": job_error(job),
        "metrics": {
            "queue_ms": _ms(job.created_at, job.started_at),
            "execution_ms": _ms(job.started_at, job.finished_at),
        },
        "urls": job_links(job.prompt_id),
        "metadata": labels(job),
    }


def job_summary(job: Job) -> dict[str, Any]:
    """A job as the list shows it: lighter than the Job object."""
    return {
        "id": job.prompt_id,
        "status": V2_STATUS[job.status],
        "create_time": iso(job.created_at),
        "update_time": iso(job.finished_at or job.started_at or job.created_at),
        "metadata": labels(job),
        "urls": job_links(job.prompt_id),
    }


# -- outputs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputRef:
    """What an output id names: a job and one file of its tenant's folders."""

    prompt_id: str
    type: str
    subfolder: str
    filename: str

    def query(self) -> dict[str, str]:
        """The file as `/view`'s query names it."""
        return {"filename": self.filename, "type": self.type, "subfolder": self.subfolder}


def output_id(ref: OutputRef) -> str:
    raw = json.dumps([ref.prompt_id, ref.type, ref.subfolder, ref.filename], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def parse_output_id(text: str) -> OutputRef | None:
    """The output an id names; None for anything `output_id` did not make."""
    if not 0 < len(text) <= MAX_OUTPUT_ID:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        parts = json.loads(raw.decode())
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    if not (isinstance(parts, list) and len(parts) == 4 and all(isinstance(p, str) for p in parts)):
        return None
    if parts[1] not in ("output", "temp", "input"):
        return None
    return OutputRef(*parts)


def output_files(prompt_id: str, ui: dict[str, Any]) -> list[tuple[str, str, OutputRef]]:
    """(node_id, kind, file) of every file a prompt's UI outputs name, in their order.
    Files kept on a ComfyUI backend (not in the gateway's folders) are left out."""
    found = []
    for node_id, node_ui in ui.items():
        if not isinstance(node_ui, dict):
            continue
        for key, items in node_ui.items():
            for item in items if isinstance(items, list) else ():
                if not isinstance(item, dict) or not isinstance(item.get("filename"), str):
                    continue
                subfolder = item.get("subfolder") or ""
                kind = item.get("type") or "output"
                if not isinstance(subfolder, str) or not isinstance(kind, str):
                    continue
                if split_reference(subfolder) is not None:
                    continue
                ref = OutputRef(prompt_id, kind, subfolder, item["filename"])
                found.append((str(node_id), _kind(key, item["filename"]), ref))
    return found


def _kind(key: str, filename: str) -> str:
    if key in _KINDS:
        return _KINDS[key]
    media = media_type(filename).split("/")[0]
    return {"image": "image", "video": "video", "audio": "audio"}.get(media, "file")


def media_type(filename: str) -> str:
    return mimetypes.guess_type(filename)[0] or "application/octet-stream"


def _sizes(folders: Folders, refs: Sequence[OutputRef]) -> list[int]:
    sizes = []
    for ref in refs:
        try:
            path = folders.resolve_inside(ref.type, os.path.join(ref.subfolder, ref.filename))
            sizes.append(os.stat(path).st_size)
        except (OSError, UnsafePath, ValueError):
            sizes.append(0)  # on another gateway, or gone: its size is not known here
    return sizes


async def outputs_body(
    folders: Folders, base: str, job: Job, ui: dict[str, Any], max_age: float | None
) -> list[dict[str, Any]]:
    """v2's Output objects for the files of `ui` (a job's UI outputs, whole or one node's).
    `base` is the origin the client called (scheme://host): Output.url is absolute."""
    files = output_files(job.prompt_id, ui)
    sizes = await asyncio.to_thread(_sizes, folders, [ref for _, _, ref in files])
    deadline = expires_at(job, max_age).isoformat()
    out = []
    for (node_id, kind, ref), size in zip(files, sizes, strict=True):
        asset = output_id(ref)
        out.append(
            {
                "node_id": node_id,
                "name": ref.filename,
                "type": kind,
                "content_type": media_type(ref.filename),
                "size_bytes": size,
                "id": asset,
                "hash": None,
                "url": f"{base}{PREFIX}/assets/{asset}/content",
                "url_expires_at": deadline,
                "job_id": job.prompt_id,
            }
        )
    return out


async def job_outputs(
    folders: Folders, base: str, entry: HistoryEntry | None, max_age: float | None
) -> list[dict[str, Any]]:
    if entry is None:
        return []
    return await outputs_body(folders, base, entry.job, entry.result.outputs, max_age)
