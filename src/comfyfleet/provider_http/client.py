"""What every provider's client sets up the same way: its root URL, the key kept out of
everything it says, the account's shared cooldown, and two retry loops."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import aiohttp

from comfyfleet.provider_http.redact import Redactor
from comfyfleet.provider_http.retry import Backoff, Cooldown
from comfyfleet.provider_http.transport import Attempts, Http, api_root


class ProviderClient:
    """The base of each provider's client (`nodes/providers/<name>/client.py`).

    `_attempts` runs job-creating requests: every try waits for `cooldown`, which
    belongs to the account (share it between clients of one key), and a 429 feeds it.
    `_read_attempts` runs polls and downloads of jobs already accepted, which wait out
    their own 429s only. `timeout` bounds one HTTP request. `on_retry` hears every retry.
    """

    provider: ClassVar[str]  # the name in errors and logs

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        api_key: str,
        *,
        timeout: float,
        connect_timeout: float,
        max_attempts: int,
        read_attempts: int,
        cooldown: Cooldown | None,
        backoff: Backoff | None,
        redactor: Redactor | None,
        on_retry: Callable[[], None] | None,
    ) -> None:
        self.base_url = api_root(base_url)
        self.redactor = (redactor or Redactor()).including(api_key)
        self.cooldown = cooldown or Cooldown()
        backoff = backoff or Backoff()
        self._headers = {**self.auth_headers(api_key), "accept": "application/json"}
        self._http = Http(
            self.provider, session, self.redactor, timeout=timeout, connect_timeout=connect_timeout
        )
        self._attempts = Attempts(
            max_attempts=max_attempts, backoff=backoff, cooldown=self.cooldown, on_retry=on_retry
        )
        self._read_attempts = Attempts(
            max_attempts=read_attempts, backoff=backoff, on_retry=on_retry
        )

    def auth_headers(self, api_key: str) -> dict[str, str]:
        """How this provider takes its key (a bearer token unless it says otherwise)."""
        return {"Authorization": f"Bearer {api_key}"}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.redactor.url(self.base_url)!r})"
