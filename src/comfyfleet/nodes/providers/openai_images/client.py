"""OpenAI-compatible images API client (`/v1/images/generations` and `/v1/images/edits`).

These requests are synchronous: the answer arrives when the images are done,
tens of seconds later. A timeout after sending therefore says nothing about
whether the images were made (and billed), so such a request is only repeated
when the caller supplied an `Idempotency-Key` the provider deduplicates on.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from comfyfleet.imaging import media_type
from comfyfleet.provider_http.client import ProviderClient
from comfyfleet.provider_http.errors import (
    AmbiguousSubmit,
    JobFailed,
    ModerationError,
    ProviderError,
)
from comfyfleet.provider_http.openai_errors import MODERATION_CODES, QUOTA_CODES, error_fields
from comfyfleet.provider_http.redact import Redactor
from comfyfleet.provider_http.retry import Backoff, Cooldown
from comfyfleet.provider_http.transport import (
    Reply,
    Unanswered,
    Unsent,
    fetch_bytes,
    short,
)

PROVIDER = "openai"

FieldValue = str | int | float | bool


class OpenAIImagesClient(ProviderClient):
    provider = PROVIDER

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        max_attempts: int = 3,
        cooldown: Cooldown | None = None,
        backoff: Backoff | None = None,
        redactor: Redactor | None = None,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        """`timeout` bounds one whole request, generation time included: keep it long.

        `cooldown` gates the job-creating requests only; downloads of `url` answers
        wait out their own 429s. `on_retry` hears every retry.
        """
        super().__init__(
            session,
            base_url,
            api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_attempts=max_attempts,
            read_attempts=max_attempts,
            cooldown=cooldown,
            backoff=backoff,
            redactor=redactor,
            on_retry=on_retry,
        )

    async def generate(
        self, body: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> list[bytes]:
        """Images for a JSON generation request, decoded from b64_json or downloaded."""
        url = f"{self.base_url}/v1/images/generations"
        payload = dict(body)
        return await self._create("generate", url, lambda: {"json_body": payload}, idempotency_key)

    async def edit(
        self,
        fields: Mapping[str, FieldValue],
        images: list[tuple[str, bytes]],
        mask: bytes | None = None,
        *,
        idempotency_key: str | None = None,
        image_field: str = "image[]",
    ) -> list[bytes]:
        """Images for a multipart edit request (`images` as (file name, bytes) pairs)."""
        if not images:
            raise ProviderError(PROVIDER, "edit needs at least one image", retryable=False)
        url = f"{self.base_url}/v1/images/edits"

        def form() -> dict[str, Any]:
            # Built per attempt: aiohttp consumes a FormData when sending it.
            data = aiohttp.FormData()
            for name, value in fields.items():
                data.add_field(name, _form_text(value))
            for filename, content in images:
                data.add_field(
                    image_field, content, filename=filename, content_type=media_type(content)
                )
            if mask is not None:
                data.add_field("mask", mask, filename="mask.png", content_type=media_type(mask))
            return {"data": data}

        return await self._create("edit", url, form, idempotency_key)

    async def _create(
        self,
        what: str,
        url: str,
        payload: Callable[[], dict[str, Any]],
        idempotency_key: str | None,
    ) -> list[bytes]:
        headers = dict(self._headers)
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key

        async def once() -> Any:
            try:
                reply = await self._http.request("POST", url, headers=headers, **payload())
            except Unsent as exc:
                raise ProviderError(PROVIDER, f"{what}: {exc}", retryable=True) from None
            except Unanswered as exc:
                if idempotency_key:
                    raise ProviderError(PROVIDER, f"{what}: {exc}", retryable=True) from None
                message = f"{what}: {exc}; the images may have been generated"
                raise AmbiguousSubmit(PROVIDER, message) from None
            if not reply.ok:
                raise self._error(reply, what, idempotent=bool(idempotency_key))
            self.cooldown.budget(reply.headers)
            return reply.json()

        answer = await self._attempts.run(once, what)
        return await self._images(what, answer)

    async def _images(self, what: str, answer: Any) -> list[bytes]:
        items = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(items, list) or not items:
            raise JobFailed(PROVIDER, f"{what} answered without images")
        images = []
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("b64_json"), str):
                images.append(_decode(what, item["b64_json"]))
            elif isinstance(item, dict) and isinstance(item.get("url"), str):
                images.append(
                    await fetch_bytes(self._http, self._read_attempts, item["url"], task_id=None)
                )
            else:
                raise JobFailed(PROVIDER, f"{what} answered an image with neither b64_json nor url")
        return images

    def _error(self, reply: Reply, what: str, *, idempotent: bool) -> ProviderError:
        message, kind, code = error_fields(reply)
        detail = short(f"{message} ({code or kind})" if code or kind else message)
        if code in MODERATION_CODES or "moderation" in kind:
            text = self.redactor.text(f"{what}: {detail}")
            return ModerationError(PROVIDER, text, status=reply.status)
        if reply.status == 429 and code in QUOTA_CODES:
            text = self.redactor.text(f"{what}: {detail}")
            return ProviderError(PROVIDER, text, status=429, retryable=False)
        error = self._http.error_for(reply, what, detail, creates_job=not idempotent)
        return error


def _decode(what: str, text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise JobFailed(PROVIDER, f"{what} answered an image that is not valid base64") from None


def _form_text(value: FieldValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
