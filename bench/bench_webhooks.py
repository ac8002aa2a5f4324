"""Webhook delivery latency at 100 job ends a second, against the WebSocket's end frame.

One `comfyfleet serve --local-slots 16 --testing-nodes` process with one `[[webhooks]]`
target: a receiver in this process (aiohttp on loopback) that verifies each signature
(HMAC-SHA256, as Standard Webhooks says) and answers 204. Prompts (PrimitiveInt ->
PreviewAny, each distinct) are submitted at `--rate` a second for `--seconds`, on
schedule, with the client_id of one WebSocket client. Per prompt, from its end as the
store recorded it (the jobs API's execution_end_time, same machine clock):

- webhook latency: until the receiver has the verified delivery;
- the baseline, measured in the same run: until the WebSocket client has the prompt's
  end frame (`executing` with node null), the path a live client is told by.

    .venv/bin/python bench/bench_webhooks.py [--rate 100] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure
from harness import free_port, percentile, serve, wait_ready


def prompt(n: int) -> dict[str, Any]:
    return {
        "1": {"class_type": "PrimitiveInt", "inputs": {"value": n}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


class Receiver:
    def __init__(self, key: bytes) -> None:
        self.key = key
        self.arrived: dict[str, float] = {}  # prompt_id -> arrival (time.time())
        self.bad = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        now = time.time()
        signed = f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}."
        digest = hmac.new(self.key, signed.encode() + body, hashlib.sha256).digest()
        expected = "v1," + base64.b64encode(digest).decode()
        if not hmac.compare_digest(expected, request.headers["webhook-signature"]):
            self.bad += 1
            return web.Response(status=401)
        self.arrived.setdefault(json.loads(body)["data"]["prompt_id"], now)
        return web.Response(status=204)


async def watch(
    session: aiohttp.ClientSession, url: str, client_id: str, ends: dict[str, float]
) -> None:
    async with session.ws_connect(f"{url}/ws?clientId={client_id}", max_msg_size=0) as ws:
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            frame = json.loads(message.data)
            data = frame.get("data") or {}
            if frame["type"] == "executing" and data.get("node") is None and data.get("prompt_id"):
                ends.setdefault(data["prompt_id"], time.time())


async def submit_all(url: str, rate: float, seconds: float, client_id: str) -> list[str]:
    count = int(rate * seconds)
    ids: list[str] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:

        async def one(n: int, at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            body = {"prompt": prompt(n), "client_id": client_id}
            async with session.post(url + "/prompt", json=body) as answer:
                assert answer.status == 200, await answer.text()
                ids.append((await answer.json())["prompt_id"])

        t0 = time.monotonic() + 0.2
        await asyncio.gather(*(one(n, t0 + n / rate) for n in range(count)))
    return ids


async def ended_at(session: aiohttp.ClientSession, url: str, total: int) -> dict[str, float]:
    """Each prompt's end as recorded (seconds), once all ended."""
    while True:
        async with session.get(url + "/api/jobs", params={"limit": 1000}) as answer:
            body = await answer.json()
        jobs = body["jobs"]
        if body["pagination"]["total"] >= total and all(j["status"] == "completed" for j in jobs):
            return {j["id"]: j["execution_end_time"] / 1000 for j in jobs}
        await asyncio.sleep(0.1)


async def run(rate: float, seconds: float) -> dict[str, float]:
    secret_key = os.urandom(32)
    receiver = Receiver(secret_key)
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    hook_port, port = free_port(), free_port()
    await web.TCPSite(runner, "127.0.0.1", hook_port).start()
    url = f"http://127.0.0.1:{port}"
    try:
        with tempfile.TemporaryDirectory() as data:
            config = Path(data) / "comfyfleet.toml"
            secret = "whsec_" + base64.b64encode(secret_key).decode()
            config.write_text(
                f'[[webhooks]]\nurl = "http://127.0.0.1:{hook_port}/hook"\nsecret = "{secret}"\n'
            )
            process = serve(
                data, port, "--local-slots", "16", "--testing-nodes", "--config", str(config)
            )
            try:
                await wait_ready(url)
                return await measure(url, rate, seconds, receiver)
            finally:
                process.terminate()
                process.wait(30)
    finally:
        await runner.cleanup()


async def measure(url: str, rate: float, seconds: float, receiver: Receiver) -> dict[str, float]:
    client_id = uuid.uuid4().hex
    frames: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:
        watcher = asyncio.create_task(watch(session, url, client_id, frames))
        await asyncio.sleep(0.5)
        ids = await submit_all(url, rate, seconds, client_id)
        ends = await ended_at(session, url, len(ids))
        deadline = time.monotonic() + 30
        while len(receiver.arrived) < len(ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    hook = [receiver.arrived[i] - ends[i] for i in ids if i in receiver.arrived]
    frame = [frames[i] - ends[i] for i in ids if i in frames]
    return {
        "count": len(ids),
        "delivered": len(hook),
        "unverified": receiver.bad,
        "hook_p50": percentile(hook, 0.5) * 1000,
        "hook_p99": percentile(hook, 0.99) * 1000,
        "frame_p50": percentile(frame, 0.5) * 1000,
        "frame_p99": percentile(frame, 0.99) * 1000,
        "rate": len(ids) / (max(ends.values()) - min(ends.values())),
    }


async def main(args: argparse.Namespace) -> None:
    out = await run(args.rate, args.seconds)
    print(json.dumps(out, indent=1))
    if out["delivered"] != out["count"] or out["unverified"]:
        raise SystemExit("not every webhook arrived verified")
    figure("webhook_latency_p50_ms", out["hook_p50"], "ms", out["frame_p50"])
    figure("webhook_latency_p99_ms", out["hook_p99"], "ms", out["frame_p99"])
    figure("job_ends_per_second", out["rate"], "1/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    asyncio.run(main(parser.parse_args()))
