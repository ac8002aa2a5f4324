"""The journal: no paid job is lost or sent twice, across re-queues, evictions and restarts."""

from __future__ import annotations

import json
import uuid
from typing import Any

import aiohttp

from comfyfleet.domain.remote_jobs import NewRemoteJob, RemoteJobState
from comfyfleet.fanout.request import ApiConfig
from comfyfleet.nodes.providers.bfl.client import BFLClient
from comfyfleet.nodes.providers.bfl.nodes import BFLFluxImage
from tests.emulators import Emulator
from tests.integration.fanout.conftest import KEY, KEY_ENV, Graph, MakeRig, Rig
from tests.integration.fanout.test_concurrency import run, status_of


def batch(url: str, seeds: list[int]) -> Graph:
    graph = Graph(url)
    graph.collect("c", [graph.submit(f"s{n}", "again", seed=seed) for n, seed in enumerate(seeds)])
    return graph


async def test_requeue_with_fixed_seeds_sends_no_new_jobs(
    rig: Rig, make_rig: MakeRig, emulator: Emulator
) -> None:
    graph = batch(emulator.url, [1, 2, 3])
    assert (await run(rig, graph.prompt)).status == "success"
    assert emulator.stats()["jobs"] == 3
    assert (await run(rig, graph.prompt)).status == "success"  # the output cache
    rig.engine.cache.clear()  # evicted: the journal still has every result
    result = await run(rig, graph.prompt)
    assert emulator.stats()["jobs"] == 3
    slots = status_of(result, "c")["slots"][:3]
    assert [s["reused"] for s in slots] == [True] * 3 and all(s["remote_id"] for s in slots)
    graph.prompt["s2"]["inputs"]["seed"] = 30  # a new seed is a new job
    assert (await run(rig, graph.prompt)).status == "success"
    assert emulator.stats()["jobs"] == 4
    await rig.close()
    restarted = await make_rig()  # a new process on the same journal, empty cache
    assert (await run(restarted, graph.prompt)).status == "success"
    assert emulator.stats()["jobs"] == 4 and emulator.stats()["duplicates"] == 0


async def test_requeue_after_a_partial_failure_retries_only_the_failed_slots(
    rig: Rig, emulator: Emulator
) -> None:
    graph = Graph(emulator.url)
    flaky = graph.api(emulator.url, "env:FLAKY_KEY")
    tasks = [graph.submit(f"s{n}", "again", seed=n) for n in range(3)]
    tasks.append(graph.submit("s3", "again", seed=3, settings=flaky))
    graph.collect("c", tasks, mode="placeholder")
    rig.env["FLAKY_KEY"] = "not-yet-valid"
    first = await run(rig, graph.prompt)
    assert first.status == "success"
    assert status_of(first, "c")["counts"]["failed"] == 1
    assert emulator.stats()["jobs"] == 3
    rig.env["FLAKY_KEY"] = KEY  # fixed: queue the same prompt again
    second = await run(rig, graph.prompt)
    states = [(s["state"], s["reused"]) for s in status_of(second, "c")["slots"][:4]]
    assert states == [("success", True)] * 3 + [("success", False)]
    assert emulator.stats()["jobs"] == 4  # only the failed slot was sent again


async def bfl_job(emulator: Emulator, body: dict[str, Any]) -> str:
    async with aiohttp.ClientSession() as session:
        task = await BFLClient(session, emulator.url, KEY).submit("flux-2-pro", body)
    return task.id


async def test_a_job_left_running_by_a_dead_process_is_reattached(
    rig: Rig, emulator: Emulator
) -> None:
    emulator.settings.latency = 0.5
    graph = batch(emulator.url, [5])
    inputs = {
        **graph.prompt["s0"]["inputs"],
        "api_config": ApiConfig(emulator.url, f"env:{KEY_ENV}"),
    }
    request = BFLFluxImage().remote_request(**inputs)
    # What the dead process wrote: the job, then its id, and nothing after.
    remote_id = await bfl_job(emulator, request.body)
    journal_id = uuid.uuid4().hex
    resume = {**request.api.resume_fields(), "operation": "flux-2-pro"}
    new = NewRemoteJob(journal_id, request.request_hash, "bfl", "image", "p-old", "s0", resume)
    await rig.store.record_remote_job(new)
    polling = {**resume, "polling_url": f"{emulator.url}/v1/get_result?id={remote_id}"}
    await rig.store.remote_job_submitted(journal_id, remote_id, polling)
    result = await run(rig, graph.prompt)
    assert result.status == "success", result.error
    [slot] = status_of(result, "c")["slots"][:1]
    assert (slot["state"], slot["remote_id"]) == ("success", remote_id)
    assert emulator.stats()["jobs"] == 1  # polled, never sent again
    found = await rig.store.remote_job(journal_id)
    assert found is not None and found.state == RemoteJobState.SUCCEEDED and found.result


async def test_a_job_lost_in_flight_is_not_sent_again_by_the_same_prompt(
    rig: Rig, emulator: Emulator
) -> None:
    graph = batch(emulator.url, [6])
    inputs = {
        **graph.prompt["s0"]["inputs"],
        "api_config": ApiConfig(emulator.url, f"env:{KEY_ENV}"),
    }
    request = BFLFluxImage().remote_request(**inputs)
    # Recorded, and the process died before the provider's answer came back.
    new = NewRemoteJob("lost", request.request_hash, "bfl", "image", "p-1", "s0", {})
    await rig.store.record_remote_job(new)
    _, result = await rig.engine.run_prompt(graph.prompt, prompt_id="p-1")
    assert result is not None and result.status == "error" and result.error is not None
    assert "may have been created" in result.error["exception_message"]
    assert emulator.stats()["jobs"] == 0
    result = await run(rig, graph.prompt)  # queued again by the user: a new prompt
    assert result.status == "success" and emulator.stats()["jobs"] == 1


async def test_a_typed_key_does_not_survive_a_restart(
    rig: Rig, make_rig: MakeRig, emulator: Emulator
) -> None:
    graph = Graph(emulator.url, key=KEY)
    graph.collect("c", [graph.submit("s", "typed", seed=1)])
    stored, _ = rig.service.vault.scrub(graph.prompt, {}, rig.engine.registry)
    assert KEY not in json.dumps(stored)
    assert (await run(rig, stored)).status == "success"  # the key is in this process
    await rig.close()
    restarted = await make_rig()
    result = await run(restarted, stored)
    assert result.status == "error" and result.error is not None
    assert result.error["node_type"] == "APISettings"
    assert "kept in memory only" in result.error["exception_message"]
    assert KEY not in json.dumps(result.error)
