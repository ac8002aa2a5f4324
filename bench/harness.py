"""What the benchmarks share: server processes on free loopback ports, and percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
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


async def mark_done(
    ws: aiohttp.ClientWebSocketResponse, done: dict[str, asyncio.Future[float]]
) -> None:
    """Read a client's socket: each prompt's future gets the time its done signal came."""
    async for message in ws:
        if message.type != aiohttp.WSMsgType.TEXT:
            continue
        frame = json.loads(message.data)
        data = frame["data"]
        if frame["type"] == "executing" and data.get("node") is None:
            future = done.get(data["prompt_id"])
            if future is not None and not future.done():
                future.set_result(time.perf_counter())


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


@contextlib.contextmanager
def throwaway_database(server_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database on the server of `server_url`, dropped afterwards; its
    URL. (A database, not a schema: servers use the database's default schema.)"""
    import asyncpg  # only the PostgreSQL benchmarks need it

    name = f"bench_{uuid.uuid4().hex[:12]}"
    parts = urllib.parse.urlsplit(server_url)

    async def admin(statement: str) -> None:
        conn = await asyncpg.connect(server_url)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
