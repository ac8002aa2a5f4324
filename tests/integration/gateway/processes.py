"""Helpers for tests against `comfyfleet serve` child processes (blocking clients)."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import websocket

from tests.servers import ServerProcess

TIMEOUT = 60.0


def poll(check: Callable[[], bool], *, what: str, timeout: float = TIMEOUT) -> None:
    """Re-check a server-side condition until it holds (for state no frame announces)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def submit(server: ServerProcess, prompt: dict[str, Any], client_id: str | None = None) -> str:
    body: dict[str, Any] = {"prompt": prompt}
    if client_id:
        body["client_id"] = client_id
    prompt_id: str = server.post("/prompt", body)["prompt_id"]
    return prompt_id


class Frames:
    """A blocking WebSocket client (websocket-client) that reads JSON events."""

    def __init__(self, server: ServerProcess, client_id: str | None = None) -> None:
        self.client_id = client_id or uuid.uuid4().hex
        self.ws = websocket.WebSocket()
        url = f"ws://127.0.0.1:{server.port}/ws?clientId={self.client_id}"
        self.ws.connect(url, timeout=30)  # type: ignore[no-untyped-call]
        self.events: list[dict[str, Any]] = []

    def until(self, predicate: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """Read until an event matches; raises if the socket closes first."""
        while True:
            try:
                out = self.ws.recv()
            except websocket.WebSocketConnectionClosedException:
                raise AssertionError(f"socket closed before {what}") from None
            if not out:
                raise AssertionError(f"socket closed before {what}")
            if isinstance(out, str):
                event: dict[str, Any] = json.loads(out)
                self.events.append(event)
                if predicate(event):
                    return event

    def progress(self, prompt_id: str) -> None:
        self.until(
            lambda e: e["type"] == "progress" and e["data"]["prompt_id"] == prompt_id,
            f"progress of {prompt_id}",
        )

    def done(self, prompt_id: str) -> None:
        self.until(
            lambda e: (
                e["type"] == "executing"
                and e["data"]["node"] is None
                and e["data"]["prompt_id"] == prompt_id
            ),
            f"executing null of {prompt_id}",
        )

    def types(self, prompt_id: str) -> list[str]:
        return [e["type"] for e in self.events if e["data"].get("prompt_id") == prompt_id]

    def close(self) -> None:
        self.ws.close()


def job(server: ServerProcess, prompt_id: str) -> dict[str, Any]:
    found: dict[str, Any] = server.get(f"/api/jobs/{prompt_id}")
    return found


def wait_completed(server: ServerProcess, prompt_id: str, timeout: float = TIMEOUT) -> None:
    poll(
        lambda: job(server, prompt_id)["status"] == "completed",
        what=f"{prompt_id} to complete",
        timeout=timeout,
    )


@contextmanager
def gateways(
    tmp_path: Path,
    url: str,
    count: int,
    *args: str,
    lease: float = 2.0,
    token: str | None = None,
) -> Iterator[list[ServerProcess]]:
    """`count` gateway processes on the store at `url` (ids gw-0, gw-1, ...), each with
    `args`, started in turn and stopped together; `token` when authentication is on."""
    with ExitStack() as stack:
        started = []
        for n in range(count):
            server = ServerProcess(
                tmp_path / f"gateway-{n}",
                *("--store", url, "--lease", f"{lease}s", "--gateway-id", f"gw-{n}", *args),
                token=token,
            )
            started.append(stack.enter_context(server))
        yield started


def logged_events(base: str, prompt_id: str) -> list[str]:
    """The event types of a finished prompt's stream, as a follower reads it (SSE)."""
    with urllib.request.urlopen(f"{base}/api/jobs/{prompt_id}/events", timeout=30) as answer:
        lines = answer.read().decode().splitlines()
    return [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
