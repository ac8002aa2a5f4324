"""Drivers: each provider's client seen as submit / result / cancel, so jobs can be journaled.

A job is split where the journal needs it: `submit` is the one request that
costs money and returns what identifies the job; `result` waits for it and
downloads the file (also after a restart, from what was journaled); `cancel`
asks the provider to stop it. Retries live in the clients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from comfyfleet.fanout.request import ApiConfig, RemoteRequest
from comfyfleet.providers.bfl import BFLClient, SubmittedTask
from comfyfleet.providers.errors import AmbiguousSubmit, JobFailed
from comfyfleet.providers.openai_images import OpenAIImagesClient
from comfyfleet.providers.redact import Redactor
from comfyfleet.providers.retry import Cooldown


@dataclass
class Tries:
    """Retries the clients made for one job (5xx, 429, network), so the status can say."""

    retries: int = 0

    @property
    def attempts(self) -> int:
        return self.retries + 1

    def count(self) -> None:
        self.retries += 1


@dataclass
class Connection:
    """What one job needs to talk to its provider.

    `cooldown` is the endpoint and key's shared pause: it gates job creation only.
    """

    session: aiohttp.ClientSession
    api: ApiConfig
    key: str
    redactor: Redactor
    cooldown: Cooldown
    tries: Tries = field(default_factory=Tries)


@dataclass(frozen=True)
class Submitted:
    remote_id: str | None  # None for synchronous providers, whose answer is the result
    resume: dict[str, Any]
    data: bytes | None = None


class Driver(Protocol):
    name: str
    #: The job-creating request is short: on cancel, let it answer, then cancel the job
    #: it made. A synchronous provider's request is the whole job: abort it instead.
    shield_submit: bool

    def endpoint(self, request: RemoteRequest) -> str: ...

    async def submit(self, conn: Connection, request: RemoteRequest) -> Submitted: ...

    async def result(self, conn: Connection, remote_id: str, resume: dict[str, Any]) -> bytes: ...

    async def cancel(self, conn: Connection, remote_id: str, resume: dict[str, Any]) -> bool: ...


class BFLDriver:
    name = "bfl"
    shield_submit = True

    def endpoint(self, request: RemoteRequest) -> str:
        return f"{request.api.base_url.rstrip('/')}/v1/{request.operation}"

    def _client(self, conn: Connection) -> BFLClient:
        return BFLClient(
            conn.session,
            conn.api.base_url,
            conn.key,
            poll_interval=conn.api.poll_interval,
            deadline=conn.api.timeout,
            cooldown=conn.cooldown,
            redactor=conn.redactor,
            cancel_on_abort=False,  # the runner cancels, and journals that it did
            on_retry=conn.tries.count,
        )

    async def submit(self, conn: Connection, request: RemoteRequest) -> Submitted:
        task = await self._client(conn).submit(request.operation, request.body)
        return Submitted(task.id, {"polling_url": task.polling_url, "model": task.model})

    async def result(self, conn: Connection, remote_id: str, resume: dict[str, Any]) -> bytes:
        client = self._client(conn)
        task = _bfl_task(remote_id, resume)
        answer = await client.poll(task)
        sample = (answer.get("result") or {}).get("sample")
        if not isinstance(sample, str) or not sample:
            raise JobFailed(self.name, "job is Ready but has no sample URL", task_id=remote_id)
        return await client.download(sample, task_id=remote_id)

    async def cancel(self, conn: Connection, remote_id: str, resume: dict[str, Any]) -> bool:
        return await self._client(conn).cancel(_bfl_task(remote_id, resume))


def _bfl_task(remote_id: str, resume: dict[str, Any]) -> SubmittedTask:
    return SubmittedTask(
        remote_id, str(resume.get("polling_url", "")), str(resume.get("model", ""))
    )


class OpenAIDriver:
    name = "openai"
    shield_submit = False

    def endpoint(self, request: RemoteRequest) -> str:
        return (
            f"{request.api.base_url.rstrip('/').removesuffix('/v1')}/v1/images/{request.operation}"
        )

    async def submit(self, conn: Connection, request: RemoteRequest) -> Submitted:
        client = OpenAIImagesClient(
            conn.session,
            conn.api.base_url,
            conn.key,
            timeout=conn.api.timeout,
            cooldown=conn.cooldown,
            redactor=conn.redactor,
            on_retry=conn.tries.count,
        )
        if request.operation == "edits":
            images = [(name, data) for name, data in request.files if name != "mask"]
            mask = next((data for name, data in request.files if name == "mask"), None)
            found = await client.edit(request.body, images, mask)
        else:
            found = await client.generate(request.body)
        return Submitted(None, {}, found[0])

    async def result(self, conn: Connection, remote_id: str, resume: dict[str, Any]) -> bytes:
        raise AmbiguousSubmit(self.name, "a synchronous request has no job to poll")

    async def cancel(self, conn: Connection, remote_id: str, resume: dict[str, Any]) -> bool:
        return False  # aborting the request is all there is


DRIVERS: dict[str, Driver] = {"bfl": BFLDriver(), "openai": OpenAIDriver()}
