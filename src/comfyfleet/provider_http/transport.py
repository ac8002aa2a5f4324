"""One HTTP exchange with a provider, and the retry loop around such exchanges.

The transport's one job beyond sending is to tell two failures apart: the
connection was never made (the provider cannot have seen the request, so even a
job-creating POST may be repeated), or something broke after that (the request
may have arrived, so a POST outcome is unknown).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from multidict import CIMultiDict

from comfyfleet.errors import ComfyfleetError
from comfyfleet.provider_http.errors import AmbiguousSubmit, ProviderError, RateLimited
from comfyfleet.provider_http.redact import Redactor
from comfyfleet.provider_http.retry import Backoff, Cooldown, retry_after_from

log = logging.getLogger(__name__)

T = TypeVar("T")

# 504 comes from a gateway that gave up waiting on the origin, which may still be
# running the job; the other 5xx are the server declining the request.
_DECLINED_5XX = frozenset({500, 502, 503})


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            return None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class Unsent(ComfyfleetError):
    """No connection was made: the provider never saw the request."""


class Unanswered(ComfyfleetError):
    """The request may have been delivered, but no complete answer came back."""


class Http:
    """Sends requests for one provider, with redacted failure descriptions."""

    def __init__(
        self,
        provider: str,
        session: aiohttp.ClientSession,
        redactor: Redactor,
        *,
        timeout: float,
        connect_timeout: float,
    ) -> None:
        self.provider = provider
        self.session = session
        self.redactor = redactor
        self.timeout = timeout
        self.connect_timeout = connect_timeout

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        json_body: Any = None,
        data: Any = None,
        follow_redirects: bool = False,
    ) -> Reply:
        """Raises `Unsent` or `Unanswered` instead of aiohttp's exceptions.

        Redirects stay off for authenticated calls: aiohttp would carry custom
        key headers such as `x-key` along to whatever host the redirect names.
        """
        timeout = aiohttp.ClientTimeout(
            total=self.timeout, connect=self.connect_timeout, sock_connect=self.connect_timeout
        )
        try:
            async with self.session.request(
                method,
                url,
                headers=headers,
                json=json_body,
                data=data,
                timeout=timeout,
                allow_redirects=follow_redirects,
                raise_for_status=False,
            ) as response:
                body = await response.read()
                return Reply(response.status, CIMultiDict(response.headers), body)
        except aiohttp.InvalidURL:
            message = f"invalid URL {self.redactor.url(url)}"
            raise ProviderError(self.provider, message, retryable=False) from None
        # Both are raised before any byte of the request is written.
        except (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError) as exc:
            raise Unsent(self._describe(method, url, exc)) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unanswered(self._describe(method, url, exc)) from None

    def _describe(self, method: str, url: str, exc: BaseException) -> str:
        detail = self.redactor.text(str(exc)) or "timed out"
        return f"{method} {self.redactor.url(url)}: {type(exc).__name__}: {detail}"

    def error_for(
        self,
        reply: Reply,
        what: str,
        detail: str,
        *,
        creates_job: bool,
        task_id: str | None = None,
    ) -> ProviderError:
        """The exception for a non-2xx reply the client has no more specific meaning for."""
        message = self.redactor.text(f"{what} failed: {detail}" if detail else f"{what} failed")
        status = reply.status
        common: dict[str, Any] = {"status": status, "task_id": task_id}
        if status == 429:
            wait = retry_after_from(reply.headers)
            return RateLimited(self.provider, message, retry_after=wait, **common)
        if creates_job and status >= 500 and status not in _DECLINED_5XX:
            return AmbiguousSubmit(self.provider, message, **common)
        retryable = status >= 500 or status == 408
        return ProviderError(self.provider, message, retryable=retryable, **common)


def short(text: str, limit: int = 300) -> str:
    """Provider error bodies can be whole HTML pages; keep log lines readable."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Attempts:
    """Repeats an operation while it fails with a retryable `ProviderError`.

    With a `cooldown` (job-creating requests), every try waits for the provider's
    shared pause and a 429 feeds it. Without one (polls and downloads of jobs
    already accepted), a 429 delays only the request that got it: a paused
    account must not stall jobs it has already taken on.
    """

    def __init__(
        self,
        *,
        max_attempts: int,
        backoff: Backoff,
        cooldown: Cooldown | None = None,
        on_retry: Callable[[], None] | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.max_attempts = max(1, max_attempts)
        self.backoff = backoff
        self.cooldown = cooldown
        self._on_retry = on_retry
        self._sleep = sleep

    async def run(self, operation: Callable[[], Awaitable[T]], what: str) -> T:
        attempt = 0
        while True:
            if self.cooldown is not None:
                await self.cooldown.wait()
            try:
                return await operation()
            except ProviderError as exc:
                if not exc.retryable or attempt + 1 >= self.max_attempts:
                    raise
                delay = self._delay_after(exc, attempt)
                log.warning(
                    "%s; retry %d of %d in %.2fs",
                    exc,
                    attempt + 1,
                    self.max_attempts - 1,
                    delay,
                )
            attempt += 1
            if self._on_retry is not None:
                self._on_retry()
            await self._sleep(delay)

    def _delay_after(self, exc: ProviderError, attempt: int) -> float:
        if isinstance(exc, RateLimited):
            if self.cooldown is None:
                if exc.retry_after is not None:
                    return exc.retry_after
            else:
                self.cooldown.rate_limited(exc.retry_after)
                if exc.retry_after is not None:
                    # The shared cooldown now covers the wait; `cooldown.wait()` sleeps it.
                    return 0.0
        return self.backoff.delay(attempt)


def api_root(base_url: str) -> str:
    """The base URL without a trailing slash or `/v1`, which users paste either way."""
    root = base_url.strip().rstrip("/")
    return root.removesuffix("/v1")


async def fetch_bytes(http: Http, attempts: Attempts, url: str, *, task_id: str | None) -> bytes:
    """GET a result file. Unauthenticated: result URLs are signed, and often on another host."""

    async def once() -> bytes:
        try:
            reply = await http.request("GET", url, follow_redirects=True)
        except (Unsent, Unanswered) as exc:
            raise ProviderError(http.provider, str(exc), task_id=task_id, retryable=True) from None
        if not reply.ok:
            detail = f"{http.redactor.url(url)} answered {reply.status}"
            raise http.error_for(reply, "download", detail, creates_job=False, task_id=task_id)
        if not reply.body:
            message = f"download of {http.redactor.url(url)} was empty"
            raise ProviderError(http.provider, message, task_id=task_id, retryable=True)
        return reply.body

    return await attempts.run(once, "download")


async def notify(callback: Callable[..., Any] | None, *args: Any) -> None:
    """Call a user callback that may be a plain function or a coroutine function."""
    if callback is None:
        return
    result = callback(*args)
    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
        await result
