"""Provider chaos through the fan-out nodes, against the emulator: 5xx, 429 storms with
Retry-After, requests that hang after the job was accepted, jobs that never finish in
time. Every collector slot ends accounted for, and no paid job is ever sent twice."""

from __future__ import annotations

import time
from typing import Any

import pytest

from comfyfleet.fanout import FanoutSettings, PoolSize
from tests.emulators import Emulator
from tests.integration.fanout.conftest import Graph, MakeRig, start_emulator
from tests.integration.fanout.test_concurrency import run, status_of
from tests.integration.fanout.test_kinds import openai_inputs

pytestmark = pytest.mark.faults

ENDED = {"success", "failed"}  # how a connected slot may end under placeholder mode


@pytest.fixture
async def emulators() -> Any:
    made: list[Emulator] = []

    async def start(**settings: Any) -> Emulator:
        made.append(await start_emulator(**settings))
        return made[-1]

    yield start
    for emulator in made:
        await emulator.server.close()


async def test_provider_chaos_every_slot_accounted_for_and_no_duplicate_jobs(
    make_rig: MakeRig, emulators: Any
) -> None:
    rig = await make_rig(FanoutSettings(image=PoolSize(30, 60)))
    # 20 % of job requests answered 500, a per-key rate limit far below the burst
    # (429 storms, Retry-After sent), jobs finishing out of order.
    stormy = await emulators(latency=0.2, jitter=0.1, fail_rate=0.2, rate_limit=15.0)
    stormy.settings.retry_after = 0.2
    # Accepts each request and never answers it: the client times out after acceptance.
    hanging = await emulators(latency=0.2, hang_rate=1.0)
    # Accepts each job and never finishes it in time: the result deadline passes.
    slow = await emulators(latency=60.0)

    graph = Graph(stormy.url)
    hang_api = graph.api(hanging.url, graph.prompt[graph.settings]["inputs"]["api_key"])
    graph.prompt[hang_api]["inputs"]["timeout"] = 1.0
    slow_api = graph.api(slow.url, graph.prompt[graph.settings]["inputs"]["api_key"])
    graph.prompt[slow_api]["inputs"]["timeout"] = 1.0

    tasks = [graph.submit(f"storm{n}", "storm", seed=n) for n in range(20)]
    for n in range(5):
        node = f"hang{n}"
        # Distinct texts: the OpenAI body has no seed, and equal bodies count as duplicates.
        inputs = openai_inputs(graph, f"hang {n}", 100 + n, api_config=[hang_api, 0])
        graph.prompt[node] = {"class_type": "Concurrent Submit | OpenAIImage", "inputs": inputs}
        tasks.append(node)
    tasks += [graph.submit(f"slow{n}", "slow", seed=200 + n, settings=slow_api) for n in range(5)]
    graph.collect("c", tasks, mode="placeholder")

    started = time.monotonic()
    result = await run(rig, graph.prompt)
    elapsed = time.monotonic() - started
    assert result.status == "success", result.error
    assert elapsed < 30, elapsed

    report = status_of(result, "c")
    slots = report["slots"][:30]
    assert sum(report["counts"].values()) == len(report["slots"])
    assert {s["state"] for s in slots} <= ENDED, [s["state"] for s in slots]
    states = [s["state"] for s in slots]
    # Retries weather the storm (a slot fails only after every retry met a 5xx or 429).
    weathered = states[:20].count("success")
    assert weathered >= 16, report["counts"]
    assert states[20:] == ["failed"] * 10, states[20:]  # hangs and timeouts end, as failures
    assert all(s["error"] for s in slots[20:])

    storm = stormy.stats()
    assert storm["failed"] > 0 and storm["rate_limited"] > 0, storm  # there was a storm
    assert storm["jobs"] == weathered and storm["duplicates"] == 0, storm
    hung = hanging.stats()
    assert hung["hung"] == 5 and hung["duplicates"] == 0, hung
    assert hung["create_requests"] == 5, hung  # an ambiguous submit is never sent again
    late = slow.stats()
    assert late["jobs"] == 5 and late["duplicates"] == 0, late
