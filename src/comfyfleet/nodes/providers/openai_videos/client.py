"""OpenAI-compatible videos API client (`/v1/videos`): create a job, poll it, download it.

Creating a video is the only request that costs money and it carries no
idempotency key, so it is repeated only when the provider provably never saw
it. Status polls and the download are reads, retried freely; both need the key
(the content is served by the API itself, not from a signed URL).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

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
    short,
)

log = logging.getLogger(__name__)

PROVIDER = "openai_videos"
_RUNNING = frozenset({"queued", "in_progress"})


class OpenAIVideosClient(ProviderClient):
    provider = PROVIDER

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        api_key: str,
        *,
        poll_interval: float = 2.0,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        deadline: float = 1800.0,
        max_attempts: int = 4,
        poll_attempts: int = 10,
        cooldown: Cooldown | None = None,
        backoff: Backoff | None = None,
        redactor: Redactor | None = None,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        """`timeout` bounds each HTTP request; `deadline` bounds the wait for a video.

        `cooldown` gates job creation only (it belongs to the account, so share it);
        polls and downloads wait out their own 429s. `on_retry` hears every retry.
        """
        super().__init__(
            session,
            base_url,
            api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_attempts=max_attempts,
            read_attempts=poll_attempts,
            cooldown=cooldown,
            backoff=backoff,
            redactor=redactor,
            on_retry=on_retry,
        )
        self.poll_interval = poll_interval
        self.deadline = deadline

    def _url(self, video_id: str = "", tail: str = "") -> str:
        name = f"/{quote(video_id, safe='')}" if video_id else ""
        return f"{self.base_url}/v1/videos{name}{tail}"

    async def create(self, fields: Mapping[str, str], reference: bytes | None = None) -> str:
        """Start a video job (multipart, as the API documents it); returns its id."""

        def form() -> aiohttp.FormData:
            # Built per attempt: aiohttp consumes a FormData when sending it.
            data = aiohttp.FormData()
            for name, value in fields.items():
                data.add_field(name, value)
            if reference is not None:
                kind = media_type(reference)
                data.add_field(
                    "input_reference", reference, filename="reference", content_type=kind
                )
            return data

        async def once() -> str:
            try:
                reply = await self._http.request(
                    "POST", self._url(), headers=self._headers, data=form()
                )
            except Unsent as exc:
                raise ProviderError(PROVIDER, f"create: {exc}", retryable=True) from None
            except Unanswered as exc:
                message = f"create: {exc}; the video job may have been created"
                raise AmbiguousSubmit(PROVIDER, message) from None
            if not reply.ok:
                raise self._error(reply, "create", creates_job=True)
            self.cooldown.budget(reply.headers)
            answer = reply.json()
            video_id = answer.get("id") if isinstance(answer, dict) else None
            if not isinstance(video_id, str) or not video_id:
                # A 2xx means the job exists, but without its id it cannot be found again.
                message = f"create answered {reply.status} without a video id"
                raise AmbiguousSubmit(PROVIDER, message, status=reply.status)
            return video_id

        return await self._attempts.run(once, "create video")

    async def wait(self, video_id: str) -> dict[str, Any]:
        """Poll until the job is `completed` and return that answer; raise when it failed.

        Polls keep a fixed beat from the first one, so slow answers do not add up.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        beat = 0
        while True:
            answer = await self._read_attempts.run(lambda: self._status(video_id), "poll")
            status = str(answer.get("status"))
            if status == "completed":
                return answer
            if status not in _RUNNING:
                raise _failure(video_id, status, answer)
            now = loop.time()
            if now - started >= self.deadline:
                message = f"no video after {self.deadline:.0f}s (last status {status!r})"
                raise ProviderError(PROVIDER, message, task_id=video_id, retryable=False)
            beat = max(beat + 1, math.floor((now - started) / self.poll_interval) + 1)
            await asyncio.sleep(started + beat * self.poll_interval - now)

    async def _status(self, video_id: str) -> dict[str, Any]:
        try:
            reply = await self._http.request("GET", self._url(video_id), headers=self._headers)
        except (Unsent, Unanswered) as exc:
            raise ProviderError(
                PROVIDER, f"poll: {exc}", task_id=video_id, retryable=True
            ) from None
        if reply.status == 404:
            raise JobFailed(PROVIDER, "video not found", status=404, task_id=video_id)
        if not reply.ok:
            raise self._error(reply, "poll", creates_job=False, task_id=video_id)
        answer = reply.json()
        if not isinstance(answer, dict):
            message = f"poll answered {reply.status} with something other than a JSON object"
            raise ProviderError(PROVIDER, message, task_id=video_id, retryable=True)
        return answer

    async def download(self, video_id: str) -> bytes:
        """The finished video's MP4 bytes (`variant=video`)."""
        url = self._url(video_id, "/content?variant=video")

        async def once() -> bytes:
            try:
                reply = await self._http.request("GET", url, headers=self._headers)
            except (Unsent, Unanswered) as exc:
                raise ProviderError(
                    PROVIDER, f"download: {exc}", task_id=video_id, retryable=True
                ) from None
            if not reply.ok:
                raise self._error(reply, "download", creates_job=False, task_id=video_id)
            if not reply.body:
                raise ProviderError(
                    PROVIDER, "download was empty", task_id=video_id, retryable=True
                )
            return reply.body

        return await self._read_attempts.run(once, "download")

    async def delete(self, video_id: str) -> bool:
        """Delete the video (the API's one way to drop a job). Best effort: False when it
        could not."""
        try:
            reply = await self._http.request("DELETE", self._url(video_id), headers=self._headers)
        except (Unsent, Unanswered, ProviderError) as exc:
            log.warning("delete of video %s failed: %s", video_id, exc)
            return False
        if not reply.ok:
            error = self._error(reply, "delete", creates_job=False, task_id=video_id)
            log.warning("delete of video %s: %s", video_id, error)
            return False
        return True

    def _error(
        self, reply: Reply, what: str, *, creates_job: bool, task_id: str | None = None
    ) -> ProviderError:
        message, kind, code = error_fields(reply)
        detail = short(f"{message} ({code or kind})" if code or kind else message)
        if code in MODERATION_CODES or "moderation" in kind:
            text = self.redactor.text(f"{what}: {detail}")
            return ModerationError(PROVIDER, text, status=reply.status, task_id=task_id)
        if reply.status == 429 and code in QUOTA_CODES:
            text = self.redactor.text(f"{what}: {detail}")
            return ProviderError(PROVIDER, text, status=429, retryable=False)
        return self._http.error_for(reply, what, detail, creates_job=creates_job, task_id=task_id)


def _failure(video_id: str, status: str, answer: dict[str, Any]) -> ProviderError:
    found = answer.get("error")
    error: dict[str, Any] = found if isinstance(found, dict) else {}
    code = str(error.get("code") or "")
    detail = short(str(error.get("message") or code or ""), 200)
    message = f"video ended with status {status!r}" + (f": {detail}" if detail else "")
    if code in MODERATION_CODES:
        return ModerationError(PROVIDER, message, task_id=video_id)
    return JobFailed(PROVIDER, message, task_id=video_id)
