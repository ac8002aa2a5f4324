"""Real comfyfleet servers for tests: in-process on loopback, or as a separate process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer

from comfyfleet.server.app import build_app
from comfyfleet.server.config import ServerConfig
from comfyfleet.server.gateway import Gateway


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def start_in_process(data_dir: Path, **settings: Any) -> tuple[TestServer, Gateway]:
    """A gateway served by aiohttp on 127.0.0.1 (real HTTP and WebSocket), at the port
    its config names: the URL its peers on a shared store reach it at."""
    settings.setdefault("port", free_port())
    config = ServerConfig(data_dir=data_dir, testing_nodes=True, **settings)
    gateway = Gateway.create(config)
    server = TestServer(build_app(gateway), host="127.0.0.1", port=config.port)
    await server.start_server()
    return server, gateway


class ServerProcess:
    """`comfyfleet serve` as a child process, for crash and client-compatibility tests."""

    def __init__(
        self, data_dir: Path, *extra: str, port: int | None = None, token: str | None = None
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.extra: Sequence[str] = extra
        self.token = token  # sent as a bearer token by get / post (a server with auth on)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir / f"server-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> ServerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            str(Path(sys.executable).parent / "comfyfleet"),
            "serve",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--testing-nodes",
            *self.extra,
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log.read_text()}")
            try:
                self.get("/prompt")
                return self
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.05)
        raise TimeoutError(f"server did not start:\n{self.log.read_text()}")

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, headers=self._headers())
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def get_bytes(self, path: str) -> bytes:
        request = urllib.request.Request(self.url + path, headers=self._headers())
        with urllib.request.urlopen(request, timeout=10) as response:
            body: bytes = response.read()
            return body

    def post(self, path: str, body: Any) -> Any:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **self._headers()},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return json.loads(raw) if raw else None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
