"""Tenants sharing the slots (docs/features/fair-share.md): a noisy neighbour, weights,
priority aging, caps, and what fair share costs one tenant alone.

Fresh `comfyfleet serve --testing-nodes` processes with two tenants' tokens (alice,
bob), `--local-slots 8` unless said; prompts are EmptyImage -> Sleep(s) -> PreviewImage,
each distinct. Figures:

- noisy neighbour: alice queues `--backlog` prompts of 0.2 s, then bob sends 20. Bob's
  first start after his submit (goal: under 0.25 s), and the time his 20 take, against
  the same 20 on a fresh server with no one else (goal: within 2x);
- shares: weights 3:1, both backlogged with prompts of 0.1 to 1 s (alice's and bob's
  drawn alike) for `--seconds`: alice's part of the slot-time after the first 10 s (goal
  75 % within 5 points). With `--store URL`, the same over 3 gateways on one
  PostgreSQL database (3 + 3 + 2 slots);
- priority aging: alice (high) keeps the slots busy, bob (low) sends one prompt, aging
  2 s: his wait (bound: twice the aging, plus a slot coming free);
- caps: `max_running = 3` for alice over 40 prompts: the most she ran at once
  (sampled) and bob's prompts meanwhile;
- one tenant alone: 1,000 trivial prompts (PrimitiveInt -> PreviewAny, 16 in flight)
  with fair share on, against `[fair_share] enabled = false` (goal: within 5 %), each
  on a fresh server, twice, best of each.

    .venv/bin/python bench/bench_fair_share.py [--backlog 5000] [--seconds 120] [--store URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure
from harness import free_port, serve, throwaway_database

ALICE = "alice-bench-token-5e1f"
BOB = "bob-bench-token-9a7c"
ROOT = "root-bench-token-3d2b"
TOKENS = f"""
[[auth.tokens]]
token = "{ROOT}"
admin = true

[[auth.tokens]]
token = "{ALICE}"
tenant = "alice"

[[auth.tokens]]
token = "{BOB}"
tenant = "bob"
"""


def sleep_prompt(seconds: float, n: int) -> dict[str, Any]:
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": n % 0xFFFFFF},
        },
        "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": seconds}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    }


def trivial_prompt(n: int) -> dict[str, Any]:
    return {
        "1": {"class_type": "PrimitiveInt", "inputs": {"value": n}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


@dataclass
class Client:
    url: str
    session: aiohttp.ClientSession

    async def submit(self, prompt: dict[str, Any]) -> str:
        async with self.session.post(self.url + "/prompt", json={"prompt": prompt}) as answer:
            body = await answer.json()
            assert answer.status == 200, body
            return str(body["prompt_id"])

    async def submit_all(self, prompts: Sequence[dict[str, Any]], at_once: int = 32) -> list[str]:
        gate = asyncio.Semaphore(at_once)

        async def one(prompt: dict[str, Any]) -> str:
            async with gate:
                return await self.submit(prompt)

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    async def job(self, prompt_id: str) -> dict[str, Any]:
        async with self.session.get(f"{self.url}/api/jobs/{prompt_id}") as answer:
            found: dict[str, Any] = await answer.json()
            return found

    async def jobs(self, status: str) -> list[dict[str, Any]]:
        """Every job in `status` (all tenants' for the admin), page by page."""
        found: list[dict[str, Any]] = []
        while True:
            query = f"status={status}&limit=500&offset={len(found)}"
            async with self.session.get(f"{self.url}/api/jobs?{query}") as answer:
                page = (await answer.json())["jobs"]
            found += page
            if len(page) < 500:
                return found


@contextlib.asynccontextmanager
async def gateways(
    tmp: Path, tables: str, slots: Sequence[int], store: str | None = None
) -> AsyncIterator[dict[str, Client]]:
    """Gateways (one per entry of `slots`) with the tokens and `tables`; a client per
    token of the first one, plus one per gateway for alice (`alice@N`)."""
    config = tmp / "fleet.toml"
    config.write_text(TOKENS + tables)
    servers: list[tuple[subprocess.Popen[bytes], str]] = []
    sessions: list[aiohttp.ClientSession] = []
    try:
        for n, count in enumerate(slots):
            port = free_port()
            flags = ["--config", str(config), "--local-slots", str(count), "--testing-nodes"]
            if store is not None:
                flags += ["--store", store]
            servers.append((serve(tmp / f"gw{n}", port, *flags), f"http://127.0.0.1:{port}"))
        clients: dict[str, Client] = {}
        for n, (_, url) in enumerate(servers):
            for name, token in (("root", ROOT), ("alice", ALICE), ("bob", BOB)):
                session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"})
                sessions.append(session)
                clients.setdefault(name, Client(url, session))
                clients[f"{name}@{n}"] = Client(url, session)
        for _, url in servers:
            await wait_until_up(url)
        yield clients
    finally:
        for session in sessions:
            await session.close()
        for server, _ in servers:
            server.terminate()
        for server, _ in servers:
            server.wait(timeout=30)


async def wait_until_up(url: str) -> None:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ROOT}"}) as session:
        for _ in range(600):
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url + "/prompt") as answer:
                    if answer.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not start")


async def wait_ended(client: Client, ids: list[str], timeout: float = 600) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        jobs = [await client.job(p) for p in ids]
        if all(j["status"] not in ("pending", "in_progress") for j in jobs):
            return jobs
        if time.monotonic() > deadline:
            raise RuntimeError("prompts did not end in time")
        await asyncio.sleep(0.1)


def seconds_of(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


async def noisy_neighbour(backlog: int) -> None:
    print(f"noisy neighbour: alice queues {backlog} x 0.2 s, then bob sends 20 (8 slots)")
    with tempfile.TemporaryDirectory() as tmp:
        async with gateways(Path(tmp), "", [8]) as clients:
            sent = time.time()
            bob = await clients["bob"].submit_all([sleep_prompt(0.2, n) for n in range(20)])
            jobs = await wait_ended(clients["bob"], bob)
            alone = max(seconds_of(j["execution_end_time"]) or 0 for j in jobs) - sent
    with tempfile.TemporaryDirectory() as tmp:
        async with gateways(Path(tmp), "", [8]) as clients:
            prompts = [sleep_prompt(0.2, 1_000_000 + n) for n in range(backlog)]
            await clients["alice"].submit_all(prompts)
            sent = time.time()
            bob = await clients["bob"].submit_all([sleep_prompt(0.2, n) for n in range(20)])
            jobs = await wait_ended(clients["bob"], bob)
            first = min(seconds_of(j["execution_start_time"]) or 0 for j in jobs) - sent
            took = max(seconds_of(j["execution_end_time"]) or 0 for j in jobs) - sent
            left = len(await clients["alice"].jobs("pending"))
    print(f"  bob's first start {first * 1e3:.0f} ms after his submit; alice still had {left}")
    print(f"  bob's 20 took {took:.2f} s, alone {alone:.2f} s ({took / alone:.2f}x)")
    figure("noisy_first_start", first * 1e3, "ms")
    figure("noisy_bob_20_seconds", took, "s", alone)
    figure("noisy_alice_pending_after", left, "count")


async def shares(seconds: float, slots: Sequence[int], store: str | None, label: str) -> None:
    print(f"shares: weights 3:1, both backlogged {seconds:.0f} s, slots {list(slots)} {label}")
    tables = "\n[tenants.alice]\nweight = 3\n"
    rng = random.Random(7)
    per_tenant = int(seconds * sum(slots) / 0.55) + 50  # more than the slots get through
    with tempfile.TemporaryDirectory() as tmp:
        async with gateways(Path(tmp), tables, slots, store) as clients:
            names = [k for k in clients if k.startswith("alice@")]
            for tenant in ("alice", "bob"):
                lengths = [round(rng.uniform(0.1, 1.0), 2) for _ in range(per_tenant)]
                prompts = [
                    sleep_prompt(s, n + (tenant == "bob") * 10**6) for n, s in enumerate(lengths)
                ]
                # Spread over the gateways: each takes its submits' hand-offs alike.
                parts = [prompts[i :: len(names)] for i in range(len(names))]
                await asyncio.gather(
                    *(clients[f"{tenant}@{i}"].submit_all(part) for i, part in enumerate(parts))
                )
            since = time.time() + 10
            await asyncio.sleep(seconds)
            until = time.time()
            used = {t: await slot_time(clients[t], since, until) for t in ("alice", "bob")}
    part = used["alice"] / (used["alice"] + used["bob"])
    print(f"  alice's part of the slot-time: {part * 100:.1f} % (goal 75)")
    figure(f"shares_alice_percent{label}", part * 100, "%")


async def slot_time(client: Client, since: float, until: float) -> float:
    """Slot-seconds the client's tenant ran within [since, until]."""
    total = 0.0
    for status in ("completed", "in_progress"):
        for job in await client.jobs(status):
            start = seconds_of(job["execution_start_time"])
            if start is None:
                continue
            end = seconds_of(job["execution_end_time"]) or until
            total += max(0.0, min(end, until) - max(start, since))
    return total


async def aging() -> None:
    print("priority aging: alice (high) keeps 8 slots busy, bob (low) sends one; aging 2 s")
    tables = (
        '\n[fair_share]\naging = "2s"\n[tenants.alice]\npriority = "high"\n'
        '[tenants.bob]\npriority = "low"\n'
    )
    with tempfile.TemporaryDirectory() as tmp:
        async with gateways(Path(tmp), tables, [8]) as clients:
            await clients["alice"].submit_all([sleep_prompt(0.2, n) for n in range(600)])
            await asyncio.sleep(1.0)
            sent = time.time()
            (bob,) = await clients["bob"].submit_all([sleep_prompt(0.2, 10**7)])
            (job,) = await wait_ended(clients["bob"], [bob])
            waited = (seconds_of(job["execution_start_time"]) or 0) - sent
    print(f"  bob's low prompt waited {waited:.2f} s (bound 2 x aging = 4 s, plus a slot)")
    figure("aging_low_wait", waited, "s", 4.0)


async def caps() -> None:
    print("caps: alice max_running = 3 over 40 x 0.3 s, bob 40 x 0.3 s (8 slots)")
    tables = "\n[tenants.alice]\nmax_running = 3\n"
    with tempfile.TemporaryDirectory() as tmp:
        async with gateways(Path(tmp), tables, [8]) as clients:
            alice = await clients["alice"].submit_all([sleep_prompt(0.3, n) for n in range(40)])
            await clients["bob"].submit_all([sleep_prompt(0.3, 10**6 + n) for n in range(40)])
            most = bob_most = 0
            while True:
                running = await clients["alice"].jobs("in_progress")
                most = max(most, len(running))
                bob_most = max(bob_most, len(await clients["bob"].jobs("in_progress")))
                jobs = [await clients["alice"].job(p) for p in alice[-3:]]
                if all(j["status"] == "completed" for j in jobs) and not running:
                    break
                await asyncio.sleep(0.05)
    print(f"  alice ran at most {most} at once (cap 3); bob at most {bob_most}")
    figure("caps_alice_most_running", most, "count", 3)
    figure("caps_bob_most_running", bob_most, "count")


async def alone(fair: bool) -> float:
    tables = "" if fair else "\n[fair_share]\nenabled = false\n"
    with tempfile.TemporaryDirectory() as tmp:
        async with gateways(Path(tmp), tables, [8]) as clients:
            alice = clients["alice"]
            await wait_ended(
                alice, await alice.submit_all([trivial_prompt(-n - 1) for n in range(30)])
            )
            start = time.perf_counter()
            ids = await alice.submit_all([trivial_prompt(n) for n in range(1000)], at_once=16)
            await wait_ended(alice, ids[-16:])
            while len(await alice.jobs("completed")) < 1030:
                await asyncio.sleep(0.05)
            return 1000 / (time.perf_counter() - start)


async def one_tenant() -> None:
    print("one tenant alone: 1,000 trivial prompts, fair share on and off (best of 2 each)")
    on = off = 0.0
    for _ in range(2):
        off = max(off, await alone(False))
        on = max(on, await alone(True))
    print(f"  fair share on {on:.0f} prompts/s, off {off:.0f} ({on / off:.3f}x)")
    figure("one_tenant_throughput", on, "prompts/s", off)


async def main(args: argparse.Namespace, database: str | None) -> None:
    await noisy_neighbour(args.backlog)
    await shares(args.seconds, [8], None, "")
    if database is not None:
        await shares(args.seconds, [3, 3, 2], database, "_3_gateways_postgresql")
    await aging()
    await caps()
    await one_tenant()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--store", help="a PostgreSQL server URL: shares over 3 gateways too")
    options = parser.parse_args()
    if options.store is None:
        asyncio.run(main(options, None))
    else:
        with throwaway_database(options.store) as url:  # made and dropped outside the loop
            asyncio.run(main(options, url))
