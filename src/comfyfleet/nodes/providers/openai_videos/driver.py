"""The OpenAI videos client as a fan-out driver: submit creates the job, result polls it
and downloads the MP4, cancel deletes it."""

from __future__ import annotations

from typing import Any

from comfyfleet.fanout.drivers import Connection, Submitted
from comfyfleet.fanout.request import RemoteRequest
from comfyfleet.nodes.providers.openai_videos.client import PROVIDER, OpenAIVideosClient
from comfyfleet.provider_http.transport import api_root


class OpenAIVideosDriver:
    name = PROVIDER
    shield_submit = True

    def endpoint(self, request: RemoteRequest) -> str:
        return f"{api_root(request.api.base_url)}/v1/videos"

    def _client(self, conn: Connection) -> OpenAIVideosClient:
        return OpenAIVideosClient(
            conn.session,
            conn.api.base_url,
            conn.key,
            poll_interval=conn.api.poll_interval,
            deadline=conn.api.timeout,
            cooldown=conn.cooldown,
            redactor=conn.redactor,
            on_retry=conn.tries.count,
        )

    async def submit(self, conn: Connection, request: RemoteRequest) -> Submitted:
        fields = {name: str(value) for name, value in request.body.items()}
        reference = next((data for name, data in request.files if name == "input_reference"), None)
        video_id = await self._client(conn).create(fields, reference)
        return Submitted(video_id, {"model": fields.get("model", "")})

    async def result(self, conn: Connection, remote_id: str, resume: dict[str, Any]) -> bytes:
        client = self._client(conn)
        await client.wait(remote_id)
        conn.finished_there()
        return await client.download(remote_id)

    async def cancel(self, conn: Connection, remote_id: str, resume: dict[str, Any]) -> bool:
        return await self._client(conn).delete(remote_id)
