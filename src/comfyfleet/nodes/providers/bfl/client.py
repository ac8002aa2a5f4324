"""Black Forest Labs (FLUX) API client: submit a job, poll it, download the image.

Submitting is the only step that costs money, and BFL has no idempotency key, so
a submit is repeated only when the provider provably never saw it. Polls and
downloads are reads and are retried freely.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import aiohttp

from comfyfleet.provider_http.client import ProviderClient
from comfyfleet.provider_http.errors import (
    AmbiguousSubmit,
    JobFailed,
    ModerationError,
    ProviderCancelled,
    ProviderError,
)
from comfyfleet.provider_http.redact import Redactor
from comfyfleet.provider_http.retry import Backoff, Cooldown
from comfyfleet.provider_http.transport import (
    Reply,
    Unanswered,
    Unsent,
    fetch_bytes,
    notify,
    short,
)

log = logging.getLogger(__name__)

PROVIDER = "bfl"
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MODERATED = frozenset({"Request Moderated", "Content Moderated"})
_FAILED = frozenset({"Error", "Failed", "Task not found"})


@dataclass(frozen=True)
class SubmittedTask:
    """What must be journaled right after a submit to find the job again."""

    id: str
    polling_url: str
    model: str = ""


OnSubmitted = Callable[[SubmittedTask], Awaitable[None] | None]
# (task, status, progress in 0..1 or None when the provider does not say)
OnProgress = Callable[[SubmittedTask, str, float | None], Awaitable[None] | None]


class BFLClient(ProviderClient):
    provider = PROVIDER

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        api_key: str,
        *,
        poll_interval: float = 1.0,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        deadline: float = 900.0,
        max_attempts: int = 4,
        poll_attempts: int = 10,
        cooldown: Cooldown | None = None,
        backoff: Backoff | None = None,
        redactor: Redactor | None = None,
        cancel_path: str | None = "/v1/cancel",
        cancel_on_abort: bool = True,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        """`timeout` bounds each HTTP request; `deadline` bounds the wait for a result.

        `cooldown` gates submits only (it belongs to the account, so share it);
        polls and downloads of accepted jobs wait out their own 429s. `cancel_path`
        is where cancel requests go (None: never try); the public API may not offer
        one, relays and the local emulator do. `on_retry` hears every retry.
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
        self.cancel_path = cancel_path
        self.cancel_on_abort = cancel_on_abort

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-key": api_key}

    async def run(
        self,
        model: str,
        body: dict[str, Any],
        *,
        on_submitted: OnSubmitted | None = None,
        on_progress: OnProgress | None = None,
    ) -> bytes:
        """Submit, report the task (so the caller can journal it), poll, download."""
        task = await self.submit(model, body)
        try:
            await notify(on_submitted, task)
            result = await self.poll(task, on_progress=on_progress)
        except (ModerationError, JobFailed, ProviderCancelled):
            raise  # the job is over on the provider's side: nothing to cancel
        except BaseException:
            if self.cancel_on_abort:
                await self._cancel_quietly(task)
            raise
        sample = (result.get("result") or {}).get("sample")
        if not isinstance(sample, str) or not sample:
            raise JobFailed(PROVIDER, "job is Ready but has no sample URL", task_id=task.id)
        return await self.download(sample, task_id=task.id)

    async def submit(self, model: str, body: dict[str, Any]) -> SubmittedTask:
        if not _MODEL_NAME.fullmatch(model):
            raise ProviderError(PROVIDER, f"invalid model name {model!r}", retryable=False)
        url = f"{self.base_url}/v1/{model}"

        async def once() -> SubmittedTask:
            try:
                reply = await self._http.request("POST", url, headers=self._headers, json_body=body)
            except Unsent as exc:
                raise ProviderError(PROVIDER, f"submit: {exc}", retryable=True) from None
            except Unanswered as exc:
                message = f"submit: {exc}; the job may have been created"
                raise AmbiguousSubmit(PROVIDER, message) from None
            return self._submitted(model, reply)

        return await self._attempts.run(once, f"submit {model}")

    def _submitted(self, model: str, reply: Reply) -> SubmittedTask:
        if not reply.ok:
            raise self._error(reply, f"submit to {model}", creates_job=True)
        self.cooldown.budget(reply.headers)
        data = reply.json()
        task_id = data.get("id") if isinstance(data, dict) else None
        if not isinstance(task_id, str) or not task_id:
            # A 2xx means the job exists, but without its id it cannot be found again.
            message = f"submit to {model} answered {reply.status} without a task id"
            raise AmbiguousSubmit(PROVIDER, message, status=reply.status)
        polling_url = data.get("polling_url")
        if not isinstance(polling_url, str) or not polling_url:
            return SubmittedTask(task_id, self._result_url(task_id), model)
        # Relays sometimes answer with a path; it is relative to the base URL.
        return SubmittedTask(task_id, urljoin(self.base_url + "/", polling_url), model)

    async def poll(
        self, task: SubmittedTask, *, on_progress: OnProgress | None = None
    ) -> dict[str, Any]:
        """Poll until `Ready` and return the final poll answer.

        Polls keep a fixed beat from the first one (every `poll_interval`), not an
        interval after each answer: the time answers take would otherwise add up,
        and a job would be seen done later and later the longer it runs. While the
        job's progress says it is far from done, beats are skipped (see `next_beat`).
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        give_up = started + self.deadline
        url = self._poll_url(task)
        beat = 0
        while True:
            answer = await self._read_attempts.run(lambda: self._poll_once(task, url), "poll")
            status = str(answer.get("status"))
            if status == "Ready":
                return answer
            _raise_if_over(task, status, answer)
            progress = _progress(answer.get("progress"))
            await notify(on_progress, task, status, progress)
            now = loop.time()
            if now >= give_up:
                message = f"no result after {self.deadline:.0f}s (last status {status!r})"
                raise ProviderError(PROVIDER, message, task_id=task.id, retryable=False)
            beat = next_beat(beat, now - started, self.poll_interval, progress)
            await asyncio.sleep(started + beat * self.poll_interval - now)

    async def _poll_once(self, task: SubmittedTask, url: str) -> dict[str, Any]:
        try:
            reply = await self._http.request("GET", url, headers=self._headers)
        except (Unsent, Unanswered) as exc:
            raise ProviderError(PROVIDER, f"poll: {exc}", task_id=task.id, retryable=True) from None
        if reply.status == 404:
            raise JobFailed(PROVIDER, "task not found", status=404, task_id=task.id)
        if not reply.ok:
            raise self._error(reply, "poll", creates_job=False, task_id=task.id)
        answer = reply.json()
        if not isinstance(answer, dict):
            message = f"poll answered {reply.status} with something other than a JSON object"
            raise ProviderError(PROVIDER, message, task_id=task.id, retryable=True)
        return answer

    async def download(self, url: str, *, task_id: str | None = None) -> bytes:
        return await fetch_bytes(self._http, self._read_attempts, url, task_id=task_id)

    async def cancel(self, task: SubmittedTask) -> bool:
        """Ask the provider to drop the job. Best effort: False when it cannot or did not."""
        if self.cancel_path is None:
            return False
        url = f"{self.base_url}/{self.cancel_path.lstrip('/')}?id={quote(task.id, safe='')}"
        try:
            reply = await self._http.request("POST", url, headers=self._headers)
        except (Unsent, Unanswered, ProviderError) as exc:
            log.warning("cancel of task %s failed: %s", task.id, exc)
            return False
        if reply.status in (404, 405, 501):
            log.info("cancel of task %s not supported here (HTTP %d)", task.id, reply.status)
            return False
        if not reply.ok:
            log.warning("cancel of task %s: %s", task.id, self._error(reply, "cancel", False))
            return False
        return True

    async def _cancel_quietly(self, task: SubmittedTask) -> None:
        try:
            await asyncio.wait_for(self.cancel(task), timeout=self._http.timeout)
        except (TimeoutError, ProviderError):
            log.warning("cancel of task %s gave no answer", task.id)

    def _error(
        self, reply: Reply, what: str, creates_job: bool, task_id: str | None = None
    ) -> ProviderError:
        detail = _detail(reply)
        if reply.status in (400, 422) and "moderat" in detail.lower():
            message = self.redactor.text(f"{what}: {detail}")
            return ModerationError(PROVIDER, message, status=reply.status, task_id=task_id)
        return self._http.error_for(reply, what, detail, creates_job=creates_job, task_id=task_id)

    def _result_url(self, task_id: str) -> str:
        return f"{self.base_url}/v1/get_result?id={quote(task_id, safe='')}"

    def _poll_url(self, task: SubmittedTask) -> str:
        """The task's polling URL, unless it would send the key to a foreign host."""
        if _same_site(self.base_url, task.polling_url):
            return task.polling_url
        log.warning(
            "polling URL %s is not on %s; polling the base URL instead",
            self.redactor.url(task.polling_url),
            self.redactor.url(self.base_url),
        )
        return self._result_url(task.id)


#: The longest run of beats skipped on the word of the job's progress: a job whose
#: progress misleads (slow at first, then fast) is seen done at most this much late.
SKIP_AT_MOST = 1.0


def next_beat(beat: int, elapsed: float, interval: float, progress: float | None) -> int:
    """The beat to poll at next, counted from the first poll `elapsed` seconds ago.

    The next beat after now (a slow answer skips beats rather than bunching up),
    or later while the job's progress says it is far from done: no poll before
    half the time it has left by its pace so far (at most SKIP_AT_MOST seconds on),
    so the poll that sees it done still lands on the first beat after it ends,
    and a job polled 20 times does with a handful of polls.
    """
    upcoming = max(beat + 1, math.floor(elapsed / interval) + 1)
    if progress is None or not 0.0 < progress < 1.0:
        return upcoming
    left = elapsed * (1.0 - progress) / progress
    return max(upcoming, math.floor((elapsed + min(left / 2, SKIP_AT_MOST)) / interval))


def _raise_if_over(task: SubmittedTask, status: str, answer: dict[str, Any]) -> None:
    """Raise for a terminal status other than Ready; return for anything still running."""
    details = short(str(answer.get("details") or answer.get("result") or ""), 200)
    message = f"job ended with status {status!r}" + (f": {details}" if details else "")
    if status in _MODERATED:
        raise ModerationError(PROVIDER, message, task_id=task.id)
    if status in _FAILED:
        raise JobFailed(PROVIDER, message, task_id=task.id)
    if "cancel" in status.lower():
        raise ProviderCancelled(PROVIDER, message, task_id=task.id)


def _progress(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    # Some deployments report percent, others a fraction.
    fraction = value / 100 if value > 1 else float(value)
    return min(1.0, max(0.0, fraction))


def _detail(reply: Reply) -> str:
    data = reply.json()
    if isinstance(data, dict) and "detail" in data:
        detail = data["detail"]
        return short(detail if isinstance(detail, str) else str(detail))
    return short(reply.body.decode("utf-8", "replace"))


def _same_site(base_url: str, url: str) -> bool:
    """Same host as the base URL, or a sibling under its parent domain.

    BFL hands out polling URLs on regional hosts (api.eu1.bfl.ai for a base of
    api.bfl.ai), so an exact host match would be too strict; anything else must
    not receive the key.
    """
    try:
        base, other = urlsplit(base_url), urlsplit(url)
    except ValueError:
        return False
    base_host, host = (base.hostname or "").lower(), (other.hostname or "").lower()
    if not host or other.scheme not in ("https", base.scheme):
        return False
    if host == base_host:
        return other.port == base.port or other.scheme == "https"
    try:
        ipaddress.ip_address(base_host)
        return False
    except ValueError:
        pass
    labels = base_host.split(".")
    return len(labels) >= 3 and host.endswith("." + ".".join(labels[1:]))
