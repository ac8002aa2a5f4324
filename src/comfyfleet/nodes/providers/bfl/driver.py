"""The BFL client as a fan-out driver: submit returns the task id, result polls and downloads."""

from __future__ import annotations

from typing import Any

from comfyfleet.fanout.drivers import Connection, Submitted
from comfyfleet.fanout.request import RemoteRequest
from comfyfleet.nodes.providers.bfl.client import BFLClient, SubmittedTask
from comfyfleet.provider_http.errors import JobFailed


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
        task = _task(remote_id, resume)
        answer = await client.poll(task)
        conn.finished_there()
        sample = (answer.get("result") or {}).get("sample")
        if not isinstance(sample, str) or not sample:
            raise JobFailed(self.name, "job is Ready but has no sample URL", task_id=remote_id)
        return await client.download(sample, task_id=remote_id)

    async def cancel(self, conn: Connection, remote_id: str, resume: dict[str, Any]) -> bool:
        return await self._client(conn).cancel(_task(remote_id, resume))


def _task(remote_id: str, resume: dict[str, Any]) -> SubmittedTask:
    return SubmittedTask(
        remote_id, str(resume.get("polling_url", "")), str(resume.get("model", ""))
    )
