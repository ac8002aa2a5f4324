"""Routes each job's events to the client that submitted it, and queue status to all.

A job without a client_id sends its per-prompt events to no one: they stay
readable in history and the jobs API. The last `executing` and
`progress_state` of each running job are kept so a client that reconnects
can be brought up to date.

Sockets are addressed by tenant and client id together (`client_key`): a client of
one tenant that names another tenant's client id gets none of its events.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from comfyfleet.domain.jobs import Job, JobResult
from comfyfleet.domain.prompt_events import is_done
from comfyfleet.engine.events import EngineEvent, Message, NodeProgress, PreviewImage, ProgressText
from comfyfleet.protocol import events
from comfyfleet.protocol.progress import ProgressState
from comfyfleet.scheduler.observers import JobObserver
from comfyfleet.server.delivery.hub import Hub
from comfyfleet.server.delivery.pacing import TokenBucket
from comfyfleet.tenants import DEFAULT_TENANT


def client_key(tenant: str, client_id: str) -> str:
    """The hub address of a tenant's client id: the client id itself for the `default`
    tenant (all clients, without authentication), else `tenant NUL client_id`. Tenant
    names hold no NUL, and plain keys hold none, so each key names one pair."""
    if tenant == DEFAULT_TENANT and "\x00" not in client_id:
        return client_id
    return f"{tenant}\x00{client_id}"


@dataclass
class _Latest:
    key: str  # client_key of the job's client
    progress: ProgressState
    executing: dict[str, Any] | None = None


class StatusBroadcaster:
    """`status` frames on queue changes: immediate while quiet, coalesced under load.

    A token bucket allows bursts of `burst` frames, refilled at `rate` per second;
    beyond that, changes are folded into one frame sent when a token is back.
    """

    def __init__(self, hub: Hub, *, rate: float = 20.0, burst: int = 10) -> None:
        self.hub = hub
        self._bucket = TokenBucket(rate, burst)
        self._latest = 0
        self._timer: asyncio.TimerHandle | None = None

    def changed(self, remaining: int) -> None:
        self._latest = remaining
        if self._timer is not None:
            return  # a folded frame is already due
        delay = self._bucket.wait()
        if delay <= 0:
            self._send()
        else:
            self._timer = asyncio.get_running_loop().call_later(delay, self._deferred)

    def _deferred(self) -> None:
        self._timer = None
        self._send()

    def _send(self) -> None:
        self._bucket.take()
        self.hub.broadcast_json("status", events.status(self._latest))

    def send_now(self, client_id: str) -> None:
        """While a folded frame is due, give one client the count now (before its done
        signal, so it sees the count first). The others get the folded frame when it is
        due: broadcasting here would send one frame per finished prompt to everyone."""
        if self._timer is not None:
            self.hub.send_json(client_id, "status", events.status(self._latest))


@dataclass
class ClientRouter(JobObserver):
    hub: Hub
    status: StatusBroadcaster
    _latest: dict[str, _Latest] = field(default_factory=dict)
    _plain_previews: dict[str, PreviewImage] = field(default_factory=dict)  # by prompt id

    def job_event(self, job: Job, event: EngineEvent) -> None:
        if not job.client_id:
            return
        client_id = client_key(job.tenant, job.client_id)
        if isinstance(event, Message):
            self._remember(job, event)
            self.hub.send_json(client_id, event.type, event.data, prompt_id=job.prompt_id)
            if event.type == "progress":
                self._send_plain_preview(job)
        elif isinstance(event, NodeProgress):
            progress = self._latest_of(job).progress
            progress.change(event.node_id, event.entry)
            if self.hub.connected(client_id):  # the whole frame only for a socket
                self.hub.send_json(
                    client_id, "progress_state", progress.frame(), prompt_id=job.prompt_id
                )
        elif isinstance(event, PreviewImage):
            # ComfyUI's order: a code-4 preview before the `progress` frame it comes
            # with, a code-1 preview after it.
            self._send_plain_preview(job)
            self.hub.send_preview(client_id, event, metadata=True, prompt_id=job.prompt_id)
            self._plain_previews[job.prompt_id] = event
        elif isinstance(event, ProgressText):
            self.hub.send_text(client_id, event, prompt_id=job.prompt_id)

    def _send_plain_preview(self, job: Job) -> None:
        preview = self._plain_previews.pop(job.prompt_id, None)
        if preview is not None and job.client_id:
            key = client_key(job.tenant, job.client_id)
            self.hub.send_preview(key, preview, metadata=False, prompt_id=job.prompt_id)

    def _latest_of(self, job: Job) -> _Latest:
        latest = self._latest.get(job.prompt_id)
        if latest is None:
            key = client_key(job.tenant, job.client_id or "")
            latest = self._latest[job.prompt_id] = _Latest(key, ProgressState(job.prompt_id))
        return latest

    def _remember(self, job: Job, message: Message) -> None:
        if message.type not in ("executing", "progress_state", "execution_start"):
            return
        latest = self._latest_of(job)
        if message.type == "executing":
            latest.executing = message.data
        elif message.type == "progress_state":  # a whole frame (a backend's, relayed)
            nodes = message.data.get("nodes")
            latest.progress.replace(nodes if isinstance(nodes, dict) else {})

    def job_finished(self, job: Job, result: JobResult) -> None:
        self._send_plain_preview(job)
        self._send_done(job, events.executing(job.prompt_id, None))

    def _send_done(self, job: Job, done: dict[str, Any]) -> None:
        self._latest.pop(job.prompt_id, None)
        if job.client_id:
            key = client_key(job.tenant, job.client_id)
            self.status.send_now(key)
            self.hub.send_json(key, "executing", done, prompt_id=job.prompt_id)

    def relayed(self, job: Job, event: EngineEvent) -> None:
        """A frame of a prompt another gateway runs, read from the event log (see
        relay.py): sent as this gateway sends its own prompts' frames, and kept for
        the catch-up of a client that reconnects."""
        if isinstance(event, Message) and is_done(event.type, event.data):
            self._send_plain_preview(job)
            self._send_done(job, event.data)
        else:
            self.job_event(job, event)

    def job_stopped(self, job: Job) -> None:
        self._latest.pop(job.prompt_id, None)  # a reconnecting client must not see it running

    def queue_changed(self, remaining: int) -> None:
        self.status.changed(remaining)

    def catch_up(self, key: str) -> list[tuple[str, dict[str, Any]]]:
        """The current `executing` / `progress_state` of the running jobs of a client
        (by `client_key`)."""
        frames: list[tuple[str, dict[str, Any]]] = []
        for latest in self._latest.values():
            if latest.key != key:
                continue
            if latest.executing is not None:
                frames.append(("executing", latest.executing))
            if latest.progress.nodes:
                frames.append(("progress_state", latest.progress.frame()))
        return frames
