"""The backend a worker starts itself, as a child process listening on loopback only
(the gateway reaches it through the worker's tunnel), stopped with the worker and
killed by the kernel if the worker dies first:

- `--local-slots N`: `comfyfleet serve` with the built-in engine;
- `--comfyui DIR`: ComfyUI's main.py in DIR, with comfyfleet's companion pack, as a
  managed backend is started (comfyfleet.managed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from comfyfleet.managed.pack import pack_paths
from comfyfleet.managed.process import spawn, terminate
from comfyfleet.managed.spec import InstanceSpec, ManagedGroup
from comfyfleet.testing import LEDGER_ENV

log = logging.getLogger(__name__)


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _passed_on(variable: str) -> bool:
    return not variable.startswith("COMFYFLEET_") or variable == LEDGER_ENV


class LocalBackend:
    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        cwd: Path,
        log_file: Path,
        port: int,
        start_timeout: float,
    ) -> None:
        self.argv, self.env, self.cwd, self.log_file = argv, env, cwd, log_file
        self.port = port
        self.start_timeout = start_timeout
        self._process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def engine(cls, data_dir: Path, slots: int, extra: list[str]) -> LocalBackend:
        """`comfyfleet serve --local-slots N` with its files in `data_dir`; `extra` are
        more flags (--testing-nodes, --custom-nodes DIR)."""
        port = _free_loopback_port()
        argv = [sys.executable, "-m", "comfyfleet", "serve", "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--data-dir", str(data_dir), "--local-slots", str(slots)]
        # No event log: the gateway keeps its own for its clients, and reads no backend's.
        argv += ["--events-retention", "0"]
        # Its settings are its flags: none of the worker's COMFYFLEET_* (a token would
        # lock the gateway out), but the testing nodes' ledger.
        env = {k: v for k, v in os.environ.items() if _passed_on(k)}
        return cls([*argv, *extra], env, data_dir, data_dir / "backend.log", port, 60.0)

    @classmethod
    def comfyui(
        cls, folder: Path, python: str, gpu: str, data_dir: Path, args: list[str]
    ) -> LocalBackend:
        """ComfyUI in `folder` run by `python`, on `gpu` (an id, or "cpu"), its input,
        output and temp folders in `data_dir`, with the companion pack; `args` are more
        of ComfyUI's flags."""
        group = ManagedGroup(name="worker", path=folder, python=python, args=tuple(args))
        spec = InstanceSpec(group, "worker", gpu, _free_loopback_port(), data_dir)
        argv = spec.argv(pack_paths(data_dir / "pack"))
        env = spec.environment(os.environ)
        return cls(argv, env, spec.cwd, spec.log, spec.port, group.start_timeout)

    async def start(self) -> None:
        for folder in ("input", "output", "temp"):  # ComfyUI lists its input folder at once
            (self.log_file.parent / folder).mkdir(parents=True, exist_ok=True)
        self._process = await spawn(self.argv, self.env, self.cwd, self.log_file)
        await self._until_up()

    async def _until_up(self) -> None:
        assert self._process is not None
        async with aiohttp.ClientSession() as session, asyncio.timeout(self.start_timeout):
            while True:
                if self._process.returncode is not None:
                    raise RuntimeError(
                        f"the worker's backend exited ({self._process.returncode}): "
                        f"see {self.log_file}"
                    )
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(f"{self.url}/system_stats") as answer:
                        if answer.status == 200:
                            return
                await asyncio.sleep(0.1)

    async def stop(self, grace: float = 10.0) -> None:
        if self._process is not None and self._process.returncode is None:
            await terminate(self._process, grace)

    async def kill(self) -> None:
        """At once: what it runs is not to finish (it goes back to the gateway's queue)."""
        await self.stop(grace=0)
