"""The OpenAI images client as a fan-out driver: one synchronous request is the whole job."""

from __future__ import annotations

from typing import Any

from comfyfleet.fanout.drivers import Connection, Submitted
from comfyfleet.fanout.request import RemoteRequest
from comfyfleet.nodes.providers.openai_images.client import OpenAIImagesClient
from comfyfleet.provider_http.errors import AmbiguousSubmit


class OpenAIImagesDriver:
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
