"""Drivers: each provider's client seen as submit / result / cancel, so jobs can be journaled.

Each provider's driver lives in its own package (`comfyfleet.nodes.providers.<name>`,
with its client and nodes); the process installs the drivers of the providers it
loads where it composes its node packs (`comfyfleet.nodes.build_registry`).

A job is split where the journal needs it: `submit` is the one request that
costs money and returns what identifies the job; `result` waits for it and
downloads the file (also after a restart, from what was journaled); `cancel`
asks the provider to stop it. Retries live in the clients.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from comfyfleet.fanout.request import ApiConfig, RemoteRequest
from comfyfleet.provider_http.redact import Redactor
from comfyfleet.provider_http.retry import Cooldown


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
    `finished_there` is called once the provider says the job is done, before its
    result is downloaded: the job no longer counts against the provider's limit on
    jobs at once, so its pool slot can start the next job during the download.
    """

    session: aiohttp.ClientSession
    api: ApiConfig
    key: str
    redactor: Redactor
    cooldown: Cooldown
    tries: Tries = field(default_factory=Tries)
    finished_there: Callable[[], None] = lambda: None


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
