"""What the benchmarks share: server processes on free loopback ports, and percentiles."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp

BIN = str(Path(sys.executable).parent / "comfyfleet")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    """The q-th quantile (nearest rank); NaN for no values."""
    ordered = sorted(values) or [float("nan")]
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def serve(data: Path | str, port: int, *extra: str) -> subprocess.Popen[bytes]:
    """`comfyfleet serve` on 127.0.0.1:`port`, quiet, with `extra` flags."""
    command = [BIN, "serve", "--port", str(port), "--data-dir", str(data), "--log-level", "WARNING"]
    return subprocess.Popen(
        [*command, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


async def wait_ready(url: str, timeout: float = 30.0) -> None:
    """Until `GET /prompt` answers 200."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with aiohttp.ClientSession() as session:
        while loop.time() < deadline:
            try:
                async with session.get(url + "/prompt") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"server at {url} did not start")
