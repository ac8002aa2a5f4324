"""The backend a `comfyfleet worker --local-slots N` brings: `comfyfleet serve` with the
built-in engine as a child process, listening on loopback only (the gateway reaches it
through the worker's tunnel), stopped with the worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from pathlib import Path

import aiohttp

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LocalBackend:
    def __init__(self, data_dir: Path, slots: int, extra: list[str]) -> None:
        self.data_dir = data_dir
        self.slots = slots
        self.extra = extra  # --testing-nodes, --custom-nodes DIR, ...
        self.port = _free_loopback_port()
        self._process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "comfyfleet",
            "serve",
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--data-dir", str(self.data_dir), "--local-slots", str(self.slots)),
            *self.extra,
        ]
        log_file = (self.data_dir / "backend.log").open("ab")
        try:
            self._process = await asyncio.create_subprocess_exec(
                *command, stdout=log_file, stderr=asyncio.subprocess.STDOUT
            )
        finally:
            log_file.close()
        await self._until_up()

    async def _until_up(self) -> None:
        assert self._process is not None
        async with aiohttp.ClientSession() as session, asyncio.timeout(START_TIMEOUT):
            while True:
                if self._process.returncode is not None:
                    raise RuntimeError(
                        f"the worker's backend exited ({self._process.returncode}): "
                        f"see {self.data_dir / 'backend.log'}"
                    )
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(f"{self.url}/system_stats") as answer:
                        if answer.status == 200:
                            return
                await asyncio.sleep(0.1)

    async def stop(self, grace: float = 10.0) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            process.kill()
            await process.wait()
